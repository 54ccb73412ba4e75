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


@triton.jit
def _scan_probe(logits_ptr, stride_row, n_cols, tile_max_ptr, part_m_ptr, part_s_ptr, n_tiles, n_parts,
                TILE: tl.constexpr, TPP: tl.constexpr, EXP: tl.constexpr, TILEMAX: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    tiles = part * TPP + tl.arange(0, TPP)
    cols = tiles[:, None] * TILE + tl.arange(0, TILE)[None, :]
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < n_cols,
                other=float("-inf")).to(tl.float32)
    if TILEMAX:
        tile_max = tl.max(x, axis=1)
        tl.store(tile_max_ptr + row * n_tiles + tiles, tile_max, mask=tiles < n_tiles)
        m = tl.max(tile_max, axis=0)
    else:
        m = tl.max(tl.max(x, axis=1), axis=0)
    if EXP:
        s = tl.sum(tl.sum(tl.exp2(x * 1.4426950408889634 - m * 1.4426950408889634), axis=1), axis=0)
    else:
        s = tl.sum(tl.sum(x, axis=1), axis=0)
    tl.store(part_m_ptr + row * n_parts + part, m)
    tl.store(part_s_ptr + row * n_parts + part, s)


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
    for name, exp, tilemax in [("scan probe: sum only (read floor)", False, False),
                               ("scan probe: + tile maxima", False, True), ("scan probe: + exp2", True, True)]:
        def probe(exp=exp, tilemax=tilemax):
            _scan_probe[(n, n_parts)](logits, logits.stride(0), v, tile_max, part_m, part_s, n_tiles, n_parts,
                                      TILE=T.TILE, TPP=tpp, EXP=exp, TILEMAX=tilemax, num_warps=T.NUM_WARPS)
        probe()
        t = cuda_time(graphed(lambda probe=probe: [probe() for _ in range(10)])) / 10
        print(f"{name:<34} {t * 1e6:>7.1f}")
    scan()

    def select():
        T._tile_select[(n,)](logits, logits.stride(0), v, tile_max, part_m, part_s, values, ids, lse, n_tiles,
                             n_parts, k, TILE=T.TILE, BLOCK_T=triton.next_power_of_2(n_tiles),
                             BLOCK_P=triton.next_power_of_2(n_parts), BLOCK_K=k, num_warps=T.SELECT_WARPS)
    select()
    t = cuda_time(graphed(lambda: [select() for _ in range(10)])) / 10
    print(f"{'select (shipped)':<34} {t * 1e6:>7.1f}")
    t = cuda_time(graphed(lambda: [T.topk_lse_triton(logits, k) for _ in range(10)])) / 10
    print(f"{'topk_lse (shipped)':<34} {t * 1e6:>7.1f}")


if __name__ == "__main__":
    main()
