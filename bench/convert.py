"""Benchmark `lilicorr-ckpt convert` against a plain copy of the same bytes on the same disk.

    python bench/convert.py                 # ~4 GB bf16 export + ~1.8 GB NVFP4 export, 5 runs each
    python bench/convert.py --layers 4 --runs 1 --workdir /mnt/fast

Builds synthetic ModelOpt-style exports with real (random) bytes on disk, not file holes, in a
temporary directory (on the disk of --workdir), then for each:
  copy     shutil.copyfile of every source file + fsync (what "copying the checkpoint" costs)
  convert  the CLI in a fresh interpreter (startup, planning, writing, source sha256, fsync, validate)
Runs alternate copy/convert; each starts after `sync` and a 1 s pause, so neither pays for the other's
write-back.and prints a markdown table: seconds (median), MB/s, convert/copy throughput ratio, and the convert
process's peak resident memory (VmHWM). Targets: ratio >= 0.70, peak RSS < 512 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lilicorr_ckpt import fixtures  # noqa: E402
from lilicorr_ckpt.checkpoint.manifest import legacy_name  # noqa: E402
from lilicorr_ckpt.checkpoint.stwrite import Entry, StreamWriter  # noqa: E402
from lilicorr_ckpt.convert.destination import fsync_path  # noqa: E402

CHUNK = 16 << 20
SETTLE_S = 1.0
PROBE = """
import re, sys
from lilicorr_ckpt.cli import main
try:
    main(["convert", *sys.argv[1:]])
except SystemExit as exc:
    hwm = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
    print("EXIT", exc.code, "HWM_KB", hwm, "TORCH", "torch" in sys.modules)
"""


def _random_block(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(CHUNK)


def _fill(writer: StreamWriter, entry: Entry, block: bytes, dtype: str) -> None:
    remaining = entry.nbytes
    if entry.dtype == "F8_E4M3":  # valid block scales (no NaN codes): 2^-6 .. 2^1
        data = (
            (np.frombuffer(block[:remaining], np.uint8) % 64 + 0x18).astype(np.uint8).tobytes()
            if remaining <= len(block)
            else None
        )
        if data is not None:
            writer.write(entry.name, data)
            return
    if entry.dtype == "F32" and remaining == 4:
        writer.write(entry.name, np.float32(1e-3).tobytes())
        return
    while remaining:
        n = min(remaining, len(block))
        writer.write(entry.name, block[:n])
        remaining -= n


def make_export(path: Path, layers: int, quant: str | None) -> int:
    """A ModelOpt-style export of the paper's Qwen3-8B drafter geometry; returns its tensor bytes."""
    config = fixtures.qwen3_8b_drafter_config(layers)
    manifest = fixtures.manifest_for(config)
    entries: list[Entry] = []
    quantized: set[str] = set()
    if quant:
        quantized = fixtures.modelopt_quantized(manifest)
        qc, nested = fixtures.quant_metadata(manifest, quant, quantized, style="modelopt")
        config["quantization_config"] = qc
    for name, t in manifest.tensors.items():
        if t.module in quantized and name == f"{t.module}.weight":
            o, i = t.shape
            entries += [
                Entry(name, "U8", (o, i // 2)),
                Entry(f"{t.module}.weight_scale", "F8_E4M3", (o, i // 16)),
                Entry(f"{t.module}.weight_scale_2", "F32", ()),
                Entry(f"{t.module}.input_scale", "F32", ()),
            ]
        else:
            entries.append(Entry(name, "BF16", t.shape))
    # what older ModelOpt exports look like: training prefix and the training module's Sequential head names
    entries = [Entry("dflash_module." + legacy_name(e.name), e.dtype, e.shape) for e in entries]
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if quant:
        (path / "hf_quant_config.json").write_text(json.dumps(nested, indent=2))
    writer = StreamWriter(path / "model.safetensors", entries, {"format": "pt"})
    block = _random_block(0)
    for entry in writer.entries:
        if entry.nbytes:
            _fill(writer, entry, block, "BF16")
    writer.close()
    return sum(e.nbytes for e in entries)


def settle() -> None:
    """Start every measurement with no dirty pages from the previous one still being written back."""
    os.sync()
    time.sleep(SETTLE_S)


def plain_copy(src: Path, dst: Path) -> float:
    settle()
    start = time.perf_counter()
    dst.mkdir()
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
        fsync_path(dst / f.name)
    fsync_path(dst)
    return time.perf_counter() - start


def run_convert(src: Path, dst: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    settle()
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(src), str(dst), "--quiet"], capture_output=True, text=True, env=env
    )
    elapsed = time.perf_counter() - start
    m = re.search(r"EXIT (\S+) HWM_KB (\d+) TORCH (\S+)", result.stdout)
    if not m or m.group(1) != "0":
        raise SystemExit(f"convert failed:\n{result.stdout}\n{result.stderr}")
    if m.group(3) != "False":
        raise SystemExit("convert imported torch")
    return elapsed, int(m.group(2)) * 1024


def bench_case(label: str, src: Path, tensor_bytes: int, work: Path, runs: int) -> dict:
    total = sum(f.stat().st_size for f in src.iterdir())
    copies, converts, peaks = [], [], []
    for k in range(runs):
        copy_dst, conv_dst = work / f"copy-{k}", work / f"conv-{k}"
        copies.append(plain_copy(src, copy_dst))
        shutil.rmtree(copy_dst)
        seconds, peak = run_convert(src, conv_dst)
        converts.append(seconds)
        peaks.append(peak)
        written = sum(f.stat().st_size for f in conv_dst.iterdir())
        shutil.rmtree(conv_dst)
    copy_s, conv_s = statistics.median(copies), statistics.median(converts)
    return {
        "case": label,
        "bytes": total,
        "written": written,
        "tensor_bytes": tensor_bytes,
        "copy_s": copy_s,
        "convert_s": conv_s,
        "copy_mbs": total / copy_s / 1e6,
        "convert_mbs": total / conv_s / 1e6,
        "ratio": copy_s / conv_s,
        "peak_rss_mb": max(peaks) / 2**20,
        "runs": runs,
        "copies": copies,
        "converts": converts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=10, help="draft layers of the bf16 export (10 = ~4.1 GB)")
    ap.add_argument("--nvfp4-layers", type=int, default=16, help="draft layers of the NVFP4 export (0: skip)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="directory on the disk to measure (default: system temp)")
    ap.add_argument("--json", action="store_true", help="also print the raw results as JSON")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lilicorr-bench-convert-", dir=args.workdir))
    try:
        cases = []
        src = work / "bf16-export"
        nbytes = make_export(src, args.layers, None)
        cases.append(bench_case(f"bf16 rename-only, {args.layers} layers", src, nbytes, work, args.runs))
        shutil.rmtree(src)
        if args.nvfp4_layers:
            src = work / "nvfp4-export"
            nbytes = make_export(src, args.nvfp4_layers, "NVFP4")
            cases.append(
                bench_case(f"NVFP4 + repairs, {args.nvfp4_layers} layers", src, nbytes, work, args.runs)
            )
            shutil.rmtree(src)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cpu = platform.processor() or platform.machine()
    print(
        f"# convert benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu}), Python "
        f"{platform.python_version()}, workdir {args.workdir or tempfile.gettempdir()}, median of {args.runs}\n"
    )
    print(
        "| case | source | output | copy s | convert s | copy MB/s | convert MB/s | convert/copy | peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cases:
        print(
            f"| {c['case']} | {c['bytes'] / 1e9:.2f} GB | {c['written'] / 1e9:.2f} GB | {c['copy_s']:.2f} | "
            f"{c['convert_s']:.2f} | "
            f"{c['copy_mbs']:.0f} | {c['convert_mbs']:.0f} | {c['ratio']:.2f} | {c['peak_rss_mb']:.0f} MB |"
        )
    ok = all(c["ratio"] >= 0.70 and c["peak_rss_mb"] < 512 for c in cases[:1]) and all(
        c["peak_rss_mb"] < 512 for c in cases
    )
    print(f"\ntargets (bf16 ratio >= 0.70, every peak RSS < 512 MB): {'met' if ok else 'NOT met'}")
    if args.json:
        print(json.dumps(cases, indent=2))


if __name__ == "__main__":
    main()
