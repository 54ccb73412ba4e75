"""Target-side speed: target-only greedy tok/s and the verify forward's latency, transformers' eager forward
against the fast path (eager and CUDA-graph replay), next to the weight-read floor.

    python bench/target.py TARGET [--tokens 256] [--verify-rows 8] [--device cuda]

The floor is (bytes of the weights one decode step reads) / (this device's measured copy bandwidth): what a
step would cost if it only had to read the weights once. All rows are measured in the same process.
"""

from __future__ import annotations

import argparse
import time

import torch

from lilicorr_runtime.fast_target import FastTarget, tokens_per_second
from lilicorr_runtime.target import load_target

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
          8182, 2, 198, 1, 4093, 198, 19161, 260, 2914, 282, 1345, 30, 2, 198, 1, 520, 9531, 198]


def copy_bandwidth(device: str) -> float:
    if device != "cuda":
        return float("nan")
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 20 / (time.perf_counter() - begin)  # bytes read + written per second


def verify_latency(target, rows: int, taps, repeats: int = 50) -> float:
    target.reserve(len(PROMPT) + rows * (repeats + 2) + 1)
    target.reset()
    target.forward(torch.tensor(PROMPT), taps)
    block = (torch.arange(rows) + 100) % target.vocab_size
    for _ in range(3):
        target.forward(block, taps)
        target.crop(len(PROMPT))
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(repeats):
        step = target.forward(block, taps)
        target.crop(len(PROMPT))
    _ = step.logits[-1, 0].item()
    return (time.perf_counter() - begin) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--verify-rows", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    slow = load_target(args.target, dtype=dtype, device=args.device, fast=False)
    fast = load_target(args.target, dtype=dtype, device=args.device, fast=True)
    eager = FastTarget(fast.model, fast.tokenizer, fast.eos_token_ids, cuda_graphs=False)
    global PROMPT
    PROMPT = [t % fast.vocab_size for t in PROMPT]  # SmolLM2's chat ids; folded for smaller vocabularies
    taps = tuple(sorted({round(i * (fast.num_layers - 1) / 4) for i in range(5)}))  # five spread taps
    weight_bytes = sum(p.numel() * p.element_size() for p in slow.model.parameters())
    bandwidth = copy_bandwidth(args.device)
    floor_s = weight_bytes / (bandwidth / 2) if bandwidth == bandwidth else float("nan")
    rows = []
    for name, target in (("transformers eager", slow), ("fast path, eager", eager), ("fast path, CUDA graphs", fast)):
        tps = tokens_per_second(target, PROMPT, args.tokens)
        verify_ms = verify_latency(target, args.verify_rows, taps) * 1e3
        rows.append((name, tps, 1e3 / tps, verify_ms))
    print(f"device {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{dtype}, weights {weight_bytes / 1e6:.0f} MB, copy bandwidth {bandwidth / 1e12:.2f} TB/s, "
          f"{args.tokens} new tokens after a {len(PROMPT)}-token prompt")
    print(f"{'path':<24} {'tok/s':>8} {'ms/token':>9} {f'verify {args.verify_rows} rows (ms)':>22} {'vs eager':>9}")
    for name, tps, ms, verify_ms in rows:
        print(f"{name:<24} {tps:8.1f} {ms:9.3f} {verify_ms:22.3f} {tps / rows[0][1]:8.1f}x")
    print(f"{'weight-read floor':<24} {1 / floor_s:8.1f} {floor_s * 1e3:9.3f}")


if __name__ == "__main__":
    main()
