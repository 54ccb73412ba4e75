"""The runtime's one way to capture a CUDA graph: warm the work up on a side stream, then capture it on another.

Every capture site uses these two functions (tests/runtime/test_graphs.py fails on a graph captured anywhere
else in the runtime): the target's step graphs (target/fast.py), the draft step (decode/draft_step.py), the
device loop's block and its prefills (decode/device_loop.py), and the tuner's timing graphs (ops/step_triton.py).

`capture` neither synchronizes the device nor runs the garbage collector first, unlike `torch.cuda.graph` (a full
collection takes ~0.2 s in a process holding a loaded GGUF target), so a graph first needed in the middle of
decoding costs only its capture. Ordering is by streams: the capture stream waits for the current stream's work,
and the current stream then waits for the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

WARMUP_RUNS = 2  # compiles the kernels and settles the allocator before a capture


def warm_up(run: Callable[[], object], times: int = WARMUP_RUNS, device: torch.device | None = None) -> None:
    """Run `run` `times` times on a side stream of `device` (None: the current device), after the work already
    queued on the current stream and before the work queued on it next."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(times):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)


def capture(run: Callable[[], T], device: torch.device | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """(a CUDA graph of `run`, what `run` returned while captured: the graph's static outputs), captured on a side
    stream of `device` (None: the current device)."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            out = run()
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, out
