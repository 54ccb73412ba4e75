"""A GGUF target read directly: one pass over the file's header for its metadata and tensor table, the
transformers config, weights and fast tokenizer built from them, no `gguf.GGUFReader` and no transformers GGUF
conversion.

transformers' own GGUF route costs seconds a load on a 135M model (bench/load.py): `gguf.GGUFReader` turns every
metadata element into a numpy view (3.7 million of them for a 49,152-token vocabulary and its merges), transformers
re-reads every field to Python for the config, the weights and the tokenizer, and dequantizes with numpy. Here
the header is read once with `struct` (lilicorr_ckpt.checkpoint.gguf_header, torch-free and shared with validate
and smoke's pre-load check: every count and length within a limit, arrays read only when asked for) and checked
against the model it declares before any tensor is read (check_model: typed metadata, every expected tensor
present once in its shape, data inside the file and not shared); the common block formats (Q4_0, Q4_1, Q8_0) are
then dequantized with torch (the same float32 arithmetic as gguf's numpy code: the weights are bit for bit those
of a transformers load, which the tests check), and other formats go to `gguf.quants.dequantize`.

The direct route covers what the fast target path runs: Llama, Qwen2 and Qwen3 with a byte-level BPE vocabulary
(`tokenizer.ggml.model` "gpt2") whose pre-tokenizer is GPT-2's own or Qwen2's (`tokenizer.ggml.pre` "qwen2", which
splits every digit apart); the tokenizer is lilicorr_ckpt.checkpoint.gguf_tokenizer's (torch-free: smoke --engine
builds it too), its chat template rendered within bounds. Anything else it does not know how to map exactly (rope
scaling, a `rope_freqs` tensor, another pre-tokenizer, a tokenizer that adds BOS or EOS, an unknown metadata key of
the architecture or tensor name, per-layer geometry, attention biases on a Llama) raises `Unsupported` with the
reason, and the caller loads the file through transformers instead. A file that is not a well-formed GGUF, or not
the model its header declares, raises `GGUFError` (an InputError and a ValueError) naming the file and what is
wrong with it."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lilicorr_ckpt.checkpoint.gguf_bpe import byte_alphabet
from lilicorr_ckpt.checkpoint.gguf_header import (
    ARRAY,
    STRING,
    GGUFError,
    GGUFHeader,
    GGUFVersionError,
    ModelLayout,
    TensorInfo,
    Unsupported,
    check_model,
)

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "Unsupported", "config_dict", "read_target", "tokenizer"]

# ggml tensor types dequantized here in torch; the others gguf_header accepts go through gguf.quants
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
_FLOAT_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base")
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
# a layer tensor's name as llama.cpp writes it: the block number in ASCII digits, without a leading zero
_LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)", re.ASCII)
_byte_alphabet = byte_alphabet  # the tests' name for it


class _Metadata(Mapping[str, Any]):
    """The header's metadata as Python values, each decoded when it is looked up (arrays as lists)."""

    def __init__(self, header: GGUFHeader) -> None:
        self._header = header

    def __getitem__(self, key: str) -> Any:
        found = self._header.fields[key]
        if found.kind != ARRAY:
            return found.value
        if found.item_kind == STRING:
            return self._header.strings(key)
        if found.item_kind == ARRAY:
            raise KeyError(f"{key} is an array of arrays")
        assert found.item_kind is not None
        values = self._header.numbers(key, frozenset({found.item_kind}), "an array")
        assert values is not None  # the array was found above
        return values.tolist()

    def __iter__(self) -> Iterator[str]:
        return iter(self._header.fields)

    def __len__(self) -> int:
        return len(self._header.fields)


class GGUFFile:
    """A GGUF file's checked header (lilicorr_ckpt.checkpoint.gguf_header: limits, tensor names and data ranges)
    and its tensors, dequantized on demand from the read-only mapping."""

    def __init__(self, path: str | Path) -> None:
        try:
            self.header = GGUFHeader(path)
        except GGUFVersionError as exc:
            raise Unsupported(f"GGUF version {exc.version} (this reader knows versions 2 and 3)") from None
        self.path = self.header.path
        self.tensors: dict[str, TensorInfo] = self.header.tensors
        self._map = self.header.buffer

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _Metadata(self.header)

    def close(self) -> None:
        self.header.close()

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
        """A block format dequantized by gguf itself (the header has checked its size and range)."""
        try:
            from gguf import GGMLQuantizationType, quants
        except ImportError:  # pragma: no cover - gguf is a runtime dependency
            raise Unsupported(
                f"tensor {info.name!r} is of ggml type {info.type_name} and gguf is missing"
            ) from None
        kind = GGMLQuantizationType(info.ggml_type)
        row_bytes = info.nbytes // (info.elements // info.dims[0])
        data = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
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


def config_dict(file: GGUFFile, layout: ModelLayout) -> dict[str, Any]:
    """The transformers config dict of a Llama / Qwen2 / Qwen3 GGUF whose header check_model has checked, or
    Unsupported. Every value is the typed one the header read (an integer key holding a string, say, has already
    been refused)."""
    header, arch = file.header, layout.architecture
    if arch not in ARCHITECTURES:
        raise Unsupported(f"architecture {arch!r} (the direct route maps {', '.join(ARCHITECTURES)})")
    config: dict[str, Any] = {"model_type": arch}
    prefix = f"{arch}."
    for key, found in header.fields.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if name not in _ARCH_KEYS:
            raise Unsupported(f"metadata key {key!r}")
        if found.kind == ARRAY:  # per-layer values (check_model has found them equal): transformers' to map
            raise Unsupported(f"per-layer {key}")
        field = _ARCH_KEYS[name]
        if field is not None:
            config[field] = header.float(key) if name in _FLOAT_KEYS else header.uint(key)
    if "general.name" in header.fields:
        config["_model_name_or_path"] = header.string("general.name")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = header.uint(prefix + "attention.key_length")
    head_dim = hidden // heads if head_dim is None else head_dim
    for key in ("rope.dimension_count", "attention.value_length"):
        value = header.uint(prefix + key)
        if value is not None and value != head_dim:  # a partial rotation, or values of another width
            raise Unsupported(f"{prefix}{key} {value} differs from the head width {head_dim}")
    if arch == "qwen2":
        if head_dim != hidden // heads:  # Qwen2's config has no head width of its own
            raise Unsupported(f"a Qwen2 head width {head_dim} other than hidden_size / heads")
    else:
        config["head_dim"] = head_dim
    if "vocab_size" not in config:
        if layout.tokens is None:
            raise Unsupported("no vocabulary size")
        config["vocab_size"] = layout.tokens
    config["tie_word_embeddings"] = layout.tied
    for gguf_key, field in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("unknown_token_id", "unk_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        value = header.uint(f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[field] = value
    return config


def hf_name(name: str) -> str:
    """The transformers parameter a GGUF tensor name loads, or Unsupported. A block number is read only as
    llama.cpp writes it (the header has refused any other spelling)."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    match = _LAYER_NAME.fullmatch(name)
    if match is not None and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
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


def tokenizer(file: GGUFFile) -> Any:
    """The GGUF's byte-level BPE tokenizer as a transformers fast tokenizer (checkpoint/gguf_tokenizer.py, torch-free
    and shared with smoke --engine), or Unsupported. transformers is imported here, not with this module: the
    transformers-free target (target/native.py) reads the file through this module with a tokenizer of its own."""
    from lilicorr_ckpt.checkpoint.gguf_tokenizer import build_tokenizer

    return build_tokenizer(file.header)


def read_target(
    path: str | Path,
    dtype: torch.dtype,
    *,
    with_tokenizer: bool = True,
    tokenizer_builder: Callable[[GGUFHeader], Any] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
    """(config dict, state dict in `dtype`, tokenizer or None) of a GGUF target; GGUFError or Unsupported.
    The header is checked against the model it declares (counts, shapes, types, data ranges: check_model) and
    everything is checked as mappable before any weight is dequantized. `tokenizer_builder` builds the tokenizer
    from the checked header (default: transformers' fast tokenizer, `tokenizer`)."""
    with GGUFFile(path) as file:
        layout = check_model(file.header)
        config = config_dict(file, layout)
        for name in file.tensors:
            hf_name(name)
        if (
            layout.unmapped
        ):  # a tensor the architecture may hold but the transformers model here has no place for
            raise Unsupported(f"tensor {layout.unmapped[0]!r}")
        if not with_tokenizer:
            tok = None
        else:
            tok = tokenizer(file) if tokenizer_builder is None else tokenizer_builder(file.header)
        state = state_dict(file, config, dtype)
    return config, state, tok
