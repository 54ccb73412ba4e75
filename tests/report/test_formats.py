"""The format registry (report/formats.py): every --format choice comes from it, and a format added to it is a
choice of validate, report and smoke with no other edit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from xml.sax.saxutils import escape, quoteattr

import pytest
from ghrunner import parse_github_output
from hypothesis import given, settings
from hypothesis import strategies as st

from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.report import ci, formats
from lilicorr_ckpt.report import validate as validate_render
from lilicorr_ckpt.report.escape import xml_attr, xml_text

from helpers import REPO, run_cli

DRAFTER = str(REPO / "examples" / "tiny-lilicorr")
TARGET = str(REPO / "examples" / "tiny-target")

# a format added the way a contributor adds one, before the command line is imported
WITH_DUMMY = """
import sys
from lilicorr_ckpt.report import formats
formats.VALIDATE["dummy"] = formats.ValidateFormat(
    name="dummy", help="one line a test wrote", example_file="dummy.txt",
    render=lambda report, style: f"DUMMY exit={report.exit_code} runtimes={len(report.runtimes)}\\n")
formats.SMOKE["dummy"] = formats.SmokeFormat(name="dummy", help="one line a test wrote",
                                             render=lambda report, style: "DUMMY\\n")
from lilicorr_ckpt.cli import main
main(sys.argv[1:])
"""


def with_dummy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITH_DUMMY, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_a_registered_format_is_a_choice_of_validate_report_and_smoke(tmp_path):
    for command in ("validate", "report", "smoke"):
        shown = with_dummy(command, "--help")
        assert shown.returncode == 0, shown.stderr
        words = " ".join(shown.stdout.split())
        assert "|dummy]" in words and "dummy: one line a test wrote" in words, (command, shown.stdout)
    rendered = with_dummy("validate", DRAFTER, "-f", "dummy")
    assert rendered.returncode == 0 and rendered.stdout == "DUMMY exit=0 runtimes=3\n", rendered.stderr
    saved = tmp_path / "report.json"
    assert run_cli("validate", DRAFTER, "-f", "json", "-o", str(saved)).returncode == 0
    again = with_dummy("report", str(saved), "-f", "dummy")
    assert again.returncode == 0 and again.stdout == "DUMMY exit=0 runtimes=3\n", again.stderr
    # smoke takes the choice: the run stops at its own usage check, after click accepted --format dummy
    taken = with_dummy("smoke", DRAFTER, "-t", TARGET, "-f", "dummy", "--max-new-tokens", "1")
    assert taken.returncode == 4 and "--max-new-tokens" in taken.stderr and "--format" not in taken.stderr, (
        taken.stderr
    )
    unknown = run_cli("smoke", DRAFTER, "-t", TARGET, "-f", "dummy")
    assert (
        unknown.returncode == 4 and "Invalid value for '--format'" in unknown.stderr
    )  # without the row: refused


def test_the_choices_and_their_help_are_the_tables():
    assert list(formats.VALIDATE) == ["text", "json", "junit", "sarif", "github", "markdown", "github-output"]
    assert list(formats.SMOKE) == ["text", "json", "junit"]
    shown = run_cli("validate", "--help").stdout
    assert "[text|json|junit|sarif|github|markdown|github-output]" in " ".join(shown.split())
    for f in formats.VALIDATE.values():  # (click may wrap a name at its hyphen)
        assert f"{f.name}: {f.help}" in " ".join(shown.split()).replace("- ", "-")


def test_each_row_renders_with_its_renderer():
    report = validate(DRAFTER)
    expected = {
        "text": validate_render.render_text(report),
        "json": validate_render.render_json(report),
        "junit": validate_render.render_junit(report),
        "sarif": validate_render.render_sarif(report),
        "github": ci.render_github(report),
        "markdown": ci.render_markdown(report),
    }
    rendered = {name: formats.render_validate(report, name) for name in formats.VALIDATE}
    outputs = rendered.pop("github-output")  # its delimiters are random: compared as the runner reads them
    assert rendered == expected and parse_github_output(outputs) == ci.github_outputs(report)
    assert json.loads(formats.render_validate(report, "json"))["exit_code"] == 0
    verbose = formats.render_validate(report, "text", formats.Style(verbose=True))
    assert verbose == validate_render.render_text(report, verbose=True)
    with pytest.raises(ValueError, match="unknown validate format 'yaml'"):
        formats.render_validate(report, "yaml")


def test_quiet_keeps_the_verdict_line_or_the_annotations():
    text = "header\nfinding\nPASS 0 errors\n"
    assert formats.verdict_line(text) == "PASS 0 errors\n"
    assert (
        formats.annotations_only("::error title=x::m\nlilicorr-ckpt validate d: FAIL\n")
        == "::error title=x::m\n"
    )


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab&<>\"'\n\r\t é"), max_size=20))
def test_xml_escaping_equals_the_standard_library(text):
    assert xml_text(text) == escape(text)
    assert xml_attr(text) == quoteattr(text)


def test_the_command_line_starts_without_an_xml_or_network_stack():
    probe = "import sys, lilicorr_ckpt.cli; print(sorted(m for m in ('xml.sax', 'ssl', 'http.client') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
