"""Where one training step of `python -m lilicorr_train.pieces fit` spends its time: the batch (host), the target's
pass over the batch (its taps and final hidden), the drafter's forward with the joint loss, the backward, and the
optimizer step, each timed apart (synchronized on CUDA) over the same steps the fit runs.

    python bench/train_step.py --target T [--data train.npz] [--layers 1] [--batch-size 32] [--anchors 48]
    python bench/train_step.py --target .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --steps 12 --profile
    python bench/train_step.py --random smollm2 --profile      # a random SmolLM2-shaped target (bench/target.py)
    python bench/train_step.py --target examples/tiny-target --device cpu --batch-size 2 --anchors 4 --length 48

Without --data the sequences are random tokens of --length (a quarter of each the prompt): the timing of a step
does not depend on what its tokens say. The drafter is a new run's (taps 3,9,15,21,27 on a 30-layer target, else
spread; its layers from the target's `--init-layer`, default the last), the settings are the fit's (bf16 autocast
on CUDA). `--profile` adds the top kernels of two steps by device time (torch.profiler).

Prints a table: each phase's median milliseconds a step and its share, then sequences, tokens and blocks a second.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lilicorr_train: the repository's

from lilicorr_ckpt.errors import UsageError
from lilicorr_runtime.target.load import load_target
from lilicorr_train.data import Dataset
from lilicorr_train.export import DrafterShape, drafter_config, spread_taps
from lilicorr_train.loop import POOL, TrainConfig, _batch, batch_rows, open_run, target_pass
from lilicorr_train.objective import LossWeights, training_step
from lilicorr_train.pieces import parse_taps
from lilicorr_train.script import run_script

PHASES = ("batch", "target", "forward", "backward", "optimizer")


def random_data(vocab: int, mask_token_id: int, count: int, length: int, seed: int = 0) -> Dataset:
    """`count` sequences of `length` random tokens (never the mask token), a quarter of each the prompt."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, min(vocab, 65535), size=count * length)
    tokens[tokens == mask_token_id] = 1
    offsets = np.arange(count + 1, dtype=np.int64) * length
    prompts = np.full(count, max(1, length // 4), dtype=np.int32)
    return Dataset(tokens.astype(np.uint16), offsets, prompts)


def padding(lengths: np.ndarray, batch_size: int, seed: int, pools: int = 64) -> tuple[float, float]:
    """How wide a fit batch is against its mean sequence (a batch is padded to its longest), over `pools`
    pools of the fit's batches: (the fit's batches cut by length, `loop.batch_rows`; batches drawn at random)."""
    steps = range(pools * POOL)
    cut = [lengths[batch_rows(lengths, i, batch_size, seed)] for i in steps]
    rng = np.random.default_rng(seed)
    drawn = [lengths[rng.integers(0, len(lengths), batch_size)] for _ in steps]
    return tuple(  # type: ignore[return-value]
        float(np.mean([b.max() for b in batches]) / np.mean([b.mean() for b in batches]))
        for batches in (cut, drawn)
    )


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn's result and its wall milliseconds, the device synchronized on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - begin) * 1e3


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.random:
        if device.type != "cuda":
            raise SystemExit("--random builds a bf16 target for CUDA's autocast: on the CPU give --target")
        here = str(Path(__file__).resolve().parent)  # its kernels.py would shadow the `kernels` package that
        sys.path[:] = [
            p for p in sys.path if p != here
        ]  # transformers looks for (bench/target.py builds a model)
        spec = importlib.util.spec_from_file_location("bench_target", Path(__file__).with_name("target.py"))
        assert spec is not None and spec.loader is not None
        bench_target = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_target)
        target = bench_target.random_target(args.random, str(device))
    else:
        target = load_target(
            args.target,
            dtype="bfloat16" if device.type == "cuda" else "float32",
            device=str(device),
            fast=True,
        )
    layers = target.config.num_hidden_layers
    taps = args.taps or ((3, 9, 15, 21, 27) if layers == 30 else spread_taps(layers))
    if max(taps) >= layers or args.mask_token_id >= target.config.vocab_size:
        raise UsageError(
            f"--taps {list(taps)} and --mask-token-id {args.mask_token_id} must lie inside the target "
            f"({layers} layers, {target.config.vocab_size} ids)"
        )
    shape = DrafterShape(num_layers=args.layers, target_layer_ids=taps, mask_token_id=args.mask_token_id)
    settings = TrainConfig(batch_size=args.batch_size, anchors=args.anchors, steps=args.steps + 1)
    data = (
        Dataset.load(args.data)
        if args.data
        else random_data(target.config.vocab_size, args.mask_token_id, 4 * args.batch_size, args.length)
    )
    with tempfile.TemporaryDirectory() as run_dir:
        run = open_run(
            Path(run_dir), drafter_config(target.config, shape), settings, target,
            layers - 1 if args.init_layer is None else args.init_layer,
        )  # fmt: skip
    drafter, cfg = run.drafter, run.train
    weights = LossWeights(beta=cfg.beta, gamma=cfg.gamma, lam=cfg.lam)
    embed_w, head_w = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    drafter.train()
    lengths = np.minimum(data.lengths(), cfg.max_length)
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    token_counts: list[int] = []
    block_counts: list[int] = []

    def step(i: int) -> dict[str, float]:
        rows = batch_rows(lengths, i, cfg.batch_size, cfg.seed)  # the fit's own batches
        batch, t_batch = timed(device, lambda: _batch(data, rows, cfg, run.generator, device))
        (hidden, features), t_target = timed(device, lambda: target_pass(target, batch.tokens, taps))

        def forward() -> Any:
            with autocast:
                return training_step(drafter, embed_w, head_w, features, hidden, batch, weights)

        out, t_forward = timed(device, forward)
        run.optimizer.zero_grad(set_to_none=True)
        _, t_backward = timed(device, lambda: out.loss.backward())

        def optimize() -> None:
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.clip)
            run.optimizer.step()

        _, t_optimizer = timed(device, optimize)
        token_counts.append(int(batch.lengths.sum()))
        block_counts.append(int(batch.anchor_valid.sum()))
        return dict(zip(PHASES, (t_batch, t_target, t_forward, t_backward, t_optimizer), strict=True))

    for i in range(args.warmup):
        step(i)
    token_counts.clear()
    block_counts.clear()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(args.warmup, args.warmup + args.steps):
        for phase, ms in step(i).items():
            times[phase].append(ms)
    profile = None
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for i in range(2):
                step(10_000 + i)
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        profile = prof.key_averages().table(sort_by=sort, row_limit=args.profile_rows)
    median = {p: statistics.median(v) for p, v in times.items()}
    total = sum(median.values())
    step_s = total / 1e3
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "drafter": f"{args.layers} layer(s), taps {','.join(map(str, taps))}",
        "batch": f"{cfg.batch_size} sequences x {cfg.anchors} anchors",
        "median_ms": median,
        "total_ms": total,
        "sequences_per_s": cfg.batch_size / step_s,
        "tokens_per_s": statistics.mean(token_counts) / step_s,
        "blocks_per_s": statistics.mean(block_counts) / step_s,
        "profile": profile,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "padding": padding(lengths, cfg.batch_size, cfg.seed),
    }


def print_report(r: dict[str, Any]) -> None:
    print(f"{r['device']} (torch {r['torch']}); drafter {r['drafter']}; {r['batch']}")
    print("| phase | ms a step (median) | share |")
    print("|---|---:|---:|")
    for phase, ms in r["median_ms"].items():
        print(f"| {phase} | {ms:.2f} | {100 * ms / r['total_ms']:.1f} % |")
    print(f"| step | {r['total_ms']:.2f} | |")
    print(
        f"{r['sequences_per_s']:.1f} sequences/s, {r['tokens_per_s']:,.0f} tokens/s, "
        f"{r['blocks_per_s']:,.0f} blocks/s"
    )
    cut, drawn = r["padding"]
    print(f"a batch is {cut:.2f} times as wide as its mean sequence (batches drawn at random: {drawn:.2f})")
    if r["peak_gib"] is not None:
        print(f"peak GPU memory {r['peak_gib']:.1f} GiB")
    if r["profile"]:
        print(r["profile"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", help="the target (GGUF file, checkpoint folder or repo id)")
    which.add_argument(
        "--random", choices=("smollm2", "qwen3-8b"), help="a random-weight target of this shape"
    )
    p.add_argument(
        "--data", default=None, help="a training set (mixes build's train.npz); default random tokens"
    )
    p.add_argument("--length", type=int, default=320, help="random sequences' length in tokens (default 320)")
    p.add_argument("--layers", type=int, default=1, help="the drafter's layers (default 1)")
    p.add_argument(
        "--taps", type=parse_taps, default=(), help="target layers tapped (default 3,9,15,21,27 on 30 layers)"
    )
    p.add_argument("--init-layer", type=int, default=None, help="the target layer the drafter starts from")
    p.add_argument("--mask-token-id", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="sequences a step (v3.sh fit's: 32)")
    p.add_argument("--anchors", type=int, default=48, help="blocks a sequence (v3.sh fit's: 48)")
    p.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--device", default=None, help="cuda or cpu (default cuda where there is one)")
    p.add_argument("--profile", action="store_true", help="also the top kernels of two steps")
    p.add_argument("--profile-rows", type=int, default=25)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1 or args.anchors < 1 or args.length < 8:
        p.error("--steps, --batch-size and --anchors must be at least 1, --warmup 0, --length 8")
    return run_script("bench/train_step.py", lambda: print_report(measure(args)) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
