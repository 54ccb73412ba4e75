"""What a first smoke run on a fresh machine costs: the same smoke command, one process each, under three cache
states, in this order, with the wall time of each (interpreter start, target load and everything else included):

    no stored tiles   a fresh Triton cache, LILICORR_TILE_CACHE=off and LILICORR_KERNEL_CACHE=off: every kernel
                      compiled as it is first launched, every step GEMM shape tuned (what a fresh machine paid
                      before tiles and kernel variants were stored)
    bundled tiles     a fresh Triton cache and empty user tables: the shapes in the package's tile table
                      (ops/tuning/tiles.json) not tuned, the variants in its kernel table (ops/tuning/kernels.json) compiled
                      ahead in parallel while the models load (a fresh machine now)
    warm              the caches the run before left: nothing compiled, nothing tuned

    python bench/smoke_cold.py -- examples/smollm2-lilicorr -t GGUF -r vllm --gpu --limit 0

Everything after `--` goes to `lilicorr-ckpt smoke`. The caches live in a temporary directory, so the user's own
caches are neither read nor changed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

Row = tuple[
    str, float, int, dict[str, Any]
]  # label, wall seconds, exit code, the profile's measurement_conditions


def run(label: str, args: list[str], env: dict[str, str], tail: int, profile: Path) -> Row:
    begin = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lilicorr_ckpt", "smoke", *args, "--out", str(profile)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - begin
    print(f"--- {label}: rc {done.returncode}, {wall:.1f} s", flush=True)
    if tail:
        print("\n".join(done.stdout.splitlines()[-tail:]), flush=True)
    if done.returncode not in (0, 1):
        print(done.stderr[-2000:], file=sys.stderr, flush=True)
    try:
        conditions = json.loads(profile.read_text())["measurement_conditions"]
    except (OSError, ValueError, KeyError):  # no profile: the run failed before writing one
        conditions = {}
    return label, wall, done.returncode, conditions


def table(rows: list[Row]) -> list[str]:
    """The wall time of each run and its phases (the profile's phase_seconds), one column per phase."""
    phases = list(dict.fromkeys(name for *_, c in rows for name in c.get("phase_seconds", {})))
    lines = [f"{'cache state':<18} {'wall s':>8} {'rc':>3}" + "".join(f" {p[:14]:>14}" for p in phases)]
    for label, wall, rc, conditions in rows:
        seconds = conditions.get("phase_seconds", {})
        cells = "".join(f" {seconds[p]:14.1f}" if p in seconds else f" {'-':>14}" for p in phases)
        lines.append(f"{label:<18} {wall:8.1f} {rc:3d}{cells}")
    for label, _, _, conditions in rows:
        k = conditions.get("kernel_variants")
        if k:
            lines.append(
                f"{label}: {k['ahead_compiled']} of {k['ahead']} stored variants compiled ahead in "
                f"{k['ahead_seconds']:.1f} s; the launches waited {k.get('read_seconds', 0.0):.1f} s to read them and "
                f"{k['at_launch_seconds']:.1f} s for {k['at_launch']} not compiled ahead ({k['launched']} in all); "
                f"{k.get('tuned', 0)} GEMM shape(s) tuned in {k.get('tuning_seconds', 0.0):.1f} s"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("smoke", nargs=argparse.REMAINDER, help="the smoke command's arguments, after --")
    parser.add_argument("--skip-untuned", action="store_true", help="leave out the no-stored-tiles run")
    parser.add_argument("--tail", type=int, default=0, help="print the last N lines of each run's report")
    parser.add_argument(
        "--dir",
        help="keep the caches in DIR (empty or new) instead of a temporary directory: later runs can then reuse "
        "the warm state with TRITON_CACHE_DIR=DIR/triton-b LILICORR_TILE_CACHE=DIR/tiles.json "
        "LILICORR_KERNEL_CACHE=DIR/kernels.json",
    )
    args = parser.parse_args()
    smoke = args.smoke[1:] if args.smoke[:1] == ["--"] else args.smoke
    if not smoke:
        parser.error("give the smoke command's arguments after --")
    # smoke's --output, -o (also -oFILE) and --out (its old spelling), each also as --name=FILE
    if any(a.startswith("-o") or a.split("=", 1)[0] in ("--output", "--out") for a in smoke):
        parser.error(
            "leave out --output (-o, --out): each run writes its profile into the bench's directory, for the "
            "phases"
        )
    rows = []
    with tempfile.TemporaryDirectory(prefix="lilicorr-cold-") as tmp:
        base = Path(args.dir or tmp)
        base.mkdir(parents=True, exist_ok=True)
        if any(base.iterdir()):
            parser.error(f"--dir {base} is not empty: its caches would not be cold")
        if not args.skip_untuned:
            rows.append(
                run(
                    "no stored tiles",
                    smoke,
                    {
                        "TRITON_CACHE_DIR": str(base / "triton-a"),
                        "LILICORR_TILE_CACHE": "off",
                        "LILICORR_KERNEL_CACHE": "off",
                    },
                    args.tail,
                    base / "untuned.json",
                )
            )
        fresh = {
            "TRITON_CACHE_DIR": str(base / "triton-b"),
            "LILICORR_TILE_CACHE": str(base / "tiles.json"),
            "LILICORR_KERNEL_CACHE": str(base / "kernels.json"),
        }
        rows.append(run("bundled tiles", smoke, fresh, args.tail, base / "bundled.json"))
        rows.append(run("warm", smoke, fresh, args.tail, base / "warm.json"))
    print(f"\n{time.strftime('%Y-%m-%d')}  smoke {' '.join(smoke)}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
