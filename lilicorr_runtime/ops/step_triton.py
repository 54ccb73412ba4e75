"""Triton kernels for the target's decode and verify steps; each mirrors a torch reference in ops/core.py.

A Llama / Qwen2 / Qwen3 layer (and a DFlash drafter's backbone layer) runs as five kernels on a step:

    step_linear  [norm prologue]        x -> qkv           (the input RMSNorm folded into the GEMM)
    rope_attention [qk-norm, rope, K/V write, attention over the visible cache rows only] -> [rows, heads * hd]
    step_linear  [residual epilogue]    x + o_proj(attn)
    step_linear  [norm prologue, gated] silu(gate) * up of the post-attention RMSNorm
    step_linear  [residual epilogue]    x + down(...)

Batch invariance. Every kernel computes a row from that row alone, in an order fixed by the weights' shape and
never by the number of rows: 16 rows per program (BLOCK_M, also for a one-row step), the same K tiling, and
attention walking the same key blocks from the same first block (a block past a row's last visible key is
fully masked, and adding a fully masked block leaves the online softmax bit for bit unchanged). So an 8-row
verify computes each row exactly as the one-token step does: greedy speculative decoding on this path emits
the target-only tokens bit for bit, with no numerical ties between the two.

RMSNorm folded into a GEMM: RMSNorm(x)·Wᵀ = rstd(x) · ((x ⊙ g)·Wᵀ), so the prologue only scales the input by
the norm weight, the sum of squares is accumulated in the same K loop, and rstd scales the accumulator at the
end (rounding differs from the unfused Qwen3RMSNorm by a few ulps of the input dtype). The squares come from a
small dot, x·xᵀ over the K tile (its diagonal), not from an elementwise square and a row sum: on an H200 the
elementwise form kept Triton from pipelining the loads of x, and a Qwen3-8B qkv at one row took 27.0 us against
19.1 (16.5 without a norm), its gate_up 71.4 against 51.9 (bf16 products are exact in fp32, so both forms are
sums of the same exact terms, in another order).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .. import rows
from .tuning import tuner

# The tuner's names, kept here for the benches and tests that read (and patch) them on this module: step_linear_triton
# passes its own TUNED, time_in_graph and sm_count to the tuner, so a patch here reaches it.
from .tuning.tuner import (  # noqa: F401 - re-exported
    CANDIDATES,
    COMPILE_THREADS,
    SPLITS,
    STREAMS,
    TUNE_BYTES,
    TUNE_CALLS,
    TUNE_ROWS,
    TUNED,
    choose_tile,
    compile_in_parallel,
    divided_candidates,
    is_divided,
    linear_config,
    linear_key,
    split_candidates,
    stream_candidates,
    stream_enabled,
    tile_key,
    time_in_graph,
)
from .tuning.tuner import allowed as _allowed  # noqa: F401 - re-exported
from .tuning.tuner import tuning_copy as _tuning_copy

BLOCK_M = rows.TILE  # rows per program in every step kernel, whatever the step's row count (batch invariance)
ATTENTION_BLOCK_N = 64  # keys per attention iteration


def _interpreted() -> bool:
    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------- step_linear
#
# y[m, n] = epilogue(prologue(x)[m, :] · W[n, :]) for a few rows m. One program per (16 rows, BLOCK_N columns,
# one of SPLIT slices of K): it streams its slice of BLOCK_N weight rows once. Programs sharing a weight tile are
# launched next to each other (the row tile is grid axis 0), so a step of many rows reads each tile from L2 after
# the first.
#
# Split-K (SPLIT > 1), for matrices too narrow to give every SM a column tile (a Qwen3-8B o_proj or down at one
# row): each program writes its fp32 partial sums to a workspace and counts its arrival on the tile's counter; the
# last to arrive adds the SPLIT partials in slice order 0, 1, ... (a fixed order, so the result is deterministic
# and the same for every row count), applies the epilogue and resets the counter for the next call.


@triton.jit
def _load_x(x_rows, kk, m_ok, k_ok):
    """A [BLOCK_M, BLOCK_K] tile of the layer's input."""
    mask = m_ok[:, None] & k_ok[None, :]
    return tl.load(x_rows + kk[None, :], mask=mask, other=0.0)


@triton.jit
def _norm_scaled(x, g_ptr, kk, k_ok, w_dtype):
    """The RMSNorm prologue on a K tile of x: x ⊙ g, back in the weight's dtype (rstd scales the sums later)."""
    g = tl.load(g_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    return (x.to(tl.float32) * g[None, :]).to(w_dtype)


@triton.jit
def _acc_dot(x, w, acc, UPCAST, PRECISION):
    """acc + x·wᵀ (in fp32 operands when UPCAST: fp32 weights, or the interpreter)."""
    if UPCAST:
        x = x.to(tl.float32)
        w = w.to(tl.float32)
    acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    return acc


@triton.jit
def _dot_tile(x, w, wu, g_ptr, kk, k_ok, acc, acc_up, squares, NORM, GATED, UPCAST, PRECISION, w_dtype):
    if NORM:  # squares: [BLOCK_M, BLOCK_M]; its diagonal holds each row's sum of squares (`_row_squares`)
        # upcast as `_acc_dot` does: the interpreter's bf16 dot multiplies the raw bits
        xs = x.to(tl.float32) if UPCAST else x
        squares = tl.dot(xs, tl.trans(xs), squares, input_precision=PRECISION)
        x = _norm_scaled(x, g_ptr, kk, k_ok, w_dtype)
    acc = _acc_dot(x, w, acc, UPCAST, PRECISION)
    if GATED:  # the up rows follow the N gate rows in the fused weight
        acc_up = _acc_dot(x, wu, acc_up, UPCAST, PRECISION)
    return acc, acc_up, squares


@triton.jit
def _k_tile(x_rows, w_rows, g_ptr, kk, k_hi, N, s_wn, m_ok, n_ok, acc, acc_up, squares, NORM, GATED, UPCAST,
            PRECISION, w_dtype):  # fmt: skip
    """One K tile (columns kk, those below k_hi) of a step GEMM's loop (`_step_linear`, `_step_linear_stream`):
    its x and weight tiles loaded, then added to the sums (`_dot_tile`)."""
    k_ok = kk < k_hi
    x = _load_x(x_rows, kk, m_ok, k_ok)
    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    wu = w
    if GATED:  # the up rows follow the N gate rows in the fused weight
        wu = tl.load(w_rows + N * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return _dot_tile(x, w, wu, g_ptr, kk, k_ok, acc, acc_up, squares, NORM, GATED, UPCAST, PRECISION, w_dtype)


@triton.jit
def _row_squares(squares, BLOCK_M: tl.constexpr):
    """Each row's sum of squares: the diagonal of the [BLOCK_M, BLOCK_M] x·xᵀ sums `_dot_tile` accumulates."""
    rows = tl.arange(0, BLOCK_M)
    return tl.sum(tl.where(rows[:, None] == rows[None, :], squares, 0.0), axis=1)


@triton.jit
def _linear_epilogue(
    acc,
    acc_up,
    squares,
    bias_ptr,
    r_ptr,
    y_ptr,
    rm,
    rn,
    n_ok,
    out_mask,
    K,
    eps,
    s_rm,
    s_ym,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
):
    if NORM:
        rstd = 1.0 / tl.sqrt(squares / K + eps)
        acc = acc * rstd[:, None]
        acc_up = acc_up * rstd[:, None]
    if BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up
    if RESIDUAL:
        acc += tl.load(
            r_ptr + rm.to(tl.int64)[:, None] * s_rm + rn[None, :],
            mask=out_mask,
            other=0.0,
        ).to(tl.float32)
    tl.store(
        y_ptr + rm.to(tl.int64)[:, None] * s_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask
    )


@triton.jit
def _step_linear(
    x_ptr,
    w_ptr,
    bias_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    K_SPLIT,
    M_PAD,
    eps,
    s_xm,
    s_wn,
    s_rm,
    s_ym,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program: rows tile pid_m, columns tile pid_n (of n_tiles), K slice pid_s."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    n_tiles = tl.num_programs(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    k_lo = pid_s * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    squares = tl.zeros((BLOCK_M, BLOCK_M), tl.float32)
    # the first K tile ahead of the loop: its weight tile, then its x tile (the order the tiles were tuned on)
    kk = k_lo + rk
    k_ok = kk < k_hi
    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    wu = w
    if GATED:
        wu = tl.load(w_rows + N * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    x = _load_x(x_rows, kk, m_ok, k_ok)
    acc, acc_up, squares = _dot_tile(
        x,
        w,
        wu,
        g_ptr,
        kk,
        k_ok,
        acc,
        acc_up,
        squares,
        NORM,
        GATED,
        UPCAST,
        PRECISION,
        w_ptr.dtype.element_ty,
    )
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        acc, acc_up, squares = _k_tile(
            x_rows, w_rows, g_ptr, k0 + rk, k_hi, N, s_wn, m_ok, n_ok, acc, acc_up, squares, NORM, GATED, UPCAST,
            PRECISION, w_ptr.dtype.element_ty,
        )  # fmt: skip
    squares = _row_squares(squares, BLOCK_M)
    out_mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        _linear_epilogue(
            acc,
            acc_up,
            squares,
            bias_ptr,
            r_ptr,
            y_ptr,
            rm,
            rn,
            n_ok,
            out_mask,
            K,
            eps,
            s_rm,
            s_ym,
            NORM,
            BIAS,
            RESIDUAL,
            GATED,
        )
    else:
        # workspace: [SPLIT, M_PAD, N] partial sums (then [SPLIT, M_PAD, N] of the up half when gated), then
        # [SPLIT, tiles along N, M_PAD] partial sums of squares
        # offsets in int64, since SPLIT x M_PAD x width can pass 2**31 (M_PAD, a multiple of 16, is never
        # specialized into a constant, unlike N == 1, so the int64 comes from it)
        m_pad = M_PAD.to(tl.int64)
        width = m_pad * 0 + (2 * N if GATED else N)
        slab_size = m_pad * width
        part = ws_ptr + pid_s.to(tl.int64) * slab_size + rm.to(tl.int64)[:, None] * width + rn[None, :]
        tl.store(part, acc, mask=out_mask)
        if GATED:
            tl.store(part + N, acc_up, mask=out_mask)
        sq_row = m_pad * n_tiles  # one slice's squares: [tiles along N, M_PAD]
        sq_base = ws_ptr + slab_size * SPLIT + pid_n.to(tl.int64) * M_PAD
        if NORM:
            tl.store(sq_base + pid_s.to(tl.int64) * sq_row + rm, squares, mask=m_ok)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        tile = pid_m * n_tiles + pid_n
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last of the tile's slices: add the partials in slice order
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            squares = tl.zeros((BLOCK_M,), tl.float32)
            first = ws_ptr + rm.to(tl.int64)[:, None] * width + rn[None, :]
            for s in range(SPLIT):
                slab = first + s * slab_size
                acc += tl.load(slab, mask=out_mask, other=0.0, cache_modifier=".cg")
                if GATED:
                    acc_up += tl.load(slab + N, mask=out_mask, other=0.0, cache_modifier=".cg")
                if NORM:
                    squares += tl.load(
                        sq_base + s * sq_row + rm,
                        mask=m_ok,
                        other=0.0,
                        cache_modifier=".cg",
                    )
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next call
            _linear_epilogue(
                acc,
                acc_up,
                squares,
                bias_ptr,
                r_ptr,
                y_ptr,
                rm,
                rn,
                n_ok,
                out_mask,
                K,
                eps,
                s_rm,
                s_ym,
                NORM,
                BIAS,
                RESIDUAL,
                GATED,
            )


# ---------------------------------------------------------------- step_linear, stream-K
#
# The same GEMM with the work cut another way, for matrices whose column tiles do not fill the device evenly (a
# Qwen3-8B gate_up at one row: 192 tiles of 64 columns on 132 SMs, one program per SM at four stages, leaves the
# second wave of programs half empty). The (column tile, K tile) units, column tile after column tile, are split
# into PROGRAMS contiguous ranges of (nearly) equal length, one per program: each program reads the same number of
# weight bytes, whatever the tile count. A program finishes the tiles its range covers whole; a tile shared by two
# or more programs is finished, as in split-K, by the last of them to arrive, which adds their partial sums in
# program order (that is, in K order). The cut depends only on the weight's shape and PROGRAMS (never on the row
# count), so the result is the same bit for bit for every row count: batch invariance holds as for split-K.
#
# Workspace, per row tile: 2 x PROGRAMS slots of [BLOCK_M, BLOCK_N] partial sums ([BLOCK_M, 2 x BLOCK_N] when
# gated), slot 2p for the segment program p starts its range with (when that does not start a tile) and 2p + 1
# for the one it ends it with; then as many [BLOCK_M] partial sums of squares.


@triton.jit
def _stream_owner(unit, PROGRAMS, TOTAL):
    """The program whose range holds `unit`: range p is [p·TOTAL // PROGRAMS, (p + 1)·TOTAL // PROGRAMS)."""
    return ((unit + 1) * PROGRAMS + TOTAL - 1) // TOTAL - 1


@triton.jit
def _step_linear_stream(
    x_ptr,
    w_ptr,
    bias_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    KB,
    eps,
    s_xm,
    s_wn,
    s_rm,
    s_ym,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid = tl.program_id(1).to(tl.int64)
    programs = tl.num_programs(1).to(tl.int64)
    n_tiles = tl.cdiv(N, BLOCK_N)
    total = (n_tiles * KB).to(tl.int64)
    u0 = pid * total // programs
    u1 = (pid + 1) * total // programs
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
    width: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    slots = 2 * programs
    sq_base = ws_ptr + pid_m.to(tl.int64) * slots * BLOCK_M * (width + 1) + slots * BLOCK_M * width
    slot_rows = ws_ptr + pid_m.to(tl.int64) * slots * BLOCK_M * (width + 1)
    part_offsets = tl.arange(0, BLOCK_M)[:, None] * width + tl.arange(0, BLOCK_N)[None, :]
    for t in range(u0 // KB, (u1 + KB - 1) // KB):
        t_lo = t * KB
        lo = tl.maximum(u0, t_lo)
        hi = tl.minimum(u1, t_lo + KB)
        rn = t * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        squares = tl.zeros((BLOCK_M, BLOCK_M), tl.float32)
        for kb in range(lo - t_lo, hi - t_lo):
            acc, acc_up, squares = _k_tile(
                x_rows, w_rows, g_ptr, kb * BLOCK_K + rk, K, N, s_wn, m_ok, n_ok, acc, acc_up, squares, NORM, GATED,
                UPCAST, PRECISION, w_ptr.dtype.element_ty,
            )  # fmt: skip
        squares = _row_squares(squares, BLOCK_M)
        out_mask = m_ok[:, None] & n_ok[None, :]
        if (lo == t_lo) & (hi == t_lo + KB):  # the whole tile is this program's
            _linear_epilogue(
                acc,
                acc_up,
                squares,
                bias_ptr,
                r_ptr,
                y_ptr,
                rm,
                rn,
                n_ok,
                out_mask,
                K,
                eps,
                s_rm,
                s_ym,
                NORM,
                BIAS,
                RESIDUAL,
                GATED,
            )
        else:
            slot = 2 * pid + (lo != u0).to(tl.int64)
            part = slot_rows + slot * BLOCK_M * width + part_offsets
            tl.store(part, acc)
            if GATED:
                tl.store(part + BLOCK_N, acc_up)
            if NORM:
                tl.store(sq_base + slot * BLOCK_M + tl.arange(0, BLOCK_M), squares)
            tl.debug_barrier()  # every thread's partial is written before the arrival is counted
            first = _stream_owner(t_lo, programs, total)
            last = _stream_owner(t_lo + KB - 1, programs, total)
            counter = cnt_ptr + pid_m * n_tiles + t
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == last - first:  # the last of the tile's programs: add the partials in K order
                acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                squares = tl.zeros((BLOCK_M,), tl.float32)
                for q in range(first, last + 1):
                    q_slot = 2 * q + (q * total // programs < t_lo).to(tl.int64)
                    q_part = slot_rows + q_slot * BLOCK_M * width + part_offsets
                    acc += tl.load(q_part, cache_modifier=".cg")
                    if GATED:
                        acc_up += tl.load(q_part + BLOCK_N, cache_modifier=".cg")
                    if NORM:
                        squares += tl.load(
                            sq_base + q_slot * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg"
                        )
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next call
                _linear_epilogue(
                    acc,
                    acc_up,
                    squares,
                    bias_ptr,
                    r_ptr,
                    y_ptr,
                    rm,
                    rn,
                    n_ok,
                    out_mask,
                    K,
                    eps,
                    s_rm,
                    s_ym,
                    NORM,
                    BIAS,
                    RESIDUAL,
                    GATED,
                )


# ---------------------------------------------------------------- step_linear, wide rows
#
# The same GEMM for calls of many rows (WIDE_ROWS and up: the verify of many sequences, a prefill). One program
# computes GROUPS x BLOCK_M rows of one column tile and reads each weight tile once for all of them, where the
# kernels above read it once per BLOCK_M rows. Every row is computed exactly as they compute it with the weight's
# tuned tile (batch invariance across the two): K cut into the same pieces (one, the SPLIT
# slices, or the stream-K programs' ranges over the column tile), each piece summed from zero K tile after K tile
# and the pieces added in K order; each row's sum of squares from the same BLOCK_M x BLOCK_M x·xᵀ dots, one per
# group of BLOCK_M rows (a batched dot). Only the column tile is free (a column's sum does not depend on its
# neighbours), except under stream-K, whose cuts differ per column tile: there it is the tuned one.


@triton.jit
def _wide_dot(x, w, acc, UPCAST, PRECISION, BATCHED: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """acc + x·wᵀ for [GROUPS * BLOCK_M] rows: one dot, or (BATCHED) one BLOCK_M-row dot per group."""
    if BATCHED:
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        x3 = tl.reshape(x, (GROUPS, BLOCK_M, BLOCK_K))
        w3 = tl.broadcast_to(tl.trans(w)[None, :, :], (GROUPS, BLOCK_K, BLOCK_N))
        acc3 = tl.reshape(acc, (GROUPS, BLOCK_M, BLOCK_N))
        acc3 += tl.dot(x3, w3, input_precision=PRECISION)
        return tl.reshape(acc3, (GROUPS * BLOCK_M, BLOCK_N))
    return _acc_dot(x, w, acc, UPCAST, PRECISION)


@triton.jit
def _wide_piece(x_rows, w_rows, g_ptr, k_lo, k_hi, N, s_wn, m_ok, n_ok, NORM, GATED, UPCAST, PRECISION, w_dtype,
                BATCHED: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):  # fmt: skip
    """The sums over K columns k_lo..k_hi, from zero: [GROUPS * BLOCK_M, BLOCK_N] (and the up half's when gated)
    and each row's sum of squares."""
    acc = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
    squares = tl.zeros((GROUPS, BLOCK_M, BLOCK_M), tl.float32)
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < k_hi
        x = _load_x(x_rows, kk, m_ok, k_ok)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
        wu = w
        if GATED:  # the up rows follow the N gate rows in the fused weight
            wu = tl.load(w_rows + N * s_wn + kk[None, :], mask=w_mask, other=0.0)
        if NORM:  # per group of BLOCK_M rows, as `_dot_tile` sums them
            x3 = tl.reshape(x.to(tl.float32) if UPCAST else x, (GROUPS, BLOCK_M, BLOCK_K))
            squares = tl.dot(x3, tl.permute(x3, (0, 2, 1)), squares, input_precision=PRECISION)
            x = _norm_scaled(x, g_ptr, kk, k_ok, w_dtype)
        acc = _wide_dot(x, w, acc, UPCAST, PRECISION, BATCHED, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K)
        if GATED:
            acc_up = _wide_dot(x, wu, acc_up, UPCAST, PRECISION, BATCHED, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K)
    eye = tl.arange(0, BLOCK_M)[:, None] == tl.arange(0, BLOCK_M)[None, :]
    diagonal = tl.sum(tl.where(eye[None, :, :], squares, 0.0), axis=2)
    return acc, acc_up, tl.reshape(diagonal, (GROUPS * BLOCK_M,))


@triton.jit
def _step_linear_wide(
    x_ptr,
    w_ptr,
    bias_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    M,
    N,
    K,
    K_SPLIT,
    PIECES,
    KB,
    PROGRAMS,
    eps,
    s_xm,
    s_wn,
    s_rm,
    s_ym,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    CUT: tl.constexpr,
    BATCHED: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UNIT_K: tl.constexpr,
):
    """One program: GROUPS * BLOCK_M rows, columns tile pid_n. CUT 0: K in one piece; 1: PIECES slices of K_SPLIT
    columns (split-K); 2: the ranges of PROGRAMS stream-K programs over KB K tiles of UNIT_K columns (the step
    tile's BLOCK_K) per column tile. The loop over a piece steps BLOCK_K columns at a time, which need not be the
    step tile's: the dots add each 16 columns' products to the running sums in K order, whatever the tile."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * (GROUPS * BLOCK_M) + tl.arange(0, GROUPS * BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    w_dtype = w_ptr.dtype.element_ty
    if CUT == 0:
        acc, acc_up, squares = _wide_piece(
            x_rows, w_rows, g_ptr, 0, K, N, s_wn, m_ok, n_ok, NORM, GATED, UPCAST, PRECISION, w_dtype, BATCHED,
            GROUPS, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    else:
        # the pieces added in K order to zero, as the kernels above add their partial sums (a piece that is a
        # whole stream-K tile is taken as it comes there: adding it to zero changes no bit, since a sum started
        # from +0 is never -0)
        t_lo = pid_n.to(tl.int64) * KB
        total = t_lo * 0 + ((N + BLOCK_N - 1) // BLOCK_N) * KB
        first = t_lo * 0
        last = t_lo * 0 + PIECES - 1
        if CUT == 2:
            first = _stream_owner(t_lo, PROGRAMS, total)
            last = _stream_owner(t_lo + KB - 1, PROGRAMS, total)
        acc = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
        squares = tl.zeros((GROUPS * BLOCK_M,), tl.float32)
        for q in range(first, last + 1):
            if CUT == 1:
                k_lo = (q * K_SPLIT).to(tl.int32)
                k_hi = tl.minimum(K, k_lo + K_SPLIT)
            else:
                k_lo = ((tl.maximum(q * total // PROGRAMS, t_lo) - t_lo) * UNIT_K).to(tl.int32)
                k_end = (tl.minimum((q + 1) * total // PROGRAMS, t_lo + KB) - t_lo) * UNIT_K
                k_hi = tl.minimum(K, k_end.to(tl.int32))
            part, part_up, part_squares = _wide_piece(
                x_rows, w_rows, g_ptr, k_lo, k_hi, N, s_wn, m_ok, n_ok, NORM, GATED, UPCAST, PRECISION, w_dtype,
                BATCHED, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            acc += part
            acc_up += part_up
            squares += part_squares
    out_mask = m_ok[:, None] & n_ok[None, :]
    _linear_epilogue(
        acc,
        acc_up,
        squares,
        bias_ptr,
        r_ptr,
        y_ptr,
        rm,
        rn,
        n_ok,
        out_mask,
        K,
        eps,
        s_rm,
        s_ym,
        NORM,
        BIAS,
        RESIDUAL,
        GATED,
    )


# ---------------------------------------------------------------- step_linear, a few tiles of rows
#
# The same GEMM for calls of a few 16-row tiles (more than BLOCK_M rows, fewer than WIDE_ROWS: the one-token step
# of 17 to 127 sequences, the verify of 2 to 15): GROUPS x BLOCK_M rows a program, so each weight tile is read once
# for all of them, with the step tile's own cut (its BLOCK_N, BLOCK_K and SPLIT slices run as parallel programs,
# the last to arrive adding the partial sums in slice order, as `_step_linear` does). Every row is computed as the
# 16-row kernel computes it: the same K slices, each summed from zero K tile after K tile, the squares from per-16-row
# dots, and the dot form (one dot over the program's rows, or one per group: BATCHED) this GPU was checked to
# round as the 16-row kernel does (`group_form`). Its split-K tail repeats `_step_linear`'s: folding both into one
# helper edits `_step_linear`'s own text, which stales its bundled kernel variants until they are recorded again on
# each GPU the table names (scripts/bundle_kernels.py).


@triton.jit
def _step_linear_rows(
    x_ptr,
    w_ptr,
    bias_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    K_SPLIT,
    M_PAD,
    eps,
    s_xm,
    s_wn,
    s_rm,
    s_ym,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT,
    BATCHED: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program: GROUPS * BLOCK_M rows (row tile pid_m), columns tile pid_n (of n_tiles), K slice pid_s."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    n_tiles = tl.num_programs(1)
    rm = pid_m * (GROUPS * BLOCK_M) + tl.arange(0, GROUPS * BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    k_lo = pid_s * K_SPLIT
    k_hi = tl.minimum(K, k_lo + K_SPLIT)
    acc, acc_up, squares = _wide_piece(
        x_rows, w_rows, g_ptr, k_lo, k_hi, N, s_wn, m_ok, n_ok, NORM, GATED, UPCAST, PRECISION,
        w_ptr.dtype.element_ty, BATCHED, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    out_mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        # `_step_linear`'s workspace and arrival count, over this program's rows (M_PAD: the row tiles' rows)
        m_pad = M_PAD.to(tl.int64)
        width = m_pad * 0 + (2 * N if GATED else N)
        slab_size = m_pad * width
        part = ws_ptr + pid_s.to(tl.int64) * slab_size + rm.to(tl.int64)[:, None] * width + rn[None, :]
        tl.store(part, acc, mask=out_mask)
        if GATED:
            tl.store(part + N, acc_up, mask=out_mask)
        sq_row = m_pad * n_tiles
        sq_base = ws_ptr + slab_size * SPLIT + pid_n.to(tl.int64) * M_PAD
        if NORM:
            tl.store(sq_base + pid_s.to(tl.int64) * sq_row + rm, squares, mask=m_ok)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        tile = pid_m * n_tiles + pid_n
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:  # the last of the tile's slices: add the partials in slice order
            acc = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
            acc_up = tl.zeros((GROUPS * BLOCK_M, BLOCK_N), tl.float32)
            squares = tl.zeros((GROUPS * BLOCK_M,), tl.float32)
            first = ws_ptr + rm.to(tl.int64)[:, None] * width + rn[None, :]
            for s in range(SPLIT):
                slab = first + s * slab_size
                acc += tl.load(slab, mask=out_mask, other=0.0, cache_modifier=".cg")
                if GATED:
                    acc_up += tl.load(slab + N, mask=out_mask, other=0.0, cache_modifier=".cg")
                if NORM:
                    squares += tl.load(sq_base + s * sq_row + rm, mask=m_ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next call
            _linear_epilogue(
                acc, acc_up, squares, bias_ptr, r_ptr, y_ptr, rm, rn, n_ok, out_mask, K, eps, s_rm, s_ym, NORM,
                BIAS, RESIDUAL, GATED,
            )  # fmt: skip
    else:
        _linear_epilogue(
            acc, acc_up, squares, bias_ptr, r_ptr, y_ptr, rm, rn, n_ok, out_mask, K, eps, s_rm, s_ym, NORM, BIAS,
            RESIDUAL, GATED,
        )  # fmt: skip


def step_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: dict[str, int] | None = None,
    wide: dict[str, int] | bool | None = None,
    groups: int | None = None,
) -> torch.Tensor:
    """x [M, K] (rows may be strided) -> y [M, N] (see core.step_linear_reference). `out`, when given, is written
    (a row-strided view is fine: a column slice of a wider buffer). `config` forces a tile shape (tests, benches);
    by default the weight shape's tuned one serves. A call of WIDE_ROWS rows or more runs the wide-row kernel,
    and a call of a few 16-row tiles the grouped one (`_step_linear_rows`, `default_groups` tiles a program), both
    computing every row as the tile's own kernel does: `wide` False keeps both off (the 16-row kernel), a dict
    forces the wide tile (GROUPS, BLOCK_N, num_warps, num_stages, and optionally BLOCK_K; tests, benches);
    `groups` forces the grouped kernel's 16-row tiles a program, 1 for none (below WIDE_ROWS rows, or with `wide`
    False; a power of two; not with a stream-K tile)."""
    if not (wide is None or wide is False or isinstance(wide, dict)):
        raise TypeError(f"wide must be None, False or a tile dict, not {wide!r}")
    if groups is not None and (not isinstance(groups, int) or groups < 1 or groups & (groups - 1)):
        raise ValueError(f"groups must be a power of two >= 1, not {groups!r}")
    if isinstance(wide, dict) and not {"GROUPS", "BLOCK_N", "num_warps", "num_stages"} <= wide.keys():
        raise ValueError(f"a wide tile needs GROUPS, BLOCK_N, num_warps and num_stages: {wide!r}")
    m = x.shape[0]
    k = weight.shape[1]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    if out is None:
        out = torch.empty((m, n), device=x.device, dtype=out_dtype or x.dtype)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if m == 0:
        return out
    if k == 0:  # nothing to stream, and a stream-K cut of no K tiles would divide by zero
        raise ValueError("step_linear_triton needs K >= 1 (ops.step_linear runs the reference for K = 0)")
    upcast = weight.dtype == torch.float32 or _interpreted()

    def launch(
        config: dict[str, int],
        y: torch.Tensor,
        w: torch.Tensor = weight,
        rows: int = m,
        compile_only: bool = False,
        tuning: bool = False,
    ) -> None:
        """The call on the first `rows` rows of x (and of residual and y); `compile_only`: compile the kernel the
        call would run (Triton's warmup), launching nothing."""
        config = dict(config)
        split = config.pop("SPLIT", 1)
        stream = config.pop("STREAM", 0)
        xs = x if rows == m else x[:rows]
        res = residual if residual is None or rows == m else residual[:rows]
        y = y if rows == m else y[:rows]
        m_tiles, n_tiles = triton.cdiv(rows, BLOCK_M), triton.cdiv(n, config["BLOCK_N"])
        # what a call's fit depends on, for the unfit sets (`_WIDE_UNFIT`, `_GROUPS_UNFIT`)
        flags = (gated, norm_weight is not None, bias is not None, residual is not None, split)
        call = ((x.device.type, x.device.index), n, k, flags, w.dtype, y.dtype, tuple(sorted(config.items())))
        if rows >= WIDE_ROWS and wide is not False and not tuning:
            if isinstance(wide, dict):
                tile = wide
            else:
                tile = default_wide_tile(
                    config,
                    split,
                    stream,
                    gated,
                    k,
                    w.dtype,
                    norm=norm_weight is not None,
                    rows=rows,
                    device=x.device,
                )
            memo = (*call, stream, tuple(sorted(tile.items())))
            if memo not in _WIDE_UNFIT:
                try:
                    _launch_wide(config, split, stream, tile, xs, w, res, y, rows, n_tiles, compile_only)
                    return
                except OutOfResources:
                    # the tile does not fit this GPU: the 16-row kernel computes the same rows
                    if isinstance(wide, dict):
                        raise
                    _WIDE_UNFIT.add(memo)
        if tuning:
            tiles = 1
        elif groups is not None:
            tiles = groups
        elif wide is None and BLOCK_M < rows < WIDE_ROWS and not stream:
            tiles = default_groups(rows, config, gated, x.device, w.dtype)
        else:
            tiles = 1
        if tiles > 1:
            if stream:
                raise ValueError("a grouped call takes the step tile's split-K cut, not a stream-K tile")
            key_rows = (*call, tiles)
            if groups is not None or key_rows not in _GROUPS_UNFIT:
                try:
                    _launch_split(config, split, tiles, xs, w, res, y, rows, n_tiles, compile_only, tuning)
                    return
                except OutOfResources:
                    # more rows a program than this GPU fits with the step tile: the 16-row kernel, same rows
                    if groups is not None:
                        raise
                    _GROUPS_UNFIT.add(key_rows)
        if stream:
            _launch_stream(config, stream, xs, w, res, y, rows, m_tiles, n_tiles, compile_only, tuning)
            return
        _launch_split(config, split, 1, xs, w, res, y, rows, n_tiles, compile_only, tuning)

    def _launch_split(config, split, tiles, xs, w, res, y, rows, n_tiles, compile_only, tuning) -> None:
        """The step tile's cut (one K piece or `split` slices) with `tiles` 16-row tiles a program: the 16-row
        kernel `_step_linear` for one (its copy when tuning), the grouped `_step_linear_rows` for more."""
        block_k = config["BLOCK_K"]
        k_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
        m_tiles = triton.cdiv(rows, tiles * BLOCK_M)
        m_pad = m_tiles * tiles * BLOCK_M
        if split > 1:
            width = 2 * n if gated else n
            workspace = torch.empty(
                split * m_pad * width + split * n_tiles * m_pad, device=x.device, dtype=torch.float32
            )
            counters = _counters(x.device, m_tiles * n_tiles)
        else:
            workspace = counters = y
        grid = (m_tiles, n_tiles, split)
        if tiles > 1:
            form = group_form(x.device, config["num_warps"])
            fn = _step_linear_rows
            grouping = {"BATCHED": 1 if form is None else form, "GROUPS": tiles}
        else:
            fn = _tuning_copy(_step_linear) if tuning else _step_linear
            grouping = {}
        kernel = functools.partial(fn.warmup, grid=grid) if compile_only else fn[grid]
        kernel(
            xs,
            w,
            bias if bias is not None else w,
            norm_weight if norm_weight is not None else w,
            res if res is not None else y,
            y,
            workspace,
            counters,
            rows,
            n,
            k,
            k_split,
            m_pad,
            eps,
            xs.stride(0),
            w.stride(0),
            res.stride(0) if res is not None else 0,
            y.stride(0),
            NORM=norm_weight is not None,
            BIAS=bias is not None,
            RESIDUAL=residual is not None,
            GATED=gated,
            UPCAST=upcast,
            PRECISION="ieee",
            SPLIT=split,
            BLOCK_M=BLOCK_M,
            **grouping,
            **config,
        )

    def _launch_stream(config, stream, xs, w, res, y, rows, m_tiles, n_tiles, compile_only, tuning) -> None:
        kb = triton.cdiv(k, config["BLOCK_K"])
        programs = stream_programs(stream, n_tiles * kb, x.device)
        width = 2 * config["BLOCK_N"] if gated else config["BLOCK_N"]
        workspace = torch.empty(
            m_tiles * 2 * programs * BLOCK_M * (width + 1), device=x.device, dtype=torch.float32
        )
        counters = _counters(x.device, m_tiles * n_tiles)
        grid = (m_tiles, programs)
        fn = _tuning_copy(_step_linear_stream) if tuning else _step_linear_stream
        kernel = functools.partial(fn.warmup, grid=grid) if compile_only else fn[grid]
        kernel(
            xs,
            w,
            bias if bias is not None else w,
            norm_weight if norm_weight is not None else w,
            res if res is not None else y,
            y,
            workspace,
            counters,
            rows,
            n,
            k,
            kb,
            eps,
            xs.stride(0),
            w.stride(0),
            res.stride(0) if res is not None else 0,
            y.stride(0),
            NORM=norm_weight is not None,
            BIAS=bias is not None,
            RESIDUAL=residual is not None,
            GATED=gated,
            UPCAST=upcast,
            PRECISION="ieee",
            BLOCK_M=BLOCK_M,
            **config,
        )

    def _launch_wide(config, split, stream, tile, xs, w, res, y, rows, n_tiles, compile_only) -> None:
        block_k = config["BLOCK_K"]
        kb = triton.cdiv(k, block_k)
        block_n = config["BLOCK_N"] if stream else tile["BLOCK_N"]
        rows_per_program = tile["GROUPS"] * BLOCK_M
        grid = (triton.cdiv(rows, rows_per_program), triton.cdiv(n, block_n))
        kernel = (
            functools.partial(_step_linear_wide.warmup, grid=grid)
            if compile_only
            else _step_linear_wide[grid]
        )
        kernel(
            xs,
            w,
            bias if bias is not None else w,
            norm_weight if norm_weight is not None else w,
            res if res is not None else y,
            y,
            rows,
            n,
            k,
            triton.cdiv(kb, split) * block_k,
            split,
            kb,
            stream_programs(stream, n_tiles * kb, x.device) if stream else 1,
            eps,
            xs.stride(0),
            w.stride(0),
            res.stride(0) if res is not None else 0,
            y.stride(0),
            NORM=norm_weight is not None,
            BIAS=bias is not None,
            RESIDUAL=residual is not None,
            GATED=gated,
            UPCAST=upcast,
            PRECISION="ieee",
            CUT=2 if stream else (1 if split > 1 else 0),
            BATCHED=tile.get("BATCHED", 0),
            GROUPS=tile["GROUPS"],
            BLOCK_M=BLOCK_M,
            BLOCK_N=block_n,
            BLOCK_K=tile.get("BLOCK_K", block_k),
            UNIT_K=block_k,
            num_warps=tile["num_warps"],
            num_stages=tile["num_stages"],
        )

    if config is None:
        key = linear_key(
            n,
            k,
            norm=norm_weight is not None,
            bias=bias is not None,
            residual=residual is not None,
            gated=gated,
            dtype=weight.dtype,
            out_dtype=out.dtype,
        )
        config = TUNED.get(key)
        if config is None:
            if x.is_cuda and not _interpreted():
                config = _stored(key, x.device) or _tune(key, launch, out, weight)
            else:
                config = linear_config(n, k)
    launch(config, out)
    return out


WIDE_ROWS = rows.WIDE  # a call of at least this many rows runs `_step_linear_wide`
WIDE_STAGE_BYTES = 96 << 10  # shared memory one pipeline stage of a wide tile may take (x and weight tiles)
# calls whose default wide tile did not fit the GPU (OutOfResources): they run the 16-row kernel
_WIDE_UNFIT: set[tuple] = set()
_WIDE_FORM: dict[tuple[str, int | None], int] = {}  # device -> BATCHED (wide_form)
_WIDE_FREE_K: dict[
    tuple[str, int | None], bool
] = {}  # device -> the wide tile steps its own BLOCK_K (wide_free_k)
WIDE_BLOCK_K = 64  # the wide tile's own K step where it may take one (wide_free_k; bf16 weights only)
WIDE_LARGE_ROWS = rows.WIDE_LARGE  # from here, with its own K step, the wide tile is 128 rows by 256 columns


def wide_config(
    config: dict[str, int],
    split: int,
    stream: int,
    gated: bool,
    k: int,
    dtype: torch.dtype,
    norm: bool = False,
    free_k: bool = False,
    rows: int = 0,
) -> dict[str, int]:
    """The wide-row kernel's tile for a weight whose step tile is `config`: 64 rows a program (GROUPS 4), the
    widest column tile whose x tiles (twice with the norm: the scaled copy) and weight tiles fit one stage in
    WIDE_STAGE_BYTES (the step tile's own under stream-K), and as many stages as fit three such. Its K step is the
    step tile's BLOCK_K, or with `free_k` (the device's dots add 16 columns at a time whatever the tile:
    `wide_free_k`) WIDE_BLOCK_K, which bench/wide_gemm.py --explore found fastest at 256 rows on an H100 (the
    step tiles' BLOCK_K, tuned for a few rows, run 1.1-1.6x slower there); from WIDE_LARGE_ROWS `rows` on, it is
    128 rows a program (GROUPS 8) with 8 warps and 256 columns where they fit (128 gated), at most 3 stages: the
    fastest there (1.2-1.5x the 64-row tile at 2,048 rows). A tile that still does not fit a GPU falls back to the
    16-row kernel (`_WIDE_UNFIT`)."""
    size = 4 if dtype == torch.float32 else 2
    block_k = config["BLOCK_K"]
    tile: dict[str, int] = {}
    if free_k:
        block_k = tile["BLOCK_K"] = WIDE_BLOCK_K
    large = free_k and rows >= WIDE_LARGE_ROWS
    groups, warps, most_stages = (8, 8, 3) if large else (4, 4, 4)
    halves = 2 if gated else 1
    x_rows = groups * BLOCK_M * (2 if norm else 1)
    block_n = config["BLOCK_N"]
    if not stream:
        for candidate in (256, 128, 64, 32, 16) if large and not gated else (128, 64, 32, 16):
            block_n = candidate
            if (x_rows + halves * candidate) * block_k * size <= WIDE_STAGE_BYTES:
                break
    stage = (x_rows + halves * block_n) * block_k * size
    stages = max(1, min(most_stages, (3 * WIDE_STAGE_BYTES) // max(stage, 1) - 1))
    return {"GROUPS": groups, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, **tile}


def default_wide_tile(
    config: dict[str, int],
    split: int,
    stream: int,
    gated: bool,
    k: int,
    dtype: torch.dtype,
    *,
    norm: bool,
    rows: int,
    device: torch.device,
) -> dict[str, int]:
    """The wide tile a call of `rows` rows takes by default: `wide_config` with the device's form (BATCHED) and, where
    the device allows it (`wide_free_k`), its own K step; the check multiplies bf16, so other weights (fp32's FMA
    dots, fp16) keep the step tile's K step."""
    form = wide_form(device)
    own_k = form == 0 and dtype == torch.bfloat16 and wide_free_k(device)
    tile = wide_config(config, split, stream, gated, k, dtype, norm=norm, free_k=own_k, rows=rows)
    tile["BATCHED"] = form
    return tile


def _device_key(device: torch.device) -> tuple[str, int | None]:
    return (device.type, device.index if device.index is not None else torch.cuda.current_device())


def wide_form(device: torch.device) -> int:
    """How the wide kernel multiplies on this device: 0, one dot over all its rows (on Hopper a wgmma), when that
    rounds every row as the 16-row kernel's mma does; else 1, one 16-row dot per group, the 16-row kernel's own
    instruction. Checked once per device, on a call outside any graph capture, by comparing both kernels' rows
    bit for bit on a small GEMM with the norm and the gate (1 until then, and off CUDA: the interpreter's numpy
    dots of more rows round differently)."""
    if device.type != "cuda" or _interpreted():
        return 1
    key = _device_key(device)
    form = _WIDE_FORM.get(key)
    if form is not None:
        return form
    if torch.cuda.is_current_stream_capturing():
        return 1
    x, w, kwargs = _form_check(device)
    same = torch.equal(
        step_linear_triton(x, w, wide=False, **kwargs), step_linear_triton(x, w, wide=_ONE_DOT, **kwargs)
    )
    _WIDE_FORM[key] = form = 0 if same else 1
    return form


_ONE_DOT = {"GROUPS": 4, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "BATCHED": 0}

MAX_GROUPS = 4  # 16-row tiles a grouped program computes at most (`default_groups`)
GROUP_ACC_REGISTERS = 64  # fp32 sums a grouped program's thread may hold (acc, and acc_up when gated)
# (device, num_warps) -> BATCHED for the grouped kernel, or None (group_form)
_GROUP_FORM: dict[tuple[tuple[str, int | None], int], int | None] = {}
# grouped calls that did not fit their GPU (OutOfResources): the 16-row kernel computes them
_GROUPS_UNFIT: set[tuple] = set()


def default_groups(
    rows: int,
    config: dict[str, int],
    gated: bool,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    """The 16-row tiles a program of the grouped kernel computes for a call of `rows` rows (more than one tile,
    fewer than WIDE_ROWS) with the step tile `config` and weights of `dtype`: enough for all the rows (a power of
    two, at most MAX_GROUPS), fewer where the sums would pass GROUP_ACC_REGISTERS a thread; 1 (the 16-row
    kernel) where this GPU's check found no grouped form that keeps the rows at the tile's warp count
    (`group_form`), and on CUDA for weights other than bf16, the dtype the check multiplies."""
    if device.type == "cuda" and not _interpreted() and dtype != torch.bfloat16:
        return 1
    if group_form(device, config["num_warps"]) is None:
        return 1
    tiles = 1
    while tiles < MAX_GROUPS and tiles * BLOCK_M < rows:
        tiles *= 2
    threads = 32 * config["num_warps"]
    halves = 2 if gated else 1
    while tiles > 1 and tiles * BLOCK_M * config["BLOCK_N"] * halves > GROUP_ACC_REGISTERS * threads:
        tiles //= 2
    return tiles


def group_form(device: torch.device, warps: int = 4) -> int | None:
    """How the grouped kernel multiplies on this device with `warps` warps a program: 0, one dot over the
    program's rows, or 1, one 16-row dot per group, whichever (0 first) rounds every row as the 16-row kernel
    does; checked once per device and warp count, outside any graph capture, on `wide_form`'s normed, gated bf16
    GEMM with split-K in three slices, at 2 and 4 tiles a program (a tile of 16 columns at 4 warps, 64 at more);
    None where neither form does (calls then run the 16-row kernel), and until checked. Off CUDA 1 (the
    interpreter: per-group numpy dots of the 16-row kernel's own shapes)."""
    if device.type != "cuda" or _interpreted():
        return 1
    key = (_device_key(device), warps)
    if key in _GROUP_FORM:
        return _GROUP_FORM[key]
    if torch.cuda.is_current_stream_capturing():
        return None
    x, w, kwargs = _form_check(device)
    x = x[: WIDE_ROWS - 1]
    kwargs["config"] = {
        "BLOCK_N": 16 if warps <= 4 else 64,
        "BLOCK_K": 64,
        "num_warps": warps,
        "num_stages": 2,
        "SPLIT": 3,
    }
    try:
        want = step_linear_triton(x, w, wide=False, **kwargs)
    except Exception:  # noqa: BLE001 - a tile this device cannot build: no grouping at this warp count
        _GROUP_FORM[key] = None
        return None
    form = None
    for batched in (0, 1):
        _GROUP_FORM[key] = batched  # the form the forced calls below take
        try:
            same = all(
                torch.equal(want, step_linear_triton(x, w, wide=False, groups=g, **kwargs)) for g in (2, 4)
            )
        except Exception:  # noqa: BLE001 - a form this device cannot build is not taken
            same = False
        if same:
            form = batched
            break
    _GROUP_FORM[key] = form
    return form


def _form_check(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """The small normed, gated GEMM the form checks compare (K = 280: four 64-column tiles and a partial one)."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(WIDE_ROWS + 5, 4 * 64 + 24, device=device, generator=gen).to(torch.bfloat16)
    w = (torch.randn(2 * 80, x.shape[1], device=device, generator=gen) * 0.05).to(torch.bfloat16)
    g = torch.rand(x.shape[1], device=device, generator=gen).to(torch.bfloat16) + 0.5
    tile = {"BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    return x, w, {"norm_weight": g, "eps": 1e-6, "gated": True, "config": tile}


def wide_free_k(device: torch.device) -> bool:
    """Whether the wide kernel may step K by a tile of its own (WIDE_BLOCK_K) on this device: true where its dots
    (one over all its rows, `wide_form` 0) add each 16 columns' products to the running sums in K order whatever
    the tile, as MMA chains do, so a row comes out as the 16-row kernel's under any BLOCK_K. Checked once per device,
    outside any graph capture, on `wide_form`'s GEMM with K steps of 32 and 128 against the step tile's 64,
    and the 128-row, 8-warp tile (false until then, and wherever the form is not one dot). For bf16 weights."""
    if wide_form(device) != 0:
        return False
    key = _device_key(device)
    free = _WIDE_FREE_K.get(key)
    if free is not None:
        return free
    if torch.cuda.is_current_stream_capturing():
        return False
    x, w, kwargs = _form_check(device)
    step = step_linear_triton(x, w, wide=False, **kwargs)
    # both wide tiles the runtime takes with their own K step: 64 rows (4 warps), and 128 (8 warps) from WIDE_LARGE
    wides = [{**_ONE_DOT, "BLOCK_K": k} for k in (32, 128)]
    wides.append({**_ONE_DOT, "GROUPS": 8, "num_warps": 8, "BLOCK_K": WIDE_BLOCK_K})
    try:
        free = all(torch.equal(step, step_linear_triton(x, w, wide=t, **kwargs)) for t in wides)
    except Exception:  # noqa: BLE001 - a tile this device cannot build keeps the step tile's K step everywhere
        free = False
    _WIDE_FREE_K[key] = free
    return free


_COUNTERS: dict[tuple[str, int | None], list[torch.Tensor]] = {}


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    """Zeroed int32 arrival counters for split-K, at least `tiles` of them, shared by every call on the device
    (the step runs on one stream, and each call's last program resets its tiles to zero). A larger set replaces
    the current one when a call needs more; the old ones stay allocated, since captured graphs still use them."""
    held = _COUNTERS.setdefault((device.type, device.index), [])
    if not held or held[-1].numel() < tiles:
        held.append(
            torch.zeros(
                max(tiles, 4096, 2 * held[-1].numel() if held else 0), device=device, dtype=torch.int32
            )
        )
    return held[-1]


def tile_in_use(key: tuple, device: torch.device) -> dict[str, int] | None:
    """The tile `step_linear_triton` runs for `key` in this process (tuned or stored), or None when none is
    known yet (the first call tunes it)."""
    return tuner.tile_in_use(key, device, sm_count(device), TUNED)


def _stored(key: tuple, device: torch.device) -> dict[str, int] | None:
    """The tile a previous process (or the bundled table) chose for this GEMM on this GPU (tuning.tuner.stored)."""
    return tuner.stored(key, device, sm_count(device), TUNED)


def _tune(key: tuple, launch, out: torch.Tensor, weight: torch.Tensor) -> dict[str, int]:
    """The tuner's choice for this GEMM (tuning.tuner.tune), timed with this module's time_in_graph."""
    kernels = (_step_linear, _step_linear_stream)
    return tuner.tune(key, launch, out, weight, kernels, sm_count(weight.device), time_in_graph, TUNED)


def sm_count(device: torch.device) -> int:
    """The device's SM count (4 off CUDA, where the interpreter runs the kernels: a few programs, several
    partitions)."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _SMS.get(index)
    if count is None:
        count = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


_SMS: dict[int, int] = {}


def stream_programs(stream: int, units: int, device: torch.device) -> int:
    """Programs a stream-K call runs: `stream` per SM, at most one per (column tile, K tile) unit."""
    return max(1, min(units, stream * sm_count(device)))


# ---------------------------------------------------------------- rotation, K/V write, attention
#
# One kernel, `_attention`, does a step's attention inputs and its attention, in the modes its flags select:
#
# - WRITE: k (normed, rotated) and v of the step's rows written into the cache at their cache rows, for one KV
#   head per program (and with WRITE_Q, that head's group of q heads rotated into a q buffer);
# - ATTEND: the causal attention of the query rows of one KV head's group over the cache rows first[b]..last[b, i],
#   q read pre-rotated from a q buffer or (ROTATE_Q) taken from qkv and rotated as it loads;
# - both at once (a step of at most FUSED_ROWS rows per sequence): every program first writes all the step's
#   K/V rows of its KV head, then (after a barrier, so its own threads see them) attends. Programs of one KV head
#   write the same values to the same rows, so none can read a different one. This saves the separate rotation
#   kernel per layer.
#
# Every rotation, in every mode, is `_rotate_rows` on a [BLOCK_M, BLOCK_D] tile of rows, so a row is rotated with
# the same instructions whatever the mode and the row count (batch invariance). cos and sin come from fp32
# tables [positions, hd/2] (attention scaling folded in), built once from the model's frequencies.

FUSED_ROWS = rows.STEP  # at most this many rows per sequence: rotation, K/V write and attention in one launch


@triton.jit
def _rotate_rows(
    src_ptr,
    m,
    col,
    ok,
    pos,
    cos_ptr,
    sin_ptr,
    w_ptr,
    eps,
    s_src,
    s_tab,
    D,
    HALF,
    QK_NORM: tl.constexpr,
    IN_DTYPE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Rows m [R] of a head starting at column col [R] of src (a qkv row), (RMSNormed and) rotated at positions
    pos [R] -> [R, BLOCK_D] in src's dtype. NeoX halves: column d pairs with d ± hd/2."""
    dtype = src_ptr.dtype.element_ty
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    mask = ok[:, None] & d_ok[None, :]
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    base = src_ptr + m.to(tl.int64)[:, None] * s_src + col[:, None]
    x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:  # Qwen3RMSNorm over the head: fp32 reduction, cast back, then x weight
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=d_ok, other=0.0).to(tl.float32)
        x = ((x * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]).to(dtype).to(tl.float32)
        xp = ((xp * rstd[:, None]).to(dtype).to(tl.float32) * wp[None, :]).to(dtype).to(tl.float32)
    j = tl.where(d < HALF, d, d - HALF)
    # a left-padding row's position is negative: it reads angle 0 (its result is never seen) rather than before
    # the table
    angle = tl.maximum(pos, 0).to(tl.int64)[:, None] * s_tab + j[None, :]
    c = tl.load(cos_ptr + angle, mask=mask, other=0.0)
    s = tl.load(sin_ptr + angle, mask=mask, other=0.0)
    sign = tl.where(d < HALF, -1.0, 1.0)[None, :]  # lo' = lo c - hi s, hi' = hi c + lo s
    if IN_DTYPE:  # the drafter's rounding: angles in the dtype, every product and sum rounded to it
        c = c.to(dtype).to(tl.float32)
        s = s.to(dtype).to(tl.float32)
        return ((x * c).to(dtype).to(tl.float32) + sign * (xp * s).to(dtype).to(tl.float32)).to(dtype)
    return (x * c + sign * (xp * s)).to(dtype)  # fp32, rounded once


@triton.jit
def _attention(
    qkv_ptr,
    q_ptr,
    kc_ptr,
    vc_ptr,
    rows_ptr,
    pos_ptr,
    last_ptr,
    first_ptr,
    cos_ptr,
    sin_ptr,
    qn_ptr,
    kn_ptr,
    o_ptr,
    n,
    H,
    G,
    KV,
    D,
    HALF,
    eps,
    sm_scale,
    s_qkv,
    s_q_m,
    s_q_h,
    s_c_b,
    s_c_h,
    s_c_r,
    s_o_m,
    s_tab,
    capacity,
    WRITE: tl.constexpr,
    WRITE_Q: tl.constexpr,
    ATTEND: tl.constexpr,
    ROTATE_Q: tl.constexpr,
    QK_NORM: tl.constexpr,
    IN_DTYPE: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    batch = (pid1 // KV).to(tl.int64)
    kvh = pid1 % KV
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    base = batch * s_c_b + kvh.to(tl.int64) * s_c_h
    if WRITE:
        # WRITE alone: this program's BLOCK_M rows; with ATTEND: every row of the step
        lo_row = 0 if ATTEND else pid0 * BLOCK_M
        hi_row = n if ATTEND else lo_row + BLOCK_M
        for r0 in range(lo_row, hi_row, BLOCK_M):
            i = r0 + tl.arange(0, BLOCK_M)
            ok = i < n
            m = batch * n + i
            pos = tl.load(pos_ptr + m, mask=ok, other=0)
            row = tl.load(rows_ptr + m, mask=ok, other=0)
            k = _rotate_rows(
                qkv_ptr,
                m,
                (H + kvh) * D + i * 0,
                ok,
                pos,
                cos_ptr,
                sin_ptr,
                kn_ptr,
                eps,
                s_qkv,
                s_tab,
                D,
                HALF,
                QK_NORM,
                IN_DTYPE,
                BLOCK_D,
            )
            v = tl.load(
                qkv_ptr + m.to(tl.int64)[:, None] * s_qkv + (H + KV + kvh) * D + d[None, :],
                mask=ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            into = base + row.to(tl.int64)[:, None] * s_c_r + d[None, :]
            keep = (ok & (row < capacity))[:, None] & d_ok[None, :]  # never past the cache
            tl.store(kc_ptr + into, k.to(kc_ptr.dtype.element_ty), mask=keep)
            tl.store(vc_ptr + into, v.to(vc_ptr.dtype.element_ty), mask=keep)
            if WRITE_Q:
                for g in range(0, G):
                    head = kvh * G + g
                    q = _rotate_rows(
                        qkv_ptr,
                        m,
                        head * D + i * 0,
                        ok,
                        pos,
                        cos_ptr,
                        sin_ptr,
                        qn_ptr,
                        eps,
                        s_qkv,
                        s_tab,
                        D,
                        HALF,
                        QK_NORM,
                        IN_DTYPE,
                        BLOCK_D,
                    )
                    tl.store(
                        q_ptr + m.to(tl.int64)[:, None] * s_q_m + head * s_q_h + d[None, :],
                        q,
                        mask=ok[:, None] & d_ok[None, :],
                    )
        if ATTEND:
            tl.debug_barrier()  # this program's K/V rows are visible to all its threads
    if ATTEND:
        r = pid0 * BLOCK_M + tl.arange(0, BLOCK_M)
        r_ok = r < G * n
        g = r // n
        i = r % n
        head = kvh * G + g
        m = batch * n + i
        if ROTATE_Q:
            pos = tl.load(pos_ptr + m, mask=r_ok, other=0)
            q = _rotate_rows(
                qkv_ptr,
                m,
                head * D,
                r_ok,
                pos,
                cos_ptr,
                sin_ptr,
                qn_ptr,
                eps,
                s_qkv,
                s_tab,
                D,
                HALF,
                QK_NORM,
                IN_DTYPE,
                BLOCK_D,
            )
        else:
            q = tl.load(
                q_ptr + m[:, None] * s_q_m + head[:, None] * s_q_h + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
        first = tl.load(first_ptr + batch)
        # a left-padding query row (last < first) and the rows past the group see the first row only: no row is
        # ever without a visible key (an empty softmax row is NaN, and NaN K/V in the cache would poison later
        # queries)
        last = tl.maximum(tl.where(r_ok, tl.load(last_ptr + m, mask=r_ok, other=0), first), first)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        lo = (
            first // BLOCK_N
        ) * BLOCK_N  # a fixed block grid from row 0: the same blocks for every step shape
        hi = tl.max(last, axis=0) + 1
        for start in range(lo, hi, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            kv_mask = ((keys >= first) & (keys < hi))[:, None] & d_ok[
                None, :
            ]  # rows before `first`: never read
            at = base + keys[:, None].to(tl.int64) * s_c_r + d[None, :]
            k = tl.load(kc_ptr + at, mask=kv_mask, other=0.0)
            v = tl.load(vc_ptr + at, mask=kv_mask, other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
            visible = (keys[None, :] >= first) & (keys[None, :] <= last[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            o_ptr + m[:, None] * s_o_m + head[:, None] * D + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=r_ok[:, None] & d_ok[None, :],
        )


def _launch_attention(
    mode: dict[str, bool],
    grid: tuple[int, int],
    *,
    qkv: torch.Tensor,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
    first: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    out: torch.Tensor,
    n: int,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
    rotate_in_dtype: bool,
) -> None:
    hd = keys.shape[3]
    _attention[grid](
        qkv,
        q,
        keys,
        values,
        rows,
        positions,
        last,
        first,
        cos,
        sin,
        q_norm if q_norm is not None else cos,
        k_norm if k_norm is not None else cos,
        out,
        n,
        num_heads,
        max(num_heads // num_kv_heads, 1),
        num_kv_heads,
        hd,
        hd // 2,
        eps,
        hd**-0.5,
        qkv.stride(0),
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        out.stride(0),
        cos.stride(0),
        keys.shape[2],
        QK_NORM=k_norm is not None,
        IN_DTYPE=rotate_in_dtype,
        UPCAST=keys.dtype == torch.float32 or _interpreted(),
        PRECISION="ieee",
        BLOCK_M=BLOCK_M,
        BLOCK_N=ATTENTION_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(hd)),
        num_warps=4,
        num_stages=2,
        **mode,
    )


def rope_kv_triton(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """See step.rope_kv_reference. qkv [b, n, (H + 2 KV)·hd] -> q [b, n, H, hd]; keys/values written in place
    (one program per 16 rows and KV head; `_attention`'s WRITE mode)."""
    b, n, width = qkv.shape
    hd = width // (num_heads + 2 * num_kv_heads)
    flat = qkv.reshape(b * n, width)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    q = torch.empty((b * n, num_heads, hd), device=qkv.device, dtype=qkv.dtype)
    if b * n == 0:
        return q.view(b, n, num_heads, hd)
    rows = rows.reshape(b * n).contiguous()
    positions = positions.reshape(b * n).contiguous()
    _launch_attention(
        {"WRITE": True, "WRITE_Q": num_heads > 0, "ATTEND": False, "ROTATE_Q": False},
        (triton.cdiv(n, BLOCK_M), b * num_kv_heads),
        qkv=flat, q=q, keys=keys, values=values, rows=rows, positions=positions, last=rows, first=rows,
        cos=cos, sin=sin, q_norm=q_norm if q_norm is not None else k_norm, k_norm=k_norm, out=flat, n=n,
        num_heads=num_heads, num_kv_heads=num_kv_heads, eps=eps, rotate_in_dtype=rotate_in_dtype,
    )  # fmt: skip
    return q.view(b, n, num_heads, hd)


def step_attention_triton(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, last: torch.Tensor, first: torch.Tensor
) -> torch.Tensor:
    """See step.step_attention_reference. q [b, n, H, hd] -> [b, n, H·hd] (`_attention`'s ATTEND mode, q from
    a buffer)."""
    b, n, heads, hd = q.shape
    kv_heads = keys.shape[1]
    out = torch.empty((b * n, heads * hd), device=q.device, dtype=q.dtype)
    if b * n == 0:
        return out.view(b, n, heads * hd)
    flat_q = q.reshape(b * n, heads, hd)
    if flat_q.stride(-1) != 1:
        flat_q = flat_q.contiguous()
    last = last.reshape(b * n).contiguous()
    _launch_attention(
        {"WRITE": False, "WRITE_Q": False, "ATTEND": True, "ROTATE_Q": False},
        (triton.cdiv(heads // kv_heads * n, BLOCK_M), b * kv_heads),
        qkv=out, q=flat_q, keys=keys, values=values, rows=last, positions=last, last=last,
        first=first.contiguous(), cos=out, sin=out, q_norm=None, k_norm=None, out=out, n=n, num_heads=heads,
        num_kv_heads=kv_heads, eps=0.0, rotate_in_dtype=False,
    )  # fmt: skip
    return out.view(b, n, heads * hd)


def rope_attention_triton(
    qkv: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
    first: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    rotate_in_dtype: bool = False,
) -> torch.Tensor:
    """See step.rope_attention_reference. qkv [b, n, (H + 2 KV)·hd] -> [b, n, H·hd]; keys/values written in
    place. At most FUSED_ROWS rows per sequence: one launch (write, barrier, attend); more (a prefill): the
    write, then the attention, each rotating its rows as the fused launch does."""
    b, n, width = qkv.shape
    hd = width // (num_heads + 2 * num_kv_heads)
    out = torch.empty((b * n, num_heads * hd), device=qkv.device, dtype=qkv.dtype)
    if b * n == 0:
        return out.view(b, n, num_heads * hd)
    flat = qkv.reshape(b * n, width)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    common: dict[str, Any] = dict(
        qkv=flat, q=out, keys=keys, values=values, rows=rows.reshape(b * n).contiguous(),
        positions=positions.reshape(b * n).contiguous(), last=last.reshape(b * n).contiguous(),
        first=first.contiguous(), cos=cos, sin=sin, q_norm=q_norm, k_norm=k_norm, out=out, n=n,
        num_heads=num_heads, num_kv_heads=num_kv_heads, eps=eps, rotate_in_dtype=rotate_in_dtype,
    )  # fmt: skip
    query_tiles = triton.cdiv(num_heads // num_kv_heads * n, BLOCK_M)
    if n <= FUSED_ROWS:
        mode = {"WRITE": True, "WRITE_Q": False, "ATTEND": True, "ROTATE_Q": True}
        _launch_attention(mode, (query_tiles, b * num_kv_heads), **common)
    else:
        mode = {"WRITE": True, "WRITE_Q": False, "ATTEND": False, "ROTATE_Q": False}
        _launch_attention(mode, (triton.cdiv(n, BLOCK_M), b * num_kv_heads), **common)
        mode = {"WRITE": False, "WRITE_Q": False, "ATTEND": True, "ROTATE_Q": True}
        _launch_attention(mode, (query_tiles, b * num_kv_heads), **common)
    return out.view(b, n, num_heads * hd)
