"""The differential fuzzer: validate against each supported release's executed loader, case by case.

For a release, each case (cases.py) is built once and judged twice: `validate --runtime ENGINE==VERSION` (accepts
or refuses) and the release's own loading code run by the conformance harness (L loads; R refuses; C crashes; SW
loads but serves another function; U routes to code the harness does not execute). They agree when validate
accepts exactly the L cases. Every disagreement is printed as the corpus row that reproduces it (a `Case(...)` line
for corpus.py), with what the loader did and what validate said.

    python -m tests.conformance.fuzz --seconds 600              # every supported release, the time split evenly
    python -m tests.conformance.fuzz --engine vllm --seed 7 --seconds 120

The conformance suite runs a fixed-seed budget per release (the harness tests call `fuzz_release`) and the
committed corpus of every disagreement found so far (corpus.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.errors import InputError

from .cases import Case, generate
from .keys import read_keys

HERE = Path(__file__).resolve().parent
CONFORMANCE = HERE.parent
TESTS = CONFORMANCE.parent
for _path in (TESTS, CONFORMANCE / "vllm"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


HARNESS_FAILURES: list[Verdict] = []  # cases the harness could not serve (its bugs), for the report


class Verdict(NamedTuple):
    case: Case
    release: str  # "vllm==0.33.0"
    loader: str  # L / R / C / SW / U
    detail: str
    accepted: bool  # validate's verdict
    rules: tuple[str, ...]  # the error rules validate gave

    @property
    def agrees(self) -> bool:
        # U: routed to code the harness does not execute; H: the harness itself failed on the case (reported
        # apart: a harness bug, not a verdict)
        return self.loader in ("U", "H") or self.accepted == (self.loader == "L")

    def row(self) -> str:
        said = "accepts" if self.accepted else f"refuses ({', '.join(self.rules)})"
        detail = " ".join(self.detail.split())[:160]
        return f"{self.case},  # {self.release}: the loader {self.loader} ({detail}); validate {said}"


def judge(
    case: Case, path: Path, engine: str, version: str, serve: Callable[[Path], tuple[str, str]]
) -> Verdict:
    """Both verdicts for one built case."""
    release = f"{engine}=={version}"
    try:
        report = validate(str(path), runtime=release)
        accepted = not report.summary.errors
        rules = tuple(sorted({f.rule for f in report.findings if f.severity == "error"}))
    except InputError as exc:  # validate refuses to read it at all: a refusal (exit 2)
        accepted, rules = False, (f"exit 2: {str(exc)[:60]}",)
    try:
        letter, detail = serve(path)
    except Exception as exc:  # noqa: BLE001 - the harness's own failure, kept apart from the verdicts
        letter, detail = "H", f"the harness failed: {type(exc).__name__}: {exc}"
    return Verdict(case, release, letter, detail, accepted, rules)


def fuzz_release(
    engine: str,
    version: str,
    serve: Callable[[Path], tuple[str, str]],
    root: Path,
    *,
    seed: int,
    seconds: float,
    workdir: Path,
    limit: int | None = None,
) -> tuple[int, list[Verdict]]:
    """(cases run, disagreements) for `seconds` of generated cases against one loaded release."""
    draw = generate(seed, read_keys(engine, root))
    deadline = time.monotonic() + seconds
    seen: set[Case] = set()
    out: list[Verdict] = []
    runs = 0
    harness_failures: list[Verdict] = []
    while time.monotonic() < deadline and (limit is None or runs < limit):
        case = draw()
        if case in seen:
            continue
        seen.add(case)
        path = case.build(workdir / f"{runs:05d}-{case.name}"[:200])
        verdict = judge(case, path, engine, version, serve)
        runs += 1
        if not verdict.agrees:
            out.append(verdict)
        elif verdict.loader == "H":
            harness_failures.append(verdict)
    HARNESS_FAILURES.extend(harness_failures)
    return runs, out


def run_cases(
    cases: Iterable[Case], engine: str, version: str, serve: Callable[[Path], tuple[str, str]], workdir: Path
) -> list[Verdict]:
    """Every case of a fixed list (the committed corpus), each one's verdicts."""
    out = []
    for i, case in enumerate(cases):
        path = case.build(workdir / f"corpus-{i:04d}-{case.name}"[:200])
        out.append(judge(case, path, engine, version, serve))
    return out


# ---------------------------------------------------------------- the harnesses, one release at a time


def vllm_serve(release: Any) -> Callable[[Path], tuple[str, str]]:
    """serve() over a vLLM release already loaded (vllm_release.load_release; the suite's `released_vllm`)."""
    import vllm_harness

    def serve(path: Path) -> tuple[str, str]:
        outcome = vllm_harness.serve(release, path)
        return outcome.verdict, f"{outcome.stage}: {outcome.detail}"

    return serve


def sglang_serve(engine: Any) -> Callable[[Path], tuple[str, str]]:
    """serve() over an SGLang release already loaded (releases.load_release; the suite's `release`)."""

    def serve(path: Path) -> tuple[str, str]:
        outcome = engine.serve(path)
        return outcome.verdict, f"{outcome.step or 'loaded'}: {outcome.detail or outcome.model}"

    return serve


def vllm_loader(version: str) -> tuple[Any, Callable[[Path], tuple[str, str]], Callable[[], None], Path]:
    """(release, serve, unload, sources) of vLLM `version`, loaded by the conformance harness."""
    import vllm_release

    release = vllm_release.load_release(version)
    return release, vllm_serve(release), lambda: vllm_release.unload(release), release.root


def sglang_loader(version: str) -> tuple[Any, Callable[[Path], tuple[str, str]], Callable[[], None], Path]:
    from conformance.sglang import releases

    engine = releases.load_release(version)
    return engine, sglang_serve(engine), releases.unload, Path(engine.root)


LOADERS = {"vllm": vllm_loader, "sglang": sglang_loader}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from lilicorr_ckpt.runtimes import RELEASES

    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="the whole run's budget (default 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--engine", choices=sorted(LOADERS), action="append", help="only this engine (repeatable)"
    )
    parser.add_argument("--release", action="append", help="only this version (repeatable)")
    args = parser.parse_args(argv)
    targets = [
        (engine, p.version)
        for engine in sorted(LOADERS)
        if not args.engine or engine in args.engine
        for p in RELEASES[engine]
        if p.released and (not args.release or p.version in args.release)
    ]
    if not targets:
        parser.error("no supported release selected")
    share = args.seconds / len(targets)
    total, found = 0, []
    with tempfile.TemporaryDirectory(prefix="lilicorr-fuzz-") as tmp:
        for engine, version in targets:
            started = time.monotonic()
            _, serve, unload, root = LOADERS[engine](version)
            try:
                work = Path(tmp) / f"{engine}-{version}"
                work.mkdir()
                left = max(1.0, share - (time.monotonic() - started))
                runs, bad = fuzz_release(
                    engine, version, serve, root, seed=args.seed, seconds=left, workdir=work
                )
            finally:
                unload()
            total += runs
            found += bad
            print(f"{engine}=={version}: {runs} cases, {len(bad)} disagreements", flush=True)
    print(
        f"{total} cases in all, {len(found)} disagreements, {len(HARNESS_FAILURES)} the harness could not serve"
    )
    for verdict in HARNESS_FAILURES[:20]:
        print(f"harness: {verdict.case} on {verdict.release}: {verdict.detail[:200]}")
    for verdict in found:
        print(verdict.row())
    return 1 if found else 0
