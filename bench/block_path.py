"""How much code one speculative block runs: the files and functions of lilicorr_runtime a block executes.

    python bench/block_path.py [--drafter examples/tiny-lilicorr] [--target examples/tiny-target] [--mode head]

Decodes one prompt on the CPU (the eager loop, torch reference ops) until a few blocks have run, then records
with `sys.setprofile` every Python function of lilicorr_runtime entered during the next block (`_block`), and
prints them grouped by file: the code a reader follows to understand one draft -> verify -> accept -> commit.
The GPU's device loop replays the same block.py functions inside a CUDA graph; its capture code is not counted.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

import lilicorr_runtime
from lilicorr_ckpt import load_drafter
from lilicorr_runtime import SpeculativeDecoder, load_target
from lilicorr_runtime.decode import speculative

ROOT = Path(lilicorr_runtime.__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="examples/tiny-lilicorr")
    parser.add_argument("--target", default="examples/tiny-target")
    parser.add_argument("--mode", default="head", choices=("head", "control"))
    args = parser.parse_args()
    torch.manual_seed(0)
    target = load_target(args.target, dtype=torch.float32, device="cpu")
    drafter = load_drafter(args.drafter, runtime="all", dtype=torch.float32, device="cpu")
    decoder = SpeculativeDecoder(target, drafter, mode=args.mode, temperature=0.0, seed=0, loop="eager")

    seen: dict[str, set[str]] = defaultdict(set)
    state = {"blocks": 0, "tracing": False}
    original = speculative.SpeculativeDecoder._block

    def profiler(frame, event, _arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        try:
            rel = path.resolve().relative_to(ROOT)
        except ValueError:
            return
        seen[str(rel)].add(frame.f_code.co_qualname)

    def traced_block(self, *a, **k):  # noqa: ANN001, ANN002, ANN003
        state["blocks"] += 1
        if state["blocks"] != 4:  # the fourth block: caches and lazy constants built by then
            return original(self, *a, **k)
        sys.setprofile(profiler)
        try:
            return original(self, *a, **k)
        finally:
            sys.setprofile(None)

    speculative.SpeculativeDecoder._block = traced_block  # type: ignore[method-assign]
    try:
        decoder.generate([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=64, eos_token_ids=[])
    finally:
        speculative.SpeculativeDecoder._block = original  # type: ignore[method-assign]
    if state["blocks"] < 4:
        sys.exit(f"only {state['blocks']} blocks ran; raise max_new_tokens")
    functions = sum(len(v) for v in seen.values())
    print(
        f"one {args.mode} block, eager loop on the CPU: {len(seen)} files, {functions} functions of lilicorr_runtime"
    )
    print(f"{'file':<36} {'functions':>9}  names")
    for rel in sorted(seen, key=lambda r: (-len(seen[r]), r)):
        names = sorted(seen[rel])
        shown = ", ".join(names[:6]) + (f", ... ({len(names) - 6} more)" if len(names) > 6 else "")
        print(f"{rel:<36} {len(names):>9}  {shown}")


if __name__ == "__main__":
    main()
