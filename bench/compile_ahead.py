"""What compiling the bundled kernel variants ahead costs, measured without a GPU: Triton compiles for a named
target (sm90 here) through its whole pipeline to ptxas without a driver, so the CPU alone can time it.

    python bench/compile_ahead.py [--threads 1,2,16] [--pick all|first-widest] [--device H100]

For each thread count, in a fresh Triton cache of its own (a subprocess each), it compiles the chosen variants of
the bundled table (ops/tuning/kernels.json; the entries of every GPU named in it whose name contains --device)
in a pool of threads, as `ops.tuning.kernels.start` does while the models load, and prints the wall time, the sum
of the compiles' own times, and the speed-up over one thread. `--pick first-widest` takes each kernel's first
variant and the one with the most warps (what tests/runtime/kernels/test_compile_sm90.py compiles); `--json` prints
one JSON line per thread count instead of the table, with every variant's result, for tests.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _tuple(value: Any) -> Any:
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def variants(pick: str, device: str) -> list[dict[str, Any]]:
    """The bundled table's specs (deserialized), each once: all of them, or per kernel the first and the widest."""
    from lilicorr_runtime.ops import warm

    chosen: dict[Any, dict[str, Any]] = {}
    for gpu, entries in json.loads(warm.BUNDLED.read_text())["devices"].items():
        if device not in gpu:
            continue
        for entry in entries:
            spec = json.loads(entry["spec"])
            if pick == "all":
                chosen.setdefault(entry["spec"], spec)
                continue
            name, warps = spec["name"], spec["options"]["num_warps"]
            chosen.setdefault((name, "first"), spec)
            if warps > chosen.setdefault((name, "widest"), spec)["options"]["num_warps"]:
                chosen[(name, "widest")] = spec
    return list({json.dumps(s, sort_keys=True): s for s in chosen.values()}.values())


def compile_one(spec: dict[str, Any], arch: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, _, attr = spec["name"].rpartition(".")
    options = {"num_warps": spec["options"]["num_warps"], "num_stages": spec["options"]["num_stages"]}
    label = f"{attr} warps={options['num_warps']} stages={options['num_stages']}"
    begin = time.perf_counter()
    try:
        source = ASTSource(
            getattr(importlib.import_module(module), attr),
            {k: _tuple(v) for k, v in spec["signature"].items()},
            {tuple(k): _tuple(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)},
            {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"], strict=True)},
        )
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        return {"label": label, "cubin": len(kernel.asm["cubin"]), "seconds": time.perf_counter() - begin}
    except Exception as exc:  # reported per variant: one that does not compile is the finding
        return {"label": label, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}


def worker(threads: int, pick: str, device: str, arch: int) -> dict[str, Any]:
    import triton

    specs = variants(pick, device)
    begin = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda s: compile_one(s, arch), specs))
    return {
        "triton": triton.__version__,
        "threads": threads,
        "wall": time.perf_counter() - begin,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--pick", choices=("all", "first-widest"), default="all")
    parser.add_argument("--device", default="", help="only the table's GPUs whose name contains this")
    parser.add_argument(
        "--arch", type=int, default=90, help="the compute capability compiled for (default 90)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per thread count")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:  # one thread count, in this process and the cache its parent gave it
        print(json.dumps(worker(args.worker, args.pick, args.device, args.arch)))
        return
    try:
        counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes whole numbers, comma-separated, got {args.threads!r}")
    if not counts or min(counts) < 1:
        parser.error("--threads takes counts of at least 1")
    if not variants(args.pick, args.device):
        from lilicorr_runtime.ops import warm

        gpus = list(json.loads(warm.BUNDLED.read_text())["devices"])
        parser.error(f"--device {args.device!r} matches none of the bundled table's GPUs: {gpus}")
    rows = []
    for threads in counts:
        with tempfile.TemporaryDirectory(prefix="lilicorr-compile-") as cache:
            env = {
                k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"
            }  # the interpreter compiles nothing
            env["TRITON_CACHE_DIR"] = cache
            env.setdefault(
                "TRITON_DEFAULT_FP_FUSION", "1"
            )  # the runtime's kernels fuse (Triton 3.9 warns if unset)
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(threads),
                    "--pick",
                    args.pick,
                    f"--device={args.device}",  # one that starts with "-" is still its value
                    "--arch",
                    str(args.arch),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
        if done.returncode != 0:
            raise SystemExit(f"the worker for {threads} thread(s) failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.splitlines()[-1])
        if args.json:
            print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        return
    print(
        f"\n{time.strftime('%Y-%m-%d')}  Triton {rows[0]['triton']}, sm{args.arch}, {os.cpu_count()} CPUs here"
    )
    print(f"{'threads':>7} {'variants':>8} {'failed':>6} {'wall s':>8} {'sum s':>8} {'speed-up':>8}")
    for row in rows:
        ok = [r for r in row["results"] if "error" not in r]
        speedup = rows[0]["wall"] / row["wall"] if row["wall"] > 0 else 0.0
        print(
            f"{row['threads']:>7} {len(row['results']):>8} {len(row['results']) - len(ok):>6} {row['wall']:8.1f} "
            f"{sum(r['seconds'] for r in ok):8.1f} {speedup:7.2f}x"
        )
    for row in rows[:1]:
        for r in row["results"]:
            if "error" in r:
                print(f"  {r['label']}: {r['error']}")


if __name__ == "__main__":
    main()
