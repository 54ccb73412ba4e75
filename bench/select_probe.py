"""Where the time of topk_lse's per-row select goes (an experiment, not a product benchmark): the select
kernel with its phases switched on one at a time, on the scan output of n = 480 rows of V = 151936 bf16."""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "bench")
from kernels import cuda_time, graphed  # noqa: E402

from lilicorr_runtime.kernels import triton_ops as T  # noqa: E402
from lilicorr_runtime.kernels.triton_ops import _key_index, _key_value, _order_key  # noqa: E402


@triton.jit
def _probe(logits_ptr, stride_row, n_cols, tile_max_ptr, part_m_ptr, part_s_ptr, values_ptr, ids_ptr, lse_ptr,
           n_tiles, n_parts, k, TILE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr,
           BLOCK_K: tl.constexpr, TILES: tl.constexpr, COLUMNS: tl.constexpr, FP32: tl.constexpr):
    NONE: tl.constexpr = -9223372036854775808
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    p_offs = tl.arange(0, BLOCK_P)
    pm = tl.load(part_m_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=float("-inf"))
    ps = tl.load(part_s_ptr + row * n_parts + p_offs, mask=p_offs < n_parts, other=0.0)
    gm = tl.max(pm, axis=0)
    total = tl.sum(ps * tl.exp(pm - tl.where(gm == float("-inf"), 0.0, gm)), axis=0)
    tl.store(lse_ptr + row, gm + tl.log(total))
    k_offs = tl.arange(0, BLOCK_K)
    tiles = k_offs
    if TILES:
        t_offs = tl.arange(0, BLOCK_T)
        tmax = tl.load(tile_max_ptr + row * n_tiles + t_offs, mask=t_offs < n_tiles, other=float("-inf"))
        if FP32:
            for r in range(k):
                best = tl.max(tmax, axis=0)
                idx = tl.min(tl.where(tmax == best, t_offs, 1 << 30), axis=0)
                tmax = tl.where(t_offs == idx, float("-inf"), tmax)
                tiles = tl.where(k_offs == r, idx, tiles)
        else:
            keys = tl.where(t_offs < n_tiles, _order_key(tmax, t_offs), NONE)
            for r in range(k):
                best = tl.max(keys, axis=0)
                keys = tl.where(keys == best, NONE, keys)
                tiles = tl.where(k_offs == r, _key_index(best), tiles)
    out_v = tl.full((BLOCK_K,), float("-inf"), tl.float32)
    out_i = tiles.to(tl.int64)
    if COLUMNS:
        cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]
        valid = (k_offs[:, None] < k) & (cols < n_cols)
        y = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        if FP32:
            for j in range(k):
                best = tl.max(tl.max(y, axis=1), axis=0)
                idx = tl.min(tl.min(tl.where(y == best, cols, 1 << 30), axis=1), axis=0)
                y = tl.where(cols == idx, float("-inf"), y)
                out_v = tl.where(k_offs == j, best, out_v)
                out_i = tl.where(k_offs == j, idx.to(tl.int64), out_i)
        else:
            ykeys = tl.where(valid, _order_key(y, cols), NONE)
            for j in range(k):
                best = tl.max(tl.max(ykeys, axis=1), axis=0)
                ykeys = tl.where(ykeys == best, NONE, ykeys)
                out_v = tl.where(k_offs == j, _key_value(best), out_v)
                out_i = tl.where(k_offs == j, _key_index(best).to(tl.int64), out_i)
    tl.store(values_ptr + row * k + k_offs, out_v, mask=k_offs < k)
    tl.store(ids_ptr + row * k + k_offs, out_i, mask=k_offs < k)


def main() -> None:
    n, v, k = 480, 151936, 8
    logits = torch.randn(n, v, device="cuda", dtype=torch.bfloat16) * 3
    n_tiles = triton.cdiv(v, T.TILE)
    tpp = T.TILES_PER_PROGRAM
    n_parts = triton.cdiv(n_tiles, tpp)
    tile_max = torch.empty((n, n_tiles), device="cuda")
    part_m = torch.empty((n, n_parts), device="cuda")
    part_s = torch.empty((n, n_parts), device="cuda")
    values = torch.empty((n, k), device="cuda")
    ids = torch.empty((n, k), device="cuda", dtype=torch.int64)
    lse = torch.empty((n,), device="cuda")

    def scan():
        T._tile_scan[(n, n_parts)](logits, logits.stride(0), v, tile_max, part_m, part_s, n_tiles, n_parts,
                                   TILE=T.TILE, TPP=tpp, num_warps=T.NUM_WARPS)

    scan()
    print(f"{'variant':<34} {'us':>7}")
    t = cuda_time(graphed(lambda: [scan() for _ in range(10)])) / 10
    print(f"{'scan alone':<34} {t * 1e6:>7.1f}")
    ref = T.topk_lse_triton(logits, k)
    for name, tiles, columns, fp32, warps in [("lse only", False, False, False, 4), ("+ tiles (int64 keys)", True, False, False, 4),
                                              ("+ tiles (fp32 + index)", True, False, True, 4),
                                              ("full (int64 keys)", True, True, False, 4),
                                              ("full (fp32 + index)", True, True, True, 4),
                                              ("full (fp32 + index) 1 warp", True, True, True, 1),
                                              ("full (fp32 + index) 8 warps", True, True, True, 8)]:
        def select(tiles=tiles, columns=columns, fp32=fp32, warps=warps):
            _probe[(n,)](logits, logits.stride(0), v, tile_max, part_m, part_s, values, ids, lse, n_tiles, n_parts, k,
                         TILE=T.TILE, BLOCK_T=triton.next_power_of_2(n_tiles), BLOCK_P=triton.next_power_of_2(n_parts),
                         BLOCK_K=k, TILES=tiles, COLUMNS=columns, FP32=fp32, num_warps=warps)
        select()
        ok = "" if not columns else ("  exact" if torch.equal(ids, ref[1]) and torch.equal(values, ref[0]) else "  MISMATCH")
        t = cuda_time(graphed(lambda select=select: [select() for _ in range(10)])) / 10
        print(f"{name:<34} {t * 1e6:>7.1f}{ok}")


if __name__ == "__main__":
    main()
