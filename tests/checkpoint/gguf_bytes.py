"""GGUF files written byte by byte for the hostile-input tests (no gguf package: these tests are torch- and
gguf-free): a small valid Llama / Qwen2 / Qwen3 with a byte-level BPE tokenizer, and every knob a hostile file
turns (typed metadata of any GGUF type, tensor names, shapes, types and offsets of one's choosing, aliasing).

tests/runtime loads this module by path (runtime_helpers-style), so it imports nothing from the test folders."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q"}
_FMT |= {I64: "<q", F64: "<d"}
# ggml tensor types
T_F32, T_F16, T_Q8_0, T_Q8_1 = 0, 1, 8, 9
_TYPE_BYTES = {T_F32: (1, 4), T_F16: (1, 2), T_Q8_0: (32, 34), T_Q8_1: (32, 40)}


def string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(kind: int, data: Any, item: int | None = None) -> bytes:
    """A metadata value of GGUF type `kind` (an array: `item` is the item type, `data` the items)."""
    if kind == STR:
        return string(data)
    if kind == ARR:
        assert item is not None
        body = b"".join(value(item, x) for x in data) if item in (STR, ARR) else b""
        if item not in (STR, ARR):
            body = np.asarray(data, dtype=np.dtype(_FMT[item])).tobytes()
        return struct.pack("<IQ", item, len(data)) + body
    return struct.pack(_FMT[kind], data)


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # torch (row-major) order
    kind: int = T_F32
    data: bytes | None = None  # None: random values of the shape
    offset: int | str | None = None  # None: the next aligned offset; a tensor's name: that tensor's offset

    def nbytes(self) -> int:
        per, size = _TYPE_BYTES[self.kind]
        n = 1
        for d in self.shape:
            n *= d
        return n // per * size


@dataclass
class GGUF:
    metadata: list[tuple[str, int, Any, int | None]] = field(default_factory=list)  # (key, type, value, item)
    tensors: list[Tensor] = field(default_factory=list)
    alignment: int = 32
    version: int = 3

    def set(self, key: str, kind: int, data: Any, item: int | None = None) -> GGUF:
        self.metadata = [m for m in self.metadata if m[0] != key] + [(key, kind, data, item)]
        return self

    def drop(self, key: str) -> GGUF:
        self.metadata = [m for m in self.metadata if m[0] != key]
        return self

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def to_bytes(self, seed: int = 0) -> bytes:
        rng = np.random.default_rng(seed)
        head = b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.metadata))
        head += b"".join(
            string(k) + struct.pack("<I", kind) + value(kind, v, item) for k, kind, v, item in self.metadata
        )
        data: list[tuple[int, bytes]] = []
        offsets: list[int] = []
        placed: dict[str, int] = {}
        at = 0
        for t in self.tensors:
            payload = t.data
            if payload is None and t.offset is None:
                if t.kind == T_F32:
                    payload = (rng.standard_normal(t.shape) * 0.3).astype("<f4").tobytes()
                elif t.kind == T_F16:
                    payload = (rng.standard_normal(t.shape) * 0.3).astype("<f2").tobytes()
                else:
                    payload = bytes(t.nbytes())
            offset = at if t.offset is None else placed[t.offset] if isinstance(t.offset, str) else t.offset
            offsets.append(offset)
            placed[t.name] = offset
            if t.offset is None:
                assert payload is not None
                data.append((offset, payload))
                at = -(-(offset + len(payload)) // self.alignment) * self.alignment
        table = b""
        for t, offset in zip(self.tensors, offsets, strict=True):
            dims = tuple(reversed(t.shape))
            table += string(t.name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            table += struct.pack("<IQ", t.kind, offset)
        header = head + table
        start = -(-len(header) // self.alignment) * self.alignment
        blob = bytearray(header + bytes(start - len(header)))
        for offset, payload in data:
            end = start + offset
            if len(blob) < end:
                blob += bytes(end - len(blob))
            blob[end : end + len(payload)] = payload
        return bytes(blob)

    def write(self, path: Path, seed: int = 0) -> Path:
        path.write_bytes(self.to_bytes(seed))
        return path


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = [], 0
    for byte in range(256):
        if byte in kept:
            out.append(chr(byte))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


MERGES = ["h e", "l l", "he ll", "o Ġ", "Ġ w"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_model(
    *,
    arch: str = "llama",
    layers: int = 2,
    hidden: int = 16,
    heads: int = 2,
    kv_heads: int = 1,
    ffn: int = 32,
    vocab: int | None = None,
    tied: bool = False,
    weights: bool = True,
    chat_template: str | None = CHAT_TEMPLATE,
) -> GGUF:
    """A small, valid model as llama.cpp writes one: its config, a byte-level BPE tokenizer (256 bytes, a few
    merges, ChatML's specials, padded with unused tokens to `vocab`) and its F32 weights (`weights=False`: none,
    a vocabulary-only file)."""
    tokens = [*byte_alphabet(), *(m.replace(" ", "") for m in MERGES), *SPECIALS]
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    if vocab is not None:
        assert vocab >= len(tokens)
        pad = vocab - len(tokens)
        tokens += [f"[PAD{i}]" for i in range(pad)]
        types += [5] * pad
    n, head_dim = len(tokens), hidden // heads
    g = GGUF()
    g.set("general.architecture", STR, arch).set("general.name", STR, "tiny")
    g.set(f"{arch}.block_count", U32, layers).set(f"{arch}.context_length", U32, 256)
    g.set(f"{arch}.embedding_length", U32, hidden).set(f"{arch}.feed_forward_length", U32, ffn)
    g.set(f"{arch}.attention.head_count", U32, heads).set(f"{arch}.attention.head_count_kv", U32, kv_heads)
    g.set(f"{arch}.rope.freq_base", F32, 10000.0).set(f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5)
    g.set(f"{arch}.vocab_size", U32, n).set(f"{arch}.rope.dimension_count", U32, head_dim)
    g.set("tokenizer.ggml.model", STR, "gpt2").set("tokenizer.ggml.pre", STR, "smollm")
    g.set("tokenizer.ggml.tokens", ARR, tokens, STR).set("tokenizer.ggml.token_type", ARR, types, I32)
    g.set("tokenizer.ggml.merges", ARR, MERGES, STR)
    g.set("tokenizer.ggml.bos_token_id", U32, len(byte_alphabet()) + len(MERGES) + 1)
    g.set("tokenizer.ggml.eos_token_id", U32, len(byte_alphabet()) + len(MERGES) + 2)
    g.set("tokenizer.ggml.add_bos_token", BOOL, False)
    if chat_template is not None:
        g.set("tokenizer.chat_template", STR, chat_template)
    if not weights:
        return g
    g.tensors.append(Tensor("token_embd.weight", (n, hidden)))
    for i in range(layers):
        g.tensors += [
            Tensor(f"blk.{i}.attn_norm.weight", (hidden,)),
            Tensor(f"blk.{i}.attn_q.weight", (heads * head_dim, hidden)),
            Tensor(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden)),
            Tensor(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden)),
            Tensor(f"blk.{i}.attn_output.weight", (hidden, heads * head_dim)),
            Tensor(f"blk.{i}.ffn_norm.weight", (hidden,)),
            Tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden)),
            Tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden)),
            Tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn)),
        ]
        if arch == "qwen2":
            g.tensors += [
                Tensor(f"blk.{i}.attn_q.bias", (heads * head_dim,)),
                Tensor(f"blk.{i}.attn_k.bias", (kv_heads * head_dim,)),
                Tensor(f"blk.{i}.attn_v.bias", (kv_heads * head_dim,)),
            ]
        if arch == "qwen3":
            g.tensors += [
                Tensor(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
                Tensor(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
            ]
    g.tensors.append(Tensor("output_norm.weight", (hidden,)))
    if not tied:
        g.tensors.append(Tensor("output.weight", (n, hidden)))
    return g
