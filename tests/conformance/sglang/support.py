"""What the conformance tests share: the corpus, each checkpoint served once per release, validate's verdict
for one release, and the PENDING marks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from checks import test_loader_audit as audit
from checks import test_sibling_heads as sibling

from lilicorr_ckpt import validate

from . import release_rows


class Case(NamedTuple):
    name: str
    row: str  # the audit row (or sibling layout, or release difference) it stands for
    build: Callable[[Path], Path]


CASES = [Case(f"audit-{r.name}", r.audit, lambda tmp, r=r: audit.build(tmp, r)) for r in audit.ROWS]
CASES += [Case(f"sibling-{c.name}", c.layout, lambda tmp, c=c: sibling.build(tmp, c)) for c in sibling.CASES]
CASES += [
    Case(f"release-{r.name}", r.audit, lambda tmp, r=r: release_rows.build(tmp, r)) for r in release_rows.ROWS
]


def serve(release, built, outcomes: dict, name: str, build: Callable[[Path], Path], **kwargs: Any):
    """(the checkpoint, what `release` does with it), each served once per release and test process."""
    path = built.get(name, build)
    key = (release.version, name)
    if key not in outcomes:
        outcomes[key] = release.serve(path, **kwargs)
    return path, outcomes[key]


_VERDICTS: dict[tuple[str, str], tuple[bool, str]] = {}


def validate_verdict(path: Path, version: str) -> tuple[bool, str]:
    """validate's verdict for SGLang `version` alone: (accepts, the errors and warnings as `rule severity: message`)."""
    key = (str(path), version)
    if key not in _VERDICTS:
        # --deep: one condition (LC327, fused shards' NVFP4 global scales) is in the tensor data, not the headers
        report = validate(str(path), runtime=f"sglang=={version}", deep=True)
        (verdict,) = report.runtimes
        why = (
            "; ".join(
                f"{f.rule} {f.severity}: {f.message}"
                for f in report.findings
                if f.severity in ("error", "warning")
            )
            or "no errors or warnings"
        )
        _VERDICTS[key] = (verdict.accepted, why)
    return _VERDICTS[key]


def mark_pending(request, pending: dict[tuple[str, str], str], name: str, version: str) -> None:
    """A known disagreement between validate and the release: expected to fail (strictly: once validate is fixed,
    the test passes, fails as XPASS, and the entry must go)."""
    reason = pending.get((name, version))
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=f"PENDING validate fix: {reason}"))


def describe(version: str, outcome, accepted: bool, why: str, row: str = "") -> str:
    where = outcome.step or "the end"
    return (
        f"[{row}] SGLang {version}: {outcome.verdict} at {where}: {outcome.detail or 'loads the trained function'}"
        f" ({outcome.model or 'no model built'})\nvalidate --runtime sglang=={version}: "
        f"{'accepts' if accepted else 'refuses'}: {why}"
    )
