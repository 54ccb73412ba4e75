"""Execute a plan: stream tensor bytes into the temporary sibling of DST (convert/destination.py renames it into
place), then the configs, the index and the other files of the source.

Copies go through convert/reader.py (copy_file_range, or memory-mapped windows of the source, written
sequentially); a background thread hashes the source files at the same time (hashlib and file I/O release the
GIL). Each shard's header is written last: its length was fixed with a same-length hash placeholder, so the bytes
are deterministic. Peak memory is one window per thread plus one block of a repaired module.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lilicorr_ckpt.checkpoint.source import JSON_LIMIT
from lilicorr_ckpt.checkpoint.stwrite import header_bytes
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.convert.plan import OutTensor, Plan, shard_metadata
from lilicorr_ckpt.convert.reader import SourceReader, copy_file, hash_file, sha256_file, write_all
from lilicorr_ckpt.convert.repair import BadScales, Requantized, dequantize_blocks, requantize_blocks
from lilicorr_ckpt.errors import ConversionRefused


def _dump_json(path: Path, doc: Any) -> str:
    """Write `doc` as JSON, indented unless that takes it past JSON_LIMIT (then compact: a source config of 4 MB of
    one-line lists came out as 14 MB indented, which validate then refused to read, naming only `config.json`);
    returns the sha256 of the bytes written."""
    data = (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=True) + "\n").encode()
    if len(data) > JSON_LIMIT:
        data = (json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest()


def write_json(path: Path, doc: Any) -> None:
    _dump_json(path, doc)


def generated_files(plan: Plan) -> list[str]:
    """The files a conversion generates in DST (besides conversion.json): shards, index, config files."""
    return (
        [s.file for s in plan.shards]
        + (["model.safetensors.index.json"] if plan.index is not None else [])
        + ["config.json"]
        + (["hf_quant_config.json"] if plan.hf_quant_config is not None else [])
    )


def planned_files(plan: Plan) -> list[str]:
    """Every file a conversion writes into DST except conversion.json, which lists them (`written`)."""
    return sorted(generated_files(plan) + list(plan.copies))


def write_tensor(
    t: OutTensor,
    reader: SourceReader,
    fd: int,
    progress: Progress,
    repair_errors: dict[str, float],
    requantized: dict[str, Requantized] | None = None,
) -> None:
    if t.op == "copy":
        assert t.source is not None
        reader.copy(t.source, fd, progress)
        return
    if t.op == "constant":
        write_all(fd, t.data)
        progress.advance(len(t.data))
        return
    if t.op == "requantize":
        _write_requantized(t, reader, fd, progress, requantized if requantized is not None else {})
        return
    worst = 0.0
    assert len(t.shape) == 2
    try:
        for block, err in dequantize_blocks(
            t.kind, t.inputs, (t.shape[0], t.shape[1]), t.dtype, reader.read, t.group_size
        ):
            write_all(fd, block)
            progress.advance(len(block))
            worst = max(worst, err)
    except BadScales as exc:
        raise ConversionRefused(
            f"cannot repair {t.canonical.removesuffix('.weight')}: its scales are corrupt", [str(exc)]
        ) from None
    repair_errors[t.canonical] = worst


def _write_requantized(
    t: OutTensor, reader: SourceReader, fd: int, progress: Progress, requantized: dict[str, Requantized]
) -> None:
    """One tensor (packed weight or block scales) of a shard re-quantized against its fused group's scale, a block
    of rows at a time; the weight's pass records the shard's errors (module -> Requantized)."""
    weight = t.inputs["weight"]
    module = t.canonical.rsplit(".", 1)[0]
    shape = (weight.shape[0], weight.shape[1] * 2)
    stats = Requantized(max_abs_error=0.0, max_abs_weight=0.0)
    try:
        for block, block_stats in requantize_blocks(
            t.inputs, shape, reader.read, t.group_size, t.shared_scale_2, t.part
        ):
            write_all(fd, block)
            progress.advance(len(block))
            stats.max_abs_error = max(stats.max_abs_error, block_stats.max_abs_error)
            stats.max_abs_weight = max(stats.max_abs_weight, block_stats.max_abs_weight)
    except BadScales as exc:
        raise ConversionRefused(
            f"cannot re-quantize {module} to its fused linear's global scale: its scales are corrupt",
            [str(exc)],
        ) from None
    if t.part == "weight":
        requantized[module] = stats


def write_plan(plan: Plan, tmp: Path, progress: Progress) -> dict[str, Any]:
    """Write every file of the plan into `tmp` (other files of the source included). Returns facts for
    conversion.json (hashes, repair errors). A write error propagates as OSError (see output_error)."""
    root = plan.source.root
    reader = SourceReader(root)
    repair_errors: dict[str, float] = {}
    requantized: dict[str, Requantized] = {}
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lilicorr-hash")
    stop = threading.Event()
    hashes: dict[str, Future[str]] = {f: pool.submit(hash_file, root / f, stop) for f in plan.source_files}
    try:
        for shard in plan.shards:
            path = tmp / shard.file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.lseek(fd, shard.header_length, os.SEEK_SET)
                for entry in shard.entries:
                    write_tensor(plan.tensors[entry.name], reader, fd, progress, repair_errors, requantized)
            finally:
                os.close(fd)
        progress.note("hashing the source")
        source_hashes = {f: fut.result() for f, fut in hashes.items()}
        metadata = shard_metadata(source_hashes)
        written: dict[str, Future[str] | str] = {}
        for shard in plan.shards:
            head = header_bytes(shard.entries, metadata)
            if len(head) != shard.header_length:  # pragma: no cover - the placeholder guarantees it
                raise RuntimeError(
                    f"{shard.file}: header length changed from {shard.header_length} to {len(head)}"
                )
            fd = os.open(tmp / shard.file, os.O_WRONLY)
            try:
                os.pwrite(fd, head, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            written[shard.file] = pool.submit(
                sha256_file, tmp / shard.file, stop
            )  # what a later --force checks
        written["config.json"] = _dump_json(tmp / "config.json", plan.config)
        if plan.hf_quant_config is not None:
            written["hf_quant_config.json"] = _dump_json(tmp / "hf_quant_config.json", plan.hf_quant_config)
        if plan.index is not None:
            written["model.safetensors.index.json"] = _dump_json(
                tmp / "model.safetensors.index.json", plan.index
            )
        if plan.copies:
            progress.note(f"copying {len(plan.copies)} other files")
        for name in plan.copies:
            copy_file(root / name, tmp / name)
            written[name] = pool.submit(sha256_file, tmp / name, stop)
        progress.note("hashing the output")
        output_hashes = {name: h if isinstance(h, str) else h.result() for name, h in sorted(written.items())}
    finally:
        stop.set()  # an interrupted run does not wait for a multi-GB hash to finish
        pool.shutdown(wait=True, cancel_futures=True)
        reader.close()
    return {
        "source_sha256": source_hashes,
        "written": output_hashes,
        "repair_rounding": {k: repair_errors[k] for k in sorted(repair_errors)},
        "requantized": {k: requantized[k] for k in sorted(requantized)},
    }
