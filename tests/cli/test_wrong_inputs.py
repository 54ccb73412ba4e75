"""Inputs of the wrong kind are named for what they are: a drafter given as --target, a target given as PATH
(the two swapped), inspect on something that is no drafter."""

from __future__ import annotations

import json

import pytest

from lilicorr_ckpt.cli import main

from helpers import REPO

DRAFTER = str(REPO / "examples" / "tiny-lilicorr")
TARGET = str(REPO / "examples" / "tiny-target")


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_a_drafter_as_target_is_named_and_gets_no_config_advice(capsys):
    code, out, err = run(capsys, "validate", DRAFTER, "--target", DRAFTER)
    assert code == 2 and out == ""
    assert "is a drafter, not a target" in err and "dflash_config" in err
    assert "LC502" not in err and "shifted" not in err


def test_swapped_path_and_target_say_so(capsys):
    code, _, err = run(capsys, "validate", TARGET, "--target", DRAFTER)
    assert code == 2 and "is a target model, not a drafter (LlamaForCausalLM" in err
    assert "did you swap PATH and --target?" in err and "LiLiCorrDraftModel" not in err


def test_a_target_as_path_still_writes_the_requested_reports(tmp_path, capsys):
    code, _, _ = run(capsys, "validate", TARGET, "--json", str(tmp_path / "r.json"))
    assert code == 2 and "not a drafter" in json.loads((tmp_path / "r.json").read_text())["error"]


def test_a_broken_drafter_is_still_judged_not_refused(make_ckpt, capsys):
    from lilicorr_ckpt import fixtures

    cfg = fixtures.draft_config()
    cfg["architectures"] = ["LlamaForCausalLM"]  # a drafter config (dflash_config) with the wrong class
    code, out, _ = run(capsys, "validate", str(make_ckpt("d", cfg)))
    assert code == 1 and "LC010" in out


def test_inspect_on_a_target_or_a_non_drafter_says_so(tmp_path, capsys):
    code, out, err = run(capsys, "inspect", TARGET)
    assert (
        code == 2 and out == "" and "is a target model, not a drafter" in err and "inspect summarises" in err
    )
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (odd / "model.safetensors").write_bytes(
        (REPO / "examples" / "tiny-lilicorr" / "model.safetensors").read_bytes()
    )
    code, out, err = run(capsys, "inspect", str(odd))
    assert code == 2 and out == "" and "is not a drafter checkpoint" in err
    code, out, _ = run(capsys, "inspect", DRAFTER)
    assert code == 0 and "LiLiCorrDraftModel" in out
