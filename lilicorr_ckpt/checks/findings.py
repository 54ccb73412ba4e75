"""Findings and the rule registry. Rules know nothing about output formats; reports know nothing
about rules beyond this metadata. Each rule carries its long form (what it does, why it matters, an example, the
fix), rendered here for `lilicorr-ckpt rules ID` and docs/rules.md."""

from __future__ import annotations

import re
import textwrap

import msgspec

# the records a finding is made of are data (lilicorr_ckpt/results.py); re-exported for the checks
from lilicorr_ckpt.results import SEVERITY_ORDER as SEVERITY_ORDER
from lilicorr_ckpt.results import Finding as Finding
from lilicorr_ckpt.results import Severity
from lilicorr_ckpt.results import Waiver as Waiver


class Rule(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    name: str
    severity: Severity
    area: str
    summary: str
    fix: str
    # the long form (`lilicorr-ckpt rules ID`, docs/rules.md): what fires the rule, why it breaks or silently
    # degrades a loader, a concrete case that triggers it. Paragraphs are separated by a blank line; lines
    # indented by four spaces are a verbatim block (a config snippet, tensor names).
    doc: str = ""  # What it does
    why: str = ""  # Why it matters
    example: str = ""  # Example

    def sections(self) -> list[tuple[str, str]]:
        """(title, text) of the long form, in order; a section with no text is left out."""
        parts = [("What it does", self.doc), ("Why it matters", self.why), ("Example", self.example),
                 ("Fix", self.fix)]
        return [(title, text.strip("\n")) for title, text in parts if text.strip()]

    def long_doc(self) -> str:
        """The long form for a terminal: the rule's line, its summary, then each section."""
        lines = [f"{self.id} {self.name} ({self.severity}, {self.area})", "", *_wrap(self.summary, ""), ""]
        for title, text in self.sections():
            lines += [f"{title}:", *_wrap(text, "  "), ""]
        return "\n".join(lines)

    def markdown(self) -> str:
        """The rule's section of docs/rules.md, under an anchor of its id (SARIF helpUri points there)."""
        lines = [f'<a id="{self.id.lower()}"></a>', "", f"## {self.id} `{self.name}`", "",
                 f"**{self.severity}** · {self.area} · {self.summary}", ""]
        for title, text in self.sections():
            lines += [f"**{title}.**", "", _dedent_blocks(text), ""]
        return "\n".join(lines)


def _paragraphs(text: str) -> list[list[str]]:
    return [p.split("\n") for p in re.split(r"\n\s*\n", text.strip("\n")) if p.strip()]


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    """Prose paragraphs filled to `width`; verbatim blocks (four-space indent) kept line for line."""
    out: list[str] = []
    for k, para in enumerate(_paragraphs(text)):
        if k:
            out.append("")
        if all(line.startswith("    ") for line in para):
            out += [indent + line for line in para]
        else:
            out += textwrap.wrap(" ".join(line.strip() for line in para), width, initial_indent=indent,
                                 subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
    return out


def _dedent_blocks(text: str) -> str:
    """Markdown: prose paragraphs as written, verbatim blocks fenced."""
    out = []
    for para in _paragraphs(text):
        if all(line.startswith("    ") for line in para):
            out.append("```\n" + "\n".join(line[4:] for line in para) + "\n```")
        else:
            out.append(" ".join(line.strip() for line in para))
    return "\n\n".join(out)


RULES: dict[str, Rule] = {}

# ids no longer in the catalogue, never reused: "name (severity): what replaced it" (`rules ID` and docs/rules.md
# print the two parts)
RETIRED: dict[str, str] = {
    "LC012": "family-backbone-only (info): the DFlash2, DSpark and Domino heads are checked now: LC014 / LC015 "
             "(routing per runtime), LC016, LC150-LC159, and the head coverage rules",
    "LC128": "causal-ignored (warning): split by what each runtime does with causal: LC117 refused, LC133 run "
             "bidirectionally (a silent mis-load, error), LC134 honoured (info)",
    "LC210": "legacy-names (warning, 'unconfirmed'): the newest vLLM revision refuses them: LC217 (error); LC216 "
             "where the runtime renames them",
    "LC403": "own-head-unconfirmed (warning): SGLang drops an owned lm_head and uses the target's: LC404 (error)",
}


def rule(id: str, name: str, severity: Severity, area: str, summary: str, fix: str, doc: str = "",
         why: str = "", example: str = "") -> Rule:
    if id in RULES:
        raise ValueError(f"duplicate rule id {id}")
    if id in RETIRED:
        raise ValueError(f"rule id {id} is retired ({RETIRED[id]}); ids are never reused")
    RULES[id] = Rule(id, name, severity, area, summary, fix, doc, why, example)
    return RULES[id]


def retired_parts(rule_id: str) -> tuple[str, str]:
    """(what the retired id named, what replaced it) from its RETIRED entry ("name (severity): replacement")."""
    text = RETIRED[rule_id]
    named, sep, replaced = text.partition("): ")
    return (named + ")", replaced) if sep else ("", text)


def retired_long_doc(rule_id: str) -> str:
    """`lilicorr-ckpt rules ID` for a retired id: what it named and what replaced it."""
    named, replaced = retired_parts(rule_id)
    name, _, severity = named.partition(" (")
    head = f"{rule_id} {name} (retired; was: {severity[:-1]})" if named else f"{rule_id} (retired)"
    lines = [head, "", *_wrap("No longer in the catalogue: no finding carries this id, and it is never reused.", ""),
             "", "Replaced by:", *_wrap(replaced, "  "), ""]
    return "\n".join(lines)


def retired_markdown(rule_id: str) -> str:
    """A retired id's entry in docs/rules.md, under its own anchor (old SARIF logs still link to it)."""
    named, replaced = retired_parts(rule_id)
    name, _, severity = named.partition(" (")
    title = f"### {rule_id} `{name}` (retired)" if named else f"### {rule_id} (retired)"
    was = f" (was: {severity[:-1]})" if named else ""
    return "\n".join([f'<a id="{rule_id.lower()}"></a>', "", title, "",
                      f"No longer in the catalogue{was}; the id is never reused. Replaced by: {replaced.rstrip('.')}.",
                      ""])
