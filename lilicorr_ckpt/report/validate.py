"""Render a validate Report as text, JSON, JUnit XML or SARIF 2.1.0."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.report.escape import printable, xml_attr, xml_text
from lilicorr_ckpt.report.locate import LineFinder
from lilicorr_ckpt.results import Finding, Report

_LABEL = {"error": "ERROR", "warning": "WARN ", "info": "info "}
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
# where each rule's long form is published (docs/rules.md, generated from the catalogue); the GitHub Action sets
# LILICORR_RULES_URL to its own repository and ref so code-scanning links match the version that ran
RULES_URL = "https://github.com/lilicorr/lilicorr-ckpt/blob/main/docs/rules.md"


def rules_url() -> str:
    return os.environ.get("LILICORR_RULES_URL") or RULES_URL


def fails(report: Report, severity: str) -> bool:
    """Whether a finding of this severity fails the run: errors always, warnings under --strict."""
    return severity == "error" or (report.strict and severity == "warning")


def _counts(report: Report) -> str:
    s = report.summary
    return f"{s.errors} error{'s' * (s.errors != 1)}, {s.warnings} warning{'s' * (s.warnings != 1)}"


def summary_line(report: Report) -> str:
    """One line for a log: the verdict and, on failure, the first reason (what a CI job prints when the report
    itself goes to a file)."""
    if report.error is not None:
        return (
            f"lilicorr-ckpt validate {printable(report.path)}: not validated (exit {report.exit_code}): "
            f"{printable(report.error)}"
        )
    verdict = ", ".join(
        f"{printable(v.display)} {'accepts' if v.accepted else 'refuses'}" for v in report.runtimes
    )
    status = "PASS" if report.exit_code == 0 else "FAIL"
    strict = " --strict" if report.strict else ""
    line = f"lilicorr-ckpt validate {printable(report.path)}{strict}: {status} - {_counts(report)}"
    if report.summary.waived:
        line += f", {report.summary.waived} waived"
    line += f" ({verdict})"
    first = next((f for f in report.findings if f.waived is None and fails(report, f.severity)), None)
    if report.exit_code and first is not None:
        strict = " (--strict)" if first.severity == "warning" else ""
        line += f"; first{strict}: {first.rule} {first.name}: {printable(first.message)}"
    return line


def _where(f: Finding) -> str:
    parts = [printable(p) for p in (f.file, f.pointer) if p]
    return f"  [{':'.join(parts)}]" if parts else ""


def finding_lines(f: Finding) -> list[str]:
    """A finding as the text report prints it: one line (names from the checkpoint escaped, so none can start
    another line), plus its fix for errors and warnings."""
    runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
    lines = [f"{_LABEL[f.severity]} {f.rule} {f.name}{runtimes}: {printable(f.message)}{_where(f)}"]
    if f.fix and f.severity != "info":
        lines.append(f"      fix: {printable(f.fix)}")
    return lines


def waived_lines(report: Report, verbose: bool = False) -> list[str]:
    """The text report's lines for waived findings (info ones only with -v, as for the others)."""
    out = []
    for f in report.findings:
        if f.waived is not None and (verbose or f.severity != "info"):
            runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
            out.append(f"waived {f.rule} {f.name}{runtimes}: {printable(f.message)}")
            if f.waived.source == "--ignore":
                out.append("      waived by --ignore")
            else:  # the reason and its file come from a waiver file: shown, never a line of their own
                out.append(f"      reason: {printable(f.waived.reason)} [{printable(f.waived.source)}]")
    return out


def render_text(report: Report, *, color: bool = False, verbose: bool = False) -> str:
    def paint(text: str, fg: str | None, bold: bool = False) -> str:
        if not color:
            return text
        return click.style(text, fg=fg, bold=bold)

    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    lines = [
        f"lilicorr-ckpt validate {printable(report.path)}"
        + (f" --target {printable(report.target)}" if report.target else "")
        + (" --strict" if report.strict else "")
    ]
    if report.error is not None:
        return (
            "\n".join(
                [*lines, "", paint("ERROR", "red", bold=True) + f" not validated: {printable(report.error)}"]
            )
            + "\n"
        )
    g = {
        key: "?" if value is None else value for key, value in report.geometry.items()
    }  # ? = missing or invalid
    arch = printable(report.architecture or "unknown architecture")
    head = ""
    if report.geometry.get("lilicorr_enabled"):
        head = (
            f", head h={g.get('head_hidden_size', '?')} K={g.get('candidate_topk', '?')} "
            f"L={g.get('head_num_layers', '?')} N={g.get('head_num_heads', '?')} F={g.get('head_factor_dim', '?')}"
        )
    conv = (
        f", conv {g['conv_kernel_size']}x{g.get('conv_group_size', '?')}"
        if report.geometry.get("conv_kernel_size")
        else ""
    )
    lines.append(
        f"  {arch}: hidden {g.get('hidden_size', '?')}, {g.get('num_layers', '?')} layers, "
        f"block {g.get('block_size', '?')}{head}{conv}"
    )
    for severity in ("error", "warning", "info"):
        group = [f for f in report.findings if f.severity == severity and f.waived is None]
        if not group or (severity == "info" and not verbose):
            continue
        lines.append("")
        for f in group:
            first, *rest = finding_lines(f)
            label = _LABEL[severity]
            lines.append(paint(label, colors[severity], bold=severity == "error") + first[len(label) :])
            lines.extend(rest)
    waived = waived_lines(report, verbose)
    if waived:
        lines += ["", *waived]
    s = report.summary
    verdict = ", ".join(
        f"{printable(v.display)}: {'accepts' if v.accepted else 'refuses'}" for v in report.runtimes
    )
    hidden = (
        f" ({s.infos} info, shown with -v)"
        if s.infos and not verbose
        else (f", {s.infos} info" if s.infos else "")
    )
    if s.waived:
        hidden += f", {s.waived} waived"
    lines.append("")
    status = "PASS" if report.exit_code == 0 else "FAIL"
    lines.append(
        paint(status, "green" if status == "PASS" else "red", bold=True)
        + f" {s.errors} error{'s' * (s.errors != 1)}, {s.warnings} warning{'s' * (s.warnings != 1)}"
        f"{hidden} - {verdict}"
    )
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(msgspec.to_builtins(report), indent=2) + "\n"


def render_junit(report: Report) -> str:
    """A testcase per runtime, failed by its errors (and, under --strict, its warnings), so that the failure
    count is non-zero exactly when the exit code is 1; unreadable input is one testcase with an <error>."""
    suite = xml_attr("lilicorr-ckpt validate " + printable(report.path))
    head = '<?xml version="1.0" encoding="UTF-8"?>\n'
    if report.error is not None:
        case = (
            f'  <testcase classname="lilicorr-ckpt.validate" name="read checkpoint">'
            f'<error message={xml_attr(printable(report.error)[:500])} type="unreadable-input">{xml_text(printable(report.error))}'
            f"</error></testcase>"
        )
        return head + f'<testsuite name={suite} tests="1" failures="0" errors="1">\n{case}\n</testsuite>\n'
    cases = []
    failures = 0
    for v in report.runtimes:
        mine = [
            f for f in report.findings if (not f.runtimes or v.runtime in f.runtimes) and f.waived is None
        ]
        failing = [f for f in mine if fails(report, f.severity)]
        warnings = [f for f in mine if f.severity == "warning" and not fails(report, f.severity)]
        body = ""
        if failing:
            failures += 1
            errors = sum(f.severity == "error" for f in failing)
            what = (
                f"{errors} error(s)"
                if errors == len(failing)
                else f"{errors} error(s), {len(failing) - errors} warning(s) (--strict)"
            )
            text = "\n".join(
                f"{f.rule} {f.name} ({f.severity}): {printable(f.message)}{_where(f)}" for f in failing
            )
            body += (
                f"<failure message={xml_attr(f'{what}: {printable(failing[0].message)[:200]}')} "
                f'type="lilicorr-ckpt">{xml_text(text)}</failure>'
            )
        if warnings:
            body += (
                "<system-out>"
                + xml_text("\n".join(f"{f.rule} {f.name}: {printable(f.message)}" for f in warnings))
                + "</system-out>"
            )
        cases.append(
            f'  <testcase classname="lilicorr-ckpt.validate" name={xml_attr(printable(v.display))}>{body}</testcase>'
        )
    return (
        head
        + f'<testsuite name={suite} tests="{len(cases)}" failures="{failures}" errors="0">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def render_sarif(report: Report) -> str:
    # the catalogue, loaded when a SARIF log is written: the command line imports this module at start-up
    from lilicorr_ckpt.checks import RULES

    catalogue = sorted(RULES)  # every rule, so dashboards can show what passed as well as what fired
    docs = rules_url()
    rules = [
        {
            "id": r.id,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": (r.doc or r.summary).strip()},
            "help": {"text": f"Fix: {r.fix}"},
            "helpUri": f"{docs}#{r.id.lower()}",
            "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
            "properties": {"area": r.area},
        }
        for r in (RULES[i] for i in catalogue)
    ]
    index = {rid: i for i, rid in enumerate(catalogue)}
    results = []
    base = report.path.rstrip("/")
    root = Path(report.path).expanduser() if report.hub is None else None
    lines = LineFinder(root if root is not None and root.is_dir() else None)
    for f in report.findings:
        # under --strict a warning fails the run, so it is an error here too (code scanning blocks on errors)
        level = "error" if fails(report, f.severity) else _SARIF_LEVEL[f.severity]
        result: dict[str, object] = {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": level,
            "message": {"text": printable(f.message)},
            "properties": {
                "severity": f.severity,
                "fix": f.fix,
                "runtimes": f.runtimes,
                "pointer": f.pointer,
                "expected": f.expected,
                "actual": f.actual,
            },
        }
        if f.waived is not None:
            result["suppressions"] = [
                {
                    "kind": "external",
                    "status": "accepted",
                    "justification": printable(f"{f.waived.reason} ({f.waived.source})"),
                }
            ]
        file = f.file or "config.json"
        # the config key's line when the finding names one; for a tensor its index entry or its shard's header
        # (report/locate.py); line 1 of the file when nothing more precise is known (a Hub repo)
        file, line = lines.locate(file, f.pointer) or (file, 1)
        location: dict[str, object] = {
            "physicalLocation": {"artifactLocation": {"uri": f"{base}/{file}"}, "region": {"startLine": line}}
        }
        if f.pointer:
            kind = "member" if f.pointer.startswith("$") else "variable"  # a config key, or a tensor name
            location["logicalLocations"] = [{"fullyQualifiedName": f.pointer, "kind": kind}]
        result["locations"] = [location]
        results.append(result)
    invocation: dict[str, object] = {
        "executionSuccessful": report.error is None,
        "exitCode": report.exit_code,
        "properties": {"strict": report.strict},
    }
    if report.error is not None:
        invocation["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": printable(report.error)}}
        ]
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "lilicorr-ckpt",
                        "version": __version__,
                        "informationUri": docs,
                        "rules": rules,
                    }
                },
                "invocations": [invocation],
                "results": results,
                # the verdict per runtime, each naming the engine version it models
                "properties": {
                    "verdicts": [
                        {
                            "runtime": v.runtime,
                            "engine": v.display,
                            "version": v.version,
                            "released": v.released,
                            "accepted": v.accepted,
                            "errors": v.errors,
                            "warnings": v.warnings,
                        }
                        for v in report.runtimes
                    ]
                },
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
