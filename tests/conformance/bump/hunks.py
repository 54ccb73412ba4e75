"""The changed hunks between two releases' sources, in the files that decide loading: a unified diff per file, each
hunk headed by the definition it changes (`path:Class.method`), and a summary count.

Pure: two directory trees and a list of wheel-relative paths in, text out (no network, no harness).

    diff_trees(old_root, new_root, files, read=None) -> list[FileDiff]
    render(diffs, old_label, new_label) -> str       the unified diffs, one hunk header line each
    summary(diffs) -> str                            files, hunks, lines, per definition

`read` maps a path to what the conformance harness reads of it (None: the whole file; a set of top-level names
and `Class.method`s it extracts): a hunk in a definition the harness does not read is marked `[not read]`, so the
hunks that can change an executed verdict stand out.
"""

from __future__ import annotations

import ast
import difflib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CONTEXT = 3  # lines of context around a change, as `diff -u`
MODULE = "<module>"  # a change outside every def and class


@dataclass(frozen=True)
class Hunk:
    where: str  # the innermost definition the change is in: "Class.method", "function", or MODULE
    old_start: int  # 1-based, as a unified diff's @@ line
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  # " ctx", "-old", "+new"
    read: bool = True  # inside what the harness reads of the file

    @property
    def added(self) -> int:
        return sum(1 for line in self.lines if line.startswith("+"))

    @property
    def removed(self) -> int:
        return sum(1 for line in self.lines if line.startswith("-"))


@dataclass
class FileDiff:
    path: str
    status: str  # "changed" | "added" | "removed"
    hunks: list[Hunk] = field(default_factory=list)


def definitions(source: str) -> list[str]:
    """Line (1-based) -> the qualified name of the innermost def or class holding it, MODULE outside them; index 0
    unused. A file that does not parse is all MODULE."""
    lines = source.count("\n") + 2
    out = [MODULE] * lines
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                last = child.end_lineno or child.lineno
                for i in range(first, min(last, lines - 1) + 1):
                    out[i] = name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _is_read(where: str, read: frozenset[str] | None) -> bool:
    if read is None or where == MODULE:  # the whole file, or its imports and constants
        return True
    parts = where.split(".")
    # the definition itself, a class whose every method is kept, or a method lifted out of its class
    return any(".".join(parts[:i]) in read for i in range(1, len(parts) + 1))


def diff_text(old: str, new: str, read: frozenset[str] | None = None) -> list[Hunk]:
    """The hunks turning `old` into `new` (either may be empty: a file added or removed)."""
    a, b = old.splitlines(), new.splitlines()
    where_old, where_new = definitions(old), definitions(new)
    hunks = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        lines: list[str] = []
        first_change: tuple[str, int] | None = None
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[a1:a2]]
                continue
            if first_change is None:
                first_change = ("new", b1 + 1) if b2 > b1 else ("old", a1 + 1)
            lines += ["-" + line for line in a[a1:a2]]
            lines += ["+" + line for line in b[b1:b2]]
        assert first_change is not None
        side, line = first_change
        table = where_new if side == "new" else where_old
        where = table[line] if line < len(table) else MODULE
        hunks.append(
            Hunk(
                where=where,
                old_start=i1 + 1 if i2 > i1 else i1,
                old_count=i2 - i1,
                new_start=j1 + 1 if j2 > j1 else j1,
                new_count=j2 - j1,
                lines=tuple(lines),
                read=_is_read(where, read),
            )
        )
    return hunks


def diff_trees(
    old_root: Path,
    new_root: Path,
    files: Iterable[str],
    read: Mapping[str, frozenset[str] | None] | None = None,
) -> list[FileDiff]:
    """Every file of `files` (wheel-relative) that differs between the two trees, with its hunks."""
    out = []
    for rel in sorted(set(files)):
        old_path, new_path = old_root / rel, new_root / rel
        if not old_path.exists() and not new_path.exists():
            continue
        old = old_path.read_text() if old_path.exists() else ""
        new = new_path.read_text() if new_path.exists() else ""
        if old == new:
            continue
        status = "added" if not old_path.exists() else "removed" if not new_path.exists() else "changed"
        out.append(FileDiff(rel, status, diff_text(old, new, (read or {}).get(rel))))
    return out


def render(diffs: Iterable[FileDiff], old_label: str, new_label: str) -> str:
    """Unified diffs (`--- old/path`, `+++ new/path`), each hunk's @@ line followed by `path:definition`."""
    out: list[str] = []
    for d in diffs:
        out.append(f"--- {old_label}/{d.path}" + (" (absent)" if d.status == "added" else ""))
        out.append(f"+++ {new_label}/{d.path}" + (" (absent)" if d.status == "removed" else ""))
        for h in d.hunks:
            mark = "" if h.read else "  [not read by the harness]"
            out.append(
                f"@@ -{h.old_start},{h.old_count} +{h.new_start},{h.new_count} @@ {d.path}:{h.where}{mark}"
            )
            out += list(h.lines)
    return "\n".join(out)


def summary(diffs: list[FileDiff]) -> str:
    """`N files changed (a added, r removed), H hunks (R in what the harness reads), +A -D lines`, then one line
    per file: its hunks by definition."""
    hunks = [h for d in diffs for h in d.hunks]
    added = sum(1 for d in diffs if d.status == "added")
    removed = sum(1 for d in diffs if d.status == "removed")
    read = sum(1 for h in hunks if h.read)
    head = (
        f"{len(diffs)} files changed ({added} added, {removed} removed), {len(hunks)} hunks ({read} in what "
        f"the harness reads), +{sum(h.added for h in hunks)} -{sum(h.removed for h in hunks)} lines"
    )
    lines = [head]
    for d in diffs:
        by = Counter(h.where for h in d.hunks)
        parts = ", ".join(f"{w} ({n})" if n > 1 else w for w, n in by.items())
        tag = "" if d.status == "changed" else f" [{d.status}]"
        lines.append(f"  {d.path}{tag}: {parts}")
    return "\n".join(lines)
