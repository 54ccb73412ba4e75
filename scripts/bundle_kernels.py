"""Put the kernel variants a GPU recorded into the package's bundled table (lilicorr_runtime/ops/tuning/kernels.json),
or drop the bundled variants an edit of their kernel made stale.

    python scripts/bundle_kernels.py RECORDED.json [RECORDED.json ...]   # replace those GPUs' sections
    python scripts/bundle_kernels.py --prune                             # only drop the stale entries
    python scripts/bundle_kernels.py --check                             # list them, change nothing (exit 1 if any)

RECORDED is the per-user table a `smoke --gpu` run wrote on that GPU: `LILICORR_KERNEL_CACHE=FILE` for the run,
or `bench/smoke_cold.py --dir D` (D/kernels.json). Each GPU in it replaces that GPU's section of the bundled table
whole (a section recorded before a kernel edit holds variants no launch asks for any more); the other sections
stay. An entry whose kernel's own source text differs from this checkout's is stale: a fresh machine would not
compile it ahead, and tests/runtime/test_kernel_warm.py fails on it. Such entries are dropped, and named, from
what is bundled, recorded or already there.

After editing a kernel: record its variants again on each GPU the table names (one smoke of the bundled examples
there, all probes) and bundle them; where no GPU is at hand, `--prune` keeps the table true at the cost of those
variants' compile time on a fresh machine. Run without TRITON_INTERPRET: the source hashes are of the kernels
Triton compiles, which the interpreter replaces.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

Entries = list[dict[str, str]]


def current_sources() -> Callable[[str], str | None]:
    """name -> the source hash of that kernel in this checkout (None: not a kernel of the package)."""
    from lilicorr_runtime.ops.tuning import kernels

    cache: dict[str, str | None] = {}

    def source(name: str) -> str | None:
        if name not in cache:
            fn = kernels._kernel(name)
            cache[name] = None if fn is None else kernels.source_hash(fn)
        return cache[name]

    return source


def combine(recordings: list[dict[str, Entries]]) -> dict[str, Entries]:
    """Several recorded tables as one: a GPU recorded twice keeps both sets of entries, in order (`merge` keeps
    each spec once)."""
    out: dict[str, Entries] = {}
    for table in recordings:
        for device, entries in table.items():
            out.setdefault(device, []).extend(entries)
    return out


def merge(
    bundled: dict[str, Entries], recorded: dict[str, Entries], source: Callable[[str], str | None]
) -> tuple[dict[str, Entries], list[str]]:
    """The bundled sections with each recorded GPU's section put in its place, stale entries dropped; and a line
    per dropped entry ("GPU: kernel")."""
    out = {device: list(entries) for device, entries in bundled.items()}
    out.update({device: list(entries) for device, entries in recorded.items()})
    dropped: list[str] = []
    for device in list(out):
        kept = []
        seen: set[str] = set()
        for entry in out[device]:
            if entry["spec"] in seen:
                continue
            seen.add(entry["spec"])
            if source(entry["name"]) == entry["source"]:
                kept.append(entry)
            else:
                dropped.append(f"{device}: {entry['name'].rsplit('.', 1)[-1]}")
        if kept:
            out[device] = kept
        else:
            del out[device]
    return out, dropped


def main(argv: list[str] | None = None) -> int:
    from lilicorr_runtime.ops.tuning import kernels, tables

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("recorded", nargs="*", type=Path, help="kernel tables a smoke run recorded on a GPU")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prune", action="store_true", help="only drop the bundled table's stale entries")
    mode.add_argument("--check", action="store_true", help="list the stale entries and change nothing")
    parser.add_argument(
        "--table", type=Path, default=kernels.BUNDLED, help="the table to write (the bundled one)"
    )
    args = parser.parse_args(argv)
    if not args.recorded and not (args.prune or args.check):
        parser.error("give recorded tables, or --prune / --check")
    if args.recorded and (args.prune or args.check):
        parser.error("--prune and --check take no recorded tables")
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error(
            "run without TRITON_INTERPRET=1: the interpreter replaces the kernels whose sources are hashed"
        )
    tables_read = []
    for path in args.recorded:
        table = kernels.read(path)
        if not table:
            print(f"{path}: not a kernel table, or an empty one", file=sys.stderr)
            return 2
        tables_read.append(table)
    recorded = combine(tables_read)
    bundled = kernels.read(args.table)
    merged, dropped = merge(bundled, recorded, current_sources())
    for line in dropped:
        print(f"stale: {line}")
    for device, entries in merged.items():
        before = len(bundled.get(device, []))
        print(f"{device}: {len(entries)} variants (was {before})")
    for device in bundled.keys() - merged.keys():
        print(f"{device}: removed (every variant stale)")
    if args.check:
        return 1 if dropped else 0
    tables.write_json(args.table, {"format": kernels.FORMAT, "devices": merged})
    size = args.table.stat().st_size
    print(f"wrote {args.table} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
