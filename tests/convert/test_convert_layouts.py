"""`convert --to zlab|speculators`: the two config layouts convert into each other, as the same drafter.

Round trips on the committed producer fixtures (ModelOpt's z-lab exports, speculators' own saves) and on the tiny
fixtures: z-lab -> speculators -> z-lab gives back the config and the tensors byte for byte, and what validate reads
from the speculators output (as vLLM translates it) is the z-lab drafter: the same geometry, mask and verdict.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from convert_helpers import EXAMPLE, load_json, tensors_of

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert.layout import served_causal, speculators_from_zlab, zlab_from_speculators
from lilicorr_ckpt.errors import ConversionRefused
from lilicorr_ckpt.report.inspect import inspect_checkpoint

from helpers import REPO

PRODUCERS = REPO / "tests" / "data" / "producers"
MODELOPT = PRODUCERS / "modelopt-0.48.0rc1"
SPECULATORS = PRODUCERS / "speculators-0.9.0"


def _convert(cli, src: Path, dst: Path, *args: str) -> Path:
    run = cli("convert", src, dst, "-q", *args)
    assert run.code == 0, run
    return dst


def _same_drafter(zlab: Path, spec: Path) -> None:
    """validate reads the speculators output (translated) as the z-lab drafter, and vLLM accepts both."""
    a, b = validate(str(zlab), runtime="vllm"), validate(str(spec), runtime="vllm")
    assert a.layout == "z-lab" and b.layout == "speculators"
    assert b.geometry == a.geometry
    assert [v.accepted for v in a.runtimes] == [v.accepted for v in b.runtimes] == [True]
    assert tensors_of(zlab) == tensors_of(spec)  # the same bytes under the same names


@pytest.mark.parametrize("fixture", ["dflash-bf16", "dflash2-bf16", "dspark-bf16", "dflash-nvfp4"])
def test_modelopt_exports_round_trip_through_speculators(cli, tmp_path, fixture):
    src = MODELOPT / fixture
    # for the releases that read both layouts (vLLM): the same repairs either way (SGLang needs fc in float)
    zlab = _convert(cli, src, tmp_path / "zlab", "-r", "vllm")
    spec = _convert(cli, src, tmp_path / "spec", "--to", "speculators", "--verifier", "Qwen/Qwen3-8B")
    back = _convert(cli, spec, tmp_path / "back", "--to", "zlab", "-r", "vllm")
    assert load_json(back / "config.json") == load_json(zlab / "config.json")
    assert tensors_of(back) == tensors_of(zlab)
    if (zlab / "hf_quant_config.json").exists():
        assert load_json(back / "hf_quant_config.json") == load_json(zlab / "hf_quant_config.json")
    _same_drafter(zlab, spec)
    config = load_json(spec / "config.json")
    assert "model_type" not in config and config["speculators_version"]
    assert config["speculators_config"]["verifier"]["name_or_path"] == "Qwen/Qwen3-8B"
    # every ModelOpt export is bidirectional in every layer (causal false): the key says so, not its default
    assert config["sliding_window_non_causal"] is True
    record = load_json(spec / "conversion.json")["layout"]
    assert record["source"] == "z-lab" and record["output"] == "speculators"


@pytest.mark.parametrize("fixture", ["dflash-bf16", "dflash2-bf16", "dspark-bf16", "dflash-bf16-draftvocab"])
def test_speculators_saves_round_trip_through_zlab(cli, tmp_path, fixture):
    src = SPECULATORS / fixture
    zlab = _convert(cli, src, tmp_path / "zlab", "-r", "vllm")
    spec = _convert(cli, zlab, tmp_path / "spec", "--to", "speculators")
    back = _convert(cli, spec, tmp_path / "back", "-r", "vllm")
    assert load_json(back / "config.json") == load_json(zlab / "config.json")
    assert tensors_of(back) == tensors_of(zlab) == tensors_of(src)  # t2d and d2t included
    _same_drafter(zlab, spec)
    assert validate(str(src), runtime="vllm").geometry == validate(str(zlab), runtime="vllm").geometry


def test_the_trained_mask_is_written_not_the_translated_one(cli, tmp_path):
    # speculators' DFlash default: sliding layers trained causally (sliding_window_non_causal false); its DFlash2
    # trains them bidirectionally. The z-lab output states what vLLM then serves as trained, for both engines
    dflash = load_json(_convert(cli, SPECULATORS / "dflash-bf16", tmp_path / "a") / "config.json")
    assert "causal" not in dflash["dflash_config"] and set(dflash["layer_types"]) == {"sliding_attention"}
    dflash2 = load_json(_convert(cli, SPECULATORS / "dflash2-bf16", tmp_path / "b") / "config.json")
    assert dflash2["dflash_config"]["causal"] is False
    # a full-attention speculators drafter saved with the hazardous default: vLLM's translation would serve its
    # bidirectionally trained layers causally (LC176); the z-lab output serves them bidirectionally
    raw = load_json(SPECULATORS / "dflash-bf16" / "config.json")
    raw["transformer_layer_config"]["layer_types"] = ["full_attention"] * 2
    translated = parse_config(json.dumps(raw).encode()).config
    assert served_causal(translated, 2) == [True, True]
    zlab = zlab_from_speculators(raw)
    assert served_causal(parse_config(json.dumps(zlab).encode()).config, 2) == [False, False]
    assert "causal" not in zlab["dflash_config"]  # the layer types say it, to SGLang and vLLM alike


def _zlab_mask(layer_types: list[str], causal: bool | None) -> dict:
    config = fixtures.draft_config(head=False, layer_types=layer_types)
    if causal is None:
        del config["dflash_config"]["causal"]
    else:
        config["dflash_config"]["causal"] = causal
    return config


def test_sliding_window_non_causal_is_the_mask_the_drafter_has():
    full, sliding = ["full_attention"] * 2, ["sliding_attention"] * 2
    assert speculators_from_zlab(_zlab_mask(full, False))["sliding_window_non_causal"] is True
    assert speculators_from_zlab(_zlab_mask(sliding, False))["sliding_window_non_causal"] is True
    assert speculators_from_zlab(_zlab_mask(sliding, None))["sliding_window_non_causal"] is False
    assert speculators_from_zlab(_zlab_mask(sliding, True))["sliding_window_non_causal"] is False


@pytest.mark.parametrize(
    ("layer_types", "causal", "lost"),
    [
        (["full_attention", "full_attention"], True, "causal full-attention layers"),
        (["sliding_attention", "full_attention"], None, "causal full-attention layers"),
    ],
)
def test_a_mask_vllms_translation_cannot_serve_is_refused(layer_types, causal, lost):
    config = _zlab_mask(layer_types, causal)
    if causal is None:  # sliding causal, full bidirectional: one global causal cannot say it
        with pytest.raises(ConversionRefused) as info:
            speculators_from_zlab(config)
        assert "[causal, bidirectional]" in str(info.value) and "served as" in str(info.value)
        return
    with pytest.raises(ConversionRefused) as info:
        speculators_from_zlab(config)
    assert lost in str(info.value) and "speculators trains every full-attention layer bidirectionally" in str(
        info.value
    )


def test_lilicorr_is_refused_naming_what_is_lost(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out", "--to", "speculators")
    assert run.code == 1 and not (tmp_path / "out").exists()
    assert "cannot express this lilicorr drafter" in run.err and "lost: the LiLiCorr head" in run.err


def test_domino_and_anchor_first_dflash_are_refused():
    with pytest.raises(ConversionRefused, match="lost: the Domino head"):
        speculators_from_zlab(fixtures.sibling_config("domino"))
    config = fixtures.draft_config(head=False, dflash={"sample_from_anchor": True})
    with pytest.raises(ConversionRefused, match="fill-in layout only"):
        speculators_from_zlab(config)


@pytest.mark.parametrize("layout", ["dflash", "dflash2", "dspark-deepspec", "dspark-modelopt"])
def test_tiny_fixtures_round_trip(cli, tmp_path, layout):
    config = fixtures.draft_config(head=False) if layout == "dflash" else fixtures.sibling_config(layout)
    src = fixtures.write_checkpoint(tmp_path / "src", config)
    zlab = _convert(cli, src, tmp_path / "zlab")
    spec = _convert(cli, src, tmp_path / "spec", "--to", "speculators")
    back = _convert(cli, spec, tmp_path / "back")
    assert load_json(back / "config.json") == load_json(zlab / "config.json")
    assert tensors_of(back) == tensors_of(zlab)
    _same_drafter(zlab, spec)


def test_speculators_output_is_only_for_the_engines_that_read_it(cli, tmp_path):
    src = MODELOPT / "dflash-bf16"
    run = cli("convert", src, tmp_path / "out", "--to", "speculators", "-r", "sglang")
    assert run.code == 4 and "do" in run.err and "not read the speculators layout" in run.err
    assert "-r vllm" in run.err
    run = cli("convert", src, tmp_path / "out", "--verifier", "Qwen/Qwen3-8B")
    assert run.code == 4 and "needs --to speculators" in run.err
    run = cli("convert", src, tmp_path / "out", "--to", "speculators", "--dry-run")
    assert run.code == 0 and "layout    z-lab -> speculators" in run.out
    assert "sliding_window_non_causal true" in run.out and "validate  vllm: accepts" in run.out


def test_inspect_card_and_report_name_the_layout(cli, tmp_path):
    assert inspect_checkpoint(str(SPECULATORS / "dflash-bf16")).layout == "speculators"
    assert inspect_checkpoint(str(EXAMPLE)).layout == "z-lab"
    run = cli("inspect", SPECULATORS / "dspark-bf16")
    assert run.code == 0 and "  layout     speculators (speculators_config" in run.out
    run = cli("validate", SPECULATORS / "dflash2-bf16", "-f", "json", "-r", "vllm")
    assert json.loads(run.out)["layout"] == "speculators"


def _with_taps(src: Path, dest: Path, taps: list[int], *, num_target_layers: bool = True) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("PROVENANCE.json"))
    config = load_json(dest / "config.json")
    config["dflash_config"]["target_layer_ids"] = taps
    if not num_target_layers:
        del config["num_target_layers"]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_a_tap_on_the_verifiers_last_layer_is_refused_not_dropped(cli, tmp_path):
    # ModelOpt's export states the verifier's 8 layers (num_target_layers); layer 7 is its last
    src = _with_taps(MODELOPT / "dflash-bf16", tmp_path / "src", [1, 7])
    dst = tmp_path / "out"
    run = cli("convert", src, dst, "--to", "speculators")
    assert run.code == 1 and not dst.exists(), run
    assert "cannot carry a tap on the verifier's last layer" in run.err and "Traceback" not in run.err
    assert "target_layer_ids [1, 7] taps layer 7, the last of the verifier's 8" in run.err
    assert "aux_hidden_state_layer_ids 8" in run.err and "--to zlab" in run.err
    run = cli("convert", src, dst, "--to", "speculators", "-f", "json")
    assert run.code == 1 and json.loads(run.out)["status"] == "refused" and not dst.exists()
    # the z-lab layout carries it (vLLM captures after the last layer); SGLang's refusal is validate's (LC148)
    assert cli("convert", src, dst, "-r", "vllm", "-q").code == 0
    assert load_json(dst / "config.json")["dflash_config"]["target_layer_ids"] == [1, 7]
    # a tap below the last layer shifts by one, as every other
    ok = _with_taps(MODELOPT / "dflash-bf16", tmp_path / "ok", [1, 6])
    spec = _convert(cli, ok, tmp_path / "spec", "--to", "speculators")
    assert load_json(spec / "config.json")["aux_hidden_state_layer_ids"] == [2, 7]


def test_without_the_verifiers_layer_count_the_taps_shift_by_one(cli, tmp_path):
    # no num_target_layers: which layer is the verifier's last is unknown here, so the tap is written shifted
    src = _with_taps(MODELOPT / "dflash-bf16", tmp_path / "src", [1, 7], num_target_layers=False)
    spec = _convert(cli, src, tmp_path / "spec", "--to", "speculators")
    assert load_json(spec / "config.json")["aux_hidden_state_layer_ids"] == [2, 8]


def test_a_reduced_draft_vocabulary_refusal_names_the_release_that_serves_it(cli, tmp_path):
    # SGLang serves no reduced draft vocabulary (LC404); vLLM does: the refusal says to convert for it alone
    src, dst = SPECULATORS / "dflash-bf16-draftvocab", tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 1 and not dst.exists(), run
    assert (
        "LC404" in run.err
        and "or convert for the release that accepts it alone: vLLM 0.34.0 (-r vllm)" in run.err
    )
    assert cli("convert", src, dst, "-r", "vllm", "-q").code == 0
    # where every selected release refuses, there is no such line
    run = cli("convert", src, tmp_path / "out2", "-r", "sglang")
    assert run.code == 1 and "accepts it alone" not in run.err
