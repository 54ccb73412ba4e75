"""Waivers: --ignore, --select and [tool.lilicorr-ckpt] / lilicorr.toml, reported as suppressed, not counted."""

from __future__ import annotations

import json
import os
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
    return WaiverRule(
        rules=rules, reason="because", source="test", runtimes=tuple(runtimes), paths=tuple(paths), base=base
    )


def test_a_retired_rule_id_is_a_usage_error_naming_its_replacement():
    with pytest.raises(UsageError, match="LC403 is a retired rule id.*LC404"):
        check_rule_options("LC314,LC403", None)


def test_apply_waivers_marks_splits_and_selects():
    fs = [
        finding("LC314", ["sglang", "vllm"]),
        finding("LC404", ["sglang"]),
        finding("LC110"),
        finding("LC210"),
    ]
    out = apply_waivers(
        fs,
        [waiver("LC314", runtimes=["vllm"]), waiver("LC40"), waiver("LC110", runtimes=["trtllm"])],
        runtimes=ALL,
    )
    by = [(f.rule, tuple(f.runtimes), f.waived is not None) for f in out]
    assert by == [
        ("LC314", ("sglang",), False),
        ("LC314", ("vllm",), True),  # split by runtime
        ("LC404", ("sglang",), True),  # a prefix
        ("LC110", ("sglang", "vllm"), False),
        ("LC110", ("trtllm",), True),  # runtime-independent, split
        ("LC210", (), False),
    ]
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
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[[tool.lilicorr-ckpt.waivers]]\nrule = "LC404"\nreason = "root"\n'
    )
    path, table = find_config(ckpt)
    assert path == tmp_path / "pyproject.toml" and parse_config(path, table)[0].reason == "root"
    (ckpt / "pyproject.toml").write_text(
        '[project]\nname = "no table here"\n'
    )  # skipped: no [tool.lilicorr-ckpt]
    assert find_config(ckpt)[0] == tmp_path / "pyproject.toml"
    (ckpt / "lilicorr.toml").write_text('[[waivers]]\nrules = ["LC314"]\nreason = "close"\n')
    path, table = find_config(ckpt)
    assert path == ckpt / "lilicorr.toml" and parse_config(path, table)[0].rules == ("LC314",)


def test_the_config_search_stops_at_the_repository_root(tmp_path):
    """A waiver table above the checkout's .git directory is not the checkpoint's: the search stops at the root."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[[tool.lilicorr-ckpt.waivers]]\nrule = "LC404"\nreason = "outside"\n'
    )
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    ckpt = repo / "models" / "drafter"
    ckpt.mkdir(parents=True)
    assert find_config(ckpt) is None
    (repo / "lilicorr.toml").write_text('[[waivers]]\nrules = ["LC314"]\nreason = "inside"\n')
    assert find_config(ckpt)[0] == repo / "lilicorr.toml"


@pytest.mark.parametrize(
    "entry, needle",
    [
        ('rule = "LC404"', "a `reason` is required"),
        ('rule = "LC404"\nreason = "  "', "a `reason` is required"),
        ('reason = "r"', 'needs `rule = "LC314"`'),
        ('rule = "LC9999"\nreason = "r"', "'LC9999' is not a rule id"),
        ('rule = "LC404"\nreason = "r"\nruntimes = ["tensorrt"]', "`runtimes` must list engines among"),
        ('rule = "LC404"\nreason = "r"\nexpires = 2026-01-01', "unknown key(s) expires"),
    ],
)
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
    assert (
        "waived LC404 own-head-dropped (sglang):" in waived.stdout and "waived by --ignore" in waived.stdout
    )
    assert "PASS 0 errors, 0 warnings, 1 waived" in waived.stdout
    report = json.loads(run_cli("validate", str(owned), "--strict", "--ignore", "LC404", "-f", "json").stdout)
    assert report["exit_code"] == 0 and report["summary"]["waived"] == 1 and report["summary"]["errors"] == 0
    [f] = report["findings"]
    assert f["rule"] == "LC404" and f["waived"] == {
        "reason": "--ignore on the command line",
        "source": "--ignore",
    }
    jsonschema.validate(report, schemas.all_schemas()["validate-report.schema.json"])


def test_a_config_waiver_needs_its_runtime_and_its_reason_shows_everywhere(owned):
    (owned / "lilicorr.toml").write_text(
        '[[waivers]]\nrule = "LC404"\nruntimes = ["vllm"]\nreason = "not vllm"\n'
    )
    assert run_cli("validate", str(owned), "--strict").returncode == 1  # LC404 is SGLang's: not waived
    (owned / "lilicorr.toml").write_text(
        '[[waivers]]\nrule = "LC404"\nruntimes = ["sglang"]\n'
        'reason = "SGLang 0.5.4 loads the owned head (checked by hand)"\n'
    )
    text = run_cli("validate", str(owned), "--strict")
    assert text.returncode == 0
    assert (
        "reason: SGLang 0.5.4 loads the owned head (checked by hand) [lilicorr.toml waiver 1]" in text.stdout
    )
    sarif = json.loads(run_cli("validate", str(owned), "--strict", "-f", "sarif").stdout)
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "LC404"
    assert result["suppressions"] == [
        {
            "kind": "external",
            "status": "accepted",
            "justification": "SGLang 0.5.4 loads the owned head (checked by hand) (lilicorr.toml waiver 1)",
        }
    ]
    junit = run_cli("validate", str(owned), "--strict", "-f", "junit").stdout
    assert "LC404" not in junit
    md = run_cli("validate", str(owned), "--strict", "-f", "markdown").stdout
    assert "🔕 waived" in md and "**waived:** SGLang 0.5.4" in md
    gh = run_cli("validate", str(owned), "--strict", "-f", "github").stdout
    assert "::warning" not in gh and gh.startswith(f"lilicorr-ckpt validate {owned}: PASS")


def test_pyproject_table_beside_the_checkpoint(owned):
    (owned / "pyproject.toml").write_text(
        '[tool.lilicorr-ckpt]\nwaivers = [{rule = "LC40", reason = "ok"}]\n'
    )
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
    assert {f["rule"] for f in report["findings"]} == {
        f["rule"] for f in everything["findings"] if f["rule"].startswith("LC31")
    }
    assert only.returncode == (1 if report["summary"]["errors"] else 0)


# --- where a waiver file may come from (issue 20: planted waivers) ------------------------------------------

PLANTED = '[[waivers]]\nrules = ["LC1", "LC2", "LC3", "LC4", "LC6"]\nreason = "planted by someone else"\n'


def test_a_file_above_a_checkpoint_outside_any_work_tree_waives_nothing(owned, tmp_path):
    # another user's /tmp/lilicorr.toml, and a checkpoint downloaded below it, with no git work tree around
    assert not any((d / ".git").exists() for d in (owned, *owned.parents))
    (tmp_path / "lilicorr.toml").write_text(PLANTED)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.lilicorr-ckpt]\n" + PLANTED.replace("[[waivers]]", "[[tool.lilicorr-ckpt.waivers]]")
    )
    assert find_config(owned) is None
    result = run_cli("validate", str(owned))
    assert result.returncode == 1 and "waived" not in result.stdout
    # in the checkpoint directory itself it applies; and named with --config it applies from anywhere
    assert run_cli("validate", str(owned), "--config", str(tmp_path / "lilicorr.toml")).returncode == 0
    assert run_cli("validate", str(owned), "--config", str(tmp_path / "pyproject.toml")).returncode == 0
    (owned / "lilicorr.toml").write_text(PLANTED)
    assert find_config(owned)[0] == owned / "lilicorr.toml"


def test_inside_a_work_tree_the_search_stops_at_its_root(tmp_path):
    from lilicorr_ckpt.checks.waivers import search_root

    repo = tmp_path / "repo"
    ckpt = repo / "models" / "drafter"
    ckpt.mkdir(parents=True)
    (repo / ".git").mkdir()
    (tmp_path / "lilicorr.toml").write_text(PLANTED)  # above the work tree: never
    assert search_root(ckpt.resolve()) == repo.resolve() and find_config(ckpt) is None
    (repo / "lilicorr.toml").write_text('[[waivers]]\nrule = "LC404"\nreason = "repo root"\n')
    assert find_config(ckpt)[0] == repo / "lilicorr.toml"
    (repo / "models" / ".git").write_text("gitdir: ../.git/modules/models\n")  # a submodule's work tree
    assert search_root(ckpt.resolve()) == (repo / "models").resolve() and find_config(ckpt) is None


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to own files as another user"
)
def test_a_work_tree_or_waiver_file_of_another_user_is_not_trusted(tmp_path):
    from lilicorr_ckpt.checks.waivers import search_root

    stranger = 54321
    top = tmp_path / "shared"
    ckpt = top / "ckpt"
    ckpt.mkdir(parents=True)
    (top / ".git").mkdir()
    os.chown(top / ".git", stranger, stranger)  # someone else's "work tree" around our checkpoint
    (top / "lilicorr.toml").write_text(PLANTED)
    assert search_root(ckpt.resolve()) == ckpt.resolve() and find_config(ckpt) is None
    os.chown(top / ".git", os.getuid(), os.getgid())
    os.chown(top / "lilicorr.toml", stranger, stranger)  # our work tree, a stranger's file in it
    with pytest.raises(UsageError, match="belongs to another user.*--config"):
        find_config(ckpt)


# --- every mistake in a waiver file is a message naming the file and the key (issue 20, item 8) -------------


@pytest.mark.parametrize(
    "name, body, needle",
    [
        (
            "lilicorr.toml",
            '[[waivers]]\nrule = "LC404"\nreason = "r"\nruntimes = [["vllm"]]\n',
            "waiver 1: `runtimes` must list engines among",
        ),
        (
            "lilicorr.toml",
            '[[waivers]]\nrule = "LC404"\nreason = "r"\npaths = [1]\n',
            "waiver 1: `paths` must be",
        ),
        (
            "lilicorr.toml",
            '[[waivers]]\nrules = [["LC404"]]\nreason = "r"\n',
            "waiver 1: `rules` must be a rule id",
        ),
        ("lilicorr.toml", '[[waivers]]\nrule = 404\nreason = "r"\n', "waiver 1: `rule` must be one rule id"),
        (
            "lilicorr.toml",
            "waivers = 5\n",
            "`waivers` must be an array of tables ([[waivers]]), not an integer",
        ),
        ("pyproject.toml", "tool = 5\n", "`tool` must be a table"),
        ("pyproject.toml", '[tool]\nlilicorr-ckpt = "x"\n', "`tool.lilicorr-ckpt` must be a table"),
        ("lilicorr.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ],
)
def test_waiver_file_mistakes_are_usage_errors_naming_file_and_key(tmp_path, name, body, needle):
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(UsageError) as info:
        found = find_config(tmp_path)
        parse_config(*found)
    assert str(path) in str(info.value) and needle in str(info.value)


def test_a_waiver_file_that_is_not_utf8_exits_4_naming_it(owned):
    (owned / "lilicorr.toml").write_bytes(b'[[waivers]]\nrule = "LC404"\nreason = "caf\xe9"\n')
    result = run_cli("validate", str(owned))
    assert result.returncode == 4, result.stderr
    assert f"{owned / 'lilicorr.toml'} is not valid TOML: not UTF-8 (byte 0xe9 at offset" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


def test_rule_and_rules_together_both_count(tmp_path):
    path = tmp_path / "lilicorr.toml"
    path.write_text('[[waivers]]\nrule = "LC404"\nrules = "LC314"\nreason = "both"\n')
    [w] = parse_config(*find_config(tmp_path))
    assert w.rules == ("LC404", "LC314")


def test_config_option_mistakes_exit_4_before_any_work(tmp_path, owned):
    missing = run_cli("validate", str(tmp_path / "nowhere"), "--config", str(tmp_path / "none.toml"))
    assert missing.returncode == 4 and "--config" in missing.stderr and "no such file" in missing.stderr
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    bare = run_cli("validate", str(owned), "--config", str(tmp_path / "pyproject.toml"))
    assert bare.returncode == 4 and "has no [tool.lilicorr-ckpt] table" in bare.stderr
