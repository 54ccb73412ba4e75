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
import re
import sys
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.report.escape import (
    markdown_block,
    markdown_cell,
    markdown_code,
    markdown_text,
    output_entry,
    printable,
    stop_commands_token,
    workflow_command,
)
from lilicorr_ckpt.report.locate import LineFinder, json_key_lines, pointer_line
from lilicorr_ckpt.results import Finding, Report

__all__ = ["json_key_lines", "pointer_line"]

_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
_MARK = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}  # noqa: RUF001
MAX_SUMMARY_ROWS = 100


# --- GitHub workflow commands ---------------------------------------------------------------------------------


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
    """An annotation's text: the finding on its first line, the fix on the second (each piece printable, so
    the only line break is this one, which the workflow command carries as %0A)."""
    runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
    text = printable(f"{f.message}{runtimes}")
    if f.fix and f.severity != "info":
        text += f"\nFix: {printable(f.fix)}"
    return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def render_github(report: Report) -> str:
    """One workflow command per finding; waived findings are not annotated. A last line sums up."""
    if report.error is not None:
        return (
            workflow_command(
                "error", printable(report.error), title=f"lilicorr-ckpt validate (exit {report.exit_code})"
            )
            + f"\nlilicorr-ckpt validate {printable(report.path)}: not validated (exit {report.exit_code})\n"
        )
    root = _local_root(report)
    lines = LineFinder(root)
    out = []
    for f in report.findings:
        if _suppressed(f):
            continue
        place: dict[str, str | int | None] = {}
        if root is not None:
            where = lines.locate(f.file or "config.json", f.pointer)
            if where is not None:
                place = {"file": _workspace_relative(root / where[0]), "line": where[1]}
        level = (
            "error" if report.strict and f.severity == "warning" else _LEVEL[f.severity]
        )  # --strict fails on it
        out.append(workflow_command(level, _message(f), **place, title=printable(f"{f.rule} {f.name}")))
    s = report.summary
    verdict = ", ".join(
        f"{printable(v.display)} {'accepts' if v.accepted else 'refuses'}" for v in report.runtimes
    )
    status = "PASS" if report.exit_code == 0 else "FAIL"
    strict = " under --strict" if report.strict else ""
    out.append(
        f"lilicorr-ckpt validate {printable(report.path)}: {status}{strict} ({_plural(s.errors, 'error')}, "
        f"{_plural(s.warnings, 'warning')}; {verdict})"
    )
    return "\n".join(out) + "\n"


# --- Markdown step summary ------------------------------------------------------------------------------------


def _suppressed(f: Finding) -> bool:
    return f.waived is not None


def _strict_failure(report: Report) -> bool:
    """The run fails only because --strict counts its warnings."""
    return (
        report.exit_code == 1 and report.strict and report.summary.errors == 0 and report.summary.warnings > 0
    )


def render_markdown(report: Report) -> str:
    strict = " `--strict`" if report.strict else ""
    if report.error is not None:
        return (
            f"### ❌ lilicorr-ckpt validate {markdown_code(report.path)}{strict}: not validated "
            f"(exit {report.exit_code})\n\n" + markdown_block(report.error)
        )
    s = report.summary
    status = "PASS" if report.exit_code == 0 else "FAIL"
    icon = "✅" if status == "PASS" else "❌"
    target = f" against {markdown_code(report.target)}" if report.target else ""
    lines = [f"### {icon} lilicorr-ckpt validate {markdown_code(report.path)}{target}{strict}: {status}", ""]
    if _strict_failure(report):
        lines += [
            f"Failed under `--strict`: every runtime's verdict below is *accepts*, and "
            f"{_plural(s.warnings, 'warning')} fail{'s' * (s.warnings == 1)} the gate all the same "
            "(waive a judged one with `--ignore` or a waiver file; docs/ci.md).",
            "",
        ]
    if report.hub is not None:
        lines += [
            f"Read from {report.hub.read_from.replace('_', ' ')} at commit {markdown_code(report.hub.commit)} "
            f"(revision {markdown_code(report.hub.revision)}).",
            "",
        ]
    lines += ["| runtime | verdict | errors | warnings |", "|---|---|---|---|"]
    for v in report.runtimes:
        if not v.accepted:
            verdict = "❌ refuses"
        elif report.strict and v.warnings:
            verdict = "⚠️ accepts (its warnings fail `--strict`)"
        else:
            verdict = "✅ accepts"
        lines.append(f"| {markdown_text(v.display)} | {verdict} | {v.errors} | {v.warnings} |")
    waived = sum(_suppressed(f) for f in report.findings)
    counts = f"{_plural(s.errors, 'error')}, {_plural(s.warnings, 'warning')}, {s.infos} info"
    if waived:
        counts += f"; {waived} waived"
    lines += ["", counts, ""]
    shown = [f for f in report.findings if f.severity != "info" or _suppressed(f)]
    if shown:
        lines += ["| | rule | runtimes | finding | where |", "|---|---|---|---|---|"]
        for f in shown[:MAX_SUMMARY_ROWS]:
            where = ":".join(p for p in (f.file, f.pointer) if p)
            if _suppressed(f):
                mark = "🔕 waived"
            elif report.strict and f.severity == "warning":
                mark = _MARK["warning"] + " warning (fails `--strict`)"
            else:
                mark = _MARK[f.severity] + " " + f.severity
            message = markdown_cell(f.message)
            if f.fix and not _suppressed(f):
                message += f"<br>**fix:** {markdown_cell(f.fix)}"
            if f.waived is not None:
                message += (
                    f"<br>**waived:** {markdown_cell(f.waived.reason)} ({markdown_cell(f.waived.source)})"
                )
            runtimes = markdown_cell(", ".join(f.runtimes) or "all")
            lines.append(
                f"| {mark} | {markdown_code(f.rule)} {markdown_cell(f.name)} | {runtimes} | "
                f"{message} | {markdown_code(where) if where else ''} |"
            )
        if len(shown) > MAX_SUMMARY_ROWS:
            lines.append(f"\n... and {len(shown) - MAX_SUMMARY_ROWS} more: see the JSON or SARIF report.")
        lines.append("")
    return "\n".join(lines)


# --- $GITHUB_OUTPUT -------------------------------------------------------------------------------------------


def github_outputs(report: Report) -> dict[str, str]:
    """exit-code, result (pass|fail|error), errors, warnings, verdict-<runtime> (accepts|refuses; a release
    `vllm==1.2.3` is written `verdict-vllm-1_2_3`, as step output names allow), verdicts (a JSON object
    runtime -> verdict, runtimes as validate names them), and commit for a Hub repo."""
    verdicts = {v.runtime: "accepts" if v.accepted else "refuses" for v in report.runtimes}
    result = "error" if report.error is not None else "pass" if report.exit_code == 0 else "fail"
    out = {
        "exit-code": str(report.exit_code),
        "result": result,
        "errors": str(report.summary.errors),
        "warnings": str(report.summary.warnings),
    }
    out.update({f"verdict-{output_name(runtime)}": verdict for runtime, verdict in verdicts.items()})
    out["verdicts"] = json.dumps(verdicts, separators=(",", ":"))
    if report.hub is not None:
        out["commit"] = report.hub.commit
    return out


def render_github_output(report: Report) -> str:
    """The outputs as $GITHUB_OUTPUT entries, each in the delimiter form (escape.output_entry): a value can hold
    anything, a Hub commit id included, and still set only its own key."""
    return "".join(output_entry(name, value) for name, value in github_outputs(report).items())


# --- `lilicorr-ckpt report`: re-render a saved JSON report ----------------------------------------------------

REPORT_LIMIT = 256 << 20  # a validate report; findings are capped per rule (checks/findings.py)


def load_report(path: str) -> Report:
    from lilicorr_ckpt.checkpoint.readfile import read_regular_file, read_stream

    data = (
        read_regular_file(path, what=f"report {path}", max_bytes=REPORT_LIMIT)
        if path != "-"
        else read_stream(sys.stdin.buffer, what="the report on standard input", max_bytes=REPORT_LIMIT)
    )
    try:
        report = msgspec.json.decode(data, type=Report)
    except msgspec.DecodeError as exc:
        raise InputError(f"{path} is not a `lilicorr-ckpt validate -f json` report: {exc}") from None
    for v in report.runtimes:  # runtime ids name step outputs (verdict-<runtime>): only what validate writes
        if not _RUNTIME_ID.fullmatch(v.runtime):
            raise InputError(
                f"{path} is not a `lilicorr-ckpt validate -f json` report: runtime id "
                f"{printable(repr(v.runtime))} is not one validate writes"
            )
    return report


# an engine (`vllm`), or one release of it (`vllm==1.2.3`, `trtllm==main@abc1234`)
_RUNTIME_ID = re.compile(r"[a-z][a-z0-9_-]{0,63}(==[A-Za-z0-9][A-Za-z0-9.@_+-]{0,63})?")


def output_name(runtime: str) -> str:
    """A runtime key as a step output name (letters, digits, `-` and `_`): `vllm==1.2.3` -> `vllm-1_2_3`."""
    engine, _, version = runtime.partition("==")
    return engine + ("-" + re.sub(r"[^A-Za-z0-9_]", "_", version) if version else "")


def register(cli: Any) -> None:
    import click

    from lilicorr_ckpt.outfile import Inputs, check_output_path, write_output
    from lilicorr_ckpt.report import formats

    @cli.command(epilog="Exit codes: 0 rendered, 2 unreadable report, 4 usage error.")
    @click.argument("report_file", metavar="REPORT.json")
    @click.option(
        "--format",
        "-f",
        "fmt",
        type=click.Choice(list(formats.VALIDATE)),
        default="text",
        show_default=True,
        help="The format to render (as validate --format): " + formats.describe(formats.VALIDATE),
    )
    @click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.")
    @click.option("--verbose", "-v", is_flag=True, help="Show info-level findings in the text report.")
    @click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="text: the verdict line only; github: the annotations only (no summing-up line).",
    )
    def report(report_file: str, fmt: str, output: str | None, verbose: bool, quiet: bool) -> None:
        """Render a saved `validate -f json` report (or - for stdin) in another format.

        Validate once, publish many: the GitHub Action runs validate once to JSON, then renders the
        annotations, the step summary, the SARIF file and the log text from it.

        \b
        Examples (from the repository root):
          lilicorr-ckpt validate examples/tiny-lilicorr -f json -o report.json
          lilicorr-ckpt report report.json                        # the text report again
          lilicorr-ckpt report report.json -f github              # ::error annotations
          lilicorr-ckpt report report.json -f sarif -o validate.sarif
          # template: a GitHub Actions step, where $GITHUB_STEP_SUMMARY names the step summary
          lilicorr-ckpt report report.json -f markdown >> "$GITHUB_STEP_SUMMARY"
        """
        chosen = formats.VALIDATE[fmt]
        inputs = Inputs().add(report_file, "the report being rendered")
        if output:
            check_output_path(output, "--output", "report.sarif", inputs)
        loaded = load_report(report_file)
        inputs.add(loaded.path, "the checkpoint the report describes")  # SARIF's regions read its config.json
        text = chosen.render(loaded, formats.Style(verbose=verbose))
        if quiet and chosen.quiet is not None:
            text = chosen.quiet(text)
        if output:
            write_output(text, output, inputs=inputs)
        else:
            click.echo(text, nl=False)

    register_workflow(cli)


def register_workflow(cli: Any) -> None:
    """`lilicorr-ckpt workflow ...`: the GitHub Action's plumbing (hidden from the command list). action.yml writes
    every step output, annotation and summary line through it, so all of them go through report/escape.py."""
    import click

    @cli.group(hidden=True, epilog="Exit codes: 0 written, 2 unreadable --log file, 4 usage error.")
    def workflow() -> None:
        """Plumbing for the GitHub Action (action.yml): values encoded for $GITHUB_OUTPUT, workflow commands
        and step summaries, so that no input, path, Hub reply or log line can set an output, forge an
        annotation or add Markdown.

        \b
        Examples:
          lilicorr-ckpt workflow annotate error "cannot read ./drafter" --title "lilicorr-ckpt validate (exit 2)"
          # template: the action's steps: $GITHUB_OUTPUT is set, stderr.txt and smoke.txt are a step's output
          lilicorr-ckpt workflow output exit-code 2 result error >> "$GITHUB_OUTPUT"
          lilicorr-ckpt workflow log stderr.txt        # shown in the log, no workflow command obeyed
          lilicorr-ckpt workflow summary --title "lilicorr-ckpt smoke" --path ./drafter --status PASS --log smoke.txt
        """

    @workflow.command("output")
    @click.argument("pairs", nargs=-1, metavar="NAME VALUE [NAME VALUE]...")
    def output_command(pairs: tuple[str, ...]) -> None:
        """$GITHUB_OUTPUT entries, each in the delimiter form (NAME<<RANDOM, VALUE, RANDOM)."""
        if not pairs or len(pairs) % 2:
            raise click.UsageError("give NAME VALUE pairs")
        entries = []
        for name, value in zip(pairs[::2], pairs[1::2], strict=True):
            try:
                entries.append(output_entry(name, value))
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
        click.echo("".join(entries), nl=False)

    @workflow.command("annotate")
    @click.argument("level", type=click.Choice(["error", "warning", "notice"]))
    @click.argument("message")
    @click.option("--title", help="The annotation's title.")
    def annotate_command(level: str, message: str, title: str | None) -> None:
        """One annotation (::error / ::warning / ::notice), MESSAGE and --title on one line each."""
        click.echo(workflow_command(level, printable(message), title=printable(title) if title else None))

    @workflow.command("token")
    def token_command() -> None:
        """A fresh token for `::stop-commands::TOKEN` ... `::TOKEN::` around output the Action does not control."""
        click.echo(stop_commands_token())

    @workflow.command("log")
    @click.argument("files", nargs=-1, required=True, metavar="FILE...")
    def log_command(files: tuple[str, ...]) -> None:
        """FILEs' text for the log, between ::stop-commands:: lines: shown, no workflow command in it obeyed."""
        text = "".join(_read_log(f) for f in files)
        token = stop_commands_token(text)
        body = "".join(printable(line) + "\n" for line in text.splitlines())
        click.echo(f"::stop-commands::{token}\n{body}::{token}::")

    @workflow.command("summary")
    @click.option("--title", required=True, help="What ran, e.g. `lilicorr-ckpt smoke` (literal text).")
    @click.option("--path", "path", required=True, help="The checkpoint (shown as code).")
    @click.option("--status", required=True, help="The outcome, e.g. PASS or `not validated (exit 2)`.")
    @click.option("--failed", is_flag=True, help="Mark it failed (❌; ✅ otherwise).")
    @click.option(
        "--log", "log_file", metavar="FILE", help="A log to show under the heading, as a code block."
    )
    def summary_command(title: str, path: str, status: str, failed: bool, log_file: str | None) -> None:
        """A step-summary section: a heading, then --log as a fenced code block."""
        icon = "❌" if failed else "✅"
        text = f"### {icon} {markdown_text(title)} {markdown_code(path)}: {markdown_text(status)}\n"
        if log_file is not None:
            text += "\n" + markdown_block(_read_log(log_file))
        click.echo(text)


_MAX_LOG_BYTES = 1 << 20  # a log shown in CI; more is cut, with a note


def _read_log(path: str) -> str:
    file = Path(path)
    try:
        if not file.is_file():
            raise InputError(f"cannot read {path}: not a regular file")
        with file.open("rb") as f:
            data = f.read(_MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    text = data[:_MAX_LOG_BYTES].decode(errors="replace")
    if len(data) > _MAX_LOG_BYTES:
        text += f"\n... (cut at {_MAX_LOG_BYTES} bytes; the whole log is {path})\n"
    return text
