"""python -m tests.conformance.bump ENGINE VERSION: what a new engine release changes, before its Bump is written.

1. fetches the sources of VERSION and of the release it is compared with (tests/conformance/engines.py: only the
   wheel members the suite reads, by HTTP Range, cached in .cache/engines);
2. lists the changed hunks in the files that decide loading (engines.deciding: what the harness executes or
   extracts, what the fuzzer reads keys from): a unified diff per file, each hunk headed `path:definition`, and
   a summary count; the harness's stubbed modules that changed are listed apart (their code is never executed);
3. serves the conformance corpus (the verdict tests' checkpoints and release rows) and a fixed fuzz budget with
   both releases' executed loaders, and judges each checkpoint with validate at the newest supported profile
   (VERSION has none yet): every verdict that changed (before -> after) and every disagreement between validate
   and VERSION's loader, which is what the new Bump must capture;
4. stops in one line when the harness cannot load VERSION (a module or name it imports that the harness neither
   executes nor stubs);
5. prints the steps left to a human.

VERSION already supported (to see what the tool says about a release whose Bump exists): --against names the
older supported release to compare with (default: the one before VERSION), and validate judges with that one's
profile, as if VERSION were new; the disagreements left with VERSION's own profile are printed too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from . import hunks
from .verdicts import CandidateUnavailable, Comparison, Row, compare, pending

ENGINES = ("vllm", "sglang")
DISPLAY = {"vllm": "vLLM", "sglang": "SGLang"}


class BumpError(RuntimeError):
    """The tool cannot go on: one line saying why."""


def _engines():
    from .. import engines

    return engines


def _key(version: str) -> tuple[int, ...]:
    from lilicorr_ckpt.runtimes.base import version_key

    return version_key(version)


def resolve(engine: str, version: str, against: str | None) -> tuple[str, str, str | None]:
    """(against, the profile validate judges with, VERSION's own profile or None)."""
    supported = _engines().versions(engine)
    if not all(part.isdigit() for part in version.split(".")):
        raise BumpError(f"{version!r} is not a release version (numbers such as 0.35.0)")
    known = version in supported
    if against is None:
        older = [v for v in supported if _key(v) < _key(version)]
        if not older:
            raise BumpError(
                f"{DISPLAY[engine]} {version} is older than every supported release ({supported[0]})"
            )
        against = older[-1]
    if against not in supported:
        raise BumpError(
            f"--against {against}: not a supported {DISPLAY[engine]} release ({', '.join(supported)})"
        )
    if _key(against) >= _key(version):
        raise BumpError(f"--against {against} is not older than {version}")
    if not known and against != supported[-1]:
        print(
            f"note: {version} is compared with {against}, not with the newest supported release {supported[-1]}",
            file=sys.stderr,
        )
    return against, against, version if known else None


def fetch(engine: str, version: str) -> Path:
    """The release's sources (engines.sources), a failed fetch as one line."""
    import pytest

    try:
        return _engines().sources(engine, version)
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        raise BumpError(str(getattr(exc, "msg", exc)).splitlines()[0]) from None


def _fetched(root: Path) -> str:
    marker = root / ".complete"
    return " ".join(marker.read_text().split()) if marker.exists() else "unpacked"


def _outcome(o) -> str:
    return o.code() if o is not None else "?"


def _short(text: str, width: int = 150) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _said(row: Row, own: bool = False) -> str:
    j = row.judged_own if own else row.judged
    if j is None:
        return "?"
    return "accepts" if j.accepted else f"refuses ({', '.join(j.rules) or 'no error rule'})"


def report_verdicts(c: Comparison, out: TextIO, show_all: bool = False) -> None:
    name = DISPLAY[c.engine]
    corpus = [r for r in c.rows if r.kind == "corpus"]
    fuzzed = [r for r in c.rows if r.kind == "fuzz"]
    known = pending(c.engine)
    print(
        f"\n== loader verdicts, {name} {c.against} -> {c.candidate}: {len(corpus)} corpus checkpoints, "
        f"{len(fuzzed)} fuzz cases ({c.fuzz_seconds:g} s)",
        file=out,
    )
    changed = c.changed
    print(f"{len(changed)} verdicts changed (before -> after):", file=out)
    for r in changed:
        assert r.before and r.after
        print(
            f"  [{r.kind}] {r.name}: {_outcome(r.before)} -> {_outcome(r.after)}  ({_short(r.after.detail)})",
            file=out,
        )
    if c.moved:
        print(f"{len(c.moved)} verdicts decided at another step (same letter):", file=out)
        for r in c.moved:
            print(f"  [{r.kind}] {r.name}: {_outcome(r.before)} -> {_outcome(r.after)}", file=out)
    failures = c.harness_failures()
    if failures:
        print(
            f"{len(failures)} checkpoints the harness could not serve under {c.candidate} (harness gaps):",
            file=out,
        )
        for r in failures:
            assert r.after
            print(f"  [{r.kind}] {r.name}: {_short(r.after.detail)}", file=out)
    routed = [r for r in c.rows if r.after and r.after.letter == "U"]
    if routed:
        print(f"{len(routed)} routed to code the harness does not execute (U): not judged", file=out)

    bad = c.disagreements()
    print(
        f"\n== validate --runtime {c.engine}=={c.profile} against {name} {c.candidate}'s executed loader: "
        f"{len(bad)} new disagreements (validate agrees with {c.against}'s loader, not with {c.candidate}'s: what "
        "the Bump must capture)",
        file=out,
    )
    for r in bad:
        assert r.after
        print(
            f"  [{r.kind}] {r.name}: {name} {c.candidate} {_outcome(r.after)} ({_short(r.after.detail, 120)}); "
            f"validate {_said(r)}",
            file=out,
        )
    carried = c.carried()
    shown = carried if show_all else [r for r in carried if r.kind == "corpus"]
    print(
        f"{len(carried)} disagreements carried over (validate disagrees with {c.against}'s loader as well: "
        f"PENDING, or validate stricter than both), {len(carried) - len(shown)} fuzz cases among them not listed "
        "(--all lists them)",
        file=out,
    )
    for r in shown:
        assert r.after
        note = " [PENDING]" if (r.name, c.profile) in known else ""
        print(
            f"  [{r.kind}] {r.name}: {_outcome(r.before)} / {_outcome(r.after)}; validate {_said(r)}{note}",
            file=out,
        )
    if c.own_profile is not None:
        left = c.disagreements(own=True)
        print(
            f"\n== with {name} {c.own_profile}'s own profile (its Bump exists): {len(left)} new disagreements left, "
            f"{len(c.carried(own=True))} carried over",
            file=out,
        )
        for r in left:
            note = (
                " [PENDING]"
                if (r.name, c.own_profile) in known
                else " [not captured by the Bump, not PENDING]"
            )
            print(
                f"  [{r.kind}] {r.name}: {_outcome(r.after)}; validate {_said(r, own=True)}{note}", file=out
            )


def report_tables(c: Comparison, out: TextIO) -> None:
    """The entries the per-release tables of the verdict tests need for the candidate."""
    corpus = {r.name: r for r in c.rows if r.kind == "corpus"}
    print("\n== the per-release tables for " + c.candidate, file=out)
    if c.engine == "vllm":
        from .verdicts import _paths

        _paths()
        import test_vllm_conformance as tv

        changes = {}
        for name, r in corpus.items():
            kind, _, bare = name.partition("-")
            if kind in ("audit", "sibling") and r.after and r.after.letter not in ("H",):
                base = tv.pinned(bare, tv.BASE)
                if r.after.letter != base and not (r.after.letter == "U" and bare in tv.READ_NOT_EXECUTED):
                    changes[bare] = r.after.letter
        print(
            f"tests/conformance/vllm/test_vllm_conformance.py CHANGES[{c.candidate!r}] (against {tv.BASE}):",
            file=out,
        )
        print("    " + repr(dict(sorted(changes.items()))), file=out)
        committed = tv.CHANGES.get(c.candidate)
        if committed is not None:
            same = committed == changes
            print(f"    (committed: {'the same' if same else repr(committed)})", file=out)
        print("tests/conformance/vllm/release_rows.py, each row's vllm table:", file=out)
        for name, r in corpus.items():
            if name.startswith("release-") and r.after:
                print(f"    {name.removeprefix('release-')}: {c.candidate!r}: {r.after.letter!r}", file=out)
    else:
        print(
            "tests/conformance/sglang/executed.py: rewritten from what every release does once the Bump is in "
            "(its step 2 below); the rows whose outcome changed are listed above",
            file=out,
        )


def steps(engine: str, version: str, known: bool, out: TextIO) -> None:
    name = DISPLAY[engine]
    module = f"lilicorr_ckpt/runtimes/{engine}.py"
    print("\n== left to a human", file=out)
    if known:
        print(
            f"{name} {version} is supported already: compare its Bump in {module} with the disagreements above",
            file=out,
        )
    lines = [
        f"append Bump(version={version!r}, fields={{...}}, notes=(...)) to {module}: a field for each disagreement "
        "above (the RuntimeProfile field that decides it; a new field in lilicorr_ckpt/runtimes/base.py and its "
        "check in lilicorr_ckpt/checks/ where none does), a note per changed hunk that decides a verdict "
        "(`file:function: what it now does`), or one note saying nothing decisive changed",
    ]
    if engine == "vllm":
        lines.append(
            "add the per-release tables printed above (CHANGES, each release row's letter), a release_rows.py "
            "row for a change the corpus does not exercise yet, and PENDING for a disagreement validate cannot "
            "fix now"
        )
    else:
        lines.append(
            "rewrite the recorded outcomes: cd tests && python -m conformance.sglang.executed && ruff format "
            "conformance; add release_rows.py rows for changes the corpus does not exercise yet, and PENDING "
            "(test_verdicts.py) for a disagreement validate cannot fix now"
        )
    lines += [
        f"update docs/validate.md: the {name} {version} audit table (the hunks above that decide a verdict)",
        "run the suite: python -m pytest -q -n 2 tests/conformance tests/test_runtime_releases.py "
        f"(every test now runs {version} too), then python -m tests.conformance.fuzz --engine {engine} "
        f"--release {version} --seconds 600",
    ]
    for i, line in enumerate(lines, 1):
        print(f"{i}. {line}", file=out)


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.bump", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("version", help="the release to bump to, e.g. 0.35.0")
    parser.add_argument(
        "--against", help="the supported release to compare with (default: the newest before VERSION)"
    )
    parser.add_argument("--fuzz-seconds", type=float, default=60.0, help="the fuzzer's budget (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="the fuzzer's seed (default 1)")
    parser.add_argument(
        "--diff-file", type=Path, help="write the unified diffs there, print only the hunk list"
    )
    parser.add_argument("--all", action="store_true", help="list every carried-over fuzz disagreement too")
    parser.add_argument("--no-run", action="store_true", help="only fetch and diff: no harness, no fuzzer")
    args = parser.parse_args(argv)
    engine, version = args.engine, args.version
    name = DISPLAY[engine]
    try:
        against, profile, own = resolve(engine, version, args.against)
        started = time.monotonic()
        old_root, new_root = fetch(engine, against), fetch(engine, version)
        print(f"== {name} {version} against {against}", file=out)
        print(f"{against}: {_fetched(old_root)}\n{version}: {_fetched(new_root)}", file=out)

        deciding = _engines().deciding(engine, new_root)
        files = deciding.files(old_root, new_root)
        diffs = hunks.diff_trees(old_root, new_root, files, files)
        text = hunks.render(diffs, f"{engine}-{against}", f"{engine}-{version}")
        print(f"\n== the files that decide loading ({len(files)}): changed hunks", file=out)
        print(hunks.summary(diffs), file=out)
        if args.diff_file:
            args.diff_file.write_text(text + "\n")
            print(f"the unified diffs: {args.diff_file}; the hunks:", file=out)
            for line in text.splitlines():
                if line.startswith("@@ "):
                    print("  " + line, file=out)
        else:
            print(text, file=out)
        stubbed = hunks.diff_trees(old_root, new_root, deciding.stubbed_files(old_root, new_root))
        if stubbed:
            print(
                f"\n{len(stubbed)} modules the harness stubs changed (never executed: read them for serving "
                "infrastructure that starts to decide loading):",
                file=out,
            )
            for d in stubbed:
                print(f"  {d.path} [{d.status}]: {len(d.hunks)} hunks", file=out)
        if args.no_run:
            return 0

        comparison = compare(
            engine,
            (against, old_root),
            (version, new_root),
            profile=profile,
            own_profile=own,
            fuzz_seconds=args.fuzz_seconds,
            seed=args.seed,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        report_verdicts(comparison, out, args.all)
        report_tables(comparison, out)
        steps(engine, version, own is not None, out)
        took = time.monotonic() - started
        print(
            f"\n({took:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in comparison.timings.items()) + ")",
            file=out,
        )
        return 0
    except (BumpError, CandidateUnavailable) as exc:
        print(f"bump: {exc}", file=sys.stderr)
        return 1
