"""What the conformance suite runs of the fuzzer, per supported release, over the release its harness module has
already loaded (the vLLM and SGLang suites call these from their own test modules, so no release is loaded twice):

- the committed corpus (corpus.CORPUS): every row must agree;
- a fixed-seed budget of generated cases (FUZZ_SEED, FUZZ_CASES per release): every disagreement must be a
  corpus.PENDING row (a known one, with its reason), so a new one fails the suite with the row that reproduces it.

FUZZ_CASES keeps the whole budget (every release) under a minute on a 2-core machine (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .corpus import CORPUS, PENDING
from .run import fuzz_release, run_cases

FUZZ_SEED = 20261206
FUZZ_CASES = 40  # per release


def corpus_disagreements(
    engine: str, version: str, serve: Callable[[Path], tuple[str, str]], workdir: Path
) -> list[str]:
    """The corpus rows the release and validate disagree on (none is expected), and the PENDING rows they agree
    on now (stale entries), each as its printed row."""
    verdicts = run_cases(CORPUS, engine, version, serve, workdir)
    failed = [v for v in verdicts if v.loader == "H"]
    assert not failed, "the harness could not serve: " + "; ".join(f"{v.case}: {v.detail}" for v in failed)
    release = f"{engine}=={version}"
    # a PENDING row that agrees now is stale: its entry must go (the gap it names is closed)
    stale = [
        f"{v.row()}  [PENDING, but agrees now: remove its corpus.PENDING entry]"
        for v in verdicts
        if v.agrees and v.loader not in ("U", "H") and (v.case, release) in PENDING
    ]
    return stale + [v.row() for v in verdicts if not v.agrees and (v.case, release) not in PENDING]


def fuzz_disagreements(
    engine: str, version: str, serve: Callable[[Path], tuple[str, str]], root: Path, workdir: Path
) -> list[str]:
    """The fixed-seed budget's disagreements that are not known (corpus.PENDING), each as its printed row."""
    _, found = fuzz_release(
        engine, version, serve, root, seed=FUZZ_SEED, seconds=float("inf"), workdir=workdir, limit=FUZZ_CASES
    )
    return [v.row() for v in found if (v.case, f"{engine}=={version}") not in PENDING]
