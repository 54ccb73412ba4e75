"""Waivers: rules a team has decided to accept, with a reason, kept visible in every report.

Sources, all applied by `waive_report`, a pure function of a Report:

- `--ignore LC314,LC015`: waive these rule ids (or id prefixes such as LC3) everywhere;
- `--select LC1,LC2`: only these rules count; findings of the others are left out of the report entirely
  (they were not asked for), which is what --select means in linters;
- a configuration file found from the checkpoint directory upward to the root of the git work tree that holds
  it, or in the checkpoint directory alone when it is in none (a file in /tmp or a home directory never
  applies to a checkpoint below it by accident): `lilicorr.toml`, or a `pyproject.toml` with a
  `[tool.lilicorr-ckpt]` table (in one directory, lilicorr.toml wins); the closest one that has waivers is
  used. A work tree or waiver file owned by another user is not trusted. A file anywhere else applies only
  when named: `--config FILE`, which replaces the search:

      [[tool.lilicorr-ckpt.waivers]]           # in lilicorr.toml: [[waivers]]
      rules = ["LC314"]                         # or rule = "LC314"; prefixes allowed ("LC31")
      runtimes = ["vllm"]                       # optional: only for these engines, or releases ("vllm==V")
      paths = ["drafters/*"]                    # optional: checkpoint directories (globs, relative to the file)
      reason = "NVFP4 head loading checked by hand on vLLM 0.11 (issue #42)"   # required

A waived finding keeps its place in the report with `waived: {reason, source}`: JSON carries it, SARIF marks
the result with a `suppressions` entry, text and Markdown list it as waived, GitHub annotations skip it
(the renderers in report/ do that). The
summary, the per-runtime verdicts and the exit code count only findings that are not waived. A waiver for
some runtimes splits a finding: the other runtimes keep it.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.readfile import read_regular_file
from lilicorr_ckpt.checks import RULES  # the package, imported before this module, registers the catalogue
from lilicorr_ckpt.checks.findings import RETIRED
from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.results import SEVERITY_ORDER, Finding, Report, Waiver
from lilicorr_ckpt.runtimes import RELEASES, runtime_matches, supported_releases

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
            raise UsageError(
                f"{where}: {item!r} is not a rule id or id prefix{hint}; `lilicorr-ckpt rules` lists them"
            )


def check_rule_options(ignore: str | None, select: str | None) -> None:
    """Refuse a bad --ignore/--select before any work (a usage error, exit 4)."""
    parse_rule_list(ignore, "--ignore")
    parse_rule_list(select, "--select")


# --- configuration files --------------------------------------------------------------------------------------

_MAX_CONFIG_BYTES = 4 << 20  # a waiver file is a few lines; more is a mistake (or a trap), never read whole


def _load_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML document; every way it can fail is a usage error naming the file."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib
    try:  # the guarded reader: a FIFO, a device or a huge file is refused by name, never read
        data = read_regular_file(path, what=f"waiver file {path}", max_bytes=_MAX_CONFIG_BYTES)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not valid TOML: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UsageError(
            f"{path} is not valid TOML here: its arrays or tables are nested too deeply"
        ) from None


def _tool_table(path: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    """pyproject.toml's [tool.lilicorr-ckpt] table; None when it has none. A `tool` or `tool.lilicorr-ckpt`
    that is not a table is a usage error naming the key."""
    tool = doc.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise UsageError(
            f"{path}: `tool` must be a table ([tool.{TOOL_TABLE}] holds the waivers), not {_kind(tool)}"
        )
    table = tool.get(TOOL_TABLE)
    if table is not None and not isinstance(table, dict):
        raise UsageError(
            f"{path}: `tool.{TOOL_TABLE}` must be a table ([tool.{TOOL_TABLE}] with `waivers`), "
            f"not {_kind(table)}"
        )
    return table


def _kind(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), f"a {type(value).__name__}")


def read_config(path: Path) -> tuple[Path, dict[str, Any]] | None:
    """(path, waiver table) of one file: a pyproject.toml's [tool.lilicorr-ckpt] (None without one), any
    other file's top level (lilicorr.toml's form)."""
    doc = _load_toml(path)
    if path.name == "pyproject.toml":
        table = _tool_table(path, doc)
        return (path, table) if table is not None else None
    return path, doc


def explicit_config(file: str) -> tuple[Path, dict[str, Any]]:
    """--config FILE: that file's waivers (it must exist and, as a pyproject.toml, have the table)."""
    path = Path(file).expanduser()
    if not path.exists():
        raise UsageError(f"--config {file}: no such file")
    found = read_config(path)
    if found is None:
        raise UsageError(f"--config {file} has no [tool.{TOOL_TABLE}] table")
    return found


def _trusted_owners(checkpoint: Path) -> set[int]:
    """The users whose work tree or waiver file may waive findings of this checkpoint: whoever runs the tool and
    whoever owns the checkpoint directory (a CI container's root validating the runner's checkout)."""
    owners = {os.getuid()} if hasattr(os, "getuid") else set()
    with contextlib.suppress(OSError):
        owners.add(checkpoint.stat().st_uid)
    return owners


def _owned_by(path: Path, owners: set[int]) -> bool:
    if not owners:  # no uids on this platform
        return True
    try:
        return path.lstat().st_uid in owners
    except OSError:
        return False


def search_root(checkpoint: Path) -> Path:
    """Where the search for a waiver file stops: the root of the git work tree holding checkpoint (the closest
    directory with a `.git` owned by a trusted user), or checkpoint itself when it is in none."""
    owners = _trusted_owners(checkpoint)
    for directory in (checkpoint, *checkpoint.parents):
        dot_git = directory / ".git"
        if dot_git.exists() and _owned_by(dot_git, owners):
            return directory
    return checkpoint


def waiver_candidates(checkpoint: str | Path | None) -> list[Path]:
    """Every file find_config may read for a local checkpoint directory (each lilicorr.toml and pyproject.toml from
    it up to search_root), none for a Hub repo: inputs of the command, so that no output of it (`-o`) writes over
    the waivers it applies."""
    if checkpoint is None:
        return []
    directory = Path(checkpoint).expanduser()
    if not directory.is_dir():
        return []
    directory = directory.resolve()
    root = search_root(directory)
    out: list[Path] = []
    while True:
        out += [directory / name for name in CONFIG_FILES if (directory / name).is_file()]
        if directory == root or directory.parent == directory:
            return out
        directory = directory.parent


def find_config(checkpoint: Path) -> tuple[Path, dict[str, Any]] | None:
    """The closest lilicorr.toml or pyproject.toml with a [tool.lilicorr-ckpt] table, from checkpoint up to
    search_root(checkpoint). A candidate owned by an untrusted user is a usage error, not a silent waiver."""
    owners = _trusted_owners(checkpoint.expanduser().resolve())
    for candidate in waiver_candidates(checkpoint):  # closest first
        if not _owned_by(candidate, owners):
            raise UsageError(
                f"waiver file {candidate} belongs to another user: not applied to "
                f"{checkpoint}; pass it with --config if you trust it, or remove it"
            )
        found = read_config(candidate)
        if found is not None:
            return found
    return None


def _strings(value: object) -> list[str] | None:
    """A string or an array of strings, as a list; None for anything else (nested arrays, numbers, tables)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _shown(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_config(path: Path, table: dict[str, Any]) -> list[WaiverRule]:
    """The waivers of a [tool.lilicorr-ckpt] table (or lilicorr.toml); every mistake is a usage error naming the
    file, the entry and the key."""
    pyproject = path.name == "pyproject.toml"
    where = f"{path.name}" + (f" [tool.{TOOL_TABLE}]" if pyproject else "")
    array = f"tool.{TOOL_TABLE}.waivers" if pyproject else "waivers"
    unknown = set(table) - {"waivers"}
    if unknown:
        raise UsageError(
            f"{path}: unknown key(s) {', '.join(sorted(map(str, unknown)))} in {where}; expected `waivers`"
        )
    entries = table.get("waivers", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: `{array}` must be an array of tables ([[{array}]]), not {_kind(entries)}")
    out = []
    for i, entry in enumerate(entries, 1):
        label = f"{path}: waiver {i}"
        extra = set(entry) - _ENTRY_KEYS
        if extra:
            raise UsageError(
                f"{label}: unknown key(s) {', '.join(sorted(extra))}; expected {', '.join(sorted(_ENTRY_KEYS))}"
            )
        rules: list[str] = []
        if "rule" in entry:
            if not isinstance(entry["rule"], str):
                raise UsageError(
                    f'{label}: `rule` must be one rule id as a string (`rule = "LC314"`), got '
                    f"{_shown(entry['rule'])}"
                )
            rules.append(entry["rule"])
        if "rules" in entry:  # with `rule` too, both count
            listed = _strings(entry["rules"])
            if listed is None:
                raise UsageError(
                    f"{label}: `rules` must be a rule id or an array of them "
                    f'(`rules = ["LC314", "LC015"]`), got {_shown(entry["rules"])}'
                )
            rules += listed
        if not rules or not all(r.strip() for r in rules):
            raise UsageError(f'{label}: needs `rule = "LC314"` or `rules = ["LC314", ...]`')
        ids = tuple(dict.fromkeys(r.strip().upper() for r in rules))
        _check_rules(ids, label)
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise UsageError(
                f"{label} ({', '.join(ids)}): a `reason` is required (why this finding is acceptable)"
            )
        runtimes = _strings(entry.get("runtimes", []))
        if runtimes is None or not all(_known_runtime(r) for r in runtimes):
            raise UsageError(
                f"{label}: `runtimes` must list engines among {', '.join(RELEASES)} or releases of them "
                f'("vllm==VERSION"; supported: {supported_releases()}), got {_shown(entry.get("runtimes"))}'
            )
        paths = _strings(entry.get("paths", []))
        if paths is None:
            raise UsageError(
                f"{label}: `paths` must be a directory glob or an array of them, got "
                f"{_shown(entry.get('paths'))}"
            )
        out.append(
            WaiverRule(
                rules=ids,
                reason=reason.strip(),
                source=f"{path.name} waiver {i}",
                runtimes=tuple(runtimes),
                paths=tuple(paths),
                base=path.parent,
            )
        )
    return out


def _known_runtime(entry: str) -> bool:
    """An engine (`vllm`: each of its releases) or one supported release of it (`vllm==VERSION`)."""
    engine, sep, version = entry.partition("==")
    return engine in RELEASES and (not sep or any(p.version == version for p in RELEASES[engine]))


def config_waivers(checkpoint: Path | None, config: str | None = None) -> list[WaiverRule]:
    """The waivers of --config FILE when given, else of the file found for checkpoint (none for a Hub repo)."""
    if config is not None:
        return parse_config(*explicit_config(config))
    if checkpoint is None:
        return []
    found = find_config(checkpoint)
    return parse_config(*found) if found else []


# --- applying them --------------------------------------------------------------------------------------------


def apply_waivers(
    findings: list[Finding],
    waivers: list[WaiverRule],
    *,
    runtimes: list[str],
    select: tuple[str, ...] = (),
    checkpoint: Path | None = None,
) -> list[Finding]:
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
            hit = (
                remaining
                if not w.runtimes
                else [r for r in remaining if any(runtime_matches(r, e) for e in w.runtimes)]
            )
            if not hit:
                continue
            everything = len(hit) == len(mine) and not f.runtimes
            waived_parts.append(
                msgspec.structs.replace(
                    f, runtimes=[] if everything else hit, waived=Waiver(reason=w.reason, source=w.source)
                )
            )
            remaining = [r for r in remaining if r not in hit]
        if remaining:
            keep = f if remaining == mine else msgspec.structs.replace(f, runtimes=remaining)
            out.append(keep)
        out.extend(waived_parts)
    return out


def waive_report(
    report: Report,
    *,
    checkpoint_dir: str | Path | None,
    ignore: str | None = None,
    select: str | None = None,
    strict: bool = False,
    config: str | None = None,
) -> Report:
    """The report with --ignore/--select and the configuration file's waivers applied; summary, verdicts and
    exit code recounted from what is not waived (the report's own records, replaced). config: --config FILE, the waiver file to apply instead of the one found beside the checkpoint.
    Unchanged when there is nothing to apply."""
    ignored = parse_rule_list(ignore, "--ignore")
    selected = parse_rule_list(select, "--select")
    checkpoint = Path(checkpoint_dir) if checkpoint_dir is not None else None
    waivers = (
        [WaiverRule(rules=ignored, reason="--ignore on the command line", source="--ignore")]
        if ignored
        else []
    )
    waivers += config_waivers(checkpoint if checkpoint is not None and checkpoint.is_dir() else None, config)
    if not waivers and not selected:
        return report
    judged = [v.runtime for v in report.runtimes]
    findings = apply_waivers(
        report.findings, waivers, runtimes=judged, select=selected, checkpoint=checkpoint
    )
    findings.sort(key=lambda f: (f.waived is not None, SEVERITY_ORDER[f.severity], f.rule))
    live = [f for f in findings if f.waived is None]
    summary = msgspec.structs.replace(
        report.summary,
        errors=sum(f.severity == "error" for f in live),
        warnings=sum(f.severity == "warning" for f in live),
        infos=sum(f.severity == "info" for f in live),
        waived=len(findings) - len(live),
    )
    verdicts = []
    for v in report.runtimes:
        mine = [f for f in live if not f.runtimes or v.runtime in f.runtimes]
        errors = sum(f.severity == "error" for f in mine)
        verdicts.append(
            msgspec.structs.replace(
                v, accepted=errors == 0, errors=errors, warnings=sum(f.severity == "warning" for f in mine)
            )
        )
    exit_code = 1 if summary.errors or (strict and summary.warnings) else 0
    if report.exit_code > 1:
        exit_code = report.exit_code
    return msgspec.structs.replace(
        report, findings=findings, summary=summary, runtimes=verdicts, exit_code=exit_code
    )
