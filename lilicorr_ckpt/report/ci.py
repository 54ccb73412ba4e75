"""CI renderers of a validate Report: GitHub annotations, a Markdown step summary, GitHub step outputs.

    validate -f github          ::error file=...,line=...,title=...::message   (one per finding)
    validate -f markdown        the verdict table (and the findings) for $GITHUB_STEP_SUMMARY
    validate -f github-output   key=value lines for $GITHUB_OUTPUT (exit-code, verdict-<runtime>, counts)
    lilicorr-ckpt report REPORT.json -f FMT   any format, re-rendered from a saved `validate -f json`

Annotation lines point into config.json at the key a finding names (its JSON pointer), found by
report/locate.py's position-keeping JSON scanner; findings about a tensor point at the safetensors file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.report.locate import LineFinder, json_key_lines, pointer_line

__all__ = ["CI_FORMATS", "json_key_lines", "pointer_line", "render_report"]

if TYPE_CHECKING:  # pragma: no cover
    from lilicorr_ckpt.checks.findings import Finding
    from lilicorr_ckpt.checks.run import Report

CI_FORMATS = ("github", "markdown", "github-output")
_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
_MARK = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}  # noqa: RUF001
MAX_SUMMARY_ROWS = 100


# --- GitHub workflow commands ---------------------------------------------------------------------------------

def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def _local_root(report: Report) -> Path | None:
    if report.hub is not None:
        return None
    root = Path(report.path).expanduser()
    return root if root.is_dir() else None


def _workspace_relative(path: Path) -> str:
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def _message(f: Finding) -> str:
    runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
    text = f"{f.message}{runtimes}"
    if f.fix and f.severity != "info":
        text += f"\nFix: {f.fix}"
    return text


def render_github(report: Report) -> str:
    """One workflow command per finding; waived findings are not annotated. A last line sums up."""
    if report.error is not None:
        return (f"::error title={_escape_property(f'lilicorr-ckpt validate (exit {report.exit_code})')}::"
                f"{_escape_data(report.error)}\nlilicorr-ckpt validate {report.path}: not validated "
                f"(exit {report.exit_code})\n")
    root = _local_root(report)
    lines = LineFinder(root)
    out = []
    for f in report.findings:
        if _suppressed(f):
            continue
        props = [f"title={_escape_property(f'{f.rule} {f.name}')}"]
        file = f.file or "config.json"
        if root is not None and (root / file).is_file():
            props.insert(0, f"file={_escape_property(_workspace_relative(root / file))}")
            line = lines.line(file, f.pointer)
            if line is not None:
                props.insert(1, f"line={line}")
        level = "error" if report.strict and f.severity == "warning" else _LEVEL[f.severity]  # --strict fails on it
        out.append(f"::{level} {','.join(props)}::{_escape_data(_message(f))}")
    s = report.summary
    verdict = ", ".join(f"{v.display} {'accepts' if v.accepted else 'refuses'}" for v in report.runtimes)
    status = "PASS" if report.exit_code == 0 else "FAIL"
    out.append(f"lilicorr-ckpt validate {report.path}: {status} ({s.errors} errors, {s.warnings} warnings; "
               f"{verdict})")
    return "\n".join(out) + "\n"


# --- Markdown step summary ------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", "<br>")


def _suppressed(f: Finding) -> bool:
    return f.waived is not None


def render_markdown(report: Report) -> str:
    if report.error is not None:
        return (f"### ❌ lilicorr-ckpt validate `{report.path}`: not validated (exit {report.exit_code})\n\n"
                f"```\n{report.error}\n```\n")
    s = report.summary
    status = "PASS" if report.exit_code == 0 else "FAIL"
    icon = "✅" if status == "PASS" else "❌"
    target = f" against `{report.target}`" if report.target else ""
    lines = [f"### {icon} lilicorr-ckpt validate `{report.path}`{target}: {status}", ""]
    if report.hub is not None:
        lines += [f"Read from {report.hub.read_from.replace('_', ' ')} at commit `{report.hub.commit}` "
                  f"(revision `{report.hub.revision}`).", ""]
    lines += ["| runtime | verdict | errors | warnings |", "|---|---|---|---|"]
    for v in report.runtimes:
        verdict = "✅ accepts" if v.accepted else "❌ refuses"
        lines.append(f"| {v.display} | {verdict} | {v.errors} | {v.warnings} |")
    waived = sum(_suppressed(f) for f in report.findings)
    counts = f"{s.errors} error{'s' * (s.errors != 1)}, {s.warnings} warning{'s' * (s.warnings != 1)}, {s.infos} info"
    if waived:
        counts += f"; {waived} waived"
    lines += ["", counts, ""]
    shown = [f for f in report.findings if f.severity != "info" or _suppressed(f)]
    if shown:
        lines += ["| | rule | runtimes | finding | where |", "|---|---|---|---|---|"]
        for f in shown[:MAX_SUMMARY_ROWS]:
            where = ":".join(p for p in (f.file, f.pointer) if p)
            mark = "🔕 waived" if _suppressed(f) else _MARK[f.severity] + " " + f.severity
            message = f.message + (f"<br>**fix:** {f.fix}" if f.fix and not _suppressed(f) else "")
            if f.waived is not None:
                message += f"<br>**waived:** {f.waived.reason} ({f.waived.source})"
            lines.append(f"| {mark} | `{f.rule}` {f.name} | {', '.join(f.runtimes) or 'all'} | "
                         f"{_cell(message)} | {('`' + _cell(where) + '`') if where else ''} |")
        if len(shown) > MAX_SUMMARY_ROWS:
            lines.append(f"\n... and {len(shown) - MAX_SUMMARY_ROWS} more: see the JSON or SARIF report.")
        lines.append("")
    return "\n".join(lines)


# --- $GITHUB_OUTPUT -------------------------------------------------------------------------------------------

def render_github_output(report: Report) -> str:
    """key=value lines: exit-code, result (pass|fail), errors, warnings, verdict-<runtime> (accepts|refuses),
    and verdicts (a JSON object runtime -> verdict)."""
    verdicts = {v.runtime: "accepts" if v.accepted else "refuses" for v in report.runtimes}
    result = "error" if report.error is not None else "pass" if report.exit_code == 0 else "fail"
    lines = [f"exit-code={report.exit_code}", f"result={result}",
             f"errors={report.summary.errors}", f"warnings={report.summary.warnings}"]
    lines += [f"verdict-{runtime}={verdict}" for runtime, verdict in verdicts.items()]
    lines.append("verdicts=" + json.dumps(verdicts, separators=(",", ":")))
    if report.hub is not None:
        lines.append(f"commit={report.hub.commit}")
    return "\n".join(lines) + "\n"


def render_report(report: Report, fmt: str, *, color: bool = False, verbose: bool = False) -> str:
    """Any validate format: the CI ones here, the others through report.validate.render."""
    if fmt in CI_FORMATS:
        return render_ci(report, fmt)
    from lilicorr_ckpt.report.validate import render

    return render(report, fmt, color=color, verbose=verbose)


def render_ci(report: Report, fmt: str) -> str:
    if fmt == "github":
        return render_github(report)
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "github-output":
        return render_github_output(report)
    raise ValueError(f"unknown CI format {fmt!r}")


# --- `lilicorr-ckpt report`: re-render a saved JSON report ----------------------------------------------------

REPORT_LIMIT = 256 << 20  # a validate report; findings are capped per rule (checks/findings.py)


def load_report(path: str) -> Report:
    from lilicorr_ckpt.checkpoint.readfile import read_regular_file, read_stream
    from lilicorr_ckpt.checks.run import Report

    data = read_regular_file(path, what=f"report {path}", max_bytes=REPORT_LIMIT) if path != "-" else \
        read_stream(sys.stdin.buffer, what="the report on standard input", max_bytes=REPORT_LIMIT)
    try:
        return msgspec.json.decode(data, type=Report)
    except msgspec.DecodeError as exc:
        raise InputError(f"{path} is not a `lilicorr-ckpt validate -f json` report: {exc}") from None


def register(cli: Any) -> None:
    import click

    from lilicorr_ckpt.outfile import check_output_path, write_output

    @cli.command(epilog="Exit codes: 0 rendered, 2 unreadable report, 4 usage error.")
    @click.argument("report_file", metavar="REPORT.json")
    @click.option("--format", "-f", "fmt", required=True,
                  type=click.Choice(["text", "json", "junit", "sarif", *CI_FORMATS]),
                  help="The format to render (as validate --format).")
    @click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.")
    @click.option("--verbose", "-v", is_flag=True, help="Show info-level findings in the text report.")
    @click.option("--quiet", "-q", is_flag=True, help="Text: the verdict line only.")
    def report(report_file: str, fmt: str, output: str | None, verbose: bool, quiet: bool) -> None:
        """Render a saved `validate -f json` report (or - for stdin) in another format.

        Validate once, publish many: the GitHub Action runs validate once to JSON, then renders the
        annotations, the step summary, the SARIF file and the log text from it.

        \b
        Examples:
          lilicorr-ckpt validate ./drafter -f json -o report.json
          lilicorr-ckpt report report.json -f github              # ::error annotations
          lilicorr-ckpt report report.json -f markdown >> "$GITHUB_STEP_SUMMARY"
          lilicorr-ckpt report report.json -f sarif -o validate.sarif
        """
        if output:
            check_output_path(output, "--output", "report.sarif")
        text = render_report(load_report(report_file), fmt, verbose=verbose)
        if quiet and fmt == "text":
            text = text.rstrip("\n").rpartition("\n")[2] + "\n"
        if output:
            write_output(text, output)
        else:
            click.echo(text, nl=False)
