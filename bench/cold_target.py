"""Cold import + load of a target, each in a fresh interpreter: the target built without transformers (the default
route, target/native.py) against the route through transformers' model class (`native=False`, the route every
target took before). Each child times its imports (lilicorr_runtime, and transformers where the route needs it)
and the load_target call, and reports whether transformers and torch._dynamo ended up imported.

    python bench/cold_target.py .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf [--repeats 3]
    python bench/cold_target.py GGUF --before /tmp/old   # the native route of another checkout (a `git worktree`
                                                          # of an earlier commit) beside this one's, interleaved
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
begin = time.perf_counter()
from lilicorr_runtime.target.load import load_target
native = sys.argv[2] == "native"
if not native:
    import transformers  # imported by the load itself on this route; timed with the imports
imported = time.perf_counter()
target = load_target(sys.argv[1], native=native)
loaded = time.perf_counter()
print(json.dumps({
    "import_s": imported - begin,
    "load_s": loaded - imported,
    "total_s": loaded - begin,
    "transformers": "transformers" in sys.modules,
    "dynamo": "torch._dynamo" in sys.modules,
    "note": target.load_note,
}))
"""


def run(spec: str, route: str, tree: str | None = None) -> dict:
    env = dict(os.environ)
    if tree is not None:  # that checkout's packages first on the path
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, spec, "native" if route == "before" else route],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tree,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="another checkout: time its native route too (row 'before') instead of the transformers route",
    )
    args = parser.parse_args()
    target = os.path.abspath(args.target)
    routes = ("before", "native") if args.before else ("transformers", "native")
    rows: dict[str, list[dict]] = {}
    for _ in range(args.repeats):  # interleaved, so that machine load falls on every route alike
        for route in routes:
            tree = os.path.abspath(args.before) if route == "before" else None
            rows.setdefault(route, []).append(run(target, route, tree))
    print(
        f"{'route':<14} {'import s':>9} {'load s':>8} {'total s':>8}  transformers  torch._dynamo  "
        f"(median of {args.repeats})"
    )
    for route, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("import_s", "load_s", "total_s")}
        print(
            f"{route:<14} {med['import_s']:>9.2f} {med['load_s']:>8.2f} {med['total_s']:>8.2f}  "
            f"{runs[0]['transformers']!s:<13} {runs[0].get('dynamo')!s:<14} {runs[0]['note']}"
        )


if __name__ == "__main__":
    main()
