"""A GGUF file's header read lazily and within limits, and its structure checked against the model it declares,
before any tensor is read: torch-free, the one reading validate's `--target`, smoke's pre-load check and the
runtime's direct reader (lilicorr_runtime/target/gguf_direct.py) share.

`read_header` walks the header once with `struct`: every count, string and array length is checked against a
limit (LIMITS) before anything is allocated for it, and the walk stops at MAX_METADATA_BYTES. Scalars and short
strings are kept; arrays (the vocabulary, its merges, token types) are kept as (type, count, offset) and read only
when asked for, so a 49,152-token vocabulary costs one walk over its lengths. The tensor table is checked as it
is read: names as ggml writes them (printable ASCII, at most 63 bytes, block numbers in ASCII digits without a
leading zero, each name once), at most 4 dimensions, a ggml type gguf can dequantize, rows that fill its blocks,
and data inside the file, aligned, with no two tensors sharing a byte.

`check_model` then checks the model against its own declaration: every metadata key it knows has the type the
GGUF spec gives, the vocabulary's arrays agree, every block 0..block_count-1 has tensors and no tensor names a
block beyond them, the embedding is vocabulary x embedding_length, and for Llama, Qwen2 and Qwen3 every tensor
the architecture needs is there exactly once in its shape. A file without weights (a vocabulary-only GGUF, a
LoRA adapter) is refused here, in milliseconds.

Every refusal is a GGUFError: an InputError (exit 2 on the command line) and a ValueError (what the runtime's
library callers catch), naming the file, what is wrong and what to do."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lilicorr_ckpt.checkpoint.readfile import open_regular_file
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.errors import InputError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Limits, each far above what a real model's GGUF holds and far below what costs seconds or gigabytes to read.
MAX_METADATA_ENTRIES = 4096  # a llama.cpp conversion writes 30-60 keys
MAX_TENSORS = 65536  # a 61-layer mixture of experts holds ~1,500 tensors
MAX_KEY_BYTES = 256  # keys are short dotted names ("llama.attention.head_count_kv")
MAX_STRING_BYTES = 1 << 20  # one metadata string (the largest, a chat template, is tens of KB)
MAX_ITEM_BYTES = 1 << 16  # one string in an array (the longest tokens are a few hundred bytes)
MAX_ARRAY_ITEMS = 1 << 20  # one array: Llama 3's 280,147 merges, Gemma's 262,144 tokens
MAX_STRING_ITEMS = 1 << 21  # strings in all arrays together (each is walked in Python: ~0.3 us apiece)
MAX_METADATA_BYTES = 64 << 20  # the metadata and tensor table (a 256k vocabulary with merges: ~10 MB)
MAX_VOCABULARY = 1 << 19  # tokens (the largest vocabularies have 262,144)
MAX_NAME_BYTES = 63  # ggml's GGML_MAX_NAME (64, with the terminating NUL)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 2  # an array of arrays (no key llama.cpp writes has one) at most this deep
LIMITS = {
    "metadata entries": MAX_METADATA_ENTRIES,
    "tensors": MAX_TENSORS,
    "metadata key bytes": MAX_KEY_BYTES,
    "metadata string bytes": MAX_STRING_BYTES,
    "array string bytes": MAX_ITEM_BYTES,
    "array items": MAX_ARRAY_ITEMS,
    "strings in arrays": MAX_STRING_ITEMS,
    "header bytes": MAX_METADATA_BYTES,
    "vocabulary": MAX_VOCABULARY,
}

# metadata value types (GGUF v2/v3)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALARS: dict[int, struct.Struct] = {
    UINT8: struct.Struct("<B"),
    INT8: struct.Struct("<b"),
    UINT16: struct.Struct("<H"),
    INT16: struct.Struct("<h"),
    UINT32: struct.Struct("<I"),
    INT32: struct.Struct("<i"),
    FLOAT32: struct.Struct("<f"),
    BOOL: struct.Struct("<B"),  # a byte: 0 or 1, anything else refused
    UINT64: struct.Struct("<Q"),
    INT64: struct.Struct("<q"),
    FLOAT64: struct.Struct("<d"),
}
_NUMPY = {
    UINT8: "<u1",
    INT8: "<i1",
    UINT16: "<u2",
    INT16: "<i2",
    UINT32: "<u4",
    INT32: "<i4",
    FLOAT32: "<f4",
    BOOL: "<u1",
    UINT64: "<u8",
    INT64: "<i8",
    FLOAT64: "<f8",
}
TYPE_NAMES = {
    UINT8: "uint8",
    INT8: "int8",
    UINT16: "uint16",
    INT16: "int16",
    UINT32: "uint32",
    INT32: "int32",
    FLOAT32: "float32",
    BOOL: "bool",
    STRING: "string",
    ARRAY: "array",
    UINT64: "uint64",
    INT64: "int64",
    FLOAT64: "float64",
}
INTEGERS = frozenset({UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64})
FLOATS = frozenset({FLOAT32, FLOAT64})
_U32, _U64 = _SCALARS[UINT32], _SCALARS[UINT64]


@dataclass(frozen=True)
class GGMLType:
    name: str
    block: int  # elements per block
    nbytes: int  # bytes per block


# the ggml tensor types gguf (and so transformers, and the direct route) can dequantize; another type is refused
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    10: GGMLType("Q2_K", 256, 84),
    11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176),
    14: GGMLType("Q6_K", 256, 210),
    16: GGMLType("IQ2_XXS", 256, 66),
    17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98),
    19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82),
    23: GGMLType("IQ4_XS", 256, 136),
    29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66),
    39: GGMLType("MXFP4", 32, 17),
}
# ggml types that exist but that no loader here dequantizes (named in the refusal)
_OTHER_GGML_TYPES = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 40: "NVFP4"}

FIX_CONVERT = "convert the model again (llama.cpp's convert_hf_to_gguf.py) or download an intact copy"


class GGUFError(InputError, ValueError):
    """The file is not a GGUF model this tool can use: malformed, over a limit, or not what its header declares
    (exit 2 on the command line; a ValueError for the runtime's library callers). The message names the file."""


class GGUFVersionError(GGUFError):
    """A GGUF version this reader does not know (1, or a future one)."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class Unsupported(Exception):
    """A well-formed GGUF the runtime's direct route does not map exactly; transformers loads it instead."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # GGUF order: dims[0] is the contiguous one
    offset: int  # absolute, in the file
    nbytes: int
    block: int | None = None  # N of a "blk.N." name

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major (torch) shape."""
        return tuple(reversed(self.dims))

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


@dataclass
class Field:
    """One metadata entry: a scalar or string value, or an array read on demand."""

    kind: int
    value: Any = None  # a scalar's or a string's value
    item_kind: int | None = None  # an array's
    count: int = 0  # an array's length
    start: int = 0  # an array's first item, in the file

    def describe(self) -> str:
        if self.kind == ARRAY:
            return f"an array of {self.count} {TYPE_NAMES.get(self.item_kind or 0, '?')} values"
        return f"a {TYPE_NAMES[self.kind]}"


class _Cursor:
    def __init__(self, buffer: Any, size: int, path: Path) -> None:
        self.buffer, self.size, self.at, self.path = buffer, size, 0, path

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def need(self, count: int, what: str) -> None:
        if count < 0 or self.at + count > self.size:
            raise self.fail(
                f"not a complete GGUF file: {what} at byte {self.at} runs past its end ({self.size} bytes; "
                f"the file is truncated or corrupt): {FIX_CONVERT}"
            )
        if self.at + count > MAX_METADATA_BYTES:
            raise self.fail(
                f"its header runs past {MAX_METADATA_BYTES >> 20} MiB at {what} (the limit for a GGUF's metadata "
                f"and tensor table; a real model's is a few MB): the header is corrupt or hostile"
            )

    def unpack(self, fmt: struct.Struct, what: str) -> Any:
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buffer, self.at)
        self.at += fmt.size
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack(_U32, what))

    def u64(self, what: str) -> int:
        return int(self.unpack(_U64, what))

    def length(self, what: str, limit: int, limit_name: str) -> int:
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise self.fail(
                f"{what} is {n} bytes long, over the limit of {limit} for {limit_name}: the header is corrupt "
                f"or hostile"
            )
        self.need(n, what)
        return n

    def text(self, what: str, limit: int, limit_name: str) -> str:
        n = self.length(what, limit, limit_name)
        raw = bytes(self.buffer[self.at : self.at + n])
        self.at += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(
                f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start}): {FIX_CONVERT}"
            ) from None


class _Budget:
    def __init__(self) -> None:
        self.strings = 0


def _read_field(cursor: _Cursor, kind: int, key: str, budget: _Budget, depth: int = 0) -> Field:
    what = f"metadata {key!r}"
    if kind in _SCALARS:
        value = cursor.unpack(_SCALARS[kind], what)
        if kind == BOOL:
            if value not in (0, 1):
                raise cursor.fail(
                    f"{what} is a bool stored as {value} (the spec allows 0 or 1): {FIX_CONVERT}"
                )
            value = bool(value)
        return Field(kind, value=value)
    if kind == STRING:
        return Field(kind, value=cursor.text(what, MAX_STRING_BYTES, "a metadata string"))
    if kind == ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise cursor.fail(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep: the header is corrupt")
        item = cursor.u32(f"the item type of {what}")
        count = cursor.u64(f"the length of {what}")
        if count > MAX_ARRAY_ITEMS:
            raise cursor.fail(
                f"{what} is an array of {count} items, over the limit of {MAX_ARRAY_ITEMS} (the largest real "
                f"vocabularies and merge lists have a few hundred thousand): the header is corrupt or hostile"
            )
        start = cursor.at
        if item in _SCALARS:
            cursor.need(count * _SCALARS[item].size, what)
            cursor.at += count * _SCALARS[item].size
        elif item == STRING:
            budget.strings += count
            if budget.strings > MAX_STRING_ITEMS:
                raise cursor.fail(
                    f"its arrays hold more than {MAX_STRING_ITEMS} strings (at {what}): the header is corrupt "
                    f"or hostile"
                )
            cursor.need(count * 8, what)  # each string has at least its 8-byte length
            buffer, at, unpack = cursor.buffer, cursor.at, _U64.unpack_from
            end = min(cursor.size, MAX_METADATA_BYTES)
            for _ in range(count):
                if at + 8 > end:
                    cursor.at = at
                    cursor.need(8, what)
                (n,) = unpack(buffer, at)
                if n > MAX_ITEM_BYTES:
                    raise cursor.fail(
                        f"{what} holds a string of {n} bytes, over the limit of {MAX_ITEM_BYTES} for one array "
                        f"item: the header is corrupt or hostile"
                    )
                at += 8 + n
            cursor.at = at
            cursor.need(0, what)
        elif item == ARRAY:
            for _ in range(count):
                _read_field(cursor, ARRAY, key, budget, depth + 1)
        else:
            raise cursor.fail(f"{what} is an array of an unknown value type {item}: {FIX_CONVERT}")
        return Field(ARRAY, item_kind=item, count=count, start=start)
    raise cursor.fail(f"{what} has an unknown value type {kind}: {FIX_CONVERT}")


_BLOCK_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.", re.ASCII)
_PRINTABLE = re.compile(r"[!-~]+", re.ASCII)


def _tensor_block(name: str, cursor: _Cursor) -> int | None:
    """N of a "blk.N." tensor name, written as llama.cpp writes it; None for a name outside the blocks. Any other
    spelling of a number (a leading zero, a non-ASCII digit) is refused: readers that parse it leniently take
    "blk.03" and "blk.3" for one block, so one tensor would silently replace another."""
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise cursor.fail(
            f"tensor name {name[:80]!r} is longer than {MAX_NAME_BYTES} bytes (ggml's limit; llama.cpp refuses "
            f"the file): {FIX_CONVERT}"
        )
    if not _PRINTABLE.fullmatch(name):
        raise cursor.fail(
            f"tensor name {name!r} is not printable ASCII (ggml names are, e.g. 'blk.3.attn_q.weight'): a reader "
            f"may take it for another tensor: {FIX_CONVERT}"
        )
    for segment in name.split("."):
        if segment.isdigit() and segment != str(int(segment)):
            raise cursor.fail(
                f"tensor name {name!r} writes the number {segment!r} with a leading zero (ggml writes "
                f"'{int(segment)}'): a lenient reader takes it for another tensor of that number: {FIX_CONVERT}"
            )
    if name.startswith("blk."):
        match = _BLOCK_NAME.match(name)
        if match is None or match.end() == len(name):
            raise cursor.fail(
                f"tensor name {name!r} has no block number and tensor after 'blk.' (llama.cpp writes "
                f"'blk.N.<tensor>'): {FIX_CONVERT}"
            )
        return int(match.group(1))
    return None


class GGUFHeader:
    """A GGUF file's metadata (arrays read on demand) and tensor table, its bytes mapped read-only."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open_regular_file(self.path, what=str(self.path)) as handle:
            self.size = size = _file_size(handle)
            if size < 24:
                raise GGUFError(f"{self.path}: not a GGUF file: {size} bytes, shorter than a GGUF header")
            self.buffer: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse()
        except BaseException:
            self.buffer.close()
            raise

    def _parse(self) -> None:
        cursor = _Cursor(self.buffer, self.size, self.path)
        magic = bytes(self.buffer[:4])
        if magic != MAGIC:
            raise cursor.fail(f"not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
        cursor.at = 4
        self.version = cursor.u32("the version")
        if self.version not in VERSIONS:
            raise GGUFVersionError(
                f"{self.path}: GGUF version {self.version} (this reader knows versions 2 and 3): convert the "
                "model again with a current llama.cpp",
                self.version,
            )
        n_tensors, n_kv = cursor.u64("the tensor count"), cursor.u64("the metadata count")
        if n_kv * 13 > self.size or n_tensors * 24 > self.size:  # every entry takes at least that many bytes
            raise cursor.fail(
                f"the header claims {n_tensors} tensors and {n_kv} metadata entries, more than its {self.size} "
                f"bytes can hold (the file is truncated or corrupt): {FIX_CONVERT}"
            )
        if n_kv > MAX_METADATA_ENTRIES or n_tensors > MAX_TENSORS:
            raise cursor.fail(
                f"the header claims {n_tensors} tensors and {n_kv} metadata entries, over the limits of "
                f"{MAX_TENSORS} tensors and {MAX_METADATA_ENTRIES} entries (a real model has at most a few "
                f"thousand tensors and a hundred keys): the header is corrupt or hostile"
            )
        self.fields: dict[str, Field] = {}
        budget = _Budget()
        for index in range(n_kv):
            key = cursor.text(f"metadata key {index}", MAX_KEY_BYTES, "a metadata key")
            if key in self.fields:
                raise cursor.fail(f"metadata key {key!r} is listed twice: {FIX_CONVERT}")
            self.fields[key] = _read_field(cursor, cursor.u32(f"the type of {key!r}"), key, budget)
        alignment = self.fields.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT
        if alignment is not None:
            if alignment.kind not in INTEGERS:
                raise cursor.fail(
                    f"metadata 'general.alignment' is {alignment.describe()}, the GGUF spec gives a uint32: "
                    f"{FIX_CONVERT}"
                )
            self.alignment = alignment.value
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise cursor.fail(f"general.alignment {self.alignment!r} is not a power of two: {FIX_CONVERT}")
        raw: list[tuple[str, int, tuple[int, ...], int, int | None]] = []
        names: set[str] = set()
        for index in range(n_tensors):
            name = cursor.text(f"tensor name {index}", 1 << 12, "a tensor name")
            block = _tensor_block(name, cursor)
            if name in names:
                raise cursor.fail(f"tensor {name!r} is listed twice: {FIX_CONVERT}")
            names.add(name)
            n_dims = cursor.u32(f"the rank of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cursor.fail(
                    f"tensor {name!r} has {n_dims} dimensions (ggml's are 1 to {MAX_DIMS}): {FIX_CONVERT}"
                )
            dims = tuple(cursor.u64(f"the shape of {name!r}") for _ in range(n_dims))
            kind = cursor.u32(f"the type of {name!r}")
            offset = cursor.u64(f"the offset of {name!r}")
            raw.append((name, kind, dims, offset, block))
        self.tensor_table_end = cursor.at
        self.data_start = start = -(-cursor.at // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, kind, dims, offset, block in raw:
            if 0 in dims:
                raise cursor.fail(f"tensor {name!r} has an empty dimension {list(dims)}: {FIX_CONVERT}")
            info = GGML_TYPES.get(kind)
            if info is None:
                known = _OTHER_GGML_TYPES.get(kind)
                raise cursor.fail(
                    f"tensor {name!r} is of ggml type {known or kind}, "
                    + ("which gguf cannot dequantize" if known else "which ggml does not define")
                    + f" (types read: {', '.join(t.name for t in GGML_TYPES.values())}): {FIX_CONVERT}"
                )
            if dims[0] % info.block:
                raise cursor.fail(
                    f"tensor {name!r} rows of {dims[0]} do not fill its {info.name} blocks of {info.block}: "
                    f"{FIX_CONVERT}"
                )
            elements = 1
            for dim in dims:
                elements *= dim
            nbytes = elements // info.block * info.nbytes
            if offset % self.alignment:
                raise cursor.fail(
                    f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                    f"{self.alignment}: {FIX_CONVERT}"
                )
            if start + offset + nbytes > self.size:
                raise cursor.fail(
                    f"not a complete GGUF file: tensor {name!r} ends past the file's end ({self.size} bytes; the "
                    f"file is truncated): {FIX_CONVERT}"
                )
            self.tensors[name] = TensorInfo(name, kind, dims, start + offset, nbytes, block)
        previous: TensorInfo | None = None
        for tensor in sorted(self.tensors.values(), key=lambda t: (t.offset, t.nbytes)):
            if previous is not None and tensor.offset < previous.offset + previous.nbytes:
                raise cursor.fail(
                    f"tensors {previous.name!r} and {tensor.name!r} share bytes (their data overlaps at byte "
                    f"{tensor.offset}): every tensor must have data of its own; one written over another is "
                    f"a corrupt or hostile file: {FIX_CONVERT}"
                )
            previous = tensor

    # ------------------------------------------------------------------ life cycle

    def close(self) -> None:
        # a view of the mapping still alive (in an exception's traceback) keeps it open: unmapped with the last one
        with contextlib.suppress(BufferError):
            self.buffer.close()

    def __enter__(self) -> GGUFHeader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ typed metadata

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def _wrong(self, key: str, found: Field, expected: str) -> GGUFError:
        return self.fail(
            f"metadata {key!r} is {found.describe()}, the GGUF spec gives {expected}: {FIX_CONVERT}"
        )

    def kind(self, key: str) -> Field | None:
        return self.fields.get(key)

    def string(self, key: str) -> str | None:
        found = self.fields.get(key)
        if found is None:
            return None
        if found.kind != STRING:
            raise self._wrong(key, found, "a string")
        return str(found.value)

    def uint(self, key: str) -> int | None:
        """An unsigned count or id. The spec gives uint32 (uint64 for a few); any integer type is read."""
        found = self.fields.get(key)
        if found is None:
            return None
        if found.kind not in INTEGERS:
            raise self._wrong(key, found, "an unsigned integer")
        if found.value < 0:
            raise self.fail(f"metadata {key!r} is {found.value}, a negative count or id: {FIX_CONVERT}")
        return int(found.value)

    def float(self, key: str) -> float | None:
        found = self.fields.get(key)
        if found is None:
            return None
        if found.kind not in FLOATS:
            raise self._wrong(key, found, "a float32")
        return float(found.value)

    def bool(self, key: str) -> bool | None:
        found = self.fields.get(key)
        if found is None:
            return None
        if found.kind != BOOL:
            raise self._wrong(key, found, "a bool")
        return bool(found.value)

    def array(self, key: str, items: frozenset[int] | int, expected: str) -> Field | None:
        found = self.fields.get(key)
        if found is None:
            return None
        wanted = frozenset({items}) if isinstance(items, int) else items
        if found.kind != ARRAY or found.item_kind not in wanted:
            raise self._wrong(key, found, expected)
        return found

    def numbers(self, key: str, items: frozenset[int], expected: str) -> np.ndarray | None:
        """A numeric array as numpy values (a copy: a view would keep the mapping from closing)."""
        found = self.array(key, items, expected)
        if found is None:
            return None
        assert found.item_kind is not None
        raw = self.buffer[found.start : found.start + found.count * _SCALARS[found.item_kind].size]
        return np.frombuffer(raw, dtype=_NUMPY[found.item_kind]).copy()

    def strings(self, key: str) -> list[str] | None:
        """An array of strings, decoded (UTF-8 checked)."""
        found = self.array(key, STRING, "an array of strings")
        if found is None:
            return None
        buffer, at, unpack = self.buffer, found.start, _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(found.count):
                (n,) = unpack(buffer, at)
                at += 8
                append(buffer[at : at + n].decode("utf-8"))
                at += n
        except UnicodeDecodeError as exc:
            raise self.fail(
                f"metadata {key!r} item {len(out)} is not UTF-8 text ({exc.reason}): {FIX_CONVERT}"
            ) from None
        return out

    def count(self, key: str) -> int | None:
        found = self.fields.get(key)
        return found.count if found is not None and found.kind == ARRAY else None


def _file_size(handle: Any) -> int:
    return os.fstat(handle.fileno()).st_size


@contextlib.contextmanager
def open_header(path: str | Path) -> Iterator[GGUFHeader]:
    header = GGUFHeader(path)
    try:
        yield header
    finally:
        header.close()


# ---------------------------------------------------------------------------------------------- the model

# metadata keys and the GGUF type the spec gives each ("{arch}" for the architecture's own); every one present is
# checked, whichever reader uses it
UINT, FLOAT, BOOLEAN, TEXT, UINTS, TEXTS, INTS, FLOATS_ = (
    "uint",
    "float",
    "bool",
    "string",
    "uint or uint array",
    "string array",
    "int array",
    "float array",
)
KEY_TYPES: dict[str, str] = {
    "general.architecture": TEXT,
    "general.type": TEXT,
    "general.name": TEXT,
    "general.alignment": UINT,
    "general.file_type": UINT,
    "general.quantization_version": UINT,
    "{arch}.context_length": UINT,
    "{arch}.embedding_length": UINT,
    "{arch}.block_count": UINT,
    "{arch}.feed_forward_length": UINTS,
    "{arch}.vocab_size": UINT,
    "{arch}.attention.head_count": UINTS,
    "{arch}.attention.head_count_kv": UINTS,
    "{arch}.attention.key_length": UINT,
    "{arch}.attention.value_length": UINT,
    "{arch}.attention.layer_norm_epsilon": FLOAT,
    "{arch}.attention.layer_norm_rms_epsilon": FLOAT,
    "{arch}.rope.dimension_count": UINT,
    "{arch}.rope.freq_base": FLOAT,
    "{arch}.expert_count": UINT,
    "{arch}.expert_used_count": UINT,
    "tokenizer.ggml.model": TEXT,
    "tokenizer.ggml.pre": TEXT,
    "tokenizer.ggml.tokens": TEXTS,
    "tokenizer.ggml.token_type": INTS,
    "tokenizer.ggml.scores": FLOATS_,
    "tokenizer.ggml.merges": TEXTS,
    "tokenizer.ggml.bos_token_id": UINT,
    "tokenizer.ggml.eos_token_id": UINT,
    "tokenizer.ggml.unknown_token_id": UINT,
    "tokenizer.ggml.padding_token_id": UINT,
    "tokenizer.ggml.seperator_token_id": UINT,
    "tokenizer.ggml.mask_token_id": UINT,
    "tokenizer.ggml.add_bos_token": BOOLEAN,
    "tokenizer.ggml.add_eos_token": BOOLEAN,
    "tokenizer.ggml.add_space_prefix": BOOLEAN,
    "tokenizer.chat_template": TEXT,
}
SPECIAL_IDS = ("bos", "eos", "unknown", "padding", "seperator", "mask")
# llama.cpp's token types: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
TOKEN_TYPES = range(7)
DIRECT_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# how much larger than its tensors the model a generic architecture's metadata describes may be (grouped-query
# attention and tied embeddings make the estimate up to ~4x the real count)
GENERIC_SLACK = 8


@dataclass(frozen=True)
class ModelLayout:
    """A GGUF model as its checked header declares it."""

    architecture: str
    block_count: int
    hidden_size: int
    vocab_rows: int  # rows of token_embd
    vocab_size: int | None  # {arch}.vocab_size, else the vocabulary's length
    tokens: int | None  # tokenizer.ggml.tokens' length
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    ffn: int | None
    context_length: int | None
    rope_theta: float | None
    tied: bool
    special_ids: dict[str, int] = field(default_factory=dict)  # bos/eos/unknown/padding/... present
    unmapped: tuple[
        str, ...
    ] = ()  # tensors a direct architecture does not name (the direct route's business)


def _check_types(header: GGUFHeader, arch: str) -> None:
    for template, expected in KEY_TYPES.items():
        key = template.replace("{arch}", arch) if template.startswith("{arch}") else template
        if key not in header.fields:
            continue
        if expected == UINT:
            header.uint(key)
        elif expected == FLOAT:
            header.float(key)
        elif expected == BOOLEAN:
            header.bool(key)
        elif expected == TEXT:
            header.string(key)
        elif expected == UINTS:
            found = header.fields[key]
            if found.kind == ARRAY:
                values = header.numbers(key, INTEGERS, "an unsigned integer or an array of them")
                assert values is not None
                if len(values) and int(values.min()) < 0:
                    raise header.fail(f"metadata {key!r} holds a negative count: {FIX_CONVERT}")
            else:
                header.uint(key)
        elif expected == TEXTS:
            header.array(key, STRING, "an array of strings")
        elif expected == INTS:
            header.array(key, INTEGERS, "an array of int32")
        elif expected == FLOATS_:
            header.array(key, FLOATS, "an array of float32")
    for key, found in header.fields.items():  # named chat templates
        if key.startswith("tokenizer.chat_template.") and found.kind != STRING:
            raise header._wrong(key, found, "a string")


def _per_layer(header: GGUFHeader, key: str, layers: int) -> int | None:
    """A count given once or per layer (an array of block_count values, all equal here)."""
    found = header.fields.get(key)
    if found is None:
        return None
    if found.kind != ARRAY:
        return header.uint(key)
    values = header.numbers(key, INTEGERS, "an unsigned integer or an array of them")
    assert values is not None
    if len(values) != layers:
        raise header.fail(
            f"metadata {key!r} gives {len(values)} per-layer values for {layers} blocks: {FIX_CONVERT}"
        )
    distinct = sorted({int(v) for v in values})
    if len(distinct) != 1:
        raise Unsupported(f"per-layer {key} {distinct[:4]} (the layers differ)")
    return distinct[0]


def _tokenizer_counts(header: GGUFHeader) -> tuple[int | None, dict[str, int]]:
    """The vocabulary's length, its types and scores checked against it, and the special token ids it names."""
    tokens = header.count("tokenizer.ggml.tokens")
    if tokens is not None:
        if tokens == 0:
            raise header.fail(f"tokenizer.ggml.tokens is empty: {FIX_CONVERT}")
        if tokens > MAX_VOCABULARY:
            raise header.fail(
                f"tokenizer.ggml.tokens lists {tokens} tokens, over the limit of {MAX_VOCABULARY} (the largest "
                f"real vocabularies have 262,144): the header is corrupt or hostile"
            )
    types = header.numbers("tokenizer.ggml.token_type", INTEGERS, "an array of int32")
    if types is not None:
        if tokens is None or len(types) != tokens:
            raise header.fail(
                f"tokenizer.ggml.token_type has {len(types)} entries for {tokens or 0} tokens (one per token): "
                f"{FIX_CONVERT}"
            )
        if len(types) and (int(types.min()) < TOKEN_TYPES.start or int(types.max()) >= TOKEN_TYPES.stop):
            bad = int(types.min()) if int(types.min()) < 0 else int(types.max())
            raise header.fail(
                f"tokenizer.ggml.token_type holds {bad}, not a llama.cpp token type (0 to 6): {FIX_CONVERT}"
            )
    scores = header.array("tokenizer.ggml.scores", FLOATS, "an array of float32")
    if scores is not None and scores.count != tokens:
        raise header.fail(
            f"tokenizer.ggml.scores has {scores.count} entries for {tokens or 0} tokens: {FIX_CONVERT}"
        )
    merges = header.array("tokenizer.ggml.merges", STRING, "an array of strings")
    if merges is not None and tokens is None:
        raise header.fail(f"tokenizer.ggml.merges without tokenizer.ggml.tokens: {FIX_CONVERT}")
    special: dict[str, int] = {}
    for name in SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        value = header.uint(key)
        if value is None:
            continue
        if tokens is not None and value >= tokens:
            raise header.fail(
                f"{key} is {value}, outside its vocabulary of {tokens} tokens: the file names a token it does "
                f"not have: {FIX_CONVERT}"
            )
        special[name] = value
    return tokens, special


def _layer_shapes(
    arch: str, h: int, heads: int, kv: int, dk: int, dv: int, f: int
) -> dict[str, tuple[int, ...]]:
    """The torch shapes of one block's tensors for a direct architecture."""
    shapes: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (h,),
        "attn_q.weight": (heads * dk, h),
        "attn_k.weight": (kv * dk, h),
        "attn_v.weight": (kv * dv, h),
        "attn_output.weight": (h, heads * dv),
        "ffn_norm.weight": (h,),
        "ffn_gate.weight": (f, h),
        "ffn_up.weight": (f, h),
        "ffn_down.weight": (h, f),
    }
    if arch == "qwen2":
        shapes |= {"attn_q.bias": (heads * dk,), "attn_k.bias": (kv * dk,), "attn_v.bias": (kv * dv,)}
    if arch == "qwen3":
        shapes |= {"attn_q_norm.weight": (dk,), "attn_k_norm.weight": (dk,)}
    return shapes


# tensors a direct architecture may hold beyond its own (the direct route sends them to transformers); shapes
# checked where they are known
_OPTIONAL_LAYER = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


def _require(header: GGUFHeader, key: str) -> int:
    value = header.uint(key)
    if value is None:
        raise header.fail(
            f"no {key} in its metadata (every {key.split('.')[0]} GGUF states it): {FIX_CONVERT}"
        )
    if value == 0:
        raise header.fail(f"{key} is 0: {FIX_CONVERT}")
    return value


def check_model(header: GGUFHeader) -> ModelLayout:
    """The model the header declares, checked against its tensor table (no tensor data is read); GGUFError
    naming the first problem, Unsupported for a per-layer geometry this tool does not run."""
    if not header.tensors:
        kind = header.fields.get("general.type")
        adapter = kind is not None and kind.kind == STRING and kind.value == "adapter"
        raise header.fail(
            "holds no weights ("
            + ("a LoRA adapter" if adapter else "no tensors: a vocabulary-only GGUF, or an adapter")
            + "): --target takes the model itself, a GGUF with its weights"
        )
    kind_name = header.string("general.type")
    if kind_name == "adapter":
        raise header.fail(
            "is a LoRA adapter (general.type 'adapter'), not a model: --target takes the base model's GGUF "
            "(merge the adapter into it first to test the adapted model)"
        )
    arch = header.string("general.architecture")
    if not arch:
        raise header.fail(f"names no architecture (general.architecture): {FIX_CONVERT}")
    if not re.fullmatch(r"[a-z0-9_\-.]{1,64}", arch, re.ASCII):
        raise header.fail(f"general.architecture {arch[:80]!r} is not an architecture name: {FIX_CONVERT}")
    _check_types(header, arch)
    p = f"{arch}."
    layers = _require(header, p + "block_count")
    hidden = _require(header, p + "embedding_length")
    tokens, special = _tokenizer_counts(header)

    # blocks: 0..layers-1 each has tensors, none beyond
    present = {t.block for t in header.tensors.values() if t.block is not None}
    beyond = sorted(b for b in present if b >= layers)
    if beyond:
        raise header.fail(
            f"has tensors for blocks {shorten((str(b) for b in beyond), 3, quote='')} but {p}block_count is "
            f"{layers}: the header does not describe its weights: {FIX_CONVERT}"
        )
    if len(present) != layers:
        absent = layers - len(present)
        missing = [f"blk.{b}" for b in range(layers) if b not in present][:3]
        raise header.fail(
            f"{p}block_count is {layers}, but the file holds tensors for {len(present)} blocks (none for "
            + ", ".join(missing)
            + (f" and {absent - len(missing)} more" if absent > len(missing) else "")
            + f"): the header does not describe its weights: {FIX_CONVERT}"
        )

    embedding = header.tensors.get("token_embd.weight")
    if embedding is None:
        raise header.fail(
            f"has no token_embd.weight (the input embedding every {arch} model has): {FIX_CONVERT}"
        )
    if len(embedding.dims) != 2 or embedding.shape[1] != hidden:
        raise header.fail(
            f"token_embd.weight has shape {list(embedding.shape)}, but {p}embedding_length is {hidden} (it must "
            f"be [vocabulary, {hidden}]): {FIX_CONVERT}"
        )
    rows = embedding.shape[0]
    vocab_size = header.uint(p + "vocab_size")
    for what, value in ((f"{p}vocab_size", vocab_size), ("tokenizer.ggml.tokens' length", tokens)):
        if value is not None and value != rows:
            raise header.fail(
                f"{what} is {value}, but token_embd.weight has {rows} rows (one per token): {FIX_CONVERT}"
            )
    heads = _per_layer(header, p + "attention.head_count", layers)
    kv_heads = _per_layer(header, p + "attention.head_count_kv", layers)
    ffn = _per_layer(header, p + "feed_forward_length", layers)
    layout = dict(
        architecture=arch,
        block_count=layers,
        hidden_size=hidden,
        vocab_rows=rows,
        vocab_size=vocab_size if vocab_size is not None else tokens,
        tokens=tokens,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        context_length=header.uint(p + "context_length"),
        rope_theta=header.float(p + "rope.freq_base"),
        tied="output.weight" not in header.tensors,
        special_ids=special,
    )
    if arch in DIRECT_ARCHITECTURES:
        head_dim, unmapped = _check_direct(header, arch, layers, hidden, heads, kv_heads, ffn, rows)
        return ModelLayout(head_dim=head_dim, unmapped=unmapped, **layout)  # type: ignore[arg-type]
    _check_generic(header, arch, layers, hidden, heads, ffn, rows)
    return ModelLayout(head_dim=None, **layout)  # type: ignore[arg-type]


def _check_direct(
    header: GGUFHeader,
    arch: str,
    layers: int,
    hidden: int,
    heads: int | None,
    kv_heads: int | None,
    ffn: int | None,
    rows: int,
) -> tuple[int, tuple[str, ...]]:
    p = f"{arch}."
    if not heads:
        raise header.fail(
            f"no {p}attention.head_count in its metadata (every {arch} GGUF states it): {FIX_CONVERT}"
        )
    if not ffn:
        raise header.fail(
            f"no {p}feed_forward_length in its metadata (every {arch} GGUF states it): {FIX_CONVERT}"
        )
    kv = kv_heads or heads
    if heads % kv:
        raise header.fail(
            f"{p}attention.head_count {heads} is not a multiple of {p}attention.head_count_kv {kv}: {FIX_CONVERT}"
        )
    dk = header.uint(p + "attention.key_length")
    if dk is None:
        if hidden % heads:
            raise header.fail(
                f"{p}embedding_length {hidden} does not split into {heads} heads, and no "
                f"{p}attention.key_length gives the head width: {FIX_CONVERT}"
            )
        dk = hidden // heads
    dv = header.uint(p + "attention.value_length")
    dv = dk if dv is None else dv
    if not dk or not dv:
        raise header.fail(f"{p}attention.key_length / value_length is 0: {FIX_CONVERT}")
    expected: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (rows, hidden),
        "output_norm.weight": (hidden,),
    }
    if "output.weight" in header.tensors:
        expected["output.weight"] = (rows, hidden)
    per_layer = _layer_shapes(arch, hidden, heads, kv, dk, dv, ffn)
    for i in range(layers):
        expected |= {f"blk.{i}.{suffix}": shape for suffix, shape in per_layer.items()}
    missing = [name for name in expected if name not in header.tensors]
    if missing:
        raise header.fail(
            f"lacks {len(missing)} of the tensors a {arch} of {layers} blocks has: "
            f"{shorten(missing, 4, quote='')}: the header does not describe its weights: {FIX_CONVERT}"
        )
    optional = {
        f"blk.{i}.{suffix}": shape
        for i in range(layers)
        for suffix, shape in (
            ("attn_q.bias", (heads * dk,)),
            ("attn_k.bias", (kv * dk,)),
            ("attn_v.bias", (kv * dv,)),
            ("attn_output.bias", (hidden,)),
        )
    }
    unmapped = []
    for name, info in header.tensors.items():
        shape = expected.get(name) or optional.get(name)
        if shape is None:
            unmapped.append(name)
            continue
        if info.shape != shape:
            raise header.fail(
                f"tensor {name!r} has shape {list(info.shape)}, but its metadata makes it {list(shape)} ({p}"
                f"embedding_length {hidden}, heads {heads}/{kv} of width {dk}, feed_forward_length {ffn}, "
                f"{rows} tokens): the header does not describe its weights: {FIX_CONVERT}"
            )
        if name not in expected:
            unmapped.append(name)
    return dk, tuple(unmapped)


def _check_generic(
    header: GGUFHeader, arch: str, layers: int, hidden: int, heads: int | None, ffn: int | None, rows: int
) -> None:
    """An architecture whose tensors this tool does not list (transformers loads it): the model its metadata
    describes must be of the size its tensors are, so a header cannot make a loader build a model of billions of
    parameters from a file of megabytes."""
    ffn = ffn or 4 * hidden
    described = 2 * rows * hidden + layers * (4 * hidden * hidden + 3 * hidden * ffn)
    held = sum(t.elements for t in header.tensors.values())
    if described > GENERIC_SLACK * held + (1 << 20):
        raise header.fail(
            f"its metadata describes a {arch} of about {described:,} parameters ({layers} blocks, "
            f"embedding_length {hidden}, feed_forward_length {ffn}, {rows} tokens), but its tensors hold "
            f"{held:,}: the header does not describe its weights: {FIX_CONVERT}"
        )
    del heads


def read_model(path: str | Path) -> ModelLayout:
    """check_model of the file at `path` (GGUFError naming it; an architecture whose per-layer geometry differs
    from layer to layer is a GGUFError too, since nothing here runs it)."""
    with open_header(path) as header:
        try:
            return check_model(header)
        except Unsupported as why:
            raise header.fail(f"{why}: lilicorr-ckpt runs models whose layers share one geometry") from None
