"""validate's SGLang verdict against what the released SGLang 0.5.23 loader does, checkpoint by checkpoint.

The corpus is the loader audit's (tests/checks/test_loader_audit.py, one checkpoint per audited condition,
its SGLang rows at the end) and the sibling heads' (tests/checks/test_sibling_heads.py). For each checkpoint
the wheel's own code builds and loads the draft on CPU (engine.py); validate must refuse exactly what that
code refuses, crashes on, or loads into a function other than the trained one, and accept what it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from checks import test_loader_audit as audit
from checks import test_sibling_heads as sibling

from lilicorr_ckpt import validate


class Case(NamedTuple):
    name: str
    row: str  # the audit row (or sibling layout) it stands for
    build: Callable[[Path], Path]


CASES = [Case(f"audit-{r.name}", r.audit, lambda tmp, r=r: audit.build(tmp, r)) for r in audit.ROWS]
CASES += [Case(f"sibling-{c.name}", c.layout, lambda tmp, c=c: sibling.build(tmp, c)) for c in sibling.CASES]

# Checkpoints the harness cannot take through SGLang's whole start-up, and why; validate's verdict for them is
# the documented one (docs/validate.md, the SGLang loader audit).
NOT_EXECUTED = {
    "audit-mask_token_absent": "without mask_token_id SGLang looks `<|MASK|>` up in the target's tokenizer and "
    "adds it when missing: which row of the target's embedding the draft then reads "
    "depends on that tokenizer, not on the checkpoint (validate refuses: LC115)",
}


def validate_verdict(path: Path) -> tuple[bool, str]:
    # --deep: one condition (LC327, fused shards' NVFP4 global scales) is in the tensor data, not the headers
    report = validate(str(path), runtime="sglang", deep=True)
    (verdict,) = report.runtimes
    why = (
        "; ".join(
            f"{f.rule} {f.severity}: {f.message}"
            for f in report.findings
            if f.severity in ("error", "warning")
        )
        or "no errors or warnings"
    )
    return verdict.accepted, why


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_agrees_with_the_released_loader(sglang, tmp_path, case: Case):
    path = case.build(tmp_path)
    outcome = sglang.serve(path)
    accepted, why = validate_verdict(path)
    if case.name in NOT_EXECUTED:
        assert outcome.verdict == "?", f"{case.name} now runs through the harness: {outcome}"
        assert not accepted, why
        return
    loads = outcome.verdict == "L"
    assert accepted == loads, (
        f"[{case.row}] SGLang 0.5.23: {outcome.verdict} at {outcome.step or 'the end'}: "
        f"{outcome.detail or 'loads the trained function'}\nvalidate --runtime sglang: "
        f"{'accepts' if accepted else 'refuses'}: {why}"
    )


def test_the_lists_name_real_cases():
    names = {c.name for c in CASES}
    assert set(NOT_EXECUTED) <= names
    assert len(names) == len(CASES)
