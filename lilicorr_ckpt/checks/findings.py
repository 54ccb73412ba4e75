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
        parts = [
            ("What it does", self.doc),
            ("Why it matters", self.why),
            ("Example", self.example),
            ("Fix", self.fix),
        ]
        return [(title, text.strip("\n")) for title, text in parts if text.strip()]

    def long_doc(self) -> str:
        """The long form for a terminal: the rule's line, its summary, then each section."""
        lines = [f"{self.id} {self.name} ({self.severity}, {self.area})", "", *_wrap(self.summary, ""), ""]
        for title, text in self.sections():
            lines += [f"{title}:", *_wrap(text, "  "), ""]
        return "\n".join(lines)

    def markdown(self) -> str:
        """The rule's section of docs/rules.md, under an anchor of its id (SARIF helpUri points there)."""
        lines = [
            f'<a id="{self.id.lower()}"></a>',
            "",
            f"## {self.id} `{self.name}`",
            "",
            f"**{self.severity}** · {self.area} · {self.summary}",
            "",
        ]
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
            out += textwrap.wrap(
                " ".join(line.strip() for line in para),
                width,
                initial_indent=indent,
                subsequent_indent=indent,
                break_on_hyphens=False,
                break_long_words=False,
            )
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
# error rules whose every error is a silent mis-load: the runtime loads the checkpoint and serves another function
# than the trained one (the card's "loads silently wrong" column; a finding's silent_for adds runtimes for rules
# whose errors are refusals elsewhere)
SILENT_RULES = frozenset(
    {
        "LC133",  # causal draft run bidirectionally
        "LC138",  # use_swa ignored: full attention
        "LC145",  # taps captured in layer order: a permuted fc
        "LC160",  # use_gemma_norm not read
        "LC161",  # rope_dim not read
        "LC163",  # DSpark mask token from the other place
        "LC164",  # DFlash2 rerouted to NoPE layers
        "LC173",  # eagle aux layer ids read first
        "LC175",  # no fc without use_aux_hidden_state
        "LC181",  # norms with no positive eps floor: NaN outputs
        "LC205",  # convolution tensors dropped
        "LC327",  # fused shards served with the largest global scale
        "LC402",  # owned lm_head ignored
        "LC404",  # owned lm_head dropped
        "LC508",  # draft positions past its rotary table
        "LC609",  # a duplicated header key: one entry kept
        "LC701",  # NaN / Inf weights
        "LC703",  # an all-zero scale
        "LC704",  # a negative scale
    }
)

RETIRED: dict[str, str] = {
    "LC012": "family-backbone-only (info): the DFlash2, DSpark and Domino heads are checked now: LC014 / LC015 "
    "(routing per runtime), LC016, LC150-LC159, and the head coverage rules",
    "LC128": "causal-ignored (warning): split by what each runtime does with causal: LC117 refused, LC133 run "
    "bidirectionally (a silent mis-load, error), LC134 honoured (info)",
    "LC146": "rope-theta-absent (warning, the runtimes assume different defaults): vLLM takes the config "
    "class's default like SGLang and TensorRT-LLM (transformers' Qwen3Config fills rope_parameters before "
    "set_default_rope_theta's 1e6 could apply), so no selected runtimes differ: LC147 (info)",
    "LC154": "markov-head-type-unconfirmed (warning): vLLM builds the vanilla Markov head only and has no "
    "parameter for the gated or rnn tensors (qwen3_dspark.py): LC153 (error)",
    "LC210": "legacy-names (warning, 'unconfirmed'): the newest vLLM revision refuses them: LC217 (error); LC216 "
    "where the runtime renames them",
    "LC403": "own-head-unconfirmed (warning): SGLang drops an owned lm_head and uses the target's: LC404 (error)",
    "LC130": "taps-vs-draft-layers (error): SGLang's DFlashDraftModel.__init__ takes num_target_layers as "
    "max(target_layer_ids) + 1 when it is absent, so the ids are never checked against the draft's layers",
    "LC324": "flat-group-size-missing (error): SGLang's ModelOptFp4Config.from_config defaults NVFP4's group "
    "size to 16 when the flat form gives none: LC321 where the weights used another, LC325 where the "
    "group size is not 16",
}


def rule(
    id: str,
    name: str,
    severity: Severity,
    area: str,
    summary: str,
    fix: str,
    doc: str = "",
    why: str = "",
    example: str = "",
) -> Rule:
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
    lines = [
        head,
        "",
        *_wrap("No longer in the catalogue: no finding carries this id, and it is never reused.", ""),
        "",
        "Replaced by:",
        *_wrap(replaced, "  "),
        "",
    ]
    return "\n".join(lines)


def retired_markdown(rule_id: str) -> str:
    """A retired id's entry in docs/rules.md, under its own anchor (old SARIF logs still link to it)."""
    named, replaced = retired_parts(rule_id)
    name, _, severity = named.partition(" (")
    title = f"### {rule_id} `{name}` (retired)" if named else f"### {rule_id} (retired)"
    was = f" (was: {severity[:-1]})" if named else ""
    return "\n".join(
        [
            f'<a id="{rule_id.lower()}"></a>',
            "",
            title,
            "",
            f"No longer in the catalogue{was}; the id is never reused. Replaced by: {replaced.rstrip('.')}.",
            "",
        ]
    )


# A hostile checkpoint can make one rule fire for every one of its tensors or keys: the report keeps it readable
# (and its JSON bounded) by listing at most this many findings per rule and subjects per finding, and saying so.
MAX_FINDINGS_PER_RULE = 100
MAX_SUBJECTS = 1000


def _cap_subjects(finding: Finding, subjects: list[str], omitted: int = 0) -> Finding:
    if len(subjects) <= MAX_SUBJECTS and not omitted:
        return (
            finding if subjects is finding.subjects else msgspec.structs.replace(finding, subjects=subjects)
        )
    kept = subjects[:MAX_SUBJECTS]
    return msgspec.structs.replace(
        finding, subjects=kept, subjects_omitted=omitted + len(subjects) - len(kept)
    )


def bound_findings(findings: list[Finding]) -> list[Finding]:
    """The findings with at most MAX_FINDINGS_PER_RULE per rule (the rest summarised in one more finding of that
    rule, which names how many it stands for) and at most MAX_SUBJECTS subjects each (the count left out in
    subjects_omitted). Order is kept; a list within the caps is returned as it is."""
    per_rule: dict[str, list[int]] = {}
    for i, f in enumerate(findings):
        per_rule.setdefault(f.rule, []).append(i)
    summarised: dict[int, Finding] = {}  # index of a rule's last listed finding -> its summary
    dropped: set[int] = set()
    for indices in per_rule.values():
        if len(indices) <= MAX_FINDINGS_PER_RULE:
            continue
        rest = [findings[i] for i in indices[MAX_FINDINGS_PER_RULE - 1 :]]
        dropped.update(indices[MAX_FINDINGS_PER_RULE - 1 :])
        summarised[indices[MAX_FINDINGS_PER_RULE - 1]] = _summary(rest)
    out = []
    for i, f in enumerate(findings):
        if i in summarised:
            out.append(summarised[i])
        elif i not in dropped:
            out.append(_cap_subjects(f, f.subjects))
    return out


def _summary(rest: list[Finding]) -> Finding:
    """One finding standing for `rest` (same rule): the first one's message, how many more there are, every
    runtime and (capped) every subject involved."""
    first = rest[0]
    runtimes = sorted({r for f in rest for r in f.runtimes}) if all(f.runtimes for f in rest) else []
    subjects: list[str] = []
    omitted = 0
    for f in rest:
        room = MAX_SUBJECTS + 1 - len(subjects)  # one over the cap marks the list as cut
        subjects += f.subjects[:room]
        omitted += max(0, len(f.subjects) - room) + f.subjects_omitted
    files = {f.file for f in rest}
    summary = msgspec.structs.replace(
        first,
        message=f"{first.message} ({len(rest) - 1} more {first.rule} findings like it are not listed one by "
        "one)",
        runtimes=runtimes,
        file=first.file if len(files) == 1 else None,
        pointer=first.pointer if len(rest) == 1 else None,
        expected=None,
        actual=None,
    )
    return _cap_subjects(summary, subjects, omitted)
