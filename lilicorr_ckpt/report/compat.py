"""What each judged engine release does with a checkpoint, from a validate Report: it loads the drafter as trained,
refuses it, or loads it and serves another function (silently wrong). The card's compatibility matrix."""

from __future__ import annotations

from lilicorr_ckpt.checks.findings import SILENT_RULES
from lilicorr_ckpt.results import Finding, Report, RuntimeVerdict

LOADS, REFUSES, SILENT = "loads", "refuses", "silently wrong"


def _errors(report: Report, v: RuntimeVerdict) -> list[Finding]:
    return [
        f
        for f in report.findings
        if f.severity == "error" and f.waived is None and (not f.runtimes or v.runtime in f.runtimes)
    ]


def outcome(report: Report, v: RuntimeVerdict) -> tuple[str, list[str]]:
    """(loads | refuses | silently wrong, the rule ids that decide it). A release with any refusing error refuses;
    one whose every error is a silent mis-load (SILENT_RULES, or a finding's silent_for) loads silently wrong."""
    errors = _errors(report, v)
    if not errors:
        return LOADS, []
    refusing = [f.rule for f in errors if f.rule not in SILENT_RULES and v.runtime not in f.silent_for]
    if refusing:
        return REFUSES, sorted(set(refusing))
    return SILENT, sorted({f.rule for f in errors})


def matrix(report: Report) -> list[tuple[str, dict[str, list[str]]]]:
    """Per engine (in report order): outcome -> the releases (versions, with the deciding rules)."""
    out: dict[str, dict[str, list[str]]] = {}
    names: dict[str, str] = {}
    for v in report.runtimes:
        result, rules = outcome(report, v)
        engine = v.engine_id
        display = v.display.replace(" (unreleased)", "")
        names.setdefault(
            engine, display[: -len(v.version)].strip() if display.endswith(v.version) else display
        )
        shown = (
            v.version
            + ("" if v.released else " (unreleased)")
            + (f" ({', '.join(rules[:4])})" if rules else "")
        )
        out.setdefault(engine, {LOADS: [], REFUSES: [], SILENT: []})[result].append(shown)
    return [(names[e], cells) for e, cells in out.items()]
