"""The runtime's row limits, defined once here; the modules that use them import these (tests/runtime/test_rows.py
fails on a row limit written as a number anywhere else in the runtime).

TILE rows are what one step-kernel program computes, whatever the call's row count (`ops/step_triton.py`,
BLOCK_M: batch invariance), so every limit is a whole number of tiles.

STEP is the most rows per sequence a target step has: the one-token AR step and every verify block a drafter asks
for. A forward of at most STEP rows per sequence

- runs the fused step kernels (`target/fast.py`, STEP_ROWS), rotation, K/V write and attention in one launch
  (`ops/step_triton.py`, FUSED_ROWS);
- is replayed from a captured CUDA graph (`target/fast.py`, GRAPH_MAX_ROWS);
- on the CPU, attends as one grouped block per KV head (`ops/core.py`, CPU_GROUPED_ROWS).

PREFILL: a request's prefill of at most this many rows runs the step kernels too, so that each prompt row equals
the one-token step's bit for bit (`target/fast.py` and the device loop's admission, PREFILL_ROWS); longer
forwards run the ops' torch references.

WIDE: a step GEMM of at least this many rows runs the wide-row kernel (`ops/step_triton.py`, WIDE_ROWS): a
program computes several TILE-row groups from one read of its weight tile, every row exactly as the TILE-row
kernel computes it, so which kernel a call takes never changes a result. A crossover: on an H100 (2026-12-06) a
Qwen3-8B layer's four GEMMs took 0.710 ms wide against 0.582 ms on the TILE-row kernel at 64 rows (the gated
gate_up 0.350 against 0.178), and 0.745 against 1.457 ms at 256 rows.

Between one TILE and WIDE, a step GEMM runs the grouped kernel (`ops/step_triton.py`, `_step_linear_rows`): the
step tile's own cut with 2 or 4 TILE-row groups a program (`default_groups`, at most MAX_GROUPS), so that the
one-token step of a few sequences reads each weight tile once, where one program per TILE rows read it once per
tile; again every row exactly as the TILE-row kernel computes it (`group_form` checks the GPU's dots). On an H100
(2026-12-07) it made a Qwen3-8B step of 32 rows 4.4 % faster; in place of the wide kernel at 256 rows it made a
verify 2.2x slower, so WIDE stays where it is (at 128 rows the two are not measured apart: the single-launch
figures there were within their noise).

WIDE_LARGE: from this many rows, where the wide kernel steps K by a tile of its own, its program computes 128 rows
by up to 256 columns (8 warps) instead of 64 by 128 (`ops/step_triton.py`, WIDE_LARGE_ROWS): on an H100
(2026-12-06) 1.2-1.5x faster at 2,048 rows, no faster at 1,024 for qkv and slower at 256. Only a speed choice: the
tile never changes a row.

DRAFT_KERNEL: a drafter's static step or context append of at most this many rows (batch x block) runs its
backbone on the step kernels on CUDA (`model/drafter.py`, KERNEL_ROWS); past it the eager ops, whose cuBLAS and
SDPA tiles are faster for many rows. A crossover, not tied to STEP.
"""

from __future__ import annotations

TILE = 16
STEP = 2 * TILE  # 32
PREFILL = 64 * TILE  # 1024
DRAFT_KERNEL = 4 * TILE  # 64
WIDE = 8 * TILE  # 128
WIDE_LARGE = 64 * TILE  # 1024
