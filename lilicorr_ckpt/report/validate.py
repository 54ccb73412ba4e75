"""Render a validate Report as text, JSON, JUnit XML or SARIF 2.1.0."""

from __future__ import annotations

import json
from xml.sax.saxutils import escape, quoteattr

import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.checks.findings import RULES, Finding
from lilicorr_ckpt.checks.run import Report

FORMATS = ("text", "json", "junit", "sarif")
_LABEL = {"error": "ERROR", "warning": "WARN ", "info": "info "}


def _where(f: Finding) -> str:
    parts = [p for p in (f.file, f.pointer) if p]
    return f"  [{':'.join(parts)}]" if parts else ""


def finding_lines(f: Finding) -> list[str]:
    """A finding as the text report prints it: one line, plus its fix for errors and warnings."""
    runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
    lines = [f"{_LABEL[f.severity]} {f.rule} {f.name}{runtimes}: {f.message}{_where(f)}"]
    if f.fix and f.severity != "info":
        lines.append(f"      fix: {f.fix}")
    return lines


def waived_lines(report: Report, verbose: bool = False) -> list[str]:
    """The text report's lines for waived findings (info ones only with -v, as for the others)."""
    out = []
    for f in report.findings:
        if f.waived is not None and (verbose or f.severity != "info"):
            runtimes = f" ({', '.join(f.runtimes)})" if f.runtimes else ""
            out.append(f"waived {f.rule} {f.name}{runtimes}: {f.message}")
            if f.waived.source == "--ignore":
                out.append("      waived by --ignore")
            else:
                out.append(f"      reason: {f.waived.reason} [{f.waived.source}]")
    return out


def render_text(report: Report, *, color: bool = False, verbose: bool = False) -> str:
    def paint(text: str, fg: str | None, bold: bool = False) -> str:
        if not color:
            return text
        import click

        return click.style(text, fg=fg, bold=bold)

    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    lines = [f"lilicorr-ckpt validate {report.path}" + (f" --target {report.target}" if report.target else "")]
    g = {key: "?" if value is None else value for key, value in report.geometry.items()}  # ? = missing or invalid
    arch = report.architecture or "unknown architecture"
    head = ""
    if report.geometry.get("lilicorr_enabled"):
        head = (f", head h={g.get('head_hidden_size', '?')} K={g.get('candidate_topk', '?')} "
                f"L={g.get('head_num_layers', '?')} N={g.get('head_num_heads', '?')} F={g.get('head_factor_dim', '?')}")
    conv = f", conv {g['conv_kernel_size']}x{g.get('conv_group_size', '?')}" if report.geometry.get("conv_kernel_size") else ""
    lines.append(f"  {arch}: hidden {g.get('hidden_size', '?')}, {g.get('num_layers', '?')} layers, "
                 f"block {g.get('block_size', '?')}{head}{conv}")
    for severity in ("error", "warning", "info"):
        group = [f for f in report.findings if f.severity == severity and f.waived is None]
        if not group or (severity == "info" and not verbose):
            continue
        lines.append("")
        for f in group:
            first, *rest = finding_lines(f)
            label = _LABEL[severity]
            lines.append(paint(label, colors[severity], bold=severity == "error") + first[len(label):])
            lines.extend(rest)
    waived = waived_lines(report, verbose)
    if waived:
        lines += ["", *waived]
    s = report.summary
    verdict = ", ".join(f"{v.display}: {'accepts' if v.accepted else 'refuses'}" for v in report.runtimes)
    hidden = f" ({s.infos} info, shown with -v)" if s.infos and not verbose else (f", {s.infos} info" if s.infos else "")
    if s.waived:
        hidden += f", {s.waived} waived"
    lines.append("")
    status = "PASS" if report.exit_code == 0 else "FAIL"
    lines.append(paint(status, "green" if status == "PASS" else "red", bold=True)
                 + f" {s.errors} error{'s' * (s.errors != 1)}, {s.warnings} warning{'s' * (s.warnings != 1)}"
                 f"{hidden} - {verdict}")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(msgspec.to_builtins(report), indent=2) + "\n"


def render_junit(report: Report) -> str:
    cases = []
    for v in report.runtimes:
        mine = [f for f in report.findings if (not f.runtimes or v.runtime in f.runtimes) and f.waived is None]
        errors = [f for f in mine if f.severity == "error"]
        warnings = [f for f in mine if f.severity == "warning"]
        body = ""
        if errors:
            text = "\n".join(f"{f.rule} {f.name}: {f.message}{_where(f)}" for f in errors)
            body += (f'<failure message={quoteattr(f"{len(errors)} error(s): {errors[0].message[:200]}")} '
                     f'type="lilicorr-ckpt">{escape(text)}</failure>')
        if warnings:
            body += "<system-out>" + escape("\n".join(f"{f.rule} {f.name}: {f.message}" for f in warnings)) + \
                    "</system-out>"
        cases.append(f'  <testcase classname="lilicorr-ckpt.validate" name={quoteattr(v.display)}>{body}</testcase>')
    failures = sum(not v.accepted for v in report.runtimes)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuite name={quoteattr("lilicorr-ckpt validate " + report.path)} tests="{len(cases)}" '
            f'failures="{failures}" errors="0">\n' + "\n".join(cases) + "\n</testsuite>\n")


def render_sarif(report: Report) -> str:
    catalogue = sorted(RULES)  # every rule, so dashboards can show what passed as well as what fired
    rules = [{"id": r.id, "name": r.name, "shortDescription": {"text": r.summary}, "help": {"text": r.fix},
              "defaultConfiguration": {"level": {"error": "error", "warning": "warning", "info": "note"}[r.severity]},
              "properties": {"area": r.area}} for r in (RULES[i] for i in catalogue)]
    index = {rid: i for i, rid in enumerate(catalogue)}
    results = []
    base = report.path.rstrip("/")
    for f in report.findings:
        result: dict[str, object] = {
            "ruleId": f.rule, "ruleIndex": index[f.rule],
            "level": {"error": "error", "warning": "warning", "info": "note"}[f.severity],
            "message": {"text": f.message + (f" Fix: {f.fix}" if f.fix else "")},
            "properties": {"runtimes": f.runtimes, "pointer": f.pointer, "expected": f.expected,
                           "actual": f.actual},
        }
        if f.waived is not None:
            result["suppressions"] = [{"kind": "external", "status": "accepted",
                                       "justification": f"{f.waived.reason} ({f.waived.source})"}]
        uri = f"{base}/{f.file}" if f.file else f"{base}/config.json"
        result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": uri}}}]
        results.append(result)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "lilicorr-ckpt", "version": __version__, "rules": rules}},
                  "results": results}],
    }
    return json.dumps(doc, indent=2) + "\n"


def render(report: Report, fmt: str, *, color: bool = False, verbose: bool = False) -> str:
    if fmt == "json":
        return render_json(report)
    if fmt == "junit":
        return render_junit(report)
    if fmt == "sarif":
        return render_sarif(report)
    return render_text(report, color=color, verbose=verbose)


def report_schema() -> dict[str, object]:
    schema = msgspec.json.schema(Report)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "lilicorr-ckpt validate report"
    return schema
