"""A GGUF target read directly: one pass over the file's header for its metadata and tensor table, the
transformers config, weights and fast tokenizer built from them, no `gguf.GGUFReader` and no transformers GGUF
conversion.

transformers' own GGUF route costs seconds a load on a 135M model (bench/load.py): `gguf.GGUFReader` turns every
metadata element into a numpy view (3.7 million of them for a 49,152-token vocabulary and its merges), transformers
re-reads every field to Python for the config, the weights and the tokenizer, and dequantizes with numpy. Here
the metadata is read once with `struct`, the common block formats (Q4_0, Q4_1, Q8_0) are dequantized with torch
(the same float32 arithmetic as gguf's numpy code: the weights are bit for bit those of a transformers load,
which the tests check), and other formats go to `gguf.quants.dequantize`.

The direct route covers what the fast target path runs: Llama, Qwen2 and Qwen3 with a byte-level BPE vocabulary
(`tokenizer.ggml.model` "gpt2") whose pre-tokenizer is GPT-2's own or Qwen2's (`tokenizer.ggml.pre` "qwen2", which
splits every digit apart). Anything else it does not know how to map exactly (rope scaling, a `rope_freqs`
tensor, another pre-tokenizer, a tokenizer that adds BOS or EOS, an unknown metadata key of the architecture or
tensor name) raises `Unsupported` with the reason, and the caller loads the file through transformers instead. A file that is not a well-formed GGUF raises `GGUFError` (a ValueError)
naming the file and what is wrong with it."""

from __future__ import annotations

import mmap
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8

# metadata value types (GGUF v2/v3): struct format and size for the fixed-width ones
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
_STRING, _ARRAY = 8, 9

# ggml tensor types read here: (elements per block, bytes per block)
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30
_BLOCKS: dict[int, tuple[int, int]] = {
    F32: (1, 4),
    F16: (1, 2),
    BF16: (1, 2),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q8_0: (32, 34),
}

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# the architecture's metadata keys this route maps (to a config field, or known to need nothing); another key of
# the architecture (rope scaling, sliding windows, experts, ...) sends the file to transformers
_ARCH_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "rope.dimension_count": None,  # checked below: the whole head must rotate
    "attention.key_length": None,  # checked below: the head width
    "attention.value_length": None,
}
# GGUF tensor names (per layer after "blk.N.") to the transformers names of these architectures
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# llama.cpp's names for a pre-tokenizer that is GPT-2's own byte-level split
_GPT2_PRE_TOKENIZERS = ("gpt2", "gpt-2", "default", "smollm")
# pre-tokenizers that split text by a regular expression of their own before the byte-level mapping (the one their
# merges were learned on): Qwen2's splits every digit apart, where GPT-2's keeps runs of digits together
_SPLIT_PRE_TOKENIZERS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
}
_CONTROL, _USER_DEFINED = 3, 4


class GGUFError(ValueError):
    """The file is not a well-formed GGUF (truncated, a bad magic, a size or offset out of bounds)."""


class Unsupported(Exception):
    """The file is a GGUF this route does not map exactly; transformers loads it instead."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]  # GGUF order: dims[0] is the contiguous one
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major (torch) shape."""
        return tuple(reversed(self.dims))


class _Cursor:
    def __init__(self, buffer: Any, path: Path) -> None:
        self.buffer, self.size, self.at, self.path = buffer, len(buffer), 0, path

    def need(self, count: int, what: str) -> None:
        if count < 0 or self.at + count > self.size:
            raise GGUFError(
                f"{self.path}: not a complete GGUF file: {what} at byte {self.at} runs past its end "
                f"({self.size} bytes; the file is truncated or corrupt)"
            )

    def scalar(self, kind: int, what: str) -> Any:
        fmt, size = _SCALARS[kind]
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += size
        return value

    def string(self, what: str) -> str:
        length = self.scalar(10, what)
        self.need(length, what)
        raw = bytes(self.buffer[self.at : self.at + length])
        self.at += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{self.path}: {what} is not UTF-8 text ({exc.reason})") from None

    def value(self, kind: int, what: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY:
            item_kind, count = self.scalar(4, what), self.scalar(10, what)
            if item_kind in _SCALARS:
                fmt, size = _SCALARS[item_kind]
                self.need(count * size, what)
                values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buffer, self.at))
                self.at += count * size
                return values
            if item_kind == _STRING:
                self.need(count * 8, what)  # each string has at least its 8-byte length
                return [self.string(what) for _ in range(count)]
            if item_kind == _ARRAY:
                self.need(count * 12, what)
                return [self.value(_ARRAY, what) for _ in range(count)]
        raise GGUFError(f"{self.path}: {what} has an unknown value type {kind}")


class GGUFFile:
    """A GGUF file's metadata (Python values) and tensor table, its data mapped read-only."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            size = self.path.stat().st_size
            if size < 24:
                raise GGUFError(f"{self.path}: not a GGUF file: {size} bytes, shorter than a GGUF header")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse()
        except BaseException:
            self._map.close()
            raise

    def _parse(self) -> None:
        cursor = _Cursor(self._map, self.path)
        magic = bytes(self._map[:4])
        if magic != MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
        cursor.at = 4
        self.version = cursor.scalar(4, "the version")
        if self.version not in (2, 3):
            raise Unsupported(f"GGUF version {self.version} (this reader knows versions 2 and 3)")
        n_tensors, n_kv = cursor.scalar(10, "the tensor count"), cursor.scalar(10, "the metadata count")
        # every entry takes some bytes: a count beyond that is a corrupt header, not a loop of billions
        if n_kv * 13 > cursor.size or n_tensors * 24 > cursor.size:
            raise GGUFError(
                f"{self.path}: the header claims {n_tensors} tensors and {n_kv} metadata entries, more than "
                f"its {cursor.size} bytes can hold (the file is truncated or corrupt)"
            )
        self.metadata: dict[str, Any] = {}
        for index in range(n_kv):
            key = cursor.string(f"metadata key {index}")
            self.metadata[key] = cursor.value(cursor.scalar(4, f"the type of {key!r}"), f"metadata {key!r}")
        raw: list[tuple[str, int, tuple[int, ...], int]] = []
        for index in range(n_tensors):
            name = cursor.string(f"tensor name {index}")
            n_dims = cursor.scalar(4, f"the rank of {name!r}")
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(cursor.scalar(10, f"the shape of {name!r}") for _ in range(n_dims))
            kind, offset = (
                cursor.scalar(4, f"the type of {name!r}"),
                cursor.scalar(10, f"the offset of {name!r}"),
            )
            raw.append((name, kind, dims, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        start = -(-cursor.at // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, kind, dims, offset in raw:
            elements = 1
            for dim in dims:
                elements *= dim
            block = _BLOCKS.get(kind)
            if block is None:
                nbytes = -1  # read through gguf.quants, which knows its size
            else:
                if dims and dims[0] % block[0]:
                    raise GGUFError(f"{self.path}: tensor {name!r} rows of {dims[0]} do not fill its blocks")
                nbytes = elements // block[0] * block[1]
                if start + offset + nbytes > cursor.size:
                    raise GGUFError(
                        f"{self.path}: not a complete GGUF file: tensor {name!r} ends past the file's end "
                        f"({cursor.size} bytes; the file is truncated)"
                    )
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} is listed twice")
            self.tensors[name] = TensorInfo(name, kind, dims, start + offset, nbytes)

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor dequantized to float32, in its row-major shape (a new tensor, not a view of the file)."""
        info = self.tensors[name]
        if info.ggml_type not in _BLOCKS:
            return self._through_gguf(info)
        with (
            warnings.catch_warnings()
        ):  # read-only memory: every path below copies before anything could write
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(self._map, dtype=torch.uint8, count=info.nbytes, offset=info.offset)
        shape = info.shape
        if info.ggml_type == F32:
            return raw.view(torch.float32).reshape(shape).clone()
        if info.ggml_type == F16:
            return raw.view(torch.float16).reshape(shape).float()
        if info.ggml_type == BF16:
            return raw.view(torch.bfloat16).reshape(shape).float()
        per_block, block_bytes = _BLOCKS[info.ggml_type]
        blocks = raw.reshape(-1, block_bytes)
        scale = blocks[:, :2].contiguous().view(torch.float16).float()
        if info.ggml_type == Q8_0:
            values = blocks[:, 2:].contiguous().view(torch.int8).float() * scale
        else:
            packed = blocks[:, 4:] if info.ggml_type == Q4_1 else blocks[:, 2:]
            # the low nibbles are the block's first 16 values, the high nibbles its last 16
            nibbles = torch.cat([packed & 0x0F, packed >> 4], dim=1)
            if info.ggml_type == Q4_0:
                values = (nibbles.to(torch.int8) - 8).float() * scale
            else:
                low = blocks[:, 2:4].contiguous().view(torch.float16).float()
                values = scale * nibbles.float() + low
        return values.reshape(shape)

    def _through_gguf(self, info: TensorInfo) -> torch.Tensor:
        try:
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
        except ImportError:  # pragma: no cover - gguf is a runtime dependency
            raise Unsupported(
                f"tensor {info.name!r} is of ggml type {info.ggml_type} and gguf is missing"
            ) from None
        try:
            kind = GGMLQuantizationType(info.ggml_type)
            per_block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise GGUFError(
                f"{self.path}: tensor {info.name!r} has an unknown ggml type {info.ggml_type}"
            ) from None
        elements = 1
        for dim in info.dims:
            elements *= dim
        nbytes = elements // per_block * block_bytes
        if info.dims and info.dims[0] % per_block or info.offset + nbytes > len(self._map):
            raise GGUFError(f"{self.path}: tensor {info.name!r} does not fit the file")
        row_bytes = info.dims[0] // per_block * block_bytes if info.dims else block_bytes
        data = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=info.offset)
        try:
            values = quants.dequantize(data.reshape(-1, row_bytes), kind)
        except NotImplementedError:
            raise Unsupported(
                f"tensor {info.name!r} is of ggml type {kind.name}, which gguf cannot dequantize"
            ) from None
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(info.shape)


def _llama_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a Llama q or k projection's rows: it stores each head's rotary pairs
    interleaved (row 2i, 2i + 1) where transformers keeps them as halves (row i, i + d / 2)."""
    rows = weight.shape[0]
    if heads <= 0 or rows % (2 * heads):
        raise Unsupported(f"a q/k projection of {rows} rows cannot split into {heads} heads of rotary pairs")
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
    )


def config_dict(file: GGUFFile) -> dict[str, Any]:
    """The transformers config dict of a Llama / Qwen2 / Qwen3 GGUF, or Unsupported."""
    meta = file.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise Unsupported(f"architecture {arch!r} (the direct route maps {', '.join(ARCHITECTURES)})")
    config: dict[str, Any] = {"model_type": arch}
    prefix = f"{arch}."
    for key, value in meta.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if name not in _ARCH_KEYS:
            raise Unsupported(f"metadata key {key!r}")
        if _ARCH_KEYS[name] is not None:
            config[_ARCH_KEYS[name]] = value
    missing = [
        k for k in ("block_count", "embedding_length", "attention.head_count") if prefix + k not in meta
    ]
    if missing:
        raise Unsupported(f"no {', '.join(prefix + k for k in missing)}")
    if "general.name" in meta:
        config["_model_name_or_path"] = meta["general.name"]
    heads = config["num_attention_heads"]
    if not isinstance(heads, int) or heads <= 0:
        raise Unsupported(f"{prefix}attention.head_count {heads!r}")
    hidden = config.get("hidden_size")
    if not isinstance(hidden, int) or hidden <= 0:
        raise Unsupported(f"{prefix}embedding_length {hidden!r}")
    head_dim = meta.get(prefix + "attention.key_length", hidden // heads)
    for key in ("rope.dimension_count", "attention.value_length"):
        if meta.get(prefix + key, head_dim) != head_dim:  # a partial rotation, or values of another width
            raise Unsupported(f"{prefix}{key} {meta[prefix + key]} differs from the head width {head_dim}")
    if arch == "qwen2":
        if head_dim != hidden // heads:  # Qwen2's config has no head width of its own
            raise Unsupported(f"a Qwen2 head width {head_dim} other than hidden_size / heads")
    else:
        config["head_dim"] = head_dim
    if "vocab_size" not in config:
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise Unsupported("no vocabulary size")
        config["vocab_size"] = len(tokens)
    config["tie_word_embeddings"] = "output.weight" not in file.tensors
    for gguf_key, field in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("unknown_token_id", "unk_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        if f"tokenizer.ggml.{gguf_key}" in meta:
            config[field] = meta[f"tokenizer.ggml.{gguf_key}"]
    return config


def hf_name(name: str) -> str:
    """The transformers parameter a GGUF tensor name loads, or Unsupported."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{int(parts[1])}.{_LAYER_TENSORS[parts[2]]}"
    raise Unsupported(f"tensor {name!r}")


def state_dict(file: GGUFFile, config: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the file under its transformers name, dequantized and cast to `dtype`."""
    names = {name: hf_name(name) for name in file.tensors}
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    state: dict[str, torch.Tensor] = {}
    for name, target in names.items():
        weight = file.tensor(name)
        if config["model_type"] == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            weight = _llama_rows(weight, heads if ".attn_q." in name else kv_heads)
        state[target] = weight.to(dtype)
    return state


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the other bytes take
    code points from 256 up, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def tokenizer(file: GGUFFile) -> Any:
    """The GGUF's byte-level BPE tokenizer as a transformers fast tokenizer, or Unsupported."""
    meta = file.metadata
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise Unsupported(
            f"tokenizer model {meta.get('tokenizer.ggml.model')!r} (the direct route builds gpt2)"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _GPT2_PRE_TOKENIZERS and pre not in _SPLIT_PRE_TOKENIZERS:
        raise Unsupported(f"pre-tokenizer {pre!r}")
    for flag in (
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.add_space_prefix",
    ):
        if meta.get(flag):
            raise Unsupported(f"{flag} is set")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [0] * len(tokens or ())
    if not isinstance(tokens, list) or not isinstance(merges, list) or not tokens:
        raise Unsupported("no vocabulary and merges")
    if not isinstance(types, list) or len(types) != len(tokens):
        raise Unsupported("token types that do not match the vocabulary")
    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if not set(token) <= spelled:  # a token written as text, not in the byte alphabet: spell its bytes
            token = "".join(alphabet[byte] for byte in token.encode("utf-8"))
        vocab.setdefault(token, index)
    if len(vocab) != len(tokens):
        raise Unsupported("a vocabulary that lists a token twice")
    pairs = [tuple(merge.split(" ")) for merge in merges]
    if any(len(pair) != 2 for pair in pairs):
        raise Unsupported("a merge that is not two tokens")
    backend = Tokenizer(
        BPE(
            vocab=vocab,
            merges=pairs,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    if pre in _SPLIT_PRE_TOKENIZERS:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE_TOKENIZERS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>) are special and matched whole; user-defined ones are matched whole, not
    # special; a "control" token outside the byte alphabet is a mislabel llama.cpp writes, left alone
    control = [t for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL and set(t) <= spelled]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED and t in vocab]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token_at(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    specials = {
        "bos_token": token_at("bos_token_id"),
        "eos_token": token_at("eos_token_id"),
        "unk_token": token_at("unknown_token_id"),
        "pad_token": token_at("padding_token_id"),
    }
    kwargs: dict[str, Any] = {k: v for k, v in specials.items() if v is not None}
    if isinstance(meta.get("tokenizer.chat_template"), str):
        kwargs["chat_template"] = meta["tokenizer.chat_template"]
    return PreTrainedTokenizerFast(tokenizer_object=backend, name_or_path=str(file.path.parent), **kwargs)


def read_target(
    path: str | Path, dtype: torch.dtype, *, with_tokenizer: bool = True
) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """(config dict, state dict in `dtype`, tokenizer or None) of a GGUF target; Unsupported or GGUFError.
    Everything is checked as mappable before any weight is dequantized."""
    with GGUFFile(path) as file:
        config = config_dict(file)
        for name in file.tensors:
            hf_name(name)
        tok = tokenizer(file) if with_tokenizer else None
        state = state_dict(file, config, dtype)
    return config, state, tok
