"""Data-generation speed: `FastTarget.generate_batch` (what `lilicorr_train.mixes generate` runs) by batch size,
with where one batched decode step's GPU time goes.

    python bench/generate.py [TARGET] [--random smollm2] [--batches 256,1024,2048] [--prompts 2048] [--new 64]

For each batch size: prompts are answered up to `--new` tokens each; the table gives wall seconds, decode steps
(batches x new tokens: a batch runs until its last row ends), ms per step and generated tokens per second. A
random target answers prompts of 24-120 random tokens and never writes eos, so every row runs to the end; a real
target answers the training recipe's prompts (`lilicorr_train.prompts`) and stops at eos. Then one eager decode
step at the largest batch is profiled (the kernels its graph replays), grouped by kernel name: the GPU time of a
step, against the wall time per step in the table.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

import target as bench_target  # beside this file (run as a script)
import torch

from lilicorr_runtime.target.fast import FastTarget
from lilicorr_runtime.target.load import load_target


@torch.inference_mode()
def profile_step(fast: FastTarget, rows: int, width: int = 64) -> list[tuple[str, int, float]]:
    """(kernel, calls, us) of one eager decode step of `rows` sequences at cache row `width`."""
    eager = FastTarget(fast.model, cuda_graphs=False)
    cache = eager.core.new_cache(rows, 256)
    ids = torch.randint(0, eager.vocab_size, (rows, width), device=fast.device)
    pad = torch.zeros(rows, dtype=torch.long, device=fast.device)
    eager._eager(cache, ids, torch.tensor(0, device=fast.device), pad, (), True)
    token = torch.randint(0, eager.vocab_size, (rows, 1), device=fast.device)
    eager._eager(cache, token, torch.tensor(width, device=fast.device), pad, (), False)  # compiles
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eager._eager(cache, token, torch.tensor(width + 1, device=fast.device), pad, (), False)
        torch.cuda.synchronize()
    calls: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name.split("(")[0][:60]
            calls[name] += 1
            total[name] += (
                event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            )
    return [(name, calls[name], us) for name, us in total.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", help="a target (GGUF, directory or Hub id); or --random")
    parser.add_argument("--random", metavar="SHAPE", help="a random-weight target: smollm2 or qwen3-8b")
    parser.add_argument("--batches", default="256,1024,2048")
    parser.add_argument("--prompts", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64, help="tokens generated per prompt")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/generate.py needs a CUDA device")
    if bool(args.target) == bool(args.random):
        parser.error("give TARGET or --random SHAPE")
    if args.random:
        fast = bench_target.random_target(args.random, "cuda")
    else:
        fast = load_target(args.target, dtype="bfloat16", device="cuda", fast=True)
    rng = random.Random(0)
    eos: tuple[int, ...] = ()
    if args.random:
        prompts = [
            [rng.randrange(100, fast.vocab_size) for _ in range(rng.randint(24, 120))]
            for _ in range(args.prompts)
        ]
    else:
        from lilicorr_train.data import encode_prompt
        from lilicorr_train.prompts import training_prompts

        prompts = [encode_prompt(fast.tokenizer, p) for p in training_prompts(args.prompts, seed=7)]
        eos = tuple(fast.eos_token_ids)
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"# {torch.cuda.get_device_name()} · {args.target or 'random ' + args.random} · {args.prompts} prompts · "
        f"up to {args.new} new tokens each"
    )
    print("| batch | wall s | steps | ms per step | generated tok/s |")
    print("|---:|---:|---:|---:|---:|")
    for batch in batches:
        fast.generate_batch(prompts[:batch], 4, batch_size=batch, eos_token_ids=eos)  # graphs, compiles
        torch.cuda.synchronize()
        begin = time.perf_counter()
        outputs = fast.generate_batch(prompts, args.new, batch_size=batch, eos_token_ids=eos)
        torch.cuda.synchronize()
        wall = time.perf_counter() - begin
        steps = -(-len(prompts) // batch) * args.new
        tokens = sum(len(o) for o in outputs)
        print(f"| {batch} | {wall:.2f} | {steps} | {wall / steps * 1e3:.2f} | {tokens / wall:,.0f} |")
    rows = max(batches)
    print(f"\none eager decode step at {rows} rows, GPU time by kernel:\n")
    print("| kernel | calls | us | share |")
    print("|---|---:|---:|---:|")
    kernels = profile_step(fast, rows)
    whole = sum(us for _, _, us in kernels)
    for name, count, us in kernels[:14]:
        print(f"| {name} | {count} | {us:,.0f} | {us / whole:.0%} |")
    print(f"| all | {sum(c for _, c, _ in kernels)} | {whole:,.0f} | |")


if __name__ == "__main__":
    main()
