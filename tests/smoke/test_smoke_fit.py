"""A drafter that does not fit its target is refused before anything decodes, with validate's target findings."""

from __future__ import annotations

import json

import msgspec
import pytest
from conftest import QUICK

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.errors import SmokeRefused
from lilicorr_ckpt.smoke import fit

from helpers import REPO

SMOLLM2_DRAFTER = REPO / "examples" / "smollm2-lilicorr"
TINY_TARGET = REPO / "examples" / "tiny-target"


def test_the_smollm2_drafter_against_the_tiny_target_is_refused_before_its_weights_load(smoke, monkeypatch):
    # the pair: taps up to 28 against 4 layers, hidden 576 against 64, vocabulary 49152 against 512
    def never(*args, **kwargs):
        raise AssertionError("the target's weights were loaded")

    monkeypatch.setattr("lilicorr_ckpt.smoke.run.load_target", never)
    result = smoke(SMOLLM2_DRAFTER, "-t", TINY_TARGET, *QUICK)
    assert result.code == 1 and result.stdout == "", result.stderr
    err = result.stderr
    assert "internal error" not in err and "Traceback" not in err and "AssertionError" not in err
    # validate accepts the drafter alone for every engine's newest release; the pair is what misfits
    assert "is refused for runtime" not in err and "LC148" not in err
    assert "drafter and target do not match: widths, taps, vocabulary" in err
    assert "before its weights load; nothing was decoded" in err
    taps = json.loads((SMOLLM2_DRAFTER / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    beyond = [t for t in taps if t >= 4]  # the bundled version's taps, whichever it is
    assert beyond, taps
    assert f"ERROR LC502 target-layer-range: target_layer_ids {beyond} are not layers of target" in err
    assert "which has 4 layers (valid ids 0..3" in err
    assert (
        "ERROR LC501 target-hidden-size: draft hidden_size 576 != target" in err and "hidden_size 64" in err
    )
    assert (
        "fc takes 5 taps x 576 = 2880 features of the target's hidden states; this target's give 5 x 64 = 320"
        in err
    )
    assert "ERROR LC503 target-vocab: draft vocab_size 49152 != target" in err and "vocab_size 512" in err
    # validate's warnings about the pair come along, and the same command is named
    assert "WARN  LC505" in err and "WARN  LC506" in err
    assert (
        f"`lilicorr-ckpt validate {SMOLLM2_DRAFTER} --target {TINY_TARGET}` reports the same findings" in err
    )


def test_a_drafter_validate_accepts_is_refused_for_the_misfit_alone(smoke):
    result = smoke(SMOLLM2_DRAFTER, "-t", TINY_TARGET, "-r", "vllm", *QUICK)
    assert result.code == 1 and result.stdout == "", result.stderr
    assert result.stderr.startswith(
        "lilicorr-ckpt smoke: drafter and target do not match: widths, taps, vocabulary"
    )
    assert "LC148" not in result.stderr and "(trtllm)" not in result.stderr
    assert f"--target {TINY_TARGET} --runtime vllm` reports the same findings" in result.stderr


def test_the_refusal_lists_what_validate_lists_for_the_pair():
    from lilicorr_ckpt.checks.run import validate

    report = validate(str(SMOLLM2_DRAFTER), target=str(TINY_TARGET))
    expected = sorted((f.rule, f.message) for f in report.findings if f.rule.startswith("LC5"))
    ckpt = load_checkpoint(str(SMOLLM2_DRAFTER))
    found = fit.target_findings(ckpt, read_target(str(TINY_TARGET)), "all")
    assert sorted((f.rule, f.message) for f in found) == expected and len(expected) >= 4
    with pytest.raises(SmokeRefused) as refused:
        fit.require_fit(ckpt, read_target(str(TINY_TARGET)), path="d", spec="t", runtime="sglang")
    assert "--runtime sglang` reports the same findings" in str(refused.value)
    assert "(trtllm)" not in str(refused.value)  # the TensorRT-LLM-only row, judged for SGLang alone


def test_a_mismatch_the_targets_config_hides_is_refused_once_the_target_is_loaded(
    smoke, target, tmp_path, monkeypatch
):
    # taps 0 and 5 against the 4-layer target: a config without num_hidden_layers leaves validate unable to tell
    # (LC507, a warning), and the loaded model says 4
    config = fixtures.draft_config(
        vocab_size=16, num_target_layers=6, dflash={"mask_token_id": 15, "target_layer_ids": [0, 5]}
    )
    deep_taps = fixtures.write_checkpoint(tmp_path / "taps", config)
    judge = fit.require_fit

    def config_without_depth(checkpoint, info, **kw):
        if not kw.get("loaded", False):
            info = msgspec.structs.replace(info, num_layers=None, unreadable={"num_hidden_layers": "missing"})
        return judge(checkpoint, info, **kw)

    monkeypatch.setattr("lilicorr_ckpt.smoke.run.require_fit", config_without_depth)
    result = smoke(
        deep_taps, "-t", target, "-r", "vllm", *QUICK
    )  # SGLang refuses a tap on the last layer (LC148)
    assert result.code == 1 and result.stdout == "", result.stderr
    assert (
        "drafter and target do not match: taps (checked on the target as loaded, before decoding"
        in result.stderr
    )
    assert "ERROR LC502 target-layer-range: target_layer_ids [5] are not layers of target" in result.stderr
    assert "internal error" not in result.stderr


def test_warnings_alone_do_not_refuse(target, tmp_path):
    # a num_target_layers copied from another target (LC505) loads and decodes with the right taps
    config = fixtures.draft_config(vocab_size=16, num_target_layers=6, dflash={"mask_token_id": 15})
    ckpt = load_checkpoint(str(fixtures.write_checkpoint(tmp_path / "depth", config)))
    found = fit.require_fit(ckpt, read_target(str(target)), path="d", spec=str(target), runtime="all")
    assert [(f.rule, f.severity) for f in found] == [("LC505", "warning")]
