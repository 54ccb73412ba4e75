"""Where a target step's time goes: each step GEMM against the weight-read rate, the one-token step by setting
(whether the tuner tries stream-K tiles), and one step's kernels against its span.

    python bench/step_kernels.py --random smollm2      # a random-weight SmolLM2-135M-shaped target (bf16)
    python bench/step_kernels.py --random qwen3-8b     # a random-weight Qwen3-8B-shaped target
    python bench/step_kernels.py TARGET                # a checkpoint, a cache id or a GGUF

Three tables, all from one process (compare the ratios, not numbers across runs):

1. Every step GEMM shape the step tuned: the tile it chose (SPLIT > 1 is split-K, STREAM
   stream-K with that many programs per SM), microseconds per one-row
   call replayed back to back from a CUDA graph over copies of the weights larger than L2 (as the
   tuner times it), and the share of the copy bandwidth its weights stream at, beside the best
   tile without split-K or stream-K.
2. The target step by setting (LILICORR_STREAM_K, whether stream-K tiles are candidates; each with its own
   tuning and graphs): target-only tok/s, the step at 1 and 8 rows. (The settings this bench once compared beside
   it, programmatic dependent launch, the MLP's product in down's prologue and the layer kernel, were measured
   slower and retired: docs/performance.md, docs/runtime.md.)
3. One graph-replayed one-token step under torch.profiler: the sum of its kernels' times against the span from
   the first kernel's start to the last one's end (what is not kernel time is launch latency between kernels),
   and the kernels by name.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import target as bench_target  # noqa: E402 (bench/target.py: random-weight targets, step timing)


def gemm_table(bandwidth: float, sweep: bool = False) -> list[tuple]:
    """(shape, tuned config, us, share of bandwidth, best unsplit config, its us) per tuned GEMM shape."""
    from lilicorr_runtime.ops import step_triton as step_ops

    rows = []
    for key, tuned in list(step_ops.TUNED.items()):
        n, k, norm, bias, residual, gated, _, w_dtype, o_dtype, _ = key
        weight = torch.randn((2 * n if gated else n), k, device="cuda", dtype=w_dtype) * 0.02
        x = torch.randn(1, k, device="cuda", dtype=w_dtype)
        kwargs: dict = {"gated": gated, "out": torch.empty(1, n, device="cuda", dtype=o_dtype)}
        if norm:
            kwargs.update(norm_weight=torch.ones(k, device="cuda", dtype=w_dtype), eps=1e-6)
        if bias:
            kwargs["bias"] = torch.zeros(n, device="cuda", dtype=w_dtype)
        if residual:
            kwargs["residual"] = torch.zeros(1, n, device="cuda", dtype=o_dtype)

        out = kwargs.pop("out")

        def timed(config):
            def launch(config, y, w=weight):
                step_ops.step_linear_triton(x, w, config=config, out=y, **kwargs)

            return step_ops.time_in_graph(launch, config, out, weight)  # us, as the tuner times it

        plain = [step_ops.linear_config(n, k), *step_ops.CANDIDATES]
        best_plain = min(((timed(c), c) for c in plain), key=lambda t: t[0])
        tuned_us = timed(tuned)
        if sweep:
            every = plain + step_ops.divided_candidates(n, k, step_ops.sm_count(torch.device("cuda")))
            times = sorted(((timed(c), c) for c in every), key=lambda t: t[0])
            print(f"sweep N={n} K={k} gated={gated}: {len(times)} tiles, fastest first (us)")
            for us, c in times[:6] + times[-2:]:
                print(f"  {us:8.1f}  " + ",".join(f"{a}={b}" for a, b in c.items()))
        bytes_read = weight.numel() * weight.element_size()
        name = (
            f"N={n} K={k}"
            + (" gated" if gated else "")
            + (" norm" if norm else "")
            + (" +res" if residual else "")
        )
        rows.append(
            (name, tuned, tuned_us, bytes_read / (tuned_us * 1e-6) / bandwidth, best_plain[1], best_plain[0])
        )
    return rows


def profile_step(target) -> tuple[float, float, int, list[tuple[str, int, float]]]:
    """(kernel us, span us, kernels, [(name, count, us)]) of one graph-replayed one-token step."""
    target.forward(torch.tensor([7]))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        target.forward(torch.tensor([9]))
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not events:
        return float("nan"), float("nan"), 0, []
    busy = sum(e.time_range.end - e.time_range.start for e in events)
    span = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        by_name[e.name[:60]].append(e.time_range.end - e.time_range.start)
    names = sorted(((n, len(v), sum(v)) for n, v in by_name.items()), key=lambda t: -t[2])
    return busy, span, len(events), names


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?")
    parser.add_argument("--random", metavar="SHAPE", help="a random-weight target: smollm2 or qwen3-8b")
    parser.add_argument("--tokens", type=int, default=128, help="target-only tokens timed per setting")
    parser.add_argument(
        "--modes",
        default="on",
        help="LILICORR_STREAM_K values to compare, in order, e.g. on,off",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also time every tile candidate of each GEMM shape"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/step_kernels.py times CUDA kernels: run it on a GPU machine")
    if not args.target and not args.random:
        parser.error("give TARGET or --random SHAPE")
    bench = bench_target
    from lilicorr_runtime.ops import step_triton as step_ops
    from lilicorr_runtime.target.fast import FastTarget, tokens_per_second
    from lilicorr_runtime.target.load import load_target

    if args.random:
        base = bench.random_target(args.random, "cuda")
        name = f"random {args.random}"
    else:
        base = load_target(args.target, dtype="bfloat16", device="cuda", fast=True)
        name = args.target
    prompt = [t % base.vocab_size for t in bench.PROMPT]
    bandwidth = bench.copy_bandwidth("cuda")
    weight_bytes = sum(p.numel() * p.element_size() for p in base.model.parameters())
    num_layers = base.num_layers
    print(
        f"{time.strftime('%Y-%m-%d')}  {torch.cuda.get_device_name()}, torch {torch.__version__}, {name}, bf16, "
        f"weights {weight_bytes / 1e6:.0f} MB, copy bandwidth {bandwidth / 1e12:.2f} TB/s, floor "
        f"{weight_bytes / bandwidth * 1e3:.3f} ms/step"
    )
    taps = tuple(sorted({round(i * (num_layers - 1) / 4) for i in range(5)}))
    results = []
    model = base.model
    del base
    for mode in args.modes.split(","):
        os.environ["LILICORR_STREAM_K"] = mode
        step_ops.TUNED.clear()  # each setting tunes (or reads the stored tiles of) its own candidate set
        target = FastTarget(model)
        tps = tokens_per_second(target, prompt, args.tokens)
        steps = [bench.step_latency(target, r, taps) * 1e3 for r in (1, 8)]
        gemms = gemm_table(bandwidth, args.sweep)
        busy, span, kernels, names = profile_step(target)
        results.append((mode, tps, steps, gemms, busy, span, kernels, names))
        del target
    for mode, _tps, _steps, gemms, *_ in results:
        print(f"\nstep GEMMs at one row, {mode} (us per call, back to back in a graph, weights cold)")
        print(f"{'shape':<34} {'tuned tile':<52} {'us':>7} {'of bw':>6}   {'best unsplit us':>15}")
        for shape, tuned, us, share, _plain, plain_us in gemms:
            tile = ",".join(f"{k}={v}" for k, v in tuned.items())
            print(f"{shape:<34} {tile:<52} {us:7.1f} {share * 100:5.1f}%   {plain_us:15.1f}")
    print(
        f"\n{'stream-K':<13} {'tok/s':>8} {'1 row ms':>9} {'8 rows ms':>10} {'kernels':>8} {'kernel us':>10} {'span us':>8} {'gaps':>6}"
    )
    for mode, tps, steps, _g, busy, span, kernels, _n in results:
        gaps = 1 - busy / span if span else float("nan")
        print(
            f"{mode:<13} {tps:8.1f} {steps[0]:9.3f} {steps[1]:10.3f} {kernels:8d} {busy:10.1f} {span:8.1f} {gaps * 100:5.1f}%"
        )
    for mode, *_rest, names in results:
        print(f"\nkernels of one step, {mode}: name, count, us")
        for kernel, count, us in names[:12]:
            print(f"  {kernel:<60} {count:5d} {us:9.1f}")


if __name__ == "__main__":
    main()
