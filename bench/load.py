"""Target load time of a GGUF, each in a fresh interpreter, imports excluded, with the number of gguf readers each
built: `load_target` (read directly: target/gguf_direct.py), `load_target` on transformers' route
(LILICORR_GGUF_LOADER=transformers: one GGUF parse for the model and its tokenizer) and transformers alone
(`AutoModelForCausalLM.from_pretrained` then `AutoTokenizer.from_pretrained`).

    python bench/load.py .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import gguf, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from lilicorr_ckpt.checkpoint import resolve_target_spec
from lilicorr_runtime.target.load import load_target

parses = [0]
original = gguf.GGUFReader


class Counting(original):
    def __init__(self, *args, **kwargs):
        parses[0] += 1
        super().__init__(*args, **kwargs)


gguf.GGUFReader = Counting
mode, spec = sys.argv[1], sys.argv[2]
wall, cpu = time.perf_counter(), time.process_time()
if mode.startswith("load_target"):
    load_target(spec, dtype=torch.float32)
else:
    path = resolve_target_spec(spec).path
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "parses": parses[0]}))
"""


def measure(mode: str, target: str) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("LILICORR_GGUF_LOADER", None)
    if mode == "load_target, transformers' route":
        env["LILICORR_GGUF_LOADER"] = "transformers"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, target], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", help="a .gguf target file")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"| load ({args.repeats} runs, median) | wall s | CPU s | gguf readers built |")
    print("|---|---|---|---|")
    for mode in ("transformers", "load_target, transformers' route", "load_target"):
        runs = [measure(mode, args.target) for _ in range(args.repeats)]
        wall = statistics.median(r["wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        print(f"| {mode} | {wall:.1f} | {cpu:.1f} | {runs[0]['parses']:.0f} |")


if __name__ == "__main__":
    main()
