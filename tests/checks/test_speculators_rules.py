"""The speculators layout judged per release: the real speculators 0.9.0 fixtures, their z-lab twins, and the rules
of the layout (LC017-LC019, LC176-LC179) and of a reduced draft vocabulary.

The z-lab twin of a speculators drafter is written here by hand from the same model.safetensors (copied byte for
byte): the geometry at the top level, `target_layer_ids` one below the speculators taps, the block from the
proposal, the causality vLLM's translation gives. Its verdicts are what the wheels give a z-lab drafter; the
speculators drafter must get the same from every vLLM release.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.checkpoint.stwrite import write_file
from lilicorr_ckpt.runtimes import RELEASES

from ._support import edit_config, hits, run
from helpers import REPO

SPEC = REPO / "tests" / "data" / "producers" / "speculators-0.9.0"
FIXTURES = ("dflash-bf16", "dflash-bf16-draftvocab", "dflash2-bf16", "dspark-bf16")
VLLM = [p.release_id for p in RELEASES["vllm"]]
SGLANG = [p.release_id for p in RELEASES["sglang"]]
Tensors = dict[str, tuple[str, tuple[int, ...], bytes]]


def read_tensors(path: Path) -> Tensors:
    """name -> (dtype, shape, bytes) of a safetensors file, read raw (bf16 included)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    return {
        name: (v["dtype"], tuple(v["shape"]), data[base + v["data_offsets"][0] : base + v["data_offsets"][1]])
        for name, v in header.items()
        if name != "__metadata__"
    }


def copy_fixture(name: str, dest: Path) -> Path:
    shutil.copytree(SPEC / name, dest, ignore=shutil.ignore_patterns("PROVENANCE.json"))
    return dest


def zlab_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The z-lab config of a speculators config, written out per kind (not through the reader's translation)."""
    kind = spec["speculators_model_type"]
    nested = spec["transformer_layer_config"]
    taps = [i - 1 for i in spec["aux_hidden_state_layer_ids"]]
    tokens = spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    out: dict[str, Any] = {**nested, "dtype": spec["dtype"]}
    if kind in ("dflash", "dflash2"):
        out["architectures"] = ["DFlashDraftModel" if kind == "dflash" else "DFlash2DraftModel"]
        out["block_size"] = tokens + 1
        out["dflash_config"] = {
            "mask_token_id": spec["mask_token_id"],
            "target_layer_ids": taps,
            # vLLM's translation: one causal for every layer, the negation of sliding_window_non_causal
            "causal": not spec["sliding_window_non_causal"],
        }
        if kind == "dflash2":
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
                out["dflash_config"][key] = spec[key]
    else:  # DeepSpec's served DSpark layout: everything at the top level
        out.update(
            architectures=["Qwen3DSparkModel"],
            target_layer_ids=taps,
            mask_token_id=spec["mask_token_id"],
            block_size=spec["block_size"],
            markov_rank=spec["markov_rank"],
            markov_head_type=spec["markov_head_type"],
            enable_confidence_head=spec["enable_confidence_head"],
            confidence_head_with_markov=spec["confidence_head_with_markov"],
            sample_from_anchor=spec["sample_from_anchor"],
        )
    if spec["draft_vocab_size"] < nested["vocab_size"]:  # the reduced head speculators saves, declared owned
        out.update(draft_vocab_size=spec["draft_vocab_size"], has_own_lm_head=True)
    return out


def zlab_twin(spec_dir: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copyfile(spec_dir / "model.safetensors", dest / "model.safetensors")
    config = zlab_config(json.loads((spec_dir / "config.json").read_text()))
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def verdicts(path: Path, runtime: str = "every") -> dict[str, tuple[bool, int, int]]:
    return {v.runtime: (v.accepted, v.errors, v.warnings) for v in run(path, runtime=runtime).runtimes}


def fixture_with(tmp: Path, name: str, edit: Callable[[dict[str, Any]], Any]) -> Path:
    path = copy_fixture(name, tmp / name)
    edit_config(path, edit)
    return path


# ---------------------------------------------------------------- the real fixtures, per release


@pytest.mark.parametrize("name", FIXTURES)
def test_real_speculators_drafters_load_on_vllm_and_are_refused_by_sglang(name):
    report = run(SPEC / name, runtime="every")
    got = {v.runtime: (v.accepted, v.errors, v.warnings) for v in report.runtimes}
    # vLLM 0.31.0-0.34.0 translate dflash, dflash2 and dspark and load all four: nothing to say but LC019
    assert {r: got[r] for r in VLLM} == dict.fromkeys(VLLM, (True, 0, 0))
    # SGLang: no reader for the layout, one error and nothing else
    assert {r: got[r] for r in SGLANG} == dict.fromkeys(SGLANG, (False, 1, 0))
    assert got["trtllm"] == (True, 0, 1)
    by_rule = {(f.rule, tuple(f.runtimes)) for f in report.findings}
    assert ("LC017", tuple(SGLANG)) in by_rule and ("LC018", ("trtllm",)) in by_rule
    assert ("LC019", tuple(VLLM)) in by_rule
    for f in report.findings:  # every other finding is about vLLM's translation
        if f.rule not in ("LC017", "LC018"):
            assert f.runtimes and set(f.runtimes) <= set(VLLM), f


def test_the_lc017_fix_names_the_converter():
    (finding,) = hits(run(SPEC / "dflash-bf16", runtime="sglang"), "LC017")
    assert "lilicorr-ckpt convert --to zlab" in finding.message and "convert --to zlab" in finding.fix
    assert finding.pointer == "$.speculators_config"


# ---------------------------------------------------------------- the z-lab twin


@pytest.mark.parametrize("name", FIXTURES)
def test_a_speculators_drafter_is_read_as_its_zlab_twin(tmp_path, name):
    twin = zlab_twin(SPEC / name, tmp_path / "twin")
    spec, zlab = load_checkpoint(str(SPEC / name)), load_checkpoint(str(twin))
    assert spec.speculators is not None and zlab.speculators is None
    assert spec.geometry == zlab.geometry
    assert spec.manifest == zlab.manifest
    assert spec.names == zlab.names and spec.table == zlab.table
    # the typed configs differ only by what vLLM's translation adds beside the z-lab keys
    a, b = msgspec.structs.asdict(spec.parsed.config), msgspec.structs.asdict(zlab.parsed.config)
    differ = {k for k in a if a[k] != b[k]}
    assert differ <= {
        "eagle_aux_hidden_state_layer_ids",
        "draft_vocab_size",
        "dflash_config",
        "dspark_bonus_anchor",
    }
    assert a["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in spec.geometry.target_layer_ids or ()]
    if "dflash_config" in differ:  # only the explicit sample_from_anchor false of update_dflash
        assert (
            msgspec.structs.replace(spec.parsed.config.dflash, sample_from_anchor=None)
            == zlab.parsed.config.dflash
        )


@pytest.mark.parametrize("name", FIXTURES)
def test_a_speculators_drafter_and_its_zlab_twin_get_the_same_vllm_verdicts(tmp_path, name):
    twin = zlab_twin(SPEC / name, tmp_path / "twin")
    spec, zlab = verdicts(SPEC / name, "vllm>=0.31"), verdicts(twin, "vllm>=0.31")
    assert spec == zlab
    errors_and_warnings = {
        f.rule for f in run(twin, runtime="vllm>=0.31").findings if f.severity != "info"
    } ^ {f.rule for f in run(SPEC / name, runtime="vllm>=0.31").findings if f.severity != "info"}
    assert errors_and_warnings == set()


# ---------------------------------------------------------------- LC017 / LC018 / LC019


def test_a_translation_that_fails_is_lc017_for_vllm_too(tmp_path):
    path = fixture_with(tmp_path, "dflash-bf16", lambda c: c.pop("aux_hidden_state_layer_ids"))
    report = run(path, runtime="every")
    refused = {r for f in hits(report, "LC017") for r in f.runtimes}
    assert refused == set(SGLANG) | set(VLLM)
    (vllm,) = [f for f in hits(report, "LC017") if f.runtimes == VLLM]
    assert "aux_hidden_state_layer_ids is absent" in vllm.message
    # nothing judged from a translation vLLM does not make: no "target_layer_ids missing" (LC113)
    assert not hits(report, "LC113") and not hits(report, "LC019")
    mask = fixture_with(tmp_path / "m", "dflash-bf16", lambda c: c.pop("mask_token_id"))
    assert any("mask_token_id is absent" in f.message for f in hits(run(mask, runtime="vllm"), "LC017"))


def test_only_the_file_rules_survive_for_a_release_that_does_not_read_the_layout(tmp_path):
    path = copy_fixture("dflash-bf16", tmp_path / "d")
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04N.")  # LC601: a pickle beside the safetensors
    report = run(path, runtime="sglang")
    assert {f.rule for f in report.findings} == {"LC017", "LC601"}


def test_the_translation_is_stated_for_vllm(tmp_path):
    (finding,) = hits(run(SPEC / "dflash-bf16", runtime="vllm"), "LC019")
    assert "target_layer_ids [1, 3, 4] (aux_hidden_state_layer_ids [2, 4, 5] - 1)" in finding.message
    assert "causal true (sliding_window_non_causal false)" in finding.message
    assert "block 16 (15 speculative tokens)" in finding.message


# ---------------------------------------------------------------- LC176: the causal override


def full_attention(config: dict[str, Any]) -> None:
    config["transformer_layer_config"]["layer_types"] = ["full_attention", "full_attention"]
    config["transformer_layer_config"].pop("sliding_window")
    config["transformer_layer_config"]["use_sliding_window"] = False


def test_default_speculators_dflash_with_full_attention_layers_is_served_causally(tmp_path):
    path = fixture_with(tmp_path, "dflash-bf16", full_attention)  # sliding_window_non_causal false (default)
    report = run(path, runtime="every")
    (finding,) = hits(report, "LC176")
    assert finding.severity == "error" and finding.runtimes == VLLM
    assert "full_attention layers 0-1 were trained bidirectionally and are served causally" in finding.message
    assert {v.runtime: v.accepted for v in report.runtimes if v.runtime in VLLM} == dict.fromkeys(VLLM, False)
    # sliding_window_non_causal true: served bidirectionally, as trained
    fixed = fixture_with(
        tmp_path / "fixed",
        "dflash-bf16",
        lambda c: (full_attention(c), c.update(sliding_window_non_causal=True)),
    )
    assert not hits(run(fixed, runtime="vllm"), "LC176")


def test_a_hostile_layer_count_is_judged_without_walking_its_layers(tmp_path):
    def huge(c: dict[str, Any]) -> None:
        c["transformer_layer_config"].pop("layer_types")
        c["transformer_layer_config"]["num_hidden_layers"] = 10**15

    (finding,) = hits(run(fixture_with(tmp_path, "dflash-bf16", huge), runtime="vllm"), "LC176")
    assert "full_attention layers 0-999999999999999 were trained bidirectionally" in finding.message
    assert finding.actual == f"{10**15} of {10**15} layers served otherwise"


def test_causal_sliding_layers_are_what_speculators_trains_by_default():
    # both fixture layers are sliding: causal as trained, as vLLM serves them
    assert not hits(run(SPEC / "dflash-bf16", runtime="every"), "LC176")


def test_an_absent_sliding_window_non_causal_serves_trained_causal_sliding_layers_bidirectionally(tmp_path):
    path = fixture_with(tmp_path, "dflash-bf16", lambda c: c.pop("sliding_window_non_causal"))
    (finding,) = hits(run(path, runtime="vllm"), "LC176")
    assert (
        "sliding_attention layers 0-1 were trained causally and are served bidirectionally" in finding.message
    )


def test_dspark_is_translated_without_a_global_causal_so_non_causal_sliding_layers_are_served_causally(
    tmp_path,
):
    assert not hits(run(SPEC / "dspark-bf16", runtime="vllm"), "LC176")
    path = fixture_with(tmp_path, "dspark-bf16", lambda c: c.update(sliding_window_non_causal=True))
    (finding,) = hits(run(path, runtime="vllm"), "LC176")
    assert "were trained bidirectionally and are served causally" in finding.message


# ---------------------------------------------------------------- LC177: DSpark's anchor layout


def test_a_speculators_dspark_without_sample_from_anchor_in_the_anchor_first_layout_is_served_fill_in(
    tmp_path,
):
    # speculative_tokens 8 = block_size 8: the anchor-first layout speculators' DSpark trains by default
    path = fixture_with(tmp_path, "dspark-bf16", lambda c: c.pop("sample_from_anchor"))
    report = run(path, runtime="every")
    (finding,) = hits(report, "LC177")
    assert finding.runtimes == VLLM and finding.severity == "error"
    assert "trained anchor-first" in finding.message and "fill-in" in finding.message


def test_a_speculators_dspark_in_the_fill_in_layout_is_served_as_trained(tmp_path):
    def fill_in(c: dict[str, Any]) -> None:
        c.pop("sample_from_anchor")
        c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 7  # block_size - 1

    assert not hits(run(fixture_with(tmp_path, "dspark-bf16", fill_in), runtime="vllm"), "LC177")
    assert not hits(run(SPEC / "dspark-bf16", runtime="vllm"), "LC177")  # written: served as written


# ---------------------------------------------------------------- LC178 / LC120: a reduced draft vocabulary


def with_draft_vocab(tmp: Path, name: str, *, d2t: bool) -> Path:
    """A fixture given a reduced draft vocabulary of 256: lm_head [256, 64] (and d2t) added, draft_vocab_size
    set, DSpark's markov_w2 cut to the draft rows."""
    path = copy_fixture(name, tmp / name)
    tensors = read_tensors(path / "model.safetensors")
    tensors["lm_head.weight"] = ("BF16", (256, 64), bytes(256 * 64 * 2))
    if d2t:
        tensors["d2t"] = ("I64", (256,), np.arange(256, dtype=np.int64).tobytes())
    if "markov_head.markov_w2.weight" in tensors:
        dtype, (_, r), raw = tensors["markov_head.markov_w2.weight"]
        tensors["markov_head.markov_w2.weight"] = (dtype, (256, r), raw[: 256 * r * 2])
    write_file(path / "model.safetensors", tensors, {"format": "pt"})
    edit_config(path, lambda c: c.update(draft_vocab_size=256))
    return path


def test_the_real_draft_vocabulary_fixture_is_served_by_vllm_with_its_d2t():
    report = run(SPEC / "dflash-bf16-draftvocab", runtime="vllm>=0.31")
    assert not hits(report, "LC120") and not hits(report, "LC178") and not hits(report, "LC204")
    ckpt = load_checkpoint(str(SPEC / "dflash-bf16-draftvocab"))
    assert ckpt.manifest.tensors["lm_head.weight"].shape == (256, 64)
    assert ckpt.manifest.tensors["d2t"].shape == (256,) and ckpt.manifest.tensors["d2t"].component == "vocab"


def test_dflash2_never_maps_its_candidates_through_d2t(tmp_path):
    report = run(with_draft_vocab(tmp_path, "dflash2-bf16", d2t=True), runtime="vllm>=0.31")
    (finding,) = hits(report, "LC178")
    assert finding.runtimes == VLLM and "never applies d2t" in finding.message
    assert not hits(report, "LC120")


def test_a_draft_vocabulary_without_d2t(tmp_path):
    path = copy_fixture("dflash-bf16-draftvocab", tmp_path / "d")
    tensors = read_tensors(path / "model.safetensors")
    del tensors["d2t"]
    write_file(path / "model.safetensors", tensors, {"format": "pt"})
    (finding,) = hits(run(path, runtime="vllm"), "LC178")
    assert "without d2t" in finding.message and "keeps the map at zero" in finding.message
    dspark = with_draft_vocab(tmp_path, "dspark-bf16", d2t=False)
    (finding,) = hits(run(dspark, runtime="vllm>=0.33"), "LC178")
    assert (
        "vLLM 0.33.0 refuses the load" in finding.message
        and "vLLM 0.34.0 keeps the map at zero" in finding.message
    )
    assert not hits(run(with_draft_vocab(tmp_path / "ok", "dspark-bf16", d2t=True), runtime="vllm"), "LC178")


def test_a_zlab_dflash_with_a_draft_vocabulary_is_refused_only_where_the_head_cannot_serve_it(tmp_path):
    twin = zlab_twin(SPEC / "dflash-bf16-draftvocab", tmp_path / "twin")
    report = run(twin, runtime="every")
    assert {r for f in hits(report, "LC120") for r in f.runtimes} == {"trtllm"}
    assert {r for f in hits(report, "LC149") for r in f.runtimes} == set(SGLANG)


# ---------------------------------------------------------------- LC179: served alone


def test_a_local_verifier_path_is_refused_when_served_alone_from_vllm_0_33(tmp_path):
    path = fixture_with(
        tmp_path,
        "dflash-bf16",
        lambda c: c["speculators_config"]["verifier"].update(name_or_path="/data/models/SmolLM2-135M"),
    )
    report = run(path, runtime="every")
    (finding,) = hits(report, "LC179")
    assert finding.severity == "warning" and finding.runtimes == ["vllm==0.33.0", "vllm==0.34.0"]
    assert "not a Hub repo id" in finding.message
    assert not hits(run(SPEC / "dflash-bf16", runtime="every"), "LC179")


def test_a_speculators_config_without_its_proposal_is_refused_when_served_alone(tmp_path):
    path = fixture_with(tmp_path, "dflash-bf16", lambda c: c["speculators_config"].pop("proposal_methods"))
    (finding,) = hits(run(path, runtime="every"), "LC179")
    assert finding.runtimes == VLLM
    assert "speculators_config.proposal_methods[0].speculative_tokens" in finding.message
