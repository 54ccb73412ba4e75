"""The tensor table: every safetensors header of a checkpoint, read without touching tensor data.

The safetensors library validates each header (offsets in range, contiguous, no overlap, known
dtypes); we then read the same header JSON for the byte ranges the library does not expose.
Index <-> shard disagreements are recorded as facts for the rules, not raised.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from pathlib import Path

import msgspec
from safetensors import SafetensorError, safe_open

from lilicorr_ckpt.checkpoint.config import load_json_object
from lilicorr_ckpt.checkpoint.manifest import DTYPE_BYTES
from lilicorr_ckpt.checkpoint.readfile import open_regular_file, regular_size
from lilicorr_ckpt.checkpoint.source import INDEX_LIMIT, Source, checked_file, read_small
from lilicorr_ckpt.errors import InputError

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
# A drafter holds hundreds of tensors (a few thousand quantized); a target shard a few thousand. The caps keep a
# hostile header (a million tensors fit in 65 MB) within the budget: validate under 5 s and 1 GB.
MAX_FILE_TENSORS = 1 << 17  # any one safetensors header, a target's shards too
MAX_CHECKPOINT_TENSORS = 1 << 16  # a checkpoint's shards and index together
MAX_METADATA_ENTRIES = 1 << 12  # a header's __metadata__ ({"format": "pt"} and a few more)


class TensorInfo(msgspec.Struct, frozen=True):
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # relative to the checkpoint directory
    start: int  # absolute byte offset of the data in `file`
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class ShardFacts(msgspec.Struct, frozen=True):
    """What the index and the shards say about each other (empty when there is no index)."""

    missing_shards: dict[str, list[str]]  # shard file -> tensors the index places there
    index_only: dict[str, str]  # tensor -> shard that does not contain it
    shard_only: dict[str, str]  # tensor -> shard it is in, absent from the index
    misplaced: dict[str, tuple[str, str]]  # tensor -> (shard in index, shard it is really in)
    duplicates: dict[str, list[str]]  # tensor -> every shard holding it
    unreferenced: list[str]  # *.safetensors files the index never names
    total_size_declared: int | None
    total_size_actual: int
    has_index: bool
    both_single_and_index: bool


class TensorTable(msgspec.Struct, frozen=True):
    tensors: dict[str, TensorInfo]
    files: list[str]
    metadata: dict[str, dict[str, str]]  # file -> __metadata__
    shards: ShardFacts
    # file -> keys its header repeats (every reader keeps one entry silently, not necessarily the same one)
    duplicate_keys: dict[str, list[str]] = {}

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def header_duplicate_keys(header_bytes: bytes) -> list[str]:
    """The top-level keys a safetensors header JSON repeats (msgspec, json and the library all keep one)."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: dict[str, object] = {}
        for key, value in items:
            if key in seen and isinstance(value, dict) and "data_offsets" in value:
                repeated.append(key)
            seen[key] = value
        return seen

    with contextlib.suppress(ValueError, RecursionError):
        json.loads(header_bytes, object_pairs_hook=pairs)
    return sorted(set(repeated))


def read_header(path: Path, label: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """All tensors of one safetensors file (validated by the safetensors library) and its metadata."""
    tensors, metadata, _ = read_header_keys(path, label)
    return tensors, metadata


class TooManyTensors(InputError):
    """A tensor table larger than the cap: refused before it is built."""

    def __init__(self, label: str, count: int, limit: int, *, scope: str = "file", before: int = 0):
        self.count = count
        where = f" beside the {before} of the shards read before it" if before else ""
        super().__init__(
            f"{label}: the header lists {count} tensors{where}; the limit is {limit} tensors per "
            f"{scope} (a drafter holds hundreds to a few thousand): refusing a tensor table this large"
        )


class _Entry(msgspec.Struct):
    """One tensor's header entry, as the safetensors library has validated it."""

    dtype: str
    shape: list[int]
    data_offsets: tuple[int, int]


def header_entries(header_bytes: bytes, label: str, max_tensors: int) -> dict[str, msgspec.Raw] | None:
    """The header's entries, each value left undecoded, with `__metadata__` removed; None when the header is no JSON
    object (the safetensors library then names what is wrong). More than max_tensors tensors, or more than
    MAX_METADATA_ENTRIES metadata entries, is refused before anything is built per entry: 100 MB of header can list
    a million tensors, and each costs tens of microseconds and a kilobyte in the checks."""
    try:
        entries = msgspec.json.decode(header_bytes, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError:
        return None
    metadata = entries.pop("__metadata__", None)
    if len(entries) > max_tensors:
        raise TooManyTensors(label, len(entries), max_tensors)
    if metadata is not None:
        try:
            count = len(msgspec.json.decode(metadata, type=dict[str, msgspec.Raw]))
        except msgspec.DecodeError:
            return entries  # not an object of strings: the library refuses it
        if count > MAX_METADATA_ENTRIES:
            raise InputError(
                f"{label}: the header's __metadata__ holds {count} entries; the limit is "
                f"{MAX_METADATA_ENTRIES}: refusing a header this large"
            )
    return entries


def _reopenable(fd: int, path: Path) -> str:
    """A name that opens the very file behind fd (Linux /proc/self/fd), so the library reads what was checked even
    if the path is swapped meanwhile; the path itself elsewhere."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else str(path)


def read_header_keys(
    path: Path,
    label: str,
    *,
    max_tensors: int = MAX_FILE_TENSORS,
) -> tuple[dict[str, TensorInfo], dict[str, str], list[str]]:
    """read_header, plus the tensor names the header repeats (the library keeps one silently). More than
    max_tensors entries is refused (header_entries)."""
    size = regular_size(path, what=label)  # a FIFO or device would block: named, never opened
    try:
        with open_regular_file(path, what=label) as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise InputError(f"{label}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                raise InputError(
                    f"{label}: header length {n} is absurd (limit {MAX_HEADER_BYTES}); not a safetensors file"
                )
            if 8 + n > size:
                raise InputError(
                    f"{label}: header length {n} runs past the end of the file ({size} bytes); "
                    f"the file is truncated or not safetensors"
                )
            header_bytes = f.read(n)
            entries = header_entries(header_bytes, label, max_tensors)
            names, library_metadata = _library_view(_reopenable(f.fileno(), path), label)
    except OSError as exc:
        raise InputError(f"cannot read {label}: {exc.strerror}") from None
    if entries is None:  # pragma: no cover - the library refuses a header that is no JSON object
        raise InputError(f"{label}: header is not a JSON object")
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    try:
        for (
            name
        ) in names:  # dtype, shape and offsets as the library validated them (it parsed this same JSON)
            entry = msgspec.json.decode(entries[name], type=_Entry)
            begin, end = entry.data_offsets
            out[name] = TensorInfo(
                name=name,
                dtype=entry.dtype,
                shape=tuple(entry.shape),
                file=label,
                start=base + begin,
                end=base + end,
            )
    except (KeyError, msgspec.DecodeError) as exc:  # pragma: no cover - the library read the same entries
        raise InputError(f"{label}: header entry unreadable: {exc}") from None
    return out, {str(k): str(v) for k, v in library_metadata.items()}, header_duplicate_keys(header_bytes)


def _library_view(name: str, label: str) -> tuple[list[str], dict[str, str]]:
    """The tensor names and metadata of a header the safetensors library validated (offsets in range,
    contiguous, no overlap, known dtypes, shapes that match their byte ranges)."""
    try:
        with safe_open(name, framework="numpy") as handle:
            return list(handle.keys()), handle.metadata() or {}
    except SafetensorError as exc:
        raise InputError(f"{label}: corrupt safetensors: {exc}") from None
    except Exception as exc:  # the binding also raises OSError/ValueError on odd files
        raise InputError(f"{label}: cannot open as safetensors: {exc}") from None


def _read_index(source: Source) -> tuple[dict[str, str], int | None]:
    assert source.index is not None
    doc, _ = load_json_object(read_small(source.index, source.index.name, INDEX_LIMIT), source.index.name)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"{source.index.name}: expected an object `weight_map` of tensor name -> shard file")
    if len(weight_map) > MAX_CHECKPOINT_TENSORS:
        raise InputError(
            f"{source.index.name}: weight_map lists {len(weight_map)} tensors; the limit is "
            f"{MAX_CHECKPOINT_TENSORS} (a drafter holds hundreds to a few thousand): refusing an index "
            "this large"
        )
    for shard in set(weight_map.values()):
        checked_file(source.root, source.link_root, shard, source.index.name)
    total = None
    meta = doc.get("metadata")
    value = meta.get("total_size") if isinstance(meta, dict) else None
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value < 2**63
    ):
        total = int(value)  # Infinity, NaN or a negative total is no total: LC606 compares a real one only
    return weight_map, total


def read_tensor_table(source: Source) -> TensorTable:
    weight_map: dict[str, str] = {}
    declared_total = None
    if source.index is not None:
        weight_map, declared_total = _read_index(source)
    on_disk = {source.rel(p): p for p in source.safetensors}
    referenced = sorted(set(weight_map.values()))
    missing = {
        shard: sorted(n for n, s in weight_map.items() if s == shard)
        for shard in referenced
        if shard not in on_disk and not (source.root / shard).exists()
    }
    to_read = sorted(set(on_disk) | {s for s in referenced if s not in missing})

    per_file: dict[str, dict[str, TensorInfo]] = {}
    metadata: dict[str, dict[str, str]] = {}
    repeated: dict[str, list[str]] = {}
    read_so_far = 0
    for rel in to_read:
        path = checked_file(source.root, source.link_root, rel, "checkpoint")
        left = MAX_CHECKPOINT_TENSORS - read_so_far
        try:
            per_file[rel], metadata[rel], dups = read_header_keys(
                path, rel, max_tensors=min(left, MAX_FILE_TENSORS)
            )
        except TooManyTensors as exc:
            if left >= MAX_FILE_TENSORS:
                raise
            raise TooManyTensors(
                rel, exc.count, MAX_CHECKPOINT_TENSORS, scope="checkpoint", before=read_so_far
            ) from None
        read_so_far += len(per_file[rel])
        if dups:
            repeated[rel] = dups

    tensors: dict[str, TensorInfo] = {}
    holders: dict[str, list[str]] = {}
    for rel in to_read:
        for name, info in per_file[rel].items():
            holders.setdefault(name, []).append(rel)
            tensors.setdefault(name, info)
    duplicates = {n: files for n, files in holders.items() if len(files) > 1}

    index_only: dict[str, str] = {}
    misplaced: dict[str, tuple[str, str]] = {}
    shard_only: dict[str, str] = {}
    if source.index is not None:
        for name, shard in weight_map.items():
            if shard in missing:
                continue
            if name not in per_file.get(shard, {}):
                if name in holders:
                    misplaced[name] = (shard, holders[name][0])
                else:
                    index_only[name] = shard
        for name, files in holders.items():
            if name not in weight_map:
                shard_only[name] = files[0]
    unreferenced = sorted(set(on_disk) - set(referenced)) if source.index is not None else []
    shards = ShardFacts(
        missing_shards=missing,
        index_only=index_only,
        shard_only=shard_only,
        misplaced=misplaced,
        duplicates=duplicates,
        unreferenced=unreferenced,
        total_size_declared=declared_total,
        total_size_actual=sum(t.nbytes for t in tensors.values()),
        has_index=source.index is not None,
        both_single_and_index=source.index is not None
        and "model.safetensors" in on_disk
        and "model.safetensors" not in referenced,
    )
    return TensorTable(
        tensors=tensors, files=to_read, metadata=metadata, shards=shards, duplicate_keys=repeated
    )


def expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    size = DTYPE_BYTES.get(dtype)
    if size is None:
        return None
    n = size
    for dim in shape:
        n *= dim
    return n


def describe_shape(shape: tuple[int, ...]) -> str:
    return json.dumps(list(shape))


def read_f32_scalars(root: Path, infos: list[TensorInfo]) -> dict[str, float]:
    """The values of scalar F32 tensors (4 bytes each, e.g. NVFP4 weight_scale_2), read by seeking: a few bytes
    per tensor, whatever the checkpoint's size. A tensor whose bytes lie past its file's end is left out."""
    out: dict[str, float] = {}
    by_file: dict[str, list[TensorInfo]] = {}
    for info in infos:
        if info.dtype == "F32" and info.end - info.start == 4:
            by_file.setdefault(info.file, []).append(info)
    for rel, members in sorted(by_file.items()):
        try:
            with open_regular_file(root / rel, what=rel) as handle:
                size = os.fstat(handle.fileno()).st_size
                for info in sorted(members, key=lambda i: i.start):
                    if info.end > size:
                        continue
                    handle.seek(info.start)
                    data = handle.read(4)
                    if len(data) == 4:
                        out[info.name] = struct.unpack("<f", data)[0]
        except (OSError, InputError):
            continue
    return out
