"""Where a CPU `smoke` run's wall time goes: each command run as a child process, its progress lines timed.

    python bench/smoke_cpu.py [--repeat N] [--label L] -- SMOKE ARGS...
    python bench/smoke_cpu.py --repeat 2 -- examples/smollm2-lilicorr -t .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        -r vllm --dtype bfloat16 --batch 32 --limit 40 --max-new-tokens 128

Each run is `python -m lilicorr_ckpt smoke ARGS` with stderr a pipe (not a terminal), so smoke writes its
progress as whole lines; each line is stamped as it arrives, and the phases are the spans between the stage lines:

    start      interpreter start and imports, up to "loading the drafter"
    load       the drafter and the target (GGUF parsing, dequantization), up to the warm-up or the first arm
    warmup     the untimed warm-up (absent with --no-warmup)
    head, control, ar   each batched arm, from its "decoding the X arm" line
    decode     with --batch 1: the three arms interleaved, from the first generation's line
    check      the lossless check and the reference's near ties ("checking losslessness") to the exit

and beside them the whole run's wall time, the child's CPU time (user + system) and peak RSS (os.wait4), the
machine's load average before and after, the head gain and its 95% interval, every gate's verdict and the exit
code. One row per run; the table is printed at the end (and --json writes the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

# a stage line of smoke's progress -> the phase that starts with it
STAGES = (
    ("loading the drafter", "load"),
    ("warming up", "warmup"),
    ("decoding the head arm", "head"),
    ("decoding the control arm", "control"),
    ("decoding the ar arm", "ar"),
    (" generations (last: ", "decode"),  # --batch 1: the arms interleaved, no per-arm line
    ("checking losslessness", "check"),
)
PHASES = ("start", "load", "warmup", "head", "control", "ar", "decode", "check")


def run_once(args: list[str], echo: bool) -> dict:
    before = os.getloadavg()[0]
    begin = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "lilicorr_ckpt", "smoke", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    stamps: list[tuple[float, str]] = []
    assert child.stderr is not None and child.stdout is not None
    for line in child.stderr:
        stamps.append((time.perf_counter() - begin, line.rstrip("\n")))
        if echo:
            print(f"  [{stamps[-1][0]:6.1f}s] {stamps[-1][1]}", file=sys.stderr, flush=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - begin
    child.returncode = os.waitstatus_to_exitcode(status)
    after = os.getloadavg()[0]
    events = [(0.0, "start")]  # (when, the phase that began)
    for at, line in stamps:
        for text, phase in STAGES:
            if text in line and all(p != phase for _, p in events):
                if phase == "decode" and any(p in ("head", "control", "ar") for _, p in events):
                    continue  # a batched arm's own count line
                events.append((at, phase))
    events.sort()
    phases = {
        phase: (events[k + 1][0] if k + 1 < len(events) else wall) - at
        for k, (at, phase) in enumerate(events)
    }
    gain = re.search(r"gain ([+-][\d.]+)%, 95% CI ([+-][\d.]+)% \.\. ([+-][\d.]+)% over (\d+) prompts", out)
    if gain is None:
        gain = re.search(r"\(gain ([+-][\d.]+)%\)", out)
    gates = dict(
        (name, "INCONCLUSIVE" if summary.startswith("inconclusive") else status)
        for status, name, summary in re.findall(r"^[ \t]+(PASS|FAIL|SKIP)[ \t]+(\S+)[ \t]+(.*)$", out, re.M)
    )
    return {
        "args": " ".join(args),
        "exit": child.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2),
        "load_before": round(before, 2),
        "load_after": round(after, 2),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "gain": gain.group(0) if gain else None,
        "gates": gates,
        "report": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command, one after another")
    parser.add_argument("--label", default="", help="a name for the rows (the code version, say)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows (with each run's report) here")
    parser.add_argument("--echo", action="store_true", help="echo smoke's progress lines as they come")
    parser.add_argument("smoke", nargs=argparse.REMAINDER, help="-- then smoke's arguments")
    args = parser.parse_args()
    smoke = args.smoke[1:] if args.smoke[:1] == ["--"] else args.smoke
    if not smoke:
        parser.error("give smoke's arguments after --")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {os.cpu_count()} cores, python {sys.version.split()[0]}  "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}",
        flush=True,
    )
    rows = []
    for i in range(args.repeat):
        row = run_once(smoke, args.echo)
        row["label"] = args.label
        rows.append(row)
        print(
            f"run {i + 1}: exit {row['exit']}, {row['wall_s']} s, {row['phases_s']}, {row['gain']}",
            flush=True,
        )
    print()
    print(f"command: lilicorr-ckpt smoke {rows[0]['args']}")
    header = ["label", "run", "wall s", *[f"{p} s" for p in PHASES], "cpu s", "rss GB", "load", "exit"]
    print(" | ".join(header))
    for i, row in enumerate(rows, 1):
        phases = [f"{row['phases_s'].get(p, 0.0):.1f}" for p in PHASES]
        load = f"{row['load_before']}-{row['load_after']}"
        cells = [row["label"] or "-", str(i), f"{row['wall_s']:.1f}", *phases]
        cells += [f"{row['cpu_s']:.1f}", f"{row['peak_rss_gb']:.2f}", load, str(row["exit"])]
        print(" | ".join(cells))
    for i, row in enumerate(rows, 1):
        verdicts = ", ".join(f"{name} {status}" for name, status in row["gates"].items())
        print(f"run {i}: {row['gain'] or 'no head gain line'}; {verdicts}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
