"""A streaming safetensors writer: the header is fixed first, then tensor bytes are written in order.

Tensors are laid out by (alignment descending, name) so every tensor starts aligned to its item
size, as the safetensors library lays them out. Output is deterministic for the same input.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import msgspec

from lilicorr_ckpt.checkpoint.manifest import DTYPE_BYTES


class Entry(msgspec.Struct, frozen=True):
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            n *= dim
        return n


def layout(entries: Iterable[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (-DTYPE_BYTES[e.dtype], e.name))


def header_bytes(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": e.dtype,
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class StreamWriter:
    """Write one safetensors file: `write(name, chunk)` calls must follow `entries` order."""

    def __init__(self, path: Path, entries: Iterable[Entry], metadata: dict[str, str] | None = None):
        self.entries = layout(entries)
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._file.write(header_bytes(self.entries, metadata))
        self._index = 0
        self._written = 0
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._index < len(self.entries) and self.entries[self._index].nbytes == 0:
            self._index += 1

    def write(self, name: str, chunk: bytes | memoryview) -> None:
        entry = self.entries[self._index]
        if entry.name != name:
            raise ValueError(f"expected tensor {entry.name!r} next, got {name!r}")
        self._file.write(chunk)
        self._written += len(chunk)
        if self._written > entry.nbytes:
            raise ValueError(f"{name}: {self._written} bytes written, {entry.nbytes} expected")
        if self._written == entry.nbytes:
            self._index += 1
            self._written = 0
            self._skip_empty()

    def next_name(self) -> str | None:
        return self.entries[self._index].name if self._index < len(self.entries) else None

    def close(self, fsync: bool = True) -> None:
        if self._index != len(self.entries):
            self._file.close()
            raise ValueError(f"{self.path.name}: tensor {self.entries[self._index].name!r} was not written")
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        self._file.close()


def write_file(
    path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]], metadata: dict[str, str] | None = None
) -> None:
    """Write small in-memory tensors: name -> (dtype, shape, raw little-endian bytes)."""
    writer = StreamWriter(path, [Entry(n, d, s) for n, (d, s, _) in tensors.items()], metadata)
    for entry in writer.entries:
        if entry.nbytes:
            writer.write(entry.name, tensors[entry.name][2])
    writer.close(fsync=False)


def write_sparse(path: Path, entries: Iterable[Entry], metadata: dict[str, str] | None = None) -> None:
    """A file whose tensor data are holes (all zeros on read, no disk blocks): for size benchmarks."""
    ordered = layout(entries)
    head = header_bytes(ordered, metadata)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(e.nbytes for e in ordered))
