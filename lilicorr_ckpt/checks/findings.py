"""Findings and the rule registry. Rules know nothing about output formats; reports know nothing
about rules beyond this metadata."""

from __future__ import annotations

from typing import Literal

import msgspec

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


class Rule(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    name: str
    severity: Severity
    area: str
    summary: str
    fix: str
    doc: str = ""  # the long form `lilicorr-ckpt rules ID` prints: why it breaks a loader, an example

    def long_doc(self) -> str:
        lines = [f"{self.id} {self.name} ({self.severity}, {self.area})", "", self.summary, ""]
        if self.doc:
            lines += [self.doc.strip(), ""]
        lines += [f"Fix: {self.fix}"]
        return "\n".join(lines) + "\n"


class Waiver(msgspec.Struct, frozen=True, kw_only=True):
    """Why a finding is waived (lilicorr_ckpt/checks/waivers.py): still reported, no longer counted."""

    reason: str
    source: str  # "--ignore", or the config file (and its entry) the waiver comes from


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    rule: str
    name: str
    severity: Severity
    message: str
    fix: str | None = None
    file: str | None = None  # checkpoint-relative file the finding is about
    pointer: str | None = None  # JSON path or tensor name inside `file`
    expected: str | None = None
    actual: str | None = None
    runtimes: list[str] = []  # empty: independent of the runtime
    subjects: list[str] = []  # every key/tensor/module involved
    waived: Waiver | None = None  # set by a waiver: shown as suppressed, not in the summary or the verdicts


RULES: dict[str, Rule] = {}


def rule(id: str, name: str, severity: Severity, area: str, summary: str, fix: str, doc: str = "") -> Rule:
    if id in RULES:
        raise ValueError(f"duplicate rule id {id}")
    RULES[id] = Rule(id, name, severity, area, summary, fix, doc)
    return RULES[id]
