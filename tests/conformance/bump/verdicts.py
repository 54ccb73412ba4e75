"""The conformance harness and the fuzzer run against a candidate release: what each corpus checkpoint (and each
fuzz case) does under the newest supported release and under the candidate, and where validate, judging with the
newest supported profile (the candidate has none yet), disagrees with the candidate's executed loader.

    load(engine, version, root) -> Loader     any release's loader, supported or not (CandidateUnavailable: one
                                              line naming what the harness lacks)
    corpus(engine) -> list[Item]              the checkpoints of the engine's verdict tests
    compare(...) -> Comparison                both releases over the corpus and a fuzz budget
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
CONFORMANCE = HERE.parent
TESTS = CONFORMANCE.parent


def _paths() -> None:
    for path in (TESTS, CONFORMANCE / "vllm"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


class CandidateUnavailable(RuntimeError):
    """The harness cannot load the release: one line naming the module or name it lacks, and what to do."""


class Outcome(NamedTuple):
    letter: str  # L R C SW U, or H: the harness itself failed on it (a harness gap, never a verdict)
    step: str  # the step that decided it
    detail: str

    def code(self) -> str:
        return self.letter if self.letter in ("L", "SW", "U", "H") else f"{self.letter} {self.step}"


class Loader(NamedTuple):
    version: str
    root: Path
    serve: Callable[[Path], Outcome]
    unload: Callable[[], None]


def load(engine: str, version: str, root: Path) -> Loader:
    """The release at `root`, loaded by the engine's conformance harness whether or not lilicorr_ckpt.runtimes
    models it. Raises CandidateUnavailable (one line) where the harness lacks something the release needs."""
    _paths()
    if engine == "vllm":
        import vllm_harness
        import vllm_release

        try:
            release = vllm_release.load(root)
        except vllm_release.ReleaseNotSupported as exc:
            raise CandidateUnavailable(str(exc)) from None

        def serve_vllm(path: Path) -> Outcome:
            try:
                o = vllm_harness.serve(release, path)
            except Exception as exc:  # noqa: BLE001 - the harness's own failure, reported apart
                return Outcome("H", "harness", f"{type(exc).__name__}: {exc}")
            return Outcome(o.verdict, o.stage, o.detail)

        return Loader(version, root, serve_vllm, lambda: vllm_release.unload(release))
    if engine == "sglang":
        from conformance.sglang import releases
        from conformance.sglang.wheel import uninstall

        releases.unload()  # one release installed at a time: the suite's own is parked
        try:
            sglang = releases.import_release(version, root)
        except releases.ReleaseUnavailable as exc:
            raise CandidateUnavailable(str(exc)) from None

        def serve_sglang(path: Path) -> Outcome:
            try:
                o = sglang.serve(path)
            except Exception as exc:  # noqa: BLE001 - StubUsed and the like: a harness gap
                return Outcome("H", "harness", f"{type(exc).__name__}: {exc}")
            return Outcome(o.verdict, o.step or "", o.detail or ("loaded" if o.verdict == "L" else ""))

        return Loader(version, root, serve_sglang, lambda: uninstall(sglang.finder))
    raise KeyError(f"no conformance harness for {engine!r}")


class Item(NamedTuple):
    name: str  # "audit-<row>", "sibling-<case>", "release-<row>"
    build: Callable[[Path], Path]  # folder -> the checkpoint directory


def corpus(engine: str) -> list[Item]:
    """The checkpoints the engine's verdict tests serve: the loader audit's rows, the sibling heads' cases and the
    per-release rows (release_rows.py)."""
    _paths()
    if engine == "sglang":
        from conformance.sglang.support import CASES

        return [Item(c.name, c.build) for c in CASES]
    import release_rows
    from checks import test_loader_audit as audit
    from checks import test_sibling_heads as siblings

    out = [Item(f"audit-{r.name}", lambda d, r=r: audit.build(d, r)) for r in audit.ROWS]
    out += [Item(f"sibling-{c.name}", lambda d, c=c: siblings.build(d, c)) for c in siblings.CASES]
    out += [Item(f"release-{r.row.name}", lambda d, r=r: audit.build(d, r.row)) for r in release_rows.ROWS]
    return out


def pending(engine: str) -> dict[tuple[str, str], str]:
    """The verdict tests' PENDING (known disagreements), keyed by (corpus name as corpus() gives it, release)."""
    _paths()
    if engine == "sglang":
        from conformance.sglang import test_verdicts

        return dict(test_verdicts.PENDING)
    import release_rows
    import test_vllm_conformance as tv
    from checks import test_sibling_heads as siblings

    prefix = {r.name: "audit-" for r in tv.ROWS}
    prefix.update({c.name: "sibling-" for c in siblings.CASES})
    prefix.update({r.row.name: "release-" for r in release_rows.ROWS})
    return {(prefix.get(n, "") + n, v): why for (n, v), why in tv.PENDING.items()}


class Judged(NamedTuple):
    accepted: bool
    rules: tuple[str, ...]  # the errors validate gave (empty when it accepts)


def judge(engine: str, profile: str, path: Path) -> Judged:
    """validate --runtime ENGINE==PROFILE on the checkpoint (SGLang's verdict tests add --deep)."""
    from lilicorr_ckpt.checks.run import validate
    from lilicorr_ckpt.errors import InputError

    try:
        report = validate(str(path), runtime=f"{engine}=={profile}", deep=engine == "sglang")
    except InputError as exc:
        return Judged(False, (f"exit 2: {str(exc)[:60]}",))
    (verdict,) = report.runtimes
    rules = tuple(sorted({f.rule for f in report.findings if f.severity == "error"}))
    return Judged(verdict.accepted, () if verdict.accepted else rules)


@dataclass
class Row:
    name: str
    kind: str  # "corpus" | "fuzz"
    path: Path
    before: Outcome | None = None
    after: Outcome | None = None
    judged: Judged | None = None  # validate with the newest supported profile
    judged_own: Judged | None = None  # validate with the candidate's own profile, where it has one

    def disagrees(self, own: bool = False, before: bool = False) -> bool:
        """validate (the newest supported profile, or the candidate's own) against the candidate's loader (or,
        `before`, against the release it is compared with)."""
        j = self.judged_own if own else self.judged
        o = self.before if before else self.after
        if j is None or o is None or o.letter in ("U", "H"):
            return False
        return j.accepted != (o.letter == "L")

    @property
    def carried(self) -> bool:
        """validate already disagreed with the release compared with: a gap the candidate did not open."""
        return self.disagrees(before=True)


@dataclass
class Comparison:
    engine: str
    against: str
    candidate: str
    profile: str  # the release validate judged with
    own_profile: str | None  # the candidate's own, when lilicorr_ckpt.runtimes has it
    rows: list[Row] = field(default_factory=list)
    fuzz_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> list[Row]:
        return [r for r in self.rows if r.before and r.after and r.before.letter != r.after.letter]

    @property
    def moved(self) -> list[Row]:
        """Same verdict, decided at another step (R at model -> R at load_weights)."""
        return [
            r
            for r in self.rows
            if r.before
            and r.after
            and r.before.letter == r.after.letter
            and r.before.code() != r.after.code()
        ]

    def disagreements(self, own: bool = False) -> list[Row]:
        """The candidate's loader and validate disagree, where validate agreed with the release compared with."""
        return [r for r in self.rows if r.disagrees(own) and not r.carried]

    def carried(self, own: bool = False) -> list[Row]:
        """validate disagrees with both releases' loaders (validate stricter, or a gap older than the candidate)."""
        return [r for r in self.rows if r.disagrees(own) and r.carried]

    def harness_failures(self) -> list[Row]:
        return [r for r in self.rows if r.after and r.after.letter == "H"]


@contextlib.contextmanager
def quiet():
    """The released loaders log every refusal and retry (warnings included): the tool reports outcomes instead."""
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _fuzz_cases(engine: str, root: Path, seed: int) -> Callable[[], Any]:
    from conformance.fuzz.cases import generate
    from conformance.fuzz.keys import read_keys

    return generate(seed, read_keys(engine, root))


def compare(
    engine: str,
    against: tuple[str, Path],
    candidate: tuple[str, Path],
    *,
    profile: str,
    own_profile: str | None,
    fuzz_seconds: float,
    seed: int,
    workdir: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Comparison:
    """Serve the corpus with the candidate (then fuzz it for `fuzz_seconds`), judging each checkpoint with
    validate's `profile`; then serve every one of them with the `against` release. Raises CandidateUnavailable."""
    out = Comparison(engine, against[0], candidate[0], profile, own_profile, fuzz_seconds=fuzz_seconds)
    with tempfile.TemporaryDirectory(prefix="lilicorr-bump-") as tmp, quiet():
        work = workdir or Path(tmp)
        started = time.monotonic()
        loader = load(engine, *candidate)  # first: a release the harness cannot load stops here, in one line
        try:
            for i, item in enumerate(corpus(engine)):
                folder = work / "corpus" / f"{i:04d}"
                folder.mkdir(parents=True)
                out.rows.append(Row(item.name, "corpus", Path(item.build(folder))))
            for row in out.rows:
                row.after = loader.serve(row.path)
            progress(f"{engine} {candidate[0]}: {len(out.rows)} corpus checkpoints served")
            draw = _fuzz_cases(engine, loader.root, seed)
            deadline = time.monotonic() + fuzz_seconds
            seen: set[Any] = set()
            while time.monotonic() < deadline:
                case = draw()
                if case in seen:
                    continue
                seen.add(case)
                path = case.build(work / "fuzz" / f"{len(seen):05d}-{case.name}"[:120])
                out.rows.append(Row(str(case), "fuzz", path, after=loader.serve(path)))
            progress(
                f"{engine} {candidate[0]}: {len(seen)} fuzz cases served (seed {seed}, {fuzz_seconds:g} s)"
            )
        finally:
            loader.unload()
        out.timings["candidate"] = time.monotonic() - started

        started = time.monotonic()
        loader = load(engine, *against)
        try:
            for row in out.rows:
                row.before = loader.serve(row.path)
        finally:
            loader.unload()
        out.timings["against"] = time.monotonic() - started
        progress(f"{engine} {against[0]}: {len(out.rows)} checkpoints served")

        started = time.monotonic()
        for row in out.rows:
            row.judged = judge(engine, profile, row.path)
            if own_profile is not None:
                row.judged_own = judge(engine, own_profile, row.path)
        out.timings["validate"] = time.monotonic() - started
    return out
