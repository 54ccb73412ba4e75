"""A target directory's files checked before smoke loads anything from it (torch-free): safetensors weights, and
a config that describes them."""

from __future__ import annotations

import re
from typing import Any

from lilicorr_ckpt.checkpoint.source import PICKLE_SUFFIXES
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.checkpoint.tensors import read_header
from lilicorr_ckpt.errors import InputError

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def check_target_files(resolved: Any, spec: str) -> None:
    """Before anything is allocated: a target directory must hold safetensors weights (pickles are never opened,
    not even by a library), and the sizes its config states must match what those weights hold, so a config
    saying 10**6 layers or a vocabulary of 10**9 is refused instead of built."""
    if resolved.kind == "gguf":
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
