"""Each fact is reported once, with its catalogue severity, and named alike by validate and convert."""

from __future__ import annotations

import json

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.names import map_name
from lilicorr_ckpt.checks import RULES

from ._support import edit_config, hits, one, run


def test_a_folder_with_only_config_json_gets_one_lc608(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(fixtures.draft_config()))
    assert len(hits(run(tmp_path), "LC608")) == 1


def test_nested_training_and_model_prefixes_strip_to_the_same_name_in_validate_and_convert(ckpt):
    path = ckpt(key_prefix="dflash_module.model.")
    report = run(path)
    assert map_name("dflash_module.model.fc.weight").canonical == "fc.weight"
    # every tensor is recognised under its canonical name: only the prefix findings remain
    assert {f.rule for f in report.findings} == {"LC212", "LC213"}, [
        (f.rule, f.message) for f in report.findings
    ]


def _top_level(key):
    def move(c):
        c[key] = c["dflash_config"].pop(key)

    return move


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c["dflash_config"].update(causal=True),  # LC117 for TRT, LC128 for the others
        _top_level("block_size"),  # LC126
        _top_level("mask_token_id"),  # LC127
        lambda c: (c["dflash_config"].pop("block_size"), c.pop("block_size", None)),  # LC110 and LC125
    ],
)
def test_every_finding_has_its_catalogue_severity(ckpt, edit):
    path = ckpt(fixtures.draft_config(block_size=16, dflash={"block_size": 16}))
    edit_config(path, edit)
    report = run(path)
    assert report.findings
    for f in report.findings:
        assert f.severity == RULES[f.rule].severity, (f.rule, f.severity, f.message)


def test_legacy_names_every_selected_runtime_renames_are_informational(ckpt):
    path = ckpt(naming="sequential")  # TensorRT-LLM renames them; SGLang 0.5.23 and vLLM refuse (LC217)
    f = one(run(path, runtime="trtllm"), "LC216")
    assert f.severity == "info" and f.subjects
    assert hits(run(path, runtime="trtllm"), "LC210") == []


def test_rules_id_prints_one_rules_long_doc():
    from helpers import run_cli

    result = run_cli("rules", "LC306")
    assert result.returncode == 0 and result.stdout.startswith("LC306 must-be-float (error, quantization)")
    assert "Example:" in result.stdout and "Fix:" in result.stdout
    assert run_cli("rules", "LC999").returncode == 4
