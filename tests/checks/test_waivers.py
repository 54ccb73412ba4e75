"""Waivers: --ignore, --select and [tool.lilicorr-ckpt] / lilicorr.toml, reported as suppressed, not counted."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checks.findings import Finding
from lilicorr_ckpt.checks.waivers import (
    WaiverRule,
    apply_waivers,
    check_rule_options,
    find_config,
    parse_config,
)
from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.report import schemas

from helpers import REPO, run_cli

NVFP4 = REPO / "examples" / "tiny-modelopt-nvfp4"
ALL = ["sglang", "vllm", "trtllm"]


def finding(rule: str, runtimes=(), severity="warning") -> Finding:
    return Finding(rule=rule, name="x", severity=severity, message=f"{rule} message", runtimes=list(runtimes))


def waiver(*rules, runtimes=(), paths=(), base=None) -> WaiverRule:
    return WaiverRule(rules=rules, reason="because", source="test", runtimes=tuple(runtimes), paths=tuple(paths),
                      base=base)


def test_a_retired_rule_id_is_a_usage_error_naming_its_replacement():
    with pytest.raises(UsageError, match="LC403 is a retired rule id.*LC404"):
        check_rule_options("LC314,LC403", None)


def test_apply_waivers_marks_splits_and_selects():
    fs = [finding("LC314", ["sglang", "vllm"]), finding("LC404", ["sglang"]), finding("LC110"), finding("LC210")]
    out = apply_waivers(fs, [waiver("LC314", runtimes=["vllm"]), waiver("LC40"), waiver("LC110", runtimes=["trtllm"])],
                        runtimes=ALL)
    by = [(f.rule, tuple(f.runtimes), f.waived is not None) for f in out]
    assert by == [("LC314", ("sglang",), False), ("LC314", ("vllm",), True),  # split by runtime
                  ("LC404", ("sglang",), True),  # a prefix
                  ("LC110", ("sglang", "vllm"), False), ("LC110", ("trtllm",), True),  # runtime-independent, split
                  ("LC210", (), False)]
    # a whole runtime-independent finding stays runtime-independent when all of it is waived
    assert apply_waivers([finding("LC110")], [waiver("LC110")], runtimes=ALL)[0].runtimes == []
    # --select drops what it does not name; the input is not modified
    assert [f.rule for f in apply_waivers(fs, [], runtimes=ALL, select=("LC3", "LC2"))] == ["LC314", "LC210"]
    assert all(f.waived is None for f in fs)


def test_path_globs_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "drafters" / "a").mkdir(parents=True)
    w = waiver("LC314", paths=["drafters/*"], base=tmp_path)
    assert w.matches_path(tmp_path / "drafters" / "a") and not w.matches_path(tmp_path)
    assert not w.matches_path(None)


def test_config_is_found_upward_and_lilicorr_toml_wins(tmp_path):
    (tmp_path / ".git").mkdir()
    ckpt = tmp_path / "models" / "drafter"
    ckpt.mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[[tool.lilicorr-ckpt.waivers]]\n'
                                             'rule = "LC404"\nreason = "root"\n')
    path, table = find_config(ckpt)
    assert path == tmp_path / "pyproject.toml" and parse_config(path, table)[0].reason == "root"
    (ckpt / "pyproject.toml").write_text('[project]\nname = "no table here"\n')  # skipped: no [tool.lilicorr-ckpt]
    assert find_config(ckpt)[0] == tmp_path / "pyproject.toml"
    (ckpt / "lilicorr.toml").write_text('[[waivers]]\nrules = ["LC314"]\nreason = "close"\n')
    path, table = find_config(ckpt)
    assert path == ckpt / "lilicorr.toml" and parse_config(path, table)[0].rules == ("LC314",)
    outside = tmp_path.parent / "pyproject.toml"
    assert not outside.exists() or find_config(tmp_path)[0] != outside  # stops at the .git directory


@pytest.mark.parametrize("entry, needle", [
    ('rule = "LC404"', "a `reason` is required"),
    ('rule = "LC404"\nreason = "  "', "a `reason` is required"),
    ('reason = "r"', 'needs `rule = "LC314"`'),
    ('rule = "LC9999"\nreason = "r"', "'LC9999' is not a rule id"),
    ('rule = "LC404"\nreason = "r"\nruntimes = ["tensorrt"]', "`runtimes` must list runtimes among"),
    ('rule = "LC404"\nreason = "r"\nexpires = 2026-01-01', "unknown key(s) expires"),
])
def test_config_mistakes_are_usage_errors_naming_the_entry(tmp_path, entry, needle):
    path = tmp_path / "lilicorr.toml"
    path.write_text(f"[[waivers]]\n{entry}\n")
    with pytest.raises(UsageError, match="waiver 1") as info:
        parse_config(*find_config(tmp_path))
    assert needle in str(info.value)


@pytest.fixture
def owned(tmp_path) -> Path:
    """A checkpoint whose only finding is LC404 (an owned lm_head, which SGLang drops): an error for SGLang."""
    return fixtures.write_checkpoint(tmp_path / "owned", fixtures.draft_config(own_lm_head=True))


def test_ignore_lets_strict_pass_and_keeps_the_finding_visible(owned):
    strict = run_cli("validate", str(owned), "--strict")
    assert strict.returncode == 1 and "ERROR LC404" in strict.stdout
    waived = run_cli("validate", str(owned), "--strict", "--ignore", "LC314,LC404")
    assert waived.returncode == 0, waived.stdout
    assert "waived LC404 own-head-dropped (sglang):" in waived.stdout and "waived by --ignore" in waived.stdout
    assert "PASS 0 errors, 0 warnings, 1 waived" in waived.stdout
    report = json.loads(run_cli("validate", str(owned), "--strict", "--ignore", "LC404", "-f", "json").stdout)
    assert report["exit_code"] == 0 and report["summary"]["waived"] == 1 and report["summary"]["errors"] == 0
    [f] = report["findings"]
    assert f["rule"] == "LC404" and f["waived"] == {"reason": "--ignore on the command line", "source": "--ignore"}
    jsonschema.validate(report, schemas.all_schemas()["validate-report.schema.json"])


def test_a_config_waiver_needs_its_runtime_and_its_reason_shows_everywhere(owned):
    (owned / "lilicorr.toml").write_text('[[waivers]]\nrule = "LC404"\nruntimes = ["vllm"]\nreason = "not vllm"\n')
    assert run_cli("validate", str(owned), "--strict").returncode == 1  # LC404 is SGLang's: not waived
    (owned / "lilicorr.toml").write_text('[[waivers]]\nrule = "LC404"\nruntimes = ["sglang"]\n'
                                         'reason = "SGLang 0.5.4 loads the owned head (checked by hand)"\n')
    text = run_cli("validate", str(owned), "--strict")
    assert text.returncode == 0
    assert "reason: SGLang 0.5.4 loads the owned head (checked by hand) [lilicorr.toml waiver 1]" in text.stdout
    sarif = json.loads(run_cli("validate", str(owned), "--strict", "-f", "sarif").stdout)
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "LC404"
    assert result["suppressions"] == [{"kind": "external", "status": "accepted", "justification":
                                       "SGLang 0.5.4 loads the owned head (checked by hand) (lilicorr.toml waiver 1)"}]
    junit = run_cli("validate", str(owned), "--strict", "-f", "junit").stdout
    assert "LC404" not in junit
    md = run_cli("validate", str(owned), "--strict", "-f", "markdown").stdout
    assert "🔕 waived" in md and "**waived:** SGLang 0.5.4" in md
    gh = run_cli("validate", str(owned), "--strict", "-f", "github").stdout
    assert "::warning" not in gh and gh.startswith(f"lilicorr-ckpt validate {owned}: PASS")


def test_pyproject_table_beside_the_checkpoint(owned):
    (owned / "pyproject.toml").write_text('[tool.lilicorr-ckpt]\nwaivers = [{rule = "LC40", reason = "ok"}]\n')
    assert run_cli("validate", str(owned), "--strict").returncode == 0


def test_bad_waiver_options_and_files_exit_4_before_any_work(owned, tmp_path):
    bad = run_cli("validate", str(tmp_path / "nowhere"), "--ignore", "LC40X")
    assert bad.returncode == 4 and "'LC40X' is not a rule id or id prefix" in bad.stderr
    empty = run_cli("validate", str(owned), "--select", ",")
    assert empty.returncode == 4 and "--select needs rule ids" in empty.stderr
    (owned / "lilicorr.toml").write_text("[[waivers]\n")
    broken = run_cli("validate", str(owned))
    assert broken.returncode == 4 and "is not valid TOML" in broken.stderr
    for r in (bad, empty, broken):
        assert "Traceback" not in r.stderr


def test_select_narrows_the_gate_to_some_rules():
    everything = json.loads(run_cli("validate", str(NVFP4), "-f", "json").stdout)
    only = run_cli("validate", str(NVFP4), "-f", "json", "--select", "LC31")
    report = json.loads(only.stdout)
    assert {f["rule"] for f in report["findings"]} == {f["rule"] for f in everything["findings"]
                                                      if f["rule"].startswith("LC31")}
    assert only.returncode == (1 if report["summary"]["errors"] else 0)
