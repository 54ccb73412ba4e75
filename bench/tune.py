"""Tuning sweep for the draft-step kernels on CUDA: each configuration timed in one process, so the ratios
between rows are meaningful on a shared machine. Prints one table per knob.

    python bench/tune.py [--topk] [--head]
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, "bench")
from kernels import copy_bandwidth, cuda_time, graphed, head_workload  # noqa: E402

from lilicorr_runtime.ops import draft_triton as triton_ops  # noqa: E402


def tune_topk() -> None:
    bw = copy_bandwidth()
    v, k = 151936, 8
    print(f"\ntopk_lse V={v} bf16 k={k}, ten calls per graph replay (copy bandwidth {bw / 1e12:.2f} TB/s)")
    print(f"{'n':>4} {'tiles/prog':>10} {'scan warps':>10} {'select warps':>12} {'us':>7} {'% copy':>7}")
    knobs = ("TILES_PER_PROGRAM", "SCAN_WARPS", "SELECT_WARPS")
    defaults = tuple(getattr(triton_ops, name) for name in knobs)
    sweep = [
        (16, 4, 2),
        (16, 4, 4),
        (8, 1, 1),
        (8, 1, 2),
        (8, 1, 4),
        (8, 2, 4),
        (4, 1, 4),
        (16, 1, 4),
        (16, 2, 4),
    ]
    for n, configs in [(15, sweep[:5]), (120, sweep[:5]), (480, sweep)]:
        logits = torch.randn(n, v, device="cuda", dtype=torch.bfloat16) * 3
        ref = triton_ops.topk_lse_triton(logits, k)
        for config in configs:
            for name, value in zip(knobs, config, strict=True):
                setattr(triton_ops, name, value)
            got = triton_ops.topk_lse_triton(logits, k)
            same = all(torch.equal(a, b) for a, b in zip(got[:2], ref[:2], strict=True))
            t = (
                cuda_time(
                    graphed(lambda logits=logits: [triton_ops.topk_lse_triton(logits, k) for _ in range(10)])
                )
                / 10
            )
            print(
                f"{n:>4} {config[0]:>10} {config[1]:>10} {config[2]:>12} {t * 1e6:>7.1f} "
                f"{100 * n * v * 2 / t / bw:>6.0f}%{'' if same else '  MISMATCH'}"
            )
        for name, value in zip(knobs, defaults, strict=True):
            setattr(triton_ops, name, value)


def tune_head() -> None:
    run = head_workload()
    print("\nhead + greedy walk, Qwen3-8B geometry, batch 1 bf16, ten calls per graph replay")
    print(f"{'attn block_m':>12} {'walk warps':>10} {'us':>7}")
    defaults = (triton_ops.ATTENTION_BLOCK_M, triton_ops.WALK_WARPS)
    for block_m, walk_warps in [(32, 1), (16, 1), (64, 1), (32, 2), (32, 4)]:
        triton_ops.ATTENTION_BLOCK_M, triton_ops.WALK_WARPS = block_m, walk_warps
        t = cuda_time(graphed(lambda: [run() for _ in range(10)])) / 10
        print(f"{block_m:>12} {walk_warps:>10} {t * 1e6:>7.1f}")
    triton_ops.ATTENTION_BLOCK_M, triton_ops.WALK_WARPS = defaults


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topk", action="store_true")
    parser.add_argument("--head", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/tune.py needs CUDA")
    if args.head or not args.topk:
        tune_head()
    if args.topk or not args.head:
        tune_topk()


if __name__ == "__main__":
    main()
