"""Time the whole `lilicorr-ckpt validate` process on full-size sparse checkpoints.

Qwen3-8B drafter geometry (draft width 4096, head width 1024, K 8, 2 head layers): ~2 GB with 5 draft
layers, and the same with 20 layers (~8 GB) to show the time does not grow with tensor bytes. Files are
sparse (real headers, data are holes), so the benchmark needs no disk space.

    python bench/validate.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lilicorr_ckpt import fixtures


def time_process(args: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = subprocess.run(args, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if result.returncode != 0:
            raise SystemExit(f"validate failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    probe = (
        "import sys, runpy; sys.argv=['lilicorr-ckpt','validate',sys.argv[1]]\n"
        "try:\n  runpy.run_module('lilicorr_ckpt.cli', run_name='__main__')\n"
        "except SystemExit as e:\n  assert 'torch' not in sys.modules, 'torch was imported'\n  raise"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (5, 20):
            path = fixtures.write_sparse_checkpoint(
                Path(tmp) / f"l{layers}", fixtures.qwen3_8b_drafter_config(layers)
            )
            size = (path / "model.safetensors").stat().st_size
            times = time_process([sys.executable, "-c", probe, str(path)], args.repeats)
            rows.append((layers, size, statistics.median(times), min(times), max(times)))
    print(
        f"{'draft layers':>12} {'checkpoint':>11} {'median s':>9} {'min s':>7} {'max s':>7}   (whole process, torch never imported)"
    )
    for layers, size, med, lo, hi in rows:
        print(f"{layers:>12} {size / 1e9:>9.2f}GB {med:>9.3f} {lo:>7.3f} {hi:>7.3f}")
    ratio = rows[1][2] / rows[0][2]
    print(f"time ratio 20 layers / 5 layers: {ratio:.2f} (bytes ratio {rows[1][1] / rows[0][1]:.2f})")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
