"""Reading the speculators layout: the z-lab config vLLM's translation makes of it, what is recorded about the
layout as written, and the same checkpoint read headers-only, from a sparse 2 GB file and from the Hub."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from fakehub import FakeHub

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checkpoint.load import NotADrafter
from lilicorr_ckpt.checkpoint.speculators import hub_repo_id_problem, is_speculators, translate
from lilicorr_ckpt.families import is_drafter
from lilicorr_ckpt.runtimes import RELEASES

from helpers import REPO

SPEC = REPO / "tests" / "data" / "producers" / "speculators-0.9.0"
FIXTURES = ("dflash-bf16", "dflash-bf16-draftvocab", "dflash2-bf16", "dspark-bf16")
ENGINES = (
    REPO / ".cache" / "engines"
)  # the conformance suite's unpacked wheel sources (tests/conformance/engines.py)
# what the reader adds beside algos.py's keys: the block the proposal sets, the dtype, the reduced head declared owned
ADDED = {"block_size", "dtype", "has_own_lm_head"}


def config(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SPEC / name / "config.json").read_text())
    return doc


def test_the_speculators_layout_is_recognised_by_speculators_config_without_model_type():
    doc = config("dflash-bf16")
    assert is_speculators(doc) and is_drafter(doc)
    assert not is_speculators({**doc, "model_type": "qwen3"})  # vLLM reads a model_type first
    assert not is_speculators({**doc, "speculators_config": None})
    assert not is_drafter(
        {"speculators_config": {}, "speculators_model_type": ["dflash"]}
    )  # no crash on a list


def test_dflash_is_translated_as_vllm_translates_it():
    parsed = parse_config((SPEC / "dflash-bf16" / "config.json").read_bytes())
    raw, cfg, origin = parsed.raw, parsed.config, parsed.speculators
    assert origin is not None and origin.kind == "dflash" and origin.version == "0.9.0"
    nested = config("dflash-bf16")["transformer_layer_config"]
    assert {k: raw[k] for k in nested} == nested  # the nested config is the base, unchanged
    assert raw["architectures"] == ["DFlashDraftModel"]
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert raw["dflash_config"] == {
        "mask_token_id": 511,
        "target_layer_ids": [1, 3, 4],  # aux - 1
        "sample_from_anchor": False,
        "causal": True,  # not sliding_window_non_causal (false)
    }
    assert raw["block_size"] == 16  # speculative_tokens 15 + the anchor
    assert (
        cfg.hidden_size == 64 and cfg.num_hidden_layers == 2 and cfg.layer_types == ["sliding_attention"] * 2
    )
    assert "speculators_config" not in raw and "transformer_layer_config" not in raw
    assert parsed.unknown_keys == [] or all("target" not in k for k in parsed.unknown_keys)
    assert (
        origin.speculative_tokens == 15
        and origin.block_size == 16
        and origin.verifier == ("HuggingFaceTB/SmolLM2-135M-Instruct")
    )
    assert origin.document == config("dflash-bf16")


def test_dflash2_carries_its_convolution_and_selector_keys_into_dflash_config():
    parsed = parse_config((SPEC / "dflash2-bf16" / "config.json").read_bytes())
    d = parsed.raw["dflash_config"]
    assert parsed.raw["architectures"] == ["DFlash2DraftModel"]
    assert (d["conv_kernel_size"], d["conv_group_size"], d["selector_rank"], d["selector_top_k"]) == (
        2,
        16,
        16,
        16,
    )
    assert d["causal"] is False  # sliding_window_non_causal true
    assert parsed.raw["block_size"] == 8


def test_dspark_is_rewritten_to_qwen3_dspark_with_its_keys_at_the_top_level():
    parsed = parse_config((SPEC / "dspark-bf16" / "config.json").read_bytes())
    raw = parsed.raw
    assert raw["architectures"] == ["Qwen3DSparkModel"]  # DSparkDraftModel is not kept
    assert "dflash_config" not in raw  # update_dspark writes none: no global causal
    assert raw["target_layer_ids"] == [1, 3, 4] and raw["mask_token_id"] == 511
    assert (raw["sample_from_anchor"], raw["dspark_bonus_anchor"]) == (True, False)
    assert (raw["markov_rank"], raw["markov_head_type"], raw["block_size"]) == (16, "vanilla", 8)
    g = load_checkpoint(str(SPEC / "dspark-bf16")).geometry
    assert g.family == "dspark" and g.dspark_layout == "served" and g.confidence_with_markov


def test_the_draft_vocabulary_is_an_owned_reduced_head_with_its_d2t():
    ckpt = load_checkpoint(str(SPEC / "dflash-bf16-draftvocab"))
    g = ckpt.geometry
    assert g.draft_vocab_size == 256 and g.vocab_size == 512 and g.has_own_lm_head
    assert ckpt.manifest.tensors["lm_head.weight"].shape == (256, 64)
    assert ckpt.manifest.tensors["d2t"].dtypes == frozenset({"I64"})
    assert "t2d" not in ckpt.manifest.tensors  # training-only: vLLM skips it
    assert load_checkpoint(str(SPEC / "dflash-bf16")).geometry.draft_vocab_size is None  # 512 of 512


def test_paths_of_the_translated_config_lead_back_to_the_file_as_written():
    origin = translate(config("dflash-bf16")).origin
    assert origin.original_path("$.dflash_config.target_layer_ids[1]") == "$.aux_hidden_state_layer_ids[1]"
    assert origin.original_path("$.dflash_config.causal") == "$.sliding_window_non_causal"
    assert origin.original_path("$.hidden_size") == "$.transformer_layer_config.hidden_size"
    assert (
        origin.original_path("$.block_size") == "$.speculators_config.proposal_methods[0].speculative_tokens"
    )
    assert origin.original_path("$.elsewhere") == "$.elsewhere"


def test_what_speculators_trained_is_kept_beside_what_vllm_serves():
    dspark = translate(config("dspark-bf16")).origin
    assert dspark.trained_sample_from_anchor is True and dspark.served_sample_from_anchor is True
    unwritten = config("dspark-bf16")
    unwritten.pop("sample_from_anchor")
    origin = translate(unwritten).origin
    # speculative_tokens 8 = block_size 8: anchor-first; vLLM reads the absent key as false
    assert origin.trained_sample_from_anchor is True and origin.served_sample_from_anchor is False
    unwritten["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 7
    assert translate(unwritten).origin.trained_sample_from_anchor is False
    dflash = translate(config("dflash-bf16")).origin
    assert [dflash.trained_causal(i) for i in (0, 1)] == [
        True,
        True,
    ]  # sliding, sliding_window_non_causal false


def test_a_translation_vllm_cannot_make_is_recorded_not_raised():
    doc = config("dflash-bf16")
    for key in ("aux_hidden_state_layer_ids", "mask_token_id"):
        broken = {k: v for k, v in doc.items() if k != key}
        assert any(key in why for why in translate(broken).origin.unread)
    bad = {**doc, "aux_hidden_state_layer_ids": ["2"], "transformer_layer_config": 3}
    origin = translate(bad).origin
    assert len(origin.unread) == 2
    parsed = parse_config(json.dumps(bad).encode())  # still a config, judged by the rules
    assert parsed.speculators is not None and "target_layer_ids" not in parsed.raw["dflash_config"]


def test_a_speculators_config_of_another_kind_is_not_a_dflash_family_drafter(tmp_path):
    path = shutil.copytree(SPEC / "dflash-bf16", tmp_path / "eagle3")
    doc = config("dflash-bf16")
    doc.update(speculators_model_type="eagle3", architectures=["Eagle3Speculator"])
    (path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(NotADrafter, match="speculators eagle3 drafter"):
        load_checkpoint(str(path))


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("gpt2", True),
        ("/data/models/x", False),
        ("./x", False),
        ("a/b/c", False),
        ("org/name.git", False),
        ("org--x/name", False),
        (None, False),
        (3, False),
    ],
)
def test_the_verifier_is_judged_as_huggingface_hub_validates_a_repo_id(value, ok):
    assert (hub_repo_id_problem(value) is None) is ok


# ---------------------------------------------------------------- against the wheels' own translation


def _wheel_algos(version: str) -> dict[str, Any]:
    path = (
        ENGINES / f"vllm-{version}" / "vllm" / "transformers_utils" / "configs" / "speculators" / "algos.py"
    )
    if not path.is_file():
        pytest.skip(
            f"vLLM {version}'s sources are not unpacked in .cache/engines (the conformance suite fetches them)"
        )
    namespace: dict[str, Any] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # algos.py imports nothing
    supported: dict[str, Any] = namespace["SUPPORTED_SPECULATORS_TYPES"]
    return supported


@pytest.mark.parametrize("version", [p.version for p in RELEASES["vllm"]])
@pytest.mark.parametrize("name", FIXTURES)
def test_the_translation_is_the_one_the_vllm_wheel_makes(version, name):
    updaters = _wheel_algos(version)
    doc = config(name)
    expected = copy.deepcopy(doc.get("transformer_layer_config", {}))  # base.py extract_transformers_...
    updaters[doc["speculators_model_type"]](config_dict=doc, pre_trained_config=expected)
    got = translate(doc).config
    assert {k: v for k, v in got.items() if k not in ADDED} == {
        k: v for k, v in expected.items() if k not in ADDED
    }
    assert expected.get("block_size", got["block_size"]) == got["block_size"]


# ---------------------------------------------------------------- headers only, torch-free, and from the Hub


PROBE = """
import sys
from lilicorr_ckpt.cli import main
try:
    main(["validate", sys.argv[1], "--runtime", "vllm"])
except SystemExit as exc:
    heavy = sorted(m for m in ("torch", "transformers", "triton", "lilicorr_runtime") if m in sys.modules)
    print("HEAVY", heavy, "EXIT", exc.code)
"""


def speculators_form(zlab: dict[str, Any]) -> dict[str, Any]:
    """A head-free z-lab DFlash config rewritten in the speculators layout (as speculators' converter does)."""
    d = zlab["dflash_config"]
    skip = {"architectures", "dflash_config", "block_size", "torch_dtype", "num_target_layers", "rope_theta"}
    nested = {k: v for k, v in zlab.items() if k not in skip}
    nested["rope_parameters"] = {"rope_theta": zlab["rope_theta"], "rope_type": "default"}
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "aux_hidden_state_layer_ids": [i + 1 for i in d["target_layer_ids"]],
        "block_size": d["block_size"],
        "draft_vocab_size": zlab["vocab_size"],
        "dtype": "bfloat16",
        "mask_token_id": d["mask_token_id"],
        "sample_from_anchor": False,
        "sliding_window_non_causal": not d.get("causal", False),
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": d["block_size"] - 1}],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "Qwen/Qwen3-8B"},
        },
        "transformer_layer_config": nested,
    }


def test_a_2gb_speculators_drafter_is_validated_headers_only_without_torch(tmp_path):
    zlab = fixtures.qwen3_8b_drafter_config(5)
    zlab["dflash_config"] = {k: v for k, v in zlab["dflash_config"].items() if not k.startswith("lilicorr_")}
    zlab["architectures"] = ["DFlashDraftModel"]
    path = fixtures.write_sparse_checkpoint(tmp_path / "big", zlab)
    (path / "config.json").write_text(json.dumps(speculators_form(zlab)))
    assert (path / "model.safetensors").stat().st_size > 2e9  # holes: reading them would time out
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=60
    )
    assert "HEAVY [] EXIT 0" in result.stdout, result.stdout + result.stderr
    assert load_checkpoint(str(path)).geometry.target_layer_ids == (1, 9, 17, 25, 33)


def test_a_speculators_drafter_on_the_hub_is_read_from_its_config_and_headers(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    with FakeHub() as hub:
        hub.add("acme/spec-dspark", SPEC / "dspark-bf16")
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str(tmp_path / "hf-home"),
            HF_HUB_CACHE=str(tmp_path / "hf-cache"),
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        remote = subprocess.run(
            [
                sys.executable,
                "-m",
                "lilicorr_ckpt.cli",
                "validate",
                "acme/spec-dspark",
                "-f",
                "json",
                "--runtime",
                "every",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "lilicorr_ckpt.cli",
            "validate",
            str(SPEC / "dspark-bf16"),
            "-f",
            "json",
            "--runtime",
            "every",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert remote.returncode == local.returncode == 1, remote.stderr
    a, b = json.loads(remote.stdout), json.loads(local.stdout)
    assert (
        a["runtimes"] == b["runtimes"] and a["findings"] == b["findings"] and a["geometry"] == b["geometry"]
    )
