"""Triton kernels for the LiLiCorr draft step; each mirrors a torch reference in ops/core.py.

Shared conventions (the references implement exactly the same):
  - scores and logits are read in their dtype and compared in fp32;
  - a NaN is ordered as -inf for every selection (a NaN logit is never a candidate ahead of a finite
    one); `topk_lse` reports lse = NaN for a row that holds any NaN, so a broken row stays visible;
  - ties go to the lower index (tl.argmax(tie_break_left) and torch.argmax agree).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

# Tuned on an H200 (bench/tune.py --topk): V = 151936 bf16 gives 594 tiles, 75 scan programs per row.
TILE = 256  # columns per tile: the scan stores one maximum per tile
TILES_PER_PROGRAM = 8  # tiles one scan program reads in a single load (2048 columns, 4 KiB of bf16)
# One warp per scan program: every reduction stays inside the warp (shuffles, no barrier, no shared memory),
# and many small programs keep more bytes in flight than fewer wide ones (n = 480: 37.9 -> 35.0 us alone).
SCAN_WARPS = 1
# The per-row select is a latency-bound chain of reductions (bench/tune.py --topk).
SELECT_WARPS = 4
WALK_WARPS = 4
ATTENTION_BLOCK_M = 16  # query rows per lattice-attention program (n = 120 at Qwen3-8B geometry: 8 blocks)


# ---------------------------------------------------------------- topk_lse
#
# Two kernels. The scan reads every logit once: per tile of TILE columns it stores the tile maximum, and
# per program an online-softmax partial (m, s). The select kernel (one program per row) combines the
# partials into the log-partition, picks the k tiles with the largest maxima and orders only their
# k * TILE columns.
#
# Why the tile pre-selection is exact. Order a row by (value descending, column ascending) and let x be
# one of its first k elements. Its tile's maximum is >= x. Select the k tiles with the largest maxima,
# ties to the lower tile. Suppose x's tile were not selected: each of the k selected tiles holds an
# element >= x (its maximum is >= x's tile maximum >= x), and an element equal to x can only sit in a
# selected tile of lower index (the tie on the tile maximum was broken towards it), so at a lower
# column. Either way k elements precede x in the order, contradicting x being among the first k. So the
# first k elements lie inside the k selected tiles. Every comparison breaks ties by column, so the
# result is the stable descending order of the row, exactly what the reference returns.
#
# The select compares int32 keys, never floats: an int32 max over a warp is one redux.sync instruction,
# where an fp32 max is five shuffles. A value becomes its "ordered" bits (the float's bits, with the
# magnitude bits flipped for negatives, so integer order is float order; -0.0 is read as +0.0, NaN as
# -inf). For 16-bit logits the value takes 16 bits and a position the low 16 (inverted, so that a tie goes
# to the lower position): one reduction per round picks both. fp32 logits use two reductions per round
# (the value, then the lowest column holding it). A taken entry becomes INT32_MIN, below every real key, so
# -inf entries stay selectable in column order.


@triton.jit
def _tile_scan(
    logits_ptr,
    stride_row,
    n_cols,
    tile_max_ptr,
    part_m_ptr,
    part_s_ptr,
    n_tiles,
    n_parts,
    TILE: tl.constexpr,
    TPP: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    tiles = part * TPP + tl.arange(0, TPP)
    cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]  # [TPP, TILE], one load
    # read once and never again by this kernel: evict_first keeps the select's inputs in L2 (-0.9 us at n = 480)
    x = tl.load(
        logits_ptr + row.to(tl.int64) * stride_row + cols,
        mask=cols < n_cols,
        other=float("-inf"),
        eviction_policy="evict_first",
    ).to(tl.float32)
    # tl.max skips NaN (maxNum): a tile's maximum is NaN only when every entry is; the select reads it as -inf
    tile_max = tl.max(x, axis=1)  # [TPP]
    tl.store(tile_max_ptr + row * n_tiles + tiles, tile_max, mask=tiles < n_tiles)
    m = tl.max(tile_max, axis=0)
    # an infinite maximum is no reference point (inf - inf is NaN): 0 instead, as the reference does
    m_ref = tl.where(tl.abs(m) == float("inf"), 0.0, m) * 1.4426950408889634
    # a NaN logit makes this partial, and so the row's lse, NaN
    s = tl.sum(tl.sum(tl.exp2(x * 1.4426950408889634 - m_ref), axis=1), axis=0)
    tl.store(part_m_ptr + row * n_parts + part, m)
    tl.store(part_s_ptr + row * n_parts + part, s)


INT32_MIN = tl.constexpr(-(1 << 31))


@triton.jit
def _ordered32(v):
    """fp32 without NaN -> int32 in the same order; -0.0 as +0.0."""
    b = tl.where(v == 0, 0.0, v).to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _ordered16(v, NEG_INF_BITS: tl.constexpr):
    """16-bit floats -> their ordered bits in int32 [-32768, 32767]; NaN as -inf, -0.0 as +0.0."""
    raw = v.to(tl.int16, bitcast=True).to(tl.int32)
    raw = tl.where(v.to(tl.float32) != v.to(tl.float32), NEG_INF_BITS, raw)
    raw = tl.where(raw == -32768, 0, raw)
    return tl.where(raw >= 0, raw, raw ^ 0x7FFF)


@triton.jit
def _take_largest(key, index):
    """The largest int32 key, the lowest index holding it, and key with that entry taken out."""
    best = tl.max(key)
    at = tl.min(tl.where(key == best, index, 1 << 30))
    return best, at, tl.where(index == at, INT32_MIN, key)


@triton.jit
def _next_below(ukey, bound):
    """The largest of the unique uint32 keys `ukey` below bound + 1, as one unsigned min: bound - ukey wraps
    the keys above the bound past every key below it, so no entry has to be taken out between rounds."""
    return bound - tl.min(bound - ukey)


@triton.jit
def _tile_select(
    logits_ptr,
    stride_row,
    n_cols,
    tile_max_ptr,
    part_m_ptr,
    part_s_ptr,
    values_ptr,
    ids_ptr,
    lse_ptr,
    n_tiles,
    n_parts,
    k,
    TILE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PACK16: tl.constexpr,
    NEG_INF_BITS: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    p_offs = tl.arange(0, BLOCK_P)
    pm = tl.load(part_m_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=float("-inf"))
    ps = tl.load(part_s_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=0.0)
    t_offs = tl.arange(0, BLOCK_T)
    tmax = tl.load(tile_max_ptr + row * n_tiles + t_offs, mask=t_offs < n_tiles, other=float("-inf"))
    gm = tl.max(pm, axis=0)
    # each partial was summed relative to its own maximum, or 0 where that is infinite; so is the total
    part_ref = tl.where(tl.abs(pm) == float("inf"), 0.0, pm)
    row_ref = tl.where(tl.abs(gm) == float("inf"), 0.0, gm)
    total = tl.sum(tl.where(ps != 0, ps * tl.exp(part_ref - row_ref), ps), axis=0)
    lse = row_ref + tl.log(total)  # -inf for a row of -inf, +inf with a +inf logit, NaN with a NaN
    tl.store(lse_ptr + row, lse)

    # the k tiles with the largest maxima (ties: lower tile); an all-NaN tile has a NaN maximum, read as -inf
    k_offs = tl.arange(0, BLOCK_K)
    tmax = tl.where(tmax != tmax, float("-inf"), tmax)
    tiles = tl.zeros((BLOCK_K,), tl.int32)
    kt = tl.minimum(k, n_tiles)
    if PACK16:  # a tile maximum of 16-bit logits is a 16-bit value: (value, tile) in one key (< 65536 tiles)
        tkey = _ordered16(tmax.to(logits_ptr.dtype.element_ty), NEG_INF_BITS)
        tkey = tl.where(t_offs < n_tiles, (tkey << 16) | (0xFFFF - t_offs), INT32_MIN)
        ukey = tkey.to(tl.uint32, bitcast=True) ^ 0x80000000  # unsigned order = signed order; low bits kept
        bound = 0xFFFFFFFF
        for r in range(kt):
            best = _next_below(ukey, bound)
            tiles = tl.where(k_offs == r, 0xFFFF - (best & 0xFFFF).to(tl.int32), tiles)
            bound = best - 1
    else:
        tkey = tl.where(t_offs < n_tiles, _ordered32(tmax), INT32_MIN)
        for r in range(kt):
            _, at, tkey = _take_largest(tkey, t_offs)
            tiles = tl.where(k_offs == r, at, tiles)

    # order their columns (ties: lower column)
    cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]  # [BLOCK_K, TILE]
    ok = (k_offs[:, None] < kt) & (cols < n_cols)
    y = tl.load(base + cols, mask=ok, other=float("-inf"))
    if PACK16:
        # the position must follow the column, and the tiles were chosen by maximum: rank them by index
        by_index = tl.where(k_offs < kt, tiles, 1 << 30)
        rank = tl.sum((by_index[None, :] < by_index[:, None]).to(tl.int32), axis=1)
        pos = rank[:, None] * TILE + tl.arange(0, TILE)[None, :]
        key = tl.where(ok, (_ordered16(y, NEG_INF_BITS) << 16) | (0xFFFF - pos), INT32_MIN)
        ukey = key.to(tl.uint32, bitcast=True) ^ 0x80000000
        out_u = tl.zeros((BLOCK_K,), tl.uint32)
        bound = 0xFFFFFFFF
        for j in range(k):  # (at least k real entries were gathered, so no round runs dry)
            best = _next_below(ukey, bound)
            out_u = tl.where(k_offs == j, best, out_u)
            bound = best - 1
        out = (out_u ^ 0x80000000).to(tl.int32, bitcast=True)
        o16 = out >> 16
        out_v = tl.where(o16 >= 0, o16, o16 ^ 0x7FFF).to(tl.int16).to(y.dtype, bitcast=True).to(tl.float32)
        pos = 0xFFFF - (out & 0xFFFF)
        tile = tl.sum(tl.where((pos // TILE)[:, None] == rank[None, :], tiles[None, :], 0), axis=1)
        out_i = (tile * TILE + pos % TILE).to(tl.int64)
    else:
        y = y.to(tl.float32)
        key = tl.where(ok, _ordered32(tl.where(y != y, float("-inf"), y)), INT32_MIN)
        out_v = tl.full((BLOCK_K,), float("-inf"), tl.float32)
        out_i = tl.zeros((BLOCK_K,), tl.int64)
        for j in range(k):
            best, at, key = _take_largest(key, cols)
            o = tl.where(best >= 0, best, best ^ 0x7FFFFFFF)
            out_v = tl.where(k_offs == j, o.to(tl.float32, bitcast=True), out_v)
            out_i = tl.where(k_offs == j, at.to(tl.int64), out_i)
    tl.store(values_ptr + row * k + k_offs, out_v, mask=k_offs < k)
    tl.store(ids_ptr + row * k + k_offs, out_i, mask=k_offs < k)


# -inf as 16-bit patterns (sign-extended to int32), for NaN entries of 16-bit logits
_NEG_INF_BITS = {torch.bfloat16: -128, torch.float16: -1024}


def topk_lse_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """values [n, k] fp32 descending, ids [n, k] int64, lse [n] fp32, in one pass over [n, V] logits."""
    n, v = logits.shape
    if not 1 <= k <= 16 or k > v:
        raise ValueError(f"topk_lse_triton supports 1 <= k <= min(16, V), got k={k}, V={v}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    n_tiles = triton.cdiv(v, TILE)
    tpp = min(TILES_PER_PROGRAM, triton.next_power_of_2(n_tiles))
    n_parts = triton.cdiv(n_tiles, tpp)
    dev = logits.device
    tile_max = torch.empty((n, n_tiles), device=dev, dtype=torch.float32)
    part_m = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    part_s = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    values = torch.empty((n, k), device=dev, dtype=torch.float32)
    ids = torch.empty((n, k), device=dev, dtype=torch.int64)
    lse = torch.empty((n,), device=dev, dtype=torch.float32)
    if n == 0:
        return values, ids, lse
    _tile_scan[(n, n_parts)](
        logits,
        logits.stride(0),
        v,
        tile_max,
        part_m,
        part_s,
        n_tiles,
        n_parts,
        TILE=TILE,
        TPP=tpp,
        num_warps=SCAN_WARPS,
    )
    block_k = triton.next_power_of_2(k)
    # 16-bit keys hold a tile index and a position among the chosen tiles' columns
    pack16 = logits.dtype in _NEG_INF_BITS and n_tiles <= 1 << 16 and block_k * TILE <= 1 << 16
    _tile_select[(n,)](
        logits,
        logits.stride(0),
        v,
        tile_max,
        part_m,
        part_s,
        values,
        ids,
        lse,
        n_tiles,
        n_parts,
        k,
        TILE=TILE,
        BLOCK_T=triton.next_power_of_2(n_tiles),
        BLOCK_P=triton.next_power_of_2(n_parts),
        BLOCK_K=block_k,
        PACK16=pack16,
        NEG_INF_BITS=_NEG_INF_BITS.get(logits.dtype, 0),
        num_warps=SELECT_WARPS,
    )
    return values, ids, lse


# ---------------------------------------------------------------- lattice walks
#
# One program per row, in two phases. A walk is a chain of S dependent picks; fetching each picked row from
# memory would put S memory round trips on that chain. So first every row of the lattice (row 0: the start
# scores; row 1 + (s-1)·K + i: the scores following candidate i of slot s-1) is loaded at once and its pick
# computed in parallel: a table of what the walk would choose after each candidate. The walk then only
# follows that table (S lookups in a [1 + (S-1)·K] int vector held in registers), and the ids of the chosen
# candidates are gathered in one load at the end.


@triton.jit
def _lattice_rows(
    start_ptr,
    pairs_ptr,
    b,
    r,
    K,
    n_rows,
    s_start_b,
    s_pairs_b,
    s_pairs_s,
    s_pairs_i,
    s_pairs_j,
    BLOCK_K: tl.constexpr,
):
    """Lattice rows r (a vector; see above) as [len(r), BLOCK_K] fp32, NaN and padding as -inf."""
    offs = tl.arange(0, BLOCK_K)
    col_ok = offs[None, :] < K
    pair = tl.maximum(r - 1, 0)
    from_pairs = (r >= 1) & (r < n_rows)
    x = tl.load(
        pairs_ptr
        + b * s_pairs_b
        + (pair // K)[:, None] * s_pairs_s
        + (pair % K)[:, None] * s_pairs_i
        + offs[None, :] * s_pairs_j,
        mask=from_pairs[:, None] & col_ok,
        other=float("-inf"),
    ).to(tl.float32)
    first = tl.load(
        start_ptr + b * s_start_b + offs[None, :] + r[:, None] * 0,
        mask=(r[:, None] == 0) & col_ok,
        other=float("-inf"),
    ).to(tl.float32)
    x = tl.where(r[:, None] == 0, first, x)
    return tl.where(x != x, float("-inf"), x)  # a NaN score is never picked ahead of a finite one


@triton.jit
def _rows_argmax(x, K, BLOCK_K: tl.constexpr):
    """Per row: the first index of the maximum among the first K columns."""
    offs = tl.arange(0, BLOCK_K)[None, :]
    x = tl.where(offs < K, x, float("-inf"))
    best = tl.max(x, axis=1)
    return tl.min(tl.where((x == best[:, None]) & (offs < K), offs, 1 << 30), axis=1)


@triton.jit
def _follow(picks, S, K, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """Walk the pick table: (candidate chosen at each slot [BLOCK_S], the lattice row it was drawn from)."""
    r = tl.arange(0, BLOCK_R)
    slots = tl.arange(0, BLOCK_S)
    c = tl.sum(tl.where(r == 0, picks, 0), axis=0)
    chosen = tl.where(slots == 0, c, 0)
    drawn_from = tl.zeros((BLOCK_S,), tl.int32)
    for s in range(1, S):
        row = 1 + (s - 1) * K + c
        c = tl.sum(tl.where(r == row, picks, 0), axis=0)
        chosen = tl.where(slots == s, c, chosen)
        drawn_from = tl.where(slots == s, row, drawn_from)
    return chosen, drawn_from


@triton.jit
def _greedy_walk(
    start_ptr,
    pairs_ptr,
    ids_ptr,
    tokens_ptr,
    S,
    K,
    s_start_b,
    s_pairs_b,
    s_pairs_s,
    s_pairs_i,
    s_pairs_j,
    s_ids_b,
    s_ids_s,
    s_ids_k,
    s_tok_b,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, BLOCK_S)
    rows = _lattice_rows(
        start_ptr,
        pairs_ptr,
        b,
        tl.arange(0, BLOCK_R),
        K,
        1 + (S - 1) * K,
        s_start_b,
        s_pairs_b,
        s_pairs_s,
        s_pairs_i,
        s_pairs_j,
        BLOCK_K,
    )
    chosen, _ = _follow(_rows_argmax(rows, K, BLOCK_K), S, K, BLOCK_R, BLOCK_S)
    tokens = tl.load(ids_ptr + b * s_ids_b + slots * s_ids_s + chosen * s_ids_k, mask=slots < S)
    tl.store(tokens_ptr + b * s_tok_b + slots, tokens, mask=slots < S)


def walk_fits(slots: int, k: int) -> bool:
    """Whether a row's whole lattice ([1 + (S-1)·K, K] scores) fits one walk program's registers."""
    return (1 + max(slots - 1, 0) * k) * k <= 1 << 16


def _walk_blocks(s: int, k: int) -> dict[str, int]:
    block_k = max(16, triton.next_power_of_2(k))
    block_r = max(16, triton.next_power_of_2(1 + (s - 1) * k))
    return {
        "BLOCK_R": block_r,
        "BLOCK_S": max(16, triton.next_power_of_2(s)),
        "BLOCK_K": block_k,
        "num_warps": WALK_WARPS if block_r * block_k <= 4096 else 8,
    }


def greedy_walk_triton(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    b, k = start.shape
    s = ids.shape[1]
    tokens = torch.empty((b, s), device=start.device, dtype=ids.dtype)
    if b == 0 or s == 0:
        return tokens
    start = start if start.stride(-1) == 1 else start.contiguous()
    _greedy_walk[(b,)](
        start,
        pairs,
        ids,
        tokens,
        s,
        k,
        start.stride(0),
        *pairs.stride(),
        *ids.stride(),
        tokens.stride(0),
        **_walk_blocks(s, k),
    )
    return tokens


@triton.jit
def _sample_rows(x, K, u, t, greedy, BLOCK_K: tl.constexpr):
    """Per row of scores x [R, BLOCK_K] (no NaN) with uniforms u [R]: (pick [R], q [R, BLOCK_K])."""
    offs = tl.arange(0, BLOCK_K)[None, :]
    valid = offs < K
    x = tl.where(valid, x, float("-inf"))
    best = tl.max(x, axis=1)
    arg = _rows_argmax(x, K, BLOCK_K)  # the greedy walk's pick, so greedy rows follow exactly its path
    scaled = x / t
    smax = tl.max(scaled, axis=1)
    e = tl.where(valid, tl.exp(scaled - tl.where(smax == float("-inf"), 0.0, smax)[:, None]), 0.0)
    total = tl.sum(e, axis=1)  # >= 1 whenever the row has a finite score; rows without one are no_support
    p = e / tl.where(total > 0, total, 1.0)[:, None]
    cdf = tl.cumsum(p, axis=1)
    pick = tl.minimum(tl.sum(tl.where(valid & (cdf <= u[:, None]), 1, 0), axis=1), K - 1)
    p_pick = tl.sum(tl.where(offs == pick[:, None], p, 0.0), axis=1)
    last_in_support = tl.max(tl.where(valid & (p > 0), offs, -1), axis=1)
    pick = tl.where(p_pick > 0, pick, last_in_support)
    no_support = (best == float("-inf")) | greedy
    pick = tl.where(no_support, arg, pick)
    q = tl.where(no_support[:, None], tl.where(offs == arg[:, None], 1.0, 0.0), p)
    return pick, q


@triton.jit
def _sample_walk(
    start_ptr,
    pairs_ptr,
    ids_ptr,
    u_ptr,
    temp_ptr,
    greedy_ptr,
    tokens_ptr,
    q_ptr,
    S,
    K,
    s_start_b,
    s_pairs_b,
    s_pairs_s,
    s_pairs_i,
    s_pairs_j,
    s_ids_b,
    s_ids_s,
    s_ids_k,
    s_u_b,
    s_u_s,
    s_tok_b,
    s_q_b,
    s_q_s,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    slots = tl.arange(0, BLOCK_S)
    r = tl.arange(0, BLOCK_R)
    n_rows = 1 + (S - 1) * K
    t = tl.maximum(tl.load(temp_ptr + b).to(tl.float32), 1e-5)
    greedy = tl.load(greedy_ptr + b) != 0
    rows = _lattice_rows(
        start_ptr, pairs_ptr, b, r, K, n_rows, s_start_b, s_pairs_b, s_pairs_s, s_pairs_i, s_pairs_j, BLOCK_K
    )
    slot_of_row = tl.where(
        r == 0, 0, (tl.maximum(r - 1, 0) // K) + 1
    )  # a row is drawn with its slot's uniform
    u = tl.load(u_ptr + b * s_u_b + slot_of_row * s_u_s, mask=r < n_rows, other=0.0).to(tl.float32)
    picks, _ = _sample_rows(rows, K, u, t, greedy, BLOCK_K)
    chosen, drawn_from = _follow(picks, S, K, BLOCK_R, BLOCK_S)
    # q: the distributions the picks were drawn from, recomputed from the same rows and uniforms
    u = tl.load(u_ptr + b * s_u_b + slots * s_u_s, mask=slots < S, other=0.0).to(tl.float32)
    _, q = _sample_rows(
        _lattice_rows(
            start_ptr,
            pairs_ptr,
            b,
            drawn_from,
            K,
            n_rows,
            s_start_b,
            s_pairs_b,
            s_pairs_s,
            s_pairs_i,
            s_pairs_j,
            BLOCK_K,
        ),
        K,
        u,
        t,
        greedy,
        BLOCK_K,
    )
    tl.store(
        q_ptr + b * s_q_b + slots[:, None] * s_q_s + offs[None, :],
        q,
        mask=(slots[:, None] < S) & (offs[None, :] < K),
    )
    tokens = tl.load(ids_ptr + b * s_ids_b + slots * s_ids_s + chosen * s_ids_k, mask=slots < S)
    tl.store(tokens_ptr + b * s_tok_b + slots, tokens, mask=slots < S)


def sample_walk_triton(
    start: torch.Tensor,
    pairs: torch.Tensor,
    ids: torch.Tensor,
    uniforms: torch.Tensor,
    temperatures: torch.Tensor,
    greedy_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, k = start.shape
    s = ids.shape[1]
    tokens = torch.empty((b, s), device=start.device, dtype=ids.dtype)
    q = torch.empty((b, s, k), device=start.device, dtype=torch.float32)
    if b == 0 or s == 0:
        return tokens, q
    start = start if start.stride(-1) == 1 else start.contiguous()
    temperatures = temperatures.contiguous()
    greedy = greedy_mask.to(torch.int8).contiguous()
    _sample_walk[(b,)](
        start,
        pairs,
        ids,
        uniforms,
        temperatures,
        greedy,
        tokens,
        q,
        s,
        k,
        start.stride(0),
        *pairs.stride(),
        *ids.stride(),
        *uniforms.stride(),
        tokens.stride(0),
        q.stride(0),
        q.stride(1),
        **_walk_blocks(s, k),
    )
    return tokens, q


# ---------------------------------------------------------------- RMSNorm (Qwen3 semantics)


@triton.jit
def _rms_norm(x_ptr, w_ptr, y_ptr, n_cols, eps, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps))).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # Qwen3RMSNorm: normalise in fp32, cast back to the input dtype, then multiply by the weight
    tl.store(y_ptr + row * stride_y + offs, (w * y.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D], weight [D] -> [..., D] in torch.result_type(weight, x), one program per row."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, device=x.device, dtype=torch.result_type(weight, x))
    if rows.shape[0]:
        block = triton.next_power_of_2(d)
        _rms_norm[(rows.shape[0],)](
            rows,
            weight,
            out,
            d,
            eps,
            rows.stride(0),
            out.stride(0),
            BLOCK=block,
            num_warps=4 if block <= 1024 else 8,
        )
    return out.view(x.shape)


# ---------------------------------------------------------------- lattice scores
#
# start[b, j] = s * <n(anchor[b]), n(in[b, 0, j])>, pairs[b, t, i, j] = s * <n(out[b, t, i]), n(in[b, t+1, j])>
# with n(v) = v / max(|v|, eps). One program per (row, slot, left vector): it loads the left vector and
# the K right vectors of the next slot in one go (no dependent loop on the critical path), and computes
# norms, dots and scale. Slot 0's left vector is the anchor; only its first program has work.


@triton.jit
def _lattice_scores(
    out_ptr,
    in_ptr,
    anchor_ptr,
    start_ptr,
    pairs_ptr,
    S,
    K,
    F,
    eps,
    scale,
    s_out_b,
    s_out_s,
    s_out_k,
    s_in_b,
    s_in_s,
    s_in_k,
    s_anchor_b,
    BLOCK_K: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    pid = tl.program_id(0)
    i = pid % K
    s = (pid // K) % S  # 0: the anchor against slot 0; t >= 1: slot t-1 (vector i) against slot t
    b = (pid // (K * S)).to(tl.int64)
    rows = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_F)
    # the flags as vectors (the same value in every lane): masks must be tensors in Triton's interpreter
    from_slot = (cols * 0 + s) > 0
    from_anchor = (cols * 0 + s + i) == 0
    slot_rows = (rows * 0 + s) > 0
    anchor_rows = (rows * 0 + s + i) == 0
    row_ok = rows < K
    dots = tl.zeros((BLOCK_K,), tl.float32)
    right_sq = tl.zeros((BLOCK_K,), tl.float32)
    left_sq = tl.zeros((BLOCK_F,), tl.float32)
    for f0 in range(0, F, BLOCK_F):
        f_ok = (f0 + cols) < F
        left = tl.load(
            out_ptr + b * s_out_b + (s - 1) * s_out_s + i * s_out_k + f0 + cols,
            mask=f_ok & from_slot,
            other=0.0,
        ).to(tl.float32) + tl.load(
            anchor_ptr + b * s_anchor_b + f0 + cols, mask=f_ok & from_anchor, other=0.0
        ).to(tl.float32)
        right = tl.load(
            in_ptr + b * s_in_b + s * s_in_s + rows[:, None] * s_in_k + (f0 + cols)[None, :],
            mask=row_ok[:, None] & (f_ok & (from_slot | from_anchor))[None, :],
            other=0.0,
        ).to(tl.float32)
        dots += tl.sum(left[None, :] * right, axis=1)
        right_sq += tl.sum(right * right, axis=1)
        left_sq += left * left
    left_norm = tl.maximum(tl.sqrt(tl.sum(left_sq, axis=0)), eps)
    scores = dots / (left_norm * tl.maximum(tl.sqrt(right_sq), eps)) * scale
    tl.store(pairs_ptr + ((b * (S - 1) + s - 1) * K + i) * K + rows, scores, mask=row_ok & slot_rows)
    tl.store(start_ptr + b * K + rows, scores, mask=row_ok & anchor_rows)


def lattice_scores_triton(
    out_vectors: torch.Tensor,
    in_vectors: torch.Tensor,
    anchor_vector: torch.Tensor,
    vector_eps: float,
    logit_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out/in [b, S, K, F] and anchor [b, F] (unnormalised) -> start [b, K], pairs [b, S-1, K, K] fp32."""
    b, s, k, f = in_vectors.shape
    start = torch.empty((b, k), device=in_vectors.device, dtype=torch.float32)
    pairs = torch.empty((b, max(s - 1, 0), k, k), device=in_vectors.device, dtype=torch.float32)
    if b and s:
        out_vectors = out_vectors if out_vectors.stride(-1) == 1 else out_vectors.contiguous()
        in_vectors = in_vectors if in_vectors.stride(-1) == 1 else in_vectors.contiguous()
        anchor_vector = anchor_vector if anchor_vector.stride(-1) == 1 else anchor_vector.contiguous()
        block_k = triton.next_power_of_2(k)
        _lattice_scores[(b * s * k,)](
            out_vectors,
            in_vectors,
            anchor_vector,
            start,
            pairs,
            s,
            k,
            f,
            vector_eps,
            logit_scale,
            out_vectors.stride(0),
            out_vectors.stride(1),
            out_vectors.stride(2),
            in_vectors.stride(0),
            in_vectors.stride(1),
            in_vectors.stride(2),
            anchor_vector.stride(0),
            BLOCK_K=block_k,
            BLOCK_F=max(16, min(triton.next_power_of_2(f), 8192 // block_k)),
            num_warps=4,
        )
    return start, pairs


# ---------------------------------------------------------------- candidate features + LayerNorm(5)


@triton.jit
def _normalized_features(lp, offs, ok, K, w_ptr, b_ptr, eps, dtype: tl.constexpr):
    """LayerNorm(5)(φ) of one row of K candidates as five [BLOCK_K] fp32 vectors (each rounded to dtype).

    φ = [ℓ, e^ℓ, ℓ - max ℓ, k/(K-1) (0 when K = 1), 1{k = 0}], rounded to the model dtype as the reference.
    """
    top = tl.max(tl.where(ok, lp, float("-inf")), axis=0)
    f0 = lp.to(dtype).to(tl.float32)
    f1 = tl.exp(lp).to(dtype).to(tl.float32)
    f2 = (lp - top).to(dtype).to(tl.float32)
    f3 = (offs.to(tl.float32) / tl.maximum(K - 1, 1).to(tl.float32)).to(dtype).to(tl.float32)
    f4 = tl.where(offs == 0, 1.0, 0.0)
    mean = (f0 + f1 + f2 + f3 + f4) / 5.0
    var = (
        (f0 - mean) * (f0 - mean)
        + (f1 - mean) * (f1 - mean)
        + (f2 - mean) * (f2 - mean)
        + (f3 - mean) * (f3 - mean)
        + (f4 - mean) * (f4 - mean)
    ) / 5.0
    inv = 1.0 / tl.sqrt(var + eps)
    n0 = ((f0 - mean) * inv * tl.load(w_ptr + 0).to(tl.float32) + tl.load(b_ptr + 0).to(tl.float32)).to(dtype)
    n1 = ((f1 - mean) * inv * tl.load(w_ptr + 1).to(tl.float32) + tl.load(b_ptr + 1).to(tl.float32)).to(dtype)
    n2 = ((f2 - mean) * inv * tl.load(w_ptr + 2).to(tl.float32) + tl.load(b_ptr + 2).to(tl.float32)).to(dtype)
    n3 = ((f3 - mean) * inv * tl.load(w_ptr + 3).to(tl.float32) + tl.load(b_ptr + 3).to(tl.float32)).to(dtype)
    n4 = ((f4 - mean) * inv * tl.load(w_ptr + 4).to(tl.float32) + tl.load(b_ptr + 4).to(tl.float32)).to(dtype)
    return n0.to(tl.float32), n1.to(tl.float32), n2.to(tl.float32), n3.to(tl.float32), n4.to(tl.float32)


# ---------------------------------------------------------------- feature MLP input: SiLU(up(LayerNorm(5)(φ)))
#
# The feature MLP's first Linear has five inputs: as a GEMM it is all overhead, so it is five FMAs per
# output here, fused with the features, their LayerNorm and the SiLU. Grid: (row of K candidates, block of
# hidden columns).


@triton.jit
def _feature_hidden(
    lp_ptr,
    nw_ptr,
    nb_ptr,
    up_w_ptr,
    up_b_ptr,
    out_ptr,
    K,
    H,
    eps,
    s_up_w,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK_K)
    ok = offs < K
    c_ok = cols < H
    dtype = out_ptr.dtype.element_ty
    lp = tl.load(lp_ptr + row * K + offs, mask=ok, other=0.0).to(tl.float32)
    n0, n1, n2, n3, n4 = _normalized_features(lp, offs, ok, K, nw_ptr, nb_ptr, eps, dtype)
    w = up_w_ptr + cols * s_up_w
    acc = (
        tl.load(up_b_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        + n0[:, None] * tl.load(w + 0, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        + n1[:, None] * tl.load(w + 1, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        + n2[:, None] * tl.load(w + 2, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        + n3[:, None] * tl.load(w + 3, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        + n4[:, None] * tl.load(w + 4, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    )
    up = acc.to(dtype).to(
        tl.float32
    )  # the Linear's output in the model dtype, then SiLU as torch computes it
    tl.store(
        out_ptr + (row * K + offs)[:, None] * H + cols[None, :],
        (up / (1.0 + tl.exp(-up))).to(dtype),
        mask=ok[:, None] & c_ok[None, :],
    )


def feature_hidden_triton(
    log_probs: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    eps: float,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor,
) -> torch.Tensor:
    """log_probs [..., K] -> SiLU(up(LayerNorm(5)(φ))) [..., K, H] in up_weight's dtype."""
    k = log_probs.shape[-1]
    h = up_weight.shape[0]
    rows = log_probs.reshape(-1, k).contiguous()
    out = torch.empty((*log_probs.shape, h), device=log_probs.device, dtype=up_weight.dtype)
    if rows.shape[0] and h:
        block_k = max(16, triton.next_power_of_2(k))
        block_h = min(triton.next_power_of_2(h), 4096 // block_k)
        _feature_hidden[(rows.shape[0], triton.cdiv(h, block_h))](
            rows,
            norm_weight,
            norm_bias,
            up_weight,
            up_bias,
            out,
            k,
            h,
            eps,
            up_weight.stride(0),
            BLOCK_K=block_k,
            BLOCK_H=block_h,
            num_warps=4,
        )
    return out


# ---------------------------------------------------------------- residual update + RMSNorm (+ factor input)
#
# x' = x + (delta + bias) and y = RMSNorm(x') in one pass over the row, with the roundings of the unfused
# torch code (the Linear's output and the sum each rounded to the model dtype). The last lattice layer
# writes the factor input [y, a, y ⊙ a] (a: the row's normalised anchor) instead of y, so no concatenation
# kernel runs either.


@triton.jit
def _residual_norm(
    x_ptr,
    d_ptr,
    bias_ptr,
    w_ptr,
    a_ptr,
    x_out_ptr,
    y_ptr,
    H,
    eps,
    rows_per_batch,
    s_x,
    s_d,
    s_xo,
    s_y,
    s_a,
    HAS_DELTA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FACTOR: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * s_x + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        update = tl.load(d_ptr + row * s_d + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            update = (update + tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype)
        x = (x.to(tl.float32) + update.to(tl.float32)).to(dtype)
        tl.store(x_out_ptr + row * s_xo + cols, x, mask=ok)
    x = x.to(tl.float32)
    normed = (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps))).to(dtype).to(tl.float32)
    y = (tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32) * normed).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * s_y + cols, y, mask=ok)
    if FACTOR:
        a = tl.load(a_ptr + (row // rows_per_batch) * s_a + cols, mask=ok, other=0.0)
        tl.store(y_ptr + row * s_y + H + cols, a.to(y_ptr.dtype.element_ty), mask=ok)
        tl.store(
            y_ptr + row * s_y + 2 * H + cols,
            (y.to(tl.float32) * a.to(tl.float32)).to(y_ptr.dtype.element_ty),
            mask=ok,
        )


def residual_norm_triton(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    anchor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [b, n, H] -> (x + (delta + bias), RMSNorm(that)) or, with anchor [b, H], the factor input
    [b, n, 3H] in place of the norm."""
    b, n, h = x.shape
    rows = x.reshape(b * n, h)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    d = None
    if delta is not None:
        d = delta.reshape(b * n, h)
        d = d if d.stride(-1) == 1 else d.contiguous()
    x_out = torch.empty_like(rows) if delta is not None else rows
    y_dtype = torch.result_type(weight, x)
    y = torch.empty((b * n, 3 * h if anchor is not None else h), device=x.device, dtype=y_dtype)
    a = None
    if anchor is not None:
        a = anchor.expand(b, h)  # a [1, H] anchor serves every row (stride 0)
        a = a if a.stride(-1) == 1 else a.contiguous()
    if b * n:
        block = triton.next_power_of_2(h)
        _residual_norm[(b * n,)](
            rows,
            d if d is not None else rows,
            bias if bias is not None else weight,
            weight,
            a if a is not None else weight,
            x_out,
            y,
            h,
            eps,
            n,
            rows.stride(0),
            d.stride(0) if d is not None else 0,
            x_out.stride(0),
            y.stride(0),
            a.stride(0) if a is not None else 0,
            HAS_DELTA=delta is not None,
            HAS_BIAS=bias is not None,
            FACTOR=anchor is not None,
            BLOCK=block,
            num_warps=4 if block <= 1024 else 8,
        )
    return x_out.view(b, n, h), y.view(b, n, y.shape[-1])


# ---------------------------------------------------------------- lattice attention
#
# Bidirectional attention over the S·K lattice nodes with the additive slot bias [N, n, n], reading q, k, v
# straight out of the in_proj output [b, n, 3h] and writing [b, n, h] (no transposes or copies). A
# flash-style loop over key blocks with an online softmax; at the head's sizes (n = S·K <= a few hundred)
# it is one or two iterations.


@triton.jit
def _lattice_attention(
    qkv_ptr,
    bias_ptr,
    out_ptr,
    n,
    H,
    D,
    NH,
    sm_scale,
    s_qkv_b,
    s_qkv_n,
    s_bias_h,
    s_bias_i,
    s_out_b,
    s_out_n,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # UPCAST (fp32 inputs, and Triton's interpreter, whose bf16 dots are wrong): operands go to the dots
    # as fp32 with PRECISION "ieee". Otherwise bf16/fp16 operands and fp32 accumulation, as flash attention.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    b = (tl.program_id(1) // NH).to(tl.int64)
    head = tl.program_id(1) % NH
    d = tl.arange(0, BLOCK_D)
    r_ok = rows < n
    d_ok = d < D
    base = qkv_ptr + b * s_qkv_b + head * D
    q = tl.load(base + rows[:, None] * s_qkv_n + d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        c_ok = cols < n
        kv_mask = c_ok[:, None] & d_ok[None, :]
        k = tl.load(base + H + cols[:, None] * s_qkv_n + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(base + 2 * H + cols[:, None] * s_qkv_n + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        bias = tl.load(
            bias_ptr + head * s_bias_h + rows[:, None] * s_bias_i + cols[None, :],
            mask=r_ok[:, None] & c_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        scores = tl.where(c_ok[None, :], scores * sm_scale + bias, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + b * s_out_b + rows[:, None] * s_out_n + head * D + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=r_ok[:, None] & d_ok[None, :],
    )


def _interpreted() -> bool:
    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"


def lattice_attention_triton(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """qkv [b, n, 3h] (q, k, v stacked as nn.MultiheadAttention's in_proj), bias [N, n, n] -> [b, n, h]."""
    b, n, three_h = qkv.shape
    h = three_h // 3
    d = h // num_heads
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    if bias.stride(-1) != 1:
        bias = bias.contiguous()
    out = torch.empty((b, n, h), device=qkv.device, dtype=qkv.dtype)
    if b and n:
        block_m = ATTENTION_BLOCK_M
        block_n = max(16, min(128, triton.next_power_of_2(n)))
        _lattice_attention[(triton.cdiv(n, block_m), b * num_heads)](
            qkv,
            bias,
            out,
            n,
            h,
            d,
            num_heads,
            1.0 / math.sqrt(d),
            qkv.stride(0),
            qkv.stride(1),
            bias.stride(0),
            bias.stride(1),
            out.stride(0),
            out.stride(1),
            UPCAST=qkv.dtype == torch.float32 or _interpreted(),
            PRECISION="ieee",
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=max(16, triton.next_power_of_2(d)),
            num_warps=4,
            num_stages=1,
        )
    return out
