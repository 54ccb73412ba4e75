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

# ids no longer in the catalogue, with the condition they named and what replaced them; never reused
RETIRED: dict[str, str] = {
    "LC012": "family-backbone-only (info): the DFlash2, DSpark and Domino heads are checked now: LC014 / LC015 "
             "(routing per runtime), LC016, LC150-LC159, and the head coverage rules",
    "LC128": "causal-ignored (warning): split by what each runtime does with causal: LC117 refused, LC133 run "
             "bidirectionally (a silent mis-load, error), LC134 honoured (info)",
    "LC210": "legacy-names (warning, 'unconfirmed'): the newest vLLM revision refuses them: LC217 (error); LC216 "
             "where the runtime renames them",
    "LC403": "own-head-unconfirmed (warning): SGLang drops an owned lm_head and uses the target's: LC404 (error)",
}


def rule(id: str, name: str, severity: Severity, area: str, summary: str, fix: str, doc: str = "") -> Rule:
    if id in RULES:
        raise ValueError(f"duplicate rule id {id}")
    if id in RETIRED:
        raise ValueError(f"rule id {id} is retired ({RETIRED[id]}); ids are never reused")
    RULES[id] = Rule(id, name, severity, area, summary, fix, doc)
    return RULES[id]
