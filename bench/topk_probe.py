"""Design probe for topk_lse: a two-level tile pre-selection against the shipped kernel, in one process.

    python bench/topk_probe.py

The scan stores, besides the per-program softmax partials, the maximum of every TILE-column tile and of every
SUB-column sub-tile, in the logits dtype (a maximum of 16-bit values is a 16-bit value: half the bytes of
fp32). The select picks the k tiles with the largest maxima, then the k sub-tiles with the largest maxima
among theirs, and orders only k * SUB columns. The exactness argument of the one-level pre-selection applies
to any partition of any set ordered by (value descending, column ascending), so it applies twice.
Only 16-bit logits (the packed-key path) are probed.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "bench")
from kernels import copy_bandwidth, cuda_time, graphed  # noqa: E402

from lilicorr_runtime import ops  # noqa: E402
from lilicorr_runtime.kernels import triton_ops  # noqa: E402
from lilicorr_runtime.kernels.triton_ops import INT32_MIN, _next_below, _ordered16  # noqa: E402


@triton.jit
def _scan2(logits_ptr, stride_row, n_cols, tile_max_ptr, sub_max_ptr, part_m_ptr, part_s_ptr,
           n_tiles, n_subs, n_parts, TILE: tl.constexpr, SUB: tl.constexpr, TPP: tl.constexpr):
    R: tl.constexpr = TILE // SUB
    row = tl.program_id(0)
    part = tl.program_id(1)
    tiles = part * TPP + tl.arange(0, TPP)
    subs = tiles[:, None] * R + tl.arange(0, R)[None, :]  # [TPP, R]
    cols = subs[:, :, None] * SUB + tl.arange(0, SUB)[None, None, :]  # [TPP, R, SUB]
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < n_cols, other=float("-inf"),
                eviction_policy="evict_first")
    sub_max = tl.max(x, axis=2)  # [TPP, R], in the logits dtype
    tile_max = tl.max(sub_max, axis=1)
    tl.store(sub_max_ptr + row * n_subs + subs, sub_max, mask=subs < n_subs)
    tl.store(tile_max_ptr + row * n_tiles + tiles, tile_max, mask=tiles < n_tiles)
    xf = x.to(tl.float32)
    m = tl.max(tile_max, axis=0).to(tl.float32)
    m_ref = tl.where(tl.abs(m) == float("inf"), 0.0, m) * 1.4426950408889634
    s = tl.sum(tl.sum(tl.sum(tl.exp2(xf * 1.4426950408889634 - m_ref), axis=2), axis=1), axis=0)
    tl.store(part_m_ptr + row * n_parts + part, m)
    tl.store(part_s_ptr + row * n_parts + part, s)


@triton.jit
def _pick(ukey, k_offs, rounds, BLOCK_K: tl.constexpr):
    """The low 16 bits of the `rounds` largest unique uint32 keys, un-inverted, in rounds order."""
    picked = tl.zeros((BLOCK_K,), tl.int32)
    bound = 0xFFFFFFFF
    for r in range(rounds):
        best = _next_below(ukey, bound)
        picked = tl.where(k_offs == r, 0xFFFF - (best & 0xFFFF).to(tl.int32), picked)
        bound = best - 1
    return picked


@triton.jit
def _select2(logits_ptr, stride_row, n_cols, tile_max_ptr, sub_max_ptr, part_m_ptr, part_s_ptr,
             values_ptr, ids_ptr, lse_ptr, n_tiles, n_subs, n_parts, k,
             TILE: tl.constexpr, SUB: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr,
             BLOCK_K: tl.constexpr, NEG_INF_BITS: tl.constexpr):
    R: tl.constexpr = TILE // SUB
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    p_offs = tl.arange(0, BLOCK_P)
    pm = tl.load(part_m_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=float("-inf"))
    ps = tl.load(part_s_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=0.0)
    t_offs = tl.arange(0, BLOCK_T)
    tmax = tl.load(tile_max_ptr + row * n_tiles + t_offs, mask=t_offs < n_tiles, other=float("-inf"))
    gm = tl.max(pm, axis=0)
    part_ref = tl.where(tl.abs(pm) == float("inf"), 0.0, pm)
    row_ref = tl.where(tl.abs(gm) == float("inf"), 0.0, gm)
    total = tl.sum(tl.where(ps != 0, ps * tl.exp(part_ref - row_ref), ps), axis=0)
    tl.store(lse_ptr + row, row_ref + tl.log(total))

    k_offs = tl.arange(0, BLOCK_K)
    # level 1: the k tiles with the largest maxima (ties: lower tile)
    kt = tl.minimum(k, n_tiles)
    tkey = tl.where(t_offs < n_tiles, (_ordered16(tmax, NEG_INF_BITS) << 16) | (0xFFFF - t_offs), INT32_MIN)
    tiles = _pick(tkey.to(tl.uint32, bitcast=True) ^ 0x80000000, k_offs, kt, BLOCK_K)
    # level 2: among their sub-tiles, the k with the largest maxima (ties: lower sub-tile)
    subs = tiles[:, None] * R + tl.arange(0, R)[None, :]  # [BLOCK_K, R]
    s_ok = (k_offs[:, None] < kt) & (subs < n_subs)
    smax = tl.load(sub_max_ptr + row * n_subs + subs, mask=s_ok, other=float("-inf"))
    skey = tl.where(s_ok, (_ordered16(smax, NEG_INF_BITS) << 16) | (0xFFFF - subs), INT32_MIN)
    ks = tl.minimum(k, tl.sum(tl.sum(s_ok.to(tl.int32), axis=1), axis=0))
    chosen = _pick(skey.to(tl.uint32, bitcast=True) ^ 0x80000000, k_offs, ks, BLOCK_K)
    # order their columns; the position follows the column: rank the sub-tiles by index
    by_index = tl.where(k_offs < ks, chosen, 1 << 30)
    rank = tl.sum((by_index[None, :] < by_index[:, None]).to(tl.int32), axis=1)
    offs = tl.arange(0, SUB)[None, :]
    cols = chosen[:, None] * SUB + offs  # [BLOCK_K, SUB]
    ok = (k_offs[:, None] < ks) & (cols < n_cols)
    y = tl.load(base + cols, mask=ok, other=float("-inf"))
    pos = rank[:, None] * SUB + offs
    key = tl.where(ok, (_ordered16(y, NEG_INF_BITS) << 16) | (0xFFFF - pos), INT32_MIN)
    ukey = key.to(tl.uint32, bitcast=True) ^ 0x80000000
    out_u = tl.zeros((BLOCK_K,), tl.uint32)
    bound = 0xFFFFFFFF
    for j in range(k):
        best = _next_below(ukey, bound)
        out_u = tl.where(k_offs == j, best, out_u)
        bound = best - 1
    out = (out_u ^ 0x80000000).to(tl.int32, bitcast=True)
    o16 = out >> 16
    out_v = tl.where(o16 >= 0, o16, o16 ^ 0x7FFF).to(tl.int16).to(y.dtype, bitcast=True).to(tl.float32)
    p = 0xFFFF - (out & 0xFFFF)
    sub = tl.sum(tl.where((p // SUB)[:, None] == rank[None, :], chosen[None, :], 0), axis=1)
    tl.store(values_ptr + row * k + k_offs, out_v, mask=k_offs < k)
    tl.store(ids_ptr + row * k + k_offs, (sub * SUB + p % SUB).to(tl.int64), mask=k_offs < k)


def topk_lse2(logits, k, tile=256, sub=64, tpp=16, warps=4, select_warps=1):
    n, v = logits.shape
    n_tiles = triton.cdiv(v, tile)
    n_subs = triton.cdiv(v, sub)
    tpp = min(tpp, triton.next_power_of_2(n_tiles))
    n_parts = triton.cdiv(n_tiles, tpp)
    dev = logits.device
    tile_max = torch.empty((n, n_tiles), device=dev, dtype=logits.dtype)
    sub_max = torch.empty((n, n_subs), device=dev, dtype=logits.dtype)
    part_m = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    part_s = torch.empty((n, n_parts), device=dev, dtype=torch.float32)
    values = torch.empty((n, k), device=dev, dtype=torch.float32)
    ids = torch.empty((n, k), device=dev, dtype=torch.int64)
    lse = torch.empty((n,), device=dev, dtype=torch.float32)
    _scan2[(n, n_parts)](logits, logits.stride(0), v, tile_max, sub_max, part_m, part_s, n_tiles, n_subs, n_parts,
                         TILE=tile, SUB=sub, TPP=tpp, num_warps=warps)
    _select2[(n,)](logits, logits.stride(0), v, tile_max, sub_max, part_m, part_s, values, ids, lse,
                   n_tiles, n_subs, n_parts, k, TILE=tile, SUB=sub, BLOCK_T=triton.next_power_of_2(n_tiles),
                   BLOCK_P=triton.next_power_of_2(n_parts), BLOCK_K=triton.next_power_of_2(k),
                   NEG_INF_BITS=triton_ops._NEG_INF_BITS[logits.dtype], num_warps=select_warps)
    return values, ids, lse


def check(fn, device) -> bool:
    gen = torch.Generator().manual_seed(0)
    for v in (1024, 1025, 2047, 3072, 49152, 151936):
        for k in (1, 2, 4, 8, 16):
            for dtype in (torch.bfloat16, torch.float16):
                for ties in (False, True):
                    x = torch.randn(7, v, generator=gen) * 3
                    if ties:
                        x = x.round()  # many equal values, within and across tiles
                    x[3, v // 3] = 0.0
                    x[3, v // 2] = -0.0
                    x[5, :] = float("-inf")
                    x[6, v // 5] = float("nan")
                    x = x.to(dtype)
                    got = fn(x.to(device), k)
                    ref = ops.topk_lse_reference(x, k)
                    if not (torch.equal(got[0].cpu(), ref[0]) and torch.equal(got[1].cpu(), ref[1])):
                        print(f"  MISMATCH v={v} k={k} {dtype} ties={ties}")
                        return False
                    if not torch.allclose(got[2].cpu(), ref[2], rtol=1e-5, atol=1e-4, equal_nan=True):
                        print(f"  LSE MISMATCH v={v} k={k} {dtype} ties={ties}")
                        return False
    return True


@triton.jit
def _read_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def shipped_scan(logits, tpp=16, warps=4, tile=256):
    n, v = logits.shape
    n_tiles = triton.cdiv(v, tile)
    n_parts = triton.cdiv(n_tiles, tpp)
    tile_max = torch.empty((n, n_tiles), device=logits.device, dtype=torch.float32)
    part = torch.empty((2, n, n_parts), device=logits.device, dtype=torch.float32)
    triton_ops._tile_scan[(n, n_parts)](logits, logits.stride(0), v, tile_max, part[0], part[1], n_tiles, n_parts,
                                        TILE=tile, TPP=tpp, num_warps=warps)


def scan2_only(logits, tile, sub, tpp, warps):
    n, v = logits.shape
    n_tiles, n_subs = triton.cdiv(v, tile), triton.cdiv(v, sub)
    n_parts = triton.cdiv(n_tiles, tpp)
    tile_max = torch.empty((n, n_tiles), device=logits.device, dtype=logits.dtype)
    sub_max = torch.empty((n, n_subs), device=logits.device, dtype=logits.dtype)
    part = torch.empty((2, n, n_parts), device=logits.device, dtype=torch.float32)
    _scan2[(n, n_parts)](logits, logits.stride(0), v, tile_max, sub_max, part[0], part[1], n_tiles, n_subs, n_parts,
                         TILE=tile, SUB=sub, TPP=tpp, num_warps=warps)


class Shipped:
    """topk_lse_triton with its module knobs set for the call."""

    def __init__(self, tile=256, tpp=16, warps=4, select_warps=2):
        self.knobs = dict(TILE=tile, TILES_PER_PROGRAM=tpp, SCAN_WARPS=warps, SELECT_WARPS=select_warps)

    def __call__(self, x, k):
        saved = {name: getattr(triton_ops, name) for name in self.knobs}
        for name, value in self.knobs.items():
            setattr(triton_ops, name, value)
        try:
            return triton_ops.topk_lse_triton(x, k)
        finally:
            for name, value in saved.items():
                setattr(triton_ops, name, value)

    def __str__(self):
        return "one-level " + " ".join(f"{k}={v}" for k, v in self.knobs.items())


def per_call(fn) -> float:
    return cuda_time(graphed(lambda: [fn() for _ in range(10)])) / 10


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "--check" in sys.argv or device != "cuda":
        for cfg in (dict(tile=512, sub=64, select_warps=1), dict(tile=512, sub=64, tpp=8, warps=1)):
            print(f"exact {cfg}: {check(lambda x, k, cfg=cfg: topk_lse2(x, k, **cfg), device)}")
    if device != "cuda":
        return
    bw = copy_bandwidth()
    v, k = 151936, 8
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; n = 480 unless marked; ten calls per graph replay")
    logits = torch.randn(480, v, device="cuda", dtype=torch.bfloat16) * 3
    variants = [Shipped(256, 8, 1, 4), Shipped(256, 8, 1, 2)]
    configs = [dict(tile=256, sub=64, tpp=8, warps=1, select_warps=w) for w in (1, 2, 4)]
    configs += [dict(tile=256, sub=32, tpp=8, warps=1, select_warps=w) for w in (1, 2)]
    configs += [dict(tile=512, sub=64, tpp=4, warps=1, select_warps=2)]
    for rep in range(4):
        for n in (15, 480):
            x = logits[:n].contiguous()
            ref = triton_ops.topk_lse_triton(x, k)
            rows = [(str(var), lambda x, var=var: var(x, k)) for var in variants]
            rows += [(str(cfg), lambda x, cfg=cfg: topk_lse2(x, k, **cfg)) for cfg in configs]
            for name, fn in rows:
                got = fn(x)
                same = all(torch.equal(a, b) for a, b in zip(got[:2], ref[:2], strict=True))
                t = per_call(lambda fn=fn, x=x: fn(x))
                print(f"{rep} {n:>4} {name:<70} {t * 1e6:>7.1f} us {100 * n * v * 2 / t / bw:>5.1f}%"
                      f"{'' if same else '  MISMATCH'}")


if __name__ == "__main__":
    main()
