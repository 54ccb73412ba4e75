"""Waivers: rules a team has decided to accept, with a reason, kept visible in every report.

Sources, all applied by `waive_report`, a pure function of a Report:

- `--ignore LC314,LC015`: waive these rule ids (or id prefixes such as LC3) everywhere;
- `--select LC1,LC2`: only these rules count; findings of the others are left out of the report entirely
  (they were not asked for), which is what --select means in linters;
- a configuration file found from the checkpoint directory upward (stopping at a directory holding `.git`):
  `lilicorr.toml`, or a `pyproject.toml` with a `[tool.lilicorr-ckpt]` table (in one directory, lilicorr.toml
  wins); the closest one that has waivers is used:

      [[tool.lilicorr-ckpt.waivers]]           # in lilicorr.toml: [[waivers]]
      rules = ["LC314"]                         # or rule = "LC314"; prefixes allowed ("LC31")
      runtimes = ["vllm"]                       # optional: only for these runtimes
      paths = ["drafters/*"]                    # optional: checkpoint directories (globs, relative to the file)
      reason = "NVFP4 head loading checked by hand on vLLM 0.11 (issue #42)"   # required

A waived finding keeps its place in the report with `waived: {reason, source}`: JSON carries it, SARIF marks
the result with a `suppressions` entry, text and Markdown list it as waived, GitHub annotations skip it
(the renderers in report/ do that). The
summary, the per-runtime verdicts and the exit code count only findings that are not waived. A waiver for
some runtimes splits a finding: the other runtimes keep it.
"""

from __future__ import annotations

import difflib
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from lilicorr_ckpt.checks import RULES  # the package, imported before this module, registers the catalogue
from lilicorr_ckpt.checks.findings import RETIRED, SEVERITY_ORDER, Finding, Waiver
from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.runtimes import PROFILES

if TYPE_CHECKING:  # pragma: no cover
    from lilicorr_ckpt.checks.run import Report

CONFIG_FILES = ("lilicorr.toml", "pyproject.toml")
TOOL_TABLE = "lilicorr-ckpt"
_ENTRY_KEYS = {"rule", "rules", "runtimes", "paths", "reason"}


class WaiverRule(msgspec.Struct, frozen=True, kw_only=True):
    rules: tuple[str, ...]  # ids or id prefixes
    reason: str
    source: str
    runtimes: tuple[str, ...] = ()  # empty: every runtime
    paths: tuple[str, ...] = ()  # empty: every checkpoint
    base: Path | None = None  # paths are relative to this directory

    def matches_rule(self, rule: str) -> bool:
        return any(rule.startswith(r) for r in self.rules)

    def matches_path(self, checkpoint: Path | None) -> bool:
        if not self.paths:
            return True
        if checkpoint is None or self.base is None:
            return False
        try:
            rel = checkpoint.resolve().relative_to(self.base.resolve()).as_posix()
        except ValueError:
            return False
        return any(fnmatch(rel, pattern.rstrip("/")) for pattern in self.paths)


# --- rule ids -------------------------------------------------------------------------------------------------

def parse_rule_list(text: str | None, option: str) -> tuple[str, ...]:
    """`LC314,LC015` (spaces and repeated commas allowed) -> ids, each an id or a prefix of some id."""
    if text is None:
        return ()
    items = tuple(dict.fromkeys(p.strip().upper() for p in text.replace(" ", ",").split(",") if p.strip()))
    if not items:
        raise UsageError(f"{option} needs rule ids, e.g. {option} LC314,LC015")
    _check_rules(items, option)
    return items


def _check_rules(items: tuple[str, ...], where: str) -> None:
    known = set(RULES)
    for item in items:
        if item in RETIRED:  # waiving it would waive nothing: say what replaced it
            raise UsageError(f"{where}: {item} is a retired rule id, never emitted now ({RETIRED[item]})")
        if not any(rid.startswith(item) for rid in known) or len(item) < 3:
            close = difflib.get_close_matches(item, sorted(known), n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise UsageError(f"{where}: {item!r} is not a rule id or id prefix{hint}; `lilicorr-ckpt rules` lists them")


def check_rule_options(ignore: str | None, select: str | None) -> None:
    """Refuse a bad --ignore/--select before any work (a usage error, exit 4)."""
    parse_rule_list(ignore, "--ignore")
    parse_rule_list(select, "--select")


# --- configuration files --------------------------------------------------------------------------------------

def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None


def find_config(checkpoint: Path) -> tuple[Path, dict[str, Any]] | None:
    """The closest lilicorr.toml or pyproject.toml with a [tool.lilicorr-ckpt] table, from checkpoint upward."""
    directory = checkpoint.expanduser().resolve()
    while True:
        for name in CONFIG_FILES:
            candidate = directory / name
            if candidate.is_file():
                doc = _load_toml(candidate)
                table = doc if name == "lilicorr.toml" else doc.get("tool", {}).get(TOOL_TABLE)
                if isinstance(table, dict):
                    return candidate, table
        if (directory / ".git").exists() or directory.parent == directory:
            return None
        directory = directory.parent


def parse_config(path: Path, table: dict[str, Any]) -> list[WaiverRule]:
    """The waivers of a [tool.lilicorr-ckpt] table (or lilicorr.toml); every mistake is a usage error naming it."""
    where = f"{path.name}" + ("" if path.name == "lilicorr.toml" else f" [tool.{TOOL_TABLE}]")
    unknown = set(table) - {"waivers"}
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in {where}; expected `waivers`")
    entries = table.get("waivers", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: `waivers` must be an array of tables ([[{'waivers' if path.name == 'lilicorr.toml' else f'tool.{TOOL_TABLE}.waivers'}]])")
    out = []
    for i, entry in enumerate(entries, 1):
        label = f"{path}: waiver {i}"
        extra = set(entry) - _ENTRY_KEYS
        if extra:
            raise UsageError(f"{label}: unknown key(s) {', '.join(sorted(extra))}; expected {', '.join(sorted(_ENTRY_KEYS))}")
        rules = entry.get("rules", [])
        if "rule" in entry:
            rules = [entry["rule"], *rules] if isinstance(rules, list) else rules
        if isinstance(rules, str):
            rules = [rules]
        if not rules or not isinstance(rules, list) or not all(isinstance(r, str) and r.strip() for r in rules):
            raise UsageError(f"{label}: needs `rule = \"LC314\"` or `rules = [\"LC314\", ...]`")
        ids = tuple(r.strip().upper() for r in rules)
        _check_rules(ids, label)
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise UsageError(f"{label} ({', '.join(ids)}): a `reason` is required (why this finding is acceptable)")
        runtimes = entry.get("runtimes", [])
        if isinstance(runtimes, str):
            runtimes = [runtimes]
        if not isinstance(runtimes, list) or any(r not in PROFILES for r in runtimes):
            raise UsageError(f"{label}: `runtimes` must list runtimes among {', '.join(PROFILES)}, got {runtimes!r}")
        paths = entry.get("paths", [])
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise UsageError(f"{label}: `paths` must be a list of directory globs")
        out.append(WaiverRule(rules=ids, reason=reason.strip(), source=f"{path.name} waiver {i}",
                              runtimes=tuple(runtimes), paths=tuple(paths), base=path.parent))
    return out


def config_waivers(checkpoint: Path | None) -> list[WaiverRule]:
    if checkpoint is None:
        return []
    found = find_config(checkpoint)
    return parse_config(*found) if found else []


# --- applying them --------------------------------------------------------------------------------------------

def apply_waivers(findings: list[Finding], waivers: list[WaiverRule], *, runtimes: list[str],
                  select: tuple[str, ...] = (), checkpoint: Path | None = None) -> list[Finding]:
    """Pure: findings with --select applied and waivers marked (a finding waived for some of its runtimes is
    split in two). `runtimes` are the runtimes judged, for findings that apply to all of them."""
    out: list[Finding] = []
    for f in findings:
        if select and not any(f.rule.startswith(s) for s in select):
            continue
        if f.waived is not None:
            out.append(f)
            continue
        mine = list(f.runtimes) or list(runtimes)
        remaining = mine
        waived_parts: list[Finding] = []
        for w in waivers:
            if not remaining or not w.matches_rule(f.rule) or not w.matches_path(checkpoint):
                continue
            hit = remaining if not w.runtimes else [r for r in remaining if r in w.runtimes]
            if not hit:
                continue
            everything = len(hit) == len(mine) and not f.runtimes
            waived_parts.append(msgspec.structs.replace(f, runtimes=[] if everything else hit,
                                                        waived=Waiver(reason=w.reason, source=w.source)))
            remaining = [r for r in remaining if r not in hit]
        if remaining:
            keep = f if remaining == mine else msgspec.structs.replace(f, runtimes=remaining)
            out.append(keep)
        out.extend(waived_parts)
    return out


def waive_report(report: Report, *, checkpoint_dir: str | Path | None, ignore: str | None = None,
                 select: str | None = None, strict: bool = False) -> Report:
    """The report with --ignore/--select and the configuration file's waivers applied; summary, verdicts and
    exit code recounted from what is not waived (the report's own records, replaced: checks.run imports this
    module). Unchanged when there is nothing to apply."""
    ignored = parse_rule_list(ignore, "--ignore")
    selected = parse_rule_list(select, "--select")
    checkpoint = Path(checkpoint_dir) if checkpoint_dir is not None else None
    waivers = [WaiverRule(rules=ignored, reason="--ignore on the command line", source="--ignore")] if ignored else []
    waivers += config_waivers(checkpoint if checkpoint is not None and checkpoint.is_dir() else None)
    if not waivers and not selected:
        return report
    judged = [v.runtime for v in report.runtimes]
    findings = apply_waivers(report.findings, waivers, runtimes=judged, select=selected, checkpoint=checkpoint)
    findings.sort(key=lambda f: (f.waived is not None, SEVERITY_ORDER[f.severity], f.rule))
    live = [f for f in findings if f.waived is None]
    summary = msgspec.structs.replace(report.summary, errors=sum(f.severity == "error" for f in live),
                                      warnings=sum(f.severity == "warning" for f in live),
                                      infos=sum(f.severity == "info" for f in live), waived=len(findings) - len(live))
    verdicts = []
    for v in report.runtimes:
        mine = [f for f in live if not f.runtimes or v.runtime in f.runtimes]
        errors = sum(f.severity == "error" for f in mine)
        verdicts.append(msgspec.structs.replace(v, accepted=errors == 0, errors=errors,
                                                warnings=sum(f.severity == "warning" for f in mine)))
    exit_code = 1 if summary.errors or (strict and summary.warnings) else 0
    if report.exit_code > 1:
        exit_code = report.exit_code
    return msgspec.structs.replace(report, findings=findings, summary=summary, runtimes=verdicts, exit_code=exit_code)
