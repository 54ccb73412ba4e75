"""Where the layer kernel's time goes (ops/layer_triton.py): one launch over all layers of a one-row step, replayed
from a CUDA graph, by setting, beside the five-kernel decoder forward.

    python bench/layer_kernel.py                      # a random-weight SmolLM2-135M-shaped target (bf16)
    python bench/layer_kernel.py --context 1000       # attention over more cache rows

Settings: whether the phases wait for each other (off computes garbage: a timing experiment only, telling
the cost of the waits from the cost of the units), whether each layer's weights and cache rows are prefetched into
L2 (LILICORR_LAYER_PREFETCH), and whether the units' K loops are unrolled (LILICORR_LAYER_UNROLL). Each setting
compiles its own variant. All rows come from one process: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import torch

SETTINGS = (  # (phases wait, prefetch, unroll)
    (True, "on", "off"),
    (False, "on", "off"),
    (True, "off", "off"),
    (False, "off", "off"),
    (True, "on", "on"),
    (False, "on", "on"),
)


sys.path.insert(0, str(pathlib.Path(__file__).parent))
import target as bench_target  # noqa: E402 (bench/target.py: random-weight targets, step timing)


def replay_us(fn, repeats: int) -> float:
    """Microseconds per replay of a graph of fn (run once eagerly first)."""
    from lilicorr_runtime.target.fast import capture

    fn()
    torch.cuda.synchronize()
    graph, _ = capture(fn)
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--context", type=int, default=200, help="cache rows before the step (default 200)")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/layer_kernel.py times a CUDA kernel: run it on a GPU machine")
    if args.context < 1:
        parser.error("--context must be at least 1")
    os.environ.setdefault("LILICORR_LAYER_KERNEL", "on")
    from lilicorr_runtime.ops import layer_triton

    target = bench_target.random_target("smollm2", "cuda")
    core, kernel = target.core, target.core.layer_kernel
    if kernel is None:
        raise SystemExit("this target does not run the layer kernel (LILICORR_LAYER_KERNEL=off?)")
    layers = core.num_layers
    taps = tuple(sorted({round(i * (layers - 1) / 4) for i in range(5)}))
    target.reserve(args.context + 8)
    target.reset()
    target.forward(torch.arange(args.context) % 1000, taps)  # the prefill (five kernels) resolves the tiles
    target.forward(torch.tensor([5]), taps)  # the first layer-kernel launch, checked
    if kernel.disabled is not None:
        raise SystemExit(f"the layer kernel is off: {kernel.disabled}")
    cache = target.static_cache
    x = torch.randn(1, core.hidden_size, device="cuda", dtype=core.dtype)
    features = torch.empty(1, len(taps) * core.hidden_size, device="cuda", dtype=core.dtype)
    row = torch.tensor([args.context + 1], device="cuda")
    pad = torch.zeros(1, dtype=torch.long, device="cuda")
    cols = kernel.columns({t: i for i, t in enumerate(taps)})
    print(
        f"{time.strftime('%Y-%m-%d')}  {torch.cuda.get_device_name()}, random SmolLM2 shape, one row after "
        f"{args.context} cached, tiles {kernel.tiles}"
    )
    print(f"\n{'phases wait':<12} {'prefetch':<9} {'unroll':<7} {'us per step':>12}")
    saved = layer_triton._NO_WAIT
    try:
        for wait, prefetch, unroll in SETTINGS:
            layer_triton._NO_WAIT = not wait
            os.environ["LILICORR_LAYER_PREFETCH"], os.environ["LILICORR_LAYER_UNROLL"] = prefetch, unroll
            stream = x.clone()

            def launch(stream=stream):
                kernel.launch(
                    stream,
                    features,
                    cols,
                    cache.key_block,
                    cache.value_block,
                    row,
                    row,
                    pad,
                    core.cos,
                    core.sin,
                    1,
                )

            us = replay_us(launch, args.repeats)
            print(f"{'yes' if wait else 'no (garbage)':<12} {prefetch:<9} {unroll:<7} {us:12.1f}")
    finally:
        layer_triton._NO_WAIT = saved
        os.environ.pop("LILICORR_LAYER_PREFETCH", None)
        os.environ.pop("LILICORR_LAYER_UNROLL", None)
    kernel.disabled = "bench: the five-kernel forward"
    xx = x.view(1, 1, -1).clone()
    start = torch.tensor(args.context + 1, device="cuda")
    us = replay_us(lambda: core.forward(cache, xx, start, pad, taps), args.repeats)
    print(f"{'five kernels a layer (the decoder forward, final norm included)':<30} {us:12.1f}")


if __name__ == "__main__":
    main()
