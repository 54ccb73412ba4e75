"""What a CI job gets from validate: every report file even on unreadable input, --strict carried into JUnit
and SARIF, SARIF that the official 2.1.0 schema accepts, several reports in one run with a readable log."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report.locate import json_key_lines

from helpers import REPO

SARIF_SCHEMA = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
REPORT_SCHEMA = json.loads((REPO / "schemas" / "validate-report.schema.json").read_text())


def run(capsys, *args: str) -> tuple[int, str, str]:
    """The command line in-process (fast): (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def sarif_valid(doc: dict) -> None:
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(doc)


@pytest.fixture
def warned(make_ckpt):
    return make_ckpt("warned", fixtures.draft_config(block_size=16))  # a warning only (LC111)


@pytest.fixture
def broken(make_ckpt):
    return make_ckpt(
        "broken", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6})
    )  # SGLang, vLLM refuse


def test_unreadable_input_still_writes_every_report_file(tmp_path, capsys):
    files = {k: tmp_path / f"r.{k}" for k in ("json", "junit", "sarif", "markdown")}
    code, out, err = run(
        capsys,
        "validate",
        str(tmp_path / "nope"),
        "--strict",
        "--json",
        str(files["json"]),
        "--junit",
        str(files["junit"]),
        "--sarif",
        str(files["sarif"]),
        "--markdown",
        str(files["markdown"]),
    )
    assert code == 2 and "no such directory" in err and out == ""
    report = json.loads(files["json"].read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["exit_code"] == 2 and "no such directory" in report["error"] and report["findings"] == []
    suite = ET.fromstring(files["junit"].read_text())
    assert (suite.get("errors"), suite.get("failures")) == ("1", "0")
    assert "no such directory" in suite.find("testcase/error").get("message")
    sarif = json.loads(files["sarif"].read_text())
    sarif_valid(sarif)
    [invocation] = sarif["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False and invocation["exitCode"] == 2
    assert "no such directory" in invocation["toolExecutionNotifications"][0]["message"]["text"]
    assert "not validated (exit 2)" in files["markdown"].read_text()


def test_unreadable_input_with_a_machine_format_on_stdout_prints_the_error_report(tmp_path, capsys):
    code, out, err = run(capsys, "validate", str(tmp_path / "nope"), "-f", "json")
    assert code == 2 and json.loads(out)["exit_code"] == 2 and "lilicorr-ckpt: error:" in err


@pytest.mark.parametrize("strict", [False, True])
def test_junit_failures_match_the_exit_code(broken, warned, make_ckpt, capsys, strict):
    clean = make_ckpt("clean")
    flag = ["--strict"] if strict else []
    for ckpt, want in ((clean, 0), (warned, 1 if strict else 0), (broken, 1)):
        code, out, _ = run(capsys, "validate", str(ckpt), "-f", "junit", *flag)
        suite = ET.fromstring(out)
        failures = int(suite.get("failures"))
        assert code == want and (failures > 0) == (code == 1), (ckpt.name, strict, out)
        assert failures == len(suite.findall("testcase/failure"))


def test_strict_makes_warnings_junit_failures_and_sarif_errors(warned, capsys):
    _, lax, _ = run(capsys, "validate", str(warned), "-f", "sarif")
    _, strict, _ = run(capsys, "validate", str(warned), "-f", "sarif", "--strict")
    [lax_result] = [r for r in json.loads(lax)["runs"][0]["results"] if r["ruleId"] == "LC111"]
    [strict_result] = [r for r in json.loads(strict)["runs"][0]["results"] if r["ruleId"] == "LC111"]
    assert lax_result["level"] == "warning" and strict_result["level"] == "error"
    assert strict_result["properties"]["severity"] == "warning"  # the catalogue severity is still there
    _, junit, _ = run(capsys, "validate", str(warned), "-f", "junit", "--strict")
    failure = ET.fromstring(junit).find("testcase/failure")
    assert failure is not None and "(--strict)" in failure.get("message") and "LC111" in failure.text


def test_sarif_follows_the_official_schema_with_regions_help_and_a_separate_fix(broken, capsys):
    code, out, _ = run(capsys, "validate", str(broken), "-f", "sarif")
    doc = json.loads(out)
    sarif_valid(doc)
    run0 = doc["runs"][0]
    assert (
        run0["invocations"][0]["executionSuccessful"] is True
        and run0["invocations"][0]["exitCode"] == code == 1
    )
    rules = run0["tool"]["driver"]["rules"]
    assert all(r["helpUri"].endswith("#" + r["id"].lower()) for r in rules)
    result = next(r for r in run0["results"] if r["ruleId"] == "LC104")
    config = (broken / "config.json").read_text()
    line = json_key_lines(config)["$.dflash_config.lilicorr_candidate_topk"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": line}
    assert "lilicorr_candidate_topk" in config.splitlines()[line - 1]
    assert result["properties"]["fix"] and result["properties"]["fix"] not in result["message"]["text"]
    assert "Fix:" not in result["message"]["text"]
    assert all("region" in r["locations"][0]["physicalLocation"] for r in run0["results"])


def test_waived_results_carry_suppressions_and_stay_schema_valid(make_ckpt, capsys):
    ckpt = make_ckpt("w", fixtures.draft_config(block_size=16))
    code, out, _ = run(capsys, "validate", str(ckpt), "--strict", "--ignore", "LC111", "-f", "sarif")
    doc = json.loads(out)
    sarif_valid(doc)
    [result] = [r for r in doc["runs"][0]["results"] if r["ruleId"] == "LC111"]
    assert code == 0 and result["suppressions"][0]["status"] == "accepted"


def test_several_reports_in_one_run_keep_the_text_log(broken, tmp_path, capsys):
    sarif, junit = tmp_path / "v.sarif", tmp_path / "v.xml"
    code, out, err = run(capsys, "validate", str(broken), "--sarif", str(sarif), "--junit", str(junit))
    assert code == 1 and out.startswith(f"lilicorr-ckpt validate {broken}") and "LC104" in out
    assert err == ""  # the text report on stdout already says everything
    sarif_valid(json.loads(sarif.read_text()))
    assert ET.fromstring(junit.read_text()).get("failures") == "2"


def test_a_report_to_a_file_still_prints_a_one_line_reason(warned, tmp_path, capsys):
    out_file = tmp_path / "x.sarif"
    code, out, err = run(capsys, "validate", str(warned), "--strict", "-f", "sarif", "-o", str(out_file))
    assert code == 1 and out == "" and out_file.is_file()
    [line] = err.splitlines()
    assert ": FAIL - 0 errors, 1 warning" in line and "first (--strict): LC111" in line
    code, out, err = run(
        capsys, "validate", str(warned), "--strict", "-f", "sarif", "-o", str(out_file), "-q"
    )
    assert code == 1 and out == "" and err == ""


def test_quiet_text_is_the_verdict_line(broken, capsys):
    code, out, _ = run(capsys, "validate", str(broken), "-q")
    assert code == 1 and out.count("\n") == 1 and out.startswith("FAIL 1 error")


def test_two_reports_cannot_share_a_file(broken, tmp_path, capsys):
    same = str(tmp_path / "r.json")
    code, _, err = run(capsys, "validate", str(broken), "-f", "json", "-o", same, "--json", same)
    assert code == 4 and "--json" in err and "--output writes that file too" in err
    assert not Path(same).exists()
