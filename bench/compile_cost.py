"""What a first process spends compiling Triton kernels: runs one `lilicorr-ckpt` command (a smoke, usually) in
this process with a Triton compilation listener, then prints, by kernel, how many variants were compiled and
loaded from the cache and the seconds spent, against the command's wall time.

    TRITON_CACHE_DIR=$(mktemp -d) python bench/compile_cost.py -- smoke examples/smollm2-lilicorr -t GGUF \\
        -r vllm --gpu --limit 0

Run it with a fresh TRITON_CACHE_DIR to see a fresh machine's cost; with the warm cache, the compiled column
should be empty. Needs a Triton with `knobs.compilation.listener` (3.4 and later).
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the lilicorr-ckpt command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the lilicorr-ckpt command after --")
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        raise SystemExit(f"triton {triton.__version__} has no compilation listener (3.4 and later do)")
    lock = threading.Lock()
    compiled: dict[str, list[float]] = collections.defaultdict(list)
    loaded: dict[str, list[float]] = collections.defaultdict(list)
    first: list[float] = []
    begin = time.perf_counter()

    def listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
        name = str(metadata.get("name") or getattr(src, "name", "?"))
        with lock:
            (loaded if cache_hit else compiled)[name].append(times.total / 1e6)
            if not first:
                first.append(time.perf_counter() - begin)

    knobs.compilation.listener = listener
    from lilicorr_ckpt.cli import main as cli

    sys.argv = ["lilicorr-ckpt", *command]
    code: object = 0
    try:
        cli()
    except SystemExit as exc:
        code = exc.code
    wall = time.perf_counter() - begin
    knobs.compilation.listener = None
    names = sorted(set(compiled) | set(loaded), key=lambda n: -sum(compiled.get(n, [])))
    print(f"\n{time.strftime('%Y-%m-%d')}  lilicorr-ckpt {' '.join(command)}: exit {code}, wall {wall:.1f} s")
    print(f"{'kernel':<44} {'compiled':>8} {'s':>7} {'cached':>7} {'s':>6}")
    for name in names:
        c, h = compiled.get(name, []), loaded.get(name, [])
        print(f"{name[:44]:<44} {len(c):8d} {sum(c):7.1f} {len(h):7d} {sum(h):6.2f}")
    c_all = [t for v in compiled.values() for t in v]
    h_all = [t for v in loaded.values() for t in v]
    print(f"{'all':<44} {len(c_all):8d} {sum(c_all):7.1f} {len(h_all):7d} {sum(h_all):6.2f}")
    if first:
        print(f"first compile or load {first[0]:.1f} s after start")


if __name__ == "__main__":
    main()
