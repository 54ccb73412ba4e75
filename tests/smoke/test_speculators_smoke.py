"""A speculators drafter runs through the reference runtime as its z-lab twin does (issue 39, item 5).

The bundled tiny pair (examples/tiny-lilicorr drafting for examples/tiny-target) has a LiLiCorr head, which has no
speculators form: its DFlash backbone is taken alone (the head and convolution tensors left out), written once in
the speculators layout by hand and once as the z-lab twin of that (tests/checks/test_speculators_rules.py
`zlab_twin`). Both are built from the same in-memory checkpoint shape, so the modules, their outputs and the smoke
profile must be identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

torch = pytest.importorskip("torch")

from checks.test_speculators_rules import read_tensors, zlab_twin  # noqa: E402

from lilicorr_ckpt.checkpoint import load_checkpoint  # noqa: E402
from lilicorr_ckpt.checkpoint.stwrite import write_file  # noqa: E402
from lilicorr_ckpt.smoke import smoke  # noqa: E402
from lilicorr_ckpt.smoke.load import load_drafter  # noqa: E402
from lilicorr_runtime.model.load import CheckpointRefused, build_drafter  # noqa: E402

from helpers import REPO  # noqa: E402

TINY = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"
NESTED = (  # the geometry speculators nests in transformer_layer_config
    "attention_bias",
    "attention_dropout",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "layer_types",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "tie_word_embeddings",
    "vocab_size",
)


def speculators_dflash(dest: Path) -> Path:
    """tiny-lilicorr's DFlash backbone as speculators writes a DFlash drafter."""
    zlab = json.loads((TINY / "config.json").read_text())
    d = zlab["dflash_config"]
    nested: dict[str, Any] = {k: zlab[k] for k in NESTED}
    nested.update(
        model_type="qwen3", rope_parameters={"rope_theta": zlab["rope_theta"], "rope_type": "default"}
    )
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"": "config.DFlashSpeculatorConfig"},
        "aux_hidden_state_layer_ids": [i + 1 for i in d["target_layer_ids"]],
        "block_size": d["block_size"],
        "draft_vocab_size": zlab["vocab_size"],
        "dtype": "bfloat16",
        "mask_token_id": d["mask_token_id"],
        "sample_from_anchor": False,
        # the tiny pair's layers are full attention, trained bidirectionally: vLLM serves them so with this
        "sliding_window_non_causal": True,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "accept_tolerance": 0.0,
                    "proposal_type": "greedy",
                    "speculative_tokens": d["block_size"] - 1,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "acme/tiny-target"},
        },
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": nested,
        "transformers_version": "5.19.0",
    }
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {
        name: t
        for name, t in read_tensors(TINY / "model.safetensors").items()
        if not name.startswith("lilicorr.") and "_conv." not in name
    }
    write_file(dest / "model.safetensors", tensors, {"format": "pt"})
    return dest


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("speculators-pair")
    spec = speculators_dflash(root / "speculators")
    return spec, zlab_twin(spec, root / "zlab")


def test_both_are_read_as_one_drafter(pair):
    spec, zlab = (load_checkpoint(str(p)) for p in pair)
    assert spec.speculators is not None and zlab.speculators is None
    assert spec.geometry == zlab.geometry and spec.manifest == zlab.manifest and spec.names == zlab.names


def test_the_reference_runtime_builds_identical_drafters(pair):
    spec, zlab = (load_drafter(p, runtime="vllm") for p in pair)
    assert repr(spec) == repr(zlab)
    a, b = spec.state_dict(), zlab.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # one draft step, bit for bit: context rows from the target's taps, then a block of [anchor, masks]
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 5, spec.fc.weight.shape[1], generator=gen)
    block = torch.randn(1, spec.block_size, spec.fc.weight.shape[0], generator=gen)
    outputs = []
    for drafter in (spec, zlab):
        cache = drafter.new_cache()
        with torch.no_grad():
            drafter.append_context(cache, drafter.project_context(features))
            outputs.append(drafter(cache, block))
    assert torch.equal(outputs[0], outputs[1])


def test_both_smoke_to_the_same_acceptance(pair):
    options = {"limit": 1, "max_new_tokens": 24, "probes": "code", "warmup": False, "runtime": "vllm"}
    spec, zlab = (smoke(str(p), target=str(TARGET), **options) for p in pair)
    assert spec.arms.keys() == zlab.arms.keys() and "control" in spec.arms
    timing = {"wall_time_s", "tokens_per_second", "speedup_vs_ar"}
    for arm in spec.arms:
        a, b = (msgspec.structs.asdict(r.arms[arm]) for r in (spec, zlab))
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing
        }


def test_a_reduced_draft_vocabulary_is_refused_by_the_reference_runtime():
    ckpt = load_checkpoint(
        str(REPO / "tests" / "data" / "producers" / "speculators-0.9.0" / "dflash-bf16-draftvocab")
    )
    with pytest.raises(CheckpointRefused, match="reduced draft vocabulary"):
        build_drafter(ckpt)
