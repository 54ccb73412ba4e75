"""Kernel-level profile of the LiLiCorr head (+ walk) and topk_lse on CUDA: which kernels run, how long each takes.

    python bench/profile_head.py

Prints one table per workload: kernel name, calls, total and mean GPU microseconds (torch.profiler, eager
launches, so the kernels are exactly those a CUDA graph replays), and the sum against the in-graph time.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from kernels import cuda_time, graphed, head_workload  # noqa: E402

from lilicorr_runtime import ops  # noqa: E402


def kernel_table(title: str, fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(e.name, []).append(e.device_time)
    print(f"\n{title}: kernels per call and GPU time (us)")
    total = 0.0
    for name, ts in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        per_call = sum(ts) / calls
        total += per_call
        print(f"{len(ts) / calls:>5.1f} x {per_call:>8.2f}  {name[:110]}")
    n_kernels = sum(len(ts) for ts in rows.values()) / calls
    print(f"total: {n_kernels:.0f} kernels, {total:.1f} us of kernel time per call")
    return total


def main() -> None:
    run = head_workload()
    kernel_sum = kernel_table("head + greedy walk (Qwen3-8B geometry, batch 1, bf16)", run)
    in_graph = cuda_time(graphed(lambda: [run() for _ in range(10)])) / 10
    print(
        f"in-graph: {in_graph * 1e6:.1f} us per call; kernel time {kernel_sum:.1f} us; "
        f"gaps {in_graph * 1e6 - kernel_sum:.1f} us"
    )
    logits = torch.randn(480, 151936, device="cuda", dtype=torch.bfloat16)
    kernel_table("topk_lse n=480 V=151936 bf16 k=8", lambda: ops.topk_lse(logits, 8))


if __name__ == "__main__":
    main()
