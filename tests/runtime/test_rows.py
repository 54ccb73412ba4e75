"""The runtime's row limits come from one definition (lilicorr_runtime/rows.py): every module's limit is derived from
it, none is written as a number elsewhere, and the values are the ones the kernels were measured and tested at."""

from __future__ import annotations

import ast
from pathlib import Path

from lilicorr_runtime import rows
from lilicorr_runtime.decode.device_loop import prefill_bucket
from lilicorr_runtime.model import drafter as drafter_module
from lilicorr_runtime.ops import core, step_triton
from lilicorr_runtime.target import fast

RUNTIME = Path(rows.__file__).parent
# names ending in _ROWS that are not limits of what a kernel or graph takes: a probe's sample of context rows
NOT_LIMITS = {("model/probe.py", "CONTEXT_ROWS")}


def test_each_module_takes_its_limit_from_the_one_definition():
    assert step_triton.BLOCK_M == step_triton.TUNE_ROWS == rows.TILE
    assert (
        fast.STEP_ROWS == fast.GRAPH_MAX_ROWS == step_triton.FUSED_ROWS == core.CPU_GROUPED_ROWS == rows.STEP
    )
    assert fast.PREFILL_ROWS == rows.PREFILL
    assert drafter_module.KERNEL_ROWS == rows.DRAFT_KERNEL
    assert step_triton.WIDE_ROWS == rows.WIDE
    assert step_triton.WIDE_LARGE_ROWS == rows.WIDE_LARGE


def test_the_limits_are_whole_tiles_and_unchanged():
    # what the kernels were measured and tested at: a change here changes what is computed where
    assert (rows.TILE, rows.STEP, rows.PREFILL, rows.DRAFT_KERNEL, rows.WIDE, rows.WIDE_LARGE) == (
        16,
        32,
        1024,
        64,
        128,
        1024,
    )
    for limit in (rows.STEP, rows.PREFILL, rows.DRAFT_KERNEL, rows.WIDE, rows.WIDE_LARGE):
        assert limit % rows.TILE == 0
    assert rows.TILE <= rows.STEP <= rows.PREFILL
    # the device loop's captured prefills: whole tiles up to PREFILL, a prompt's own length past it
    assert prefill_bucket(1) == rows.TILE
    assert prefill_bucket(rows.PREFILL) == rows.PREFILL
    assert prefill_bucket(rows.PREFILL + 1) == rows.PREFILL + 1
    assert all(
        prefill_bucket(p) % rows.TILE == 0 and prefill_bucket(p) >= p for p in range(1, rows.PREFILL + 1)
    )


def _numbered_row_limits(path: Path) -> list[str]:
    """Module-level `NAME_ROWS = <int>` (or BLOCK_M) assignments in a file."""
    out = []
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        for target in targets:
            if (
                isinstance(target, ast.Name)
                and (target.id.endswith("_ROWS") or target.id == "BLOCK_M")
                and isinstance(value, ast.Constant)
                and isinstance(value.value, int)
            ):
                out.append(target.id)
    return out


def test_no_row_limit_is_written_as_a_number_outside_rows_py():
    found = [
        f"{path.relative_to(RUNTIME)}: {name}"
        for path in sorted(RUNTIME.rglob("*.py"))
        if path.name != "rows.py"
        for name in _numbered_row_limits(path)
        if (path.relative_to(RUNTIME).as_posix(), name) not in NOT_LIMITS
    ]
    assert not found, "derive these from lilicorr_runtime/rows.py:\n" + "\n".join(found)
