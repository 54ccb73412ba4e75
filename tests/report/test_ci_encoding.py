"""Nothing a report quotes can forge a CI line: step outputs, annotations, step-summary Markdown, text-report lines
and JUnit XML, whatever the path, a Hub commit id, a waiver's reason or a tensor name holds (issue 20)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import msgspec
import numpy as np
import pytest
from ghrunner import obeyed_commands, parse_github_output
from safetensors.numpy import save_file

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.remote import HubOrigin
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.report import escape
from lilicorr_ckpt.report.ci import render_github_output, render_markdown
from lilicorr_ckpt.report.formats import render_validate

FORGED_OUTPUTS = "sha\nexit-code=0\nresult=pass\nverdicts={}"
BIDI = "\u202e\u2066\u200f\u061c"


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def refused(make_ckpt):
    """Two errors (SGLang and vLLM refuse a top-k of 6)."""
    return make_ckpt("refused", fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6}))


def test_a_hostile_hub_commit_id_sets_no_other_output(refused):
    report = validate(str(refused))
    assert report.exit_code == 1
    hub = HubOrigin(repo_id="acme/d", revision="main", commit=FORGED_OUTPUTS, read_from="hub")
    outputs = parse_github_output(render_github_output(msgspec.structs.replace(report, hub=hub)))
    assert outputs["exit-code"] == "1" and outputs["result"] == "fail"
    assert json.loads(outputs["verdicts"]) == {"sglang": "refuses", "vllm": "refuses", "trtllm": "accepts"}
    assert outputs["commit"] == FORGED_OUTPUTS  # carried whole, as data
    # the summary shows it as one code span on one line
    summary = render_markdown(msgspec.structs.replace(report, hub=hub))
    [read_from] = [line for line in summary.splitlines() if line.startswith("Read from")]
    assert "exit-code=0" in read_from and not any(
        line.startswith("exit-code") for line in summary.splitlines()
    )


def test_output_entries_survive_any_value_and_pick_a_fresh_delimiter(monkeypatch):
    for value in ("", "plain", "a\nb=c\n", "x<<EOF\nEOF\ny", "\n\n", "ghadelimiter_0", "exit-code=0"):
        assert parse_github_output(escape.output_entry("out", value) + escape.output_entry("next", "1")) == {
            "out": value,
            "next": "1",
        }
    carriage = parse_github_output(
        escape.output_entry("out", "a\rexit-code=0\r\nb") + escape.output_entry("next", "1")
    )
    assert set(carriage) == {"out", "next"} and carriage["next"] == "1"
    # a delimiter that happens to occur in the value is never used
    tokens = iter(["00" * 16, "11" * 16])
    monkeypatch.setattr(escape.secrets, "token_hex", lambda n: next(tokens))
    entry = escape.output_entry("out", f"before\nghadelimiter_{'00' * 16}\nexit-code=0")
    assert entry.startswith(f"out<<ghadelimiter_{'11' * 16}\n")
    with pytest.raises(ValueError):
        escape.output_entry("exit-code\nresult", "x")


def test_a_checkpoint_path_cannot_forge_annotations_or_summary_lines(tmp_path, make_ckpt, capsys):
    evil = "d\n::error title=forged::the gate passes\n### ✅ PASS\n<img src=x onerror=alert(1)>`|"
    ckpt = fixtures.write_checkpoint(
        tmp_path / evil, fixtures.draft_config(dflash={"lilicorr_candidate_topk": 6})
    )
    code, out, _ = run(capsys, "validate", str(ckpt), "-f", "github")
    assert code == 1
    commands = obeyed_commands(out)
    assert commands and all(c.properties.get("title", "").startswith("LC") for c in commands)
    assert all(
        c.properties["file"].endswith("/config.json") and evil in c.properties["file"] for c in commands
    )
    assert len(out.splitlines()) == len(commands) + 1  # one line per annotation, one summing up
    assert out.splitlines()[-1].startswith("lilicorr-ckpt validate ") and "FAIL" in out.splitlines()[-1]
    code, md, _ = run(capsys, "validate", str(ckpt), "-f", "markdown")
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert len(headings) == 1 and headings[0].startswith("### ❌ lilicorr-ckpt validate ``")  # a code span
    assert not any(line.startswith(("::", "<")) for line in md.splitlines())
    rendered = markdown_html(md)
    if rendered is not None:
        assert rendered.count("<h3>") == 1 and "<img" not in rendered and "<h3>" in rendered.split("\n")[0]
        assert "&lt;img src=x onerror=alert(1)&gt;" in rendered.split("\n")[0]
    code, text, _ = run(capsys, "validate", str(ckpt))
    assert not any(line.startswith(("::", "###", "<img")) for line in text.splitlines())


def markdown_html(text: str) -> str | None:
    """GitHub-flavoured-enough HTML of text (CommonMark with tables), when markdown-it-py is installed."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    return MarkdownIt("commonmark").enable("table").enable("strikethrough").render(text)


def test_markdown_text_and_code_render_literally():
    hostile = "a *b* _c_ [l](http://x) <b>t</b> &amp; `c` | ~~s~~ $x$ \\ \u202e"
    for line_start in ("", "# ", "- ", "12. ", "> ", "=== "):
        html = markdown_html(
            f"{escape.markdown_text(line_start + hostile)}\n\n| {escape.markdown_cell(hostile)} | "
            f"{escape.markdown_code(hostile)} |\n|---|---|\n"
        )
        if html is None:
            pytest.skip("markdown-it-py is not installed")
        for tag in (
            "<em>",
            "<strong>",
            "<a ",
            "<b>",
            "<code>c",
            "<s>",
            "<h1>",
            "<ul>",
            "<ol>",
            "<blockquote>",
        ):
            assert tag not in html, (line_start, tag, html)
        assert html.count("<th>") == 2  # the pipes did not add cells
        assert "\u202e" not in html


def test_unreadable_input_quoting_a_path_forges_nothing(tmp_path, capsys):
    evil = str(tmp_path / "x\n::error title=forged::y")
    for fmt in ("github", "markdown"):
        code, out, _ = run(capsys, "validate", evil, "-f", fmt)
        assert code == 2
        if fmt == "github":
            [command] = obeyed_commands(out)
            assert command.properties["title"] == "lilicorr-ckpt validate (exit 2)"
        else:
            assert sum(line.startswith("#") for line in out.splitlines()) == 1
            assert not any(line.startswith("::") for line in out.splitlines())


def test_a_waiver_reason_cannot_forge_a_text_report_line(make_ckpt, capsys):
    owned = make_ckpt("owned", fixtures.draft_config(own_lm_head=True))  # LC404 for SGLang
    (owned / "lilicorr.toml").write_text(
        '[[waivers]]\nrule = "LC404"\n'
        'reason = "checked\\nERROR LC999 forged: a line of its own\\n::error::x"\n'
    )
    code, out, _ = run(capsys, "validate", str(owned), "--strict")
    assert code == 0
    assert not any(line.startswith(("ERROR", "::")) for line in out.splitlines())
    assert "reason: checked\\x0aERROR LC999 forged" in out
    code, gh, _ = run(capsys, "validate", str(owned), "--strict", "-f", "github")
    assert obeyed_commands(gh) == []  # waived: no annotation, and the reason forges none
    code, md, _ = run(capsys, "validate", str(owned), "--strict", "-f", "markdown")
    assert not any(line.startswith(("ERROR", "::")) for line in md.splitlines())


@pytest.fixture
def strange_names(make_ckpt) -> Path:
    """A checkpoint with an extra tensor whose name holds a non-character (U+FFFE, which XML 1.0 forbids) and
    bidi controls (which reorder the text that follows them)."""
    path = make_ckpt("strange")
    save_file({f"x\ufffe{BIDI}y": np.zeros(2, dtype=np.float32)}, str(path / "extra.safetensors"))
    return path


def test_junit_stays_valid_xml_on_a_tensor_name_with_a_non_character(strange_names, capsys):
    code, out, _ = run(capsys, "validate", str(strange_names), "-f", "junit")
    assert code == 1
    suite = ET.fromstring(out)
    assert "\\ufffe" in "".join(suite.itertext())


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "sarif", "github", "markdown", "github-output"])
def test_bidi_controls_are_shown_escaped_in_every_format(strange_names, capsys, fmt):
    code, out, _ = run(capsys, "validate", str(strange_names), "-f", fmt, "-v")
    assert code == 1
    assert not re.search("[\u202e\u2066\u200f\u061c\ufffe]", out), fmt
    if fmt in ("text", "junit", "github", "markdown"):
        assert "\\u202e" in out  # shown, not dropped


def test_sarif_and_json_keep_the_name_exact_for_machines(strange_names):
    report = validate(str(strange_names))
    name = f"x\ufffe{BIDI}y"
    [finding] = [f for f in report.findings if name in f.subjects]
    assert json.loads(render_validate(report, "json"))["findings"][report.findings.index(finding)][
        "subjects"
    ] == [name]
    doc = json.loads(render_validate(report, "sarif"))
    [result] = [r for r in doc["runs"][0]["results"] if r["ruleId"] == finding.rule]
    assert (
        "\u202e" not in result["message"]["text"] and "\\u202e" in result["message"]["text"]
    )  # people read it


def test_the_github_format_counts_in_the_singular_and_says_strict(make_ckpt, capsys):
    warned = make_ckpt("warned", fixtures.draft_config(block_size=16))  # one warning, LC111
    verdicts = ", ".join(f"{v.display} accepts" for v in validate(str(warned)).runtimes)
    code, out, _ = run(capsys, "validate", str(warned), "-f", "github", "--strict")
    assert code == 1
    assert out.splitlines()[-1].endswith(f": FAIL under --strict (0 errors, 1 warning; {verdicts})")


def test_workflow_plumbing_encodes_what_the_action_writes(tmp_path, capsys):
    code, out, _ = run(capsys, "workflow", "output", "exit-code", "2", "reason", FORGED_OUTPUTS)
    assert code in (0, None) and parse_github_output(out) == {"exit-code": "2", "reason": FORGED_OUTPUTS}
    code, out, _ = run(
        capsys, "workflow", "annotate", "error", "bad\n::error title=forged::x", "--title", "t,a:b"
    )
    [command] = obeyed_commands(out)
    assert (
        command.properties == {"title": "t,a:b"}
        and "forged" in command.message
        and "\n" not in command.message
    )
    log = tmp_path / "log.txt"
    log.write_text("ok\n::error title=forged::from the log\n  ::warning::indented\n```\n")
    code, out, _ = run(capsys, "workflow", "log", str(log))
    assert obeyed_commands(out) == [] and "from the log" in out
    code, out, _ = run(
        capsys,
        "workflow",
        "summary",
        "--title",
        "lilicorr-ckpt smoke",
        "--path",
        "a`b\n# x",
        "--status",
        "FAIL (exit 1)",
        "--failed",
        "--log",
        str(log),
    )
    lines = out.rstrip("\n").splitlines()
    assert lines[0].startswith("### ❌ lilicorr") and sum(line.startswith("#") for line in lines) == 1
    fence = lines[2]
    assert set(fence) == {"`"} and len(fence) > 3 and lines[-1] == fence  # longer than the ``` inside
    code, _, err = run(capsys, "workflow", "output", "bad name", "x")
    assert code == 4 and "not an output name" in err


def test_a_saved_report_naming_a_runtime_that_is_no_output_name_is_refused(refused, tmp_path, capsys):
    saved = json.loads(render_validate(validate(str(refused)), "json"))
    saved["runtimes"][0]["runtime"] = "sglang\nexit-code=0"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(saved))
    code, out, err = run(capsys, "report", str(path), "-f", "github-output")
    assert code == 2 and out == "" and "runtime id 'sglang\\nexit-code=0' is not one validate writes" in err
