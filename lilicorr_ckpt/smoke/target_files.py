"""A target's files checked before smoke loads anything from it (torch-free): a directory's safetensors weights and
a config that describes them; a GGUF's header against the model it declares (checkpoint/gguf_header.py, the check
validate --target runs too). And the direct GGUF tokenizer reader smoke --engine plugs in (direct_gguf_tokenizer)."""

from __future__ import annotations

import re
from typing import Any

from lilicorr_ckpt.checkpoint.gguf_header import Unsupported, read_model
from lilicorr_ckpt.checkpoint.source import PICKLE_SUFFIXES
from lilicorr_ckpt.checkpoint.target import read_target, resolve_target_spec
from lilicorr_ckpt.checkpoint.tensors import read_header
from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.smoke.profile import TargetRecord
from lilicorr_ckpt.smoke.tokenize import TRANSFORMERS_HINT, TargetTokenizer

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_target_files(resolved: Any, spec: str) -> None:
    """Before anything is allocated: a target directory must hold safetensors weights (pickles are never opened,
    not even by a library), and the sizes its config states must match what those weights hold, so a config
    saying 10**6 layers or a vocabulary of 10**9 is refused instead of built. A GGUF's header must describe the
    model it holds (read_model: within its limits, typed, every expected tensor present once in its shape, its
    data inside the file and unshared; a file with no weights is refused), before any tensor is read."""
    if resolved.kind == "gguf":
        read_model(resolved.path)
        return
    root = resolved.path
    weights = sorted(root.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise InputError(
                f"target {spec!r} holds only pickle weights ({', '.join(pickles[:3])}); pickles are never "
                "opened (unpickling runs code): convert the target to safetensors first"
            )
        raise InputError(f"target {spec!r} has no *.safetensors weights")
    info = read_target(spec)  # config plus the embedding's header shape, no tensor data
    layers: set[int] = set()
    for path in weights:
        tensors, _ = read_header(path, path.name)
        layers.update(int(m.group(1)) for name in tensors if (m := _LAYER_INDEX.search(name)))
    problems = []
    if info.unreadable:
        problems += [f"{key}: {why}" for key, why in info.unreadable.items()]
    if info.num_layers is not None and layers and info.num_layers != max(layers) + 1:
        problems.append(
            f"num_hidden_layers is {info.num_layers}, but the weights hold layers 0..{max(layers)}"
        )
    if (
        info.embedding_rows is not None
        and info.vocab_size is not None
        and info.vocab_size != info.embedding_rows
    ):
        problems.append(f"vocab_size is {info.vocab_size}, but the embedding has {info.embedding_rows} rows")
    if (
        info.embedding_width is not None
        and info.hidden_size is not None
        and info.hidden_size != info.embedding_width
    ):
        problems.append(
            f"hidden_size is {info.hidden_size}, but the embedding is {info.embedding_width} wide"
        )
    if problems:
        raise InputError(
            f"target {spec!r}: its config.json does not describe its weights: " + "; ".join(problems)
        )
    vocab = info.embedding_rows or info.vocab_size
    for name, value in info.special_ids.items():
        if vocab is not None and not 0 <= value < vocab:
            raise InputError(
                f"target {spec!r}: {name}_token_id {value} is outside its vocabulary ({vocab} tokens); "
                "fix it in config.json / generation_config.json"
            )


def direct_gguf_tokenizer(spec: str) -> TargetTokenizer | None:
    """smoke --engine's tokenizer of a GGUF target read directly from its header (checkpoint/gguf_tokenizer.py:
    no torch, no weights, no transformers converter), or None where that reader does not build this file's
    tokenizer exactly (a SentencePiece vocabulary, another pre-tokenizer: transformers' converter then, after
    this header check has bounded what it reads). A file that is malformed or does not describe its weights is an
    InputError (GGUFError) naming it, as the reference run refuses it."""
    resolved = resolve_target_spec(spec)
    if resolved.kind != "gguf":
        return None
    try:
        from lilicorr_ckpt.checkpoint.gguf_tokenizer import read_gguf_tokenizer
    except ImportError as exc:
        raise UsageError(f"{TRANSFORMERS_HINT} ({exc})") from None
    try:
        tokenizer, eos, layout = read_gguf_tokenizer(resolved.path)
    except Unsupported:
        read_model(resolved.path)  # the model is checked either way; transformers then builds the tokenizer
        return None
    record = TargetRecord(
        id=resolved.path.name,
        source="gguf",
        architecture=layout.architecture,
        hidden_size=layout.hidden_size,
        num_layers=layout.block_count,
        vocab_size=layout.vocab_rows,
        forward="served by the engine",
    )
    return TargetTokenizer(
        tokenizer=tokenizer, eos_token_ids=eos, record=record, vocab_size=layout.vocab_rows
    )
