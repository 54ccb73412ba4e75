"""What validate needs to know about the target model, read from its config and headers only."""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import load_json_object
from lilicorr_ckpt.checkpoint.gguf_header import read_model
from lilicorr_ckpt.checkpoint.readfile import regular_size, too_large
from lilicorr_ckpt.checkpoint.source import read_small, resolve_path
from lilicorr_ckpt.checkpoint.tensors import read_header
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.families import is_drafter


class TargetInfo(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    architecture: str | None
    hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    embedding_rows: int | None  # rows of the input embedding table, when its header was read
    embedding_width: int | None
    special_ids: dict[str, int]  # bos/eos/pad ids
    rope_theta: float | None
    max_positions: int | None = None  # max_position_embeddings (a GGUF's context_length): the serving context
    # geometry keys the target's config lacks or gives with the wrong type: key -> what was found
    unreadable: dict[str, str] = msgspec.field(default_factory=dict)


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _geometry(source: dict[str, Any], keys: dict[str, str]) -> tuple[dict[str, int | None], dict[str, str]]:
    """The integer values of keys (field -> source key), and for each one that is not an integer what was there."""
    values: dict[str, int | None] = {}
    unreadable: dict[str, str] = {}
    for field, key in keys.items():
        raw = source.get(key)
        values[field] = _int(raw)
        if values[field] is None:
            unreadable[key] = (
                "missing" if raw is None else f"{msgspec.json.encode(raw).decode()[:40]} (not an integer)"
            )
    return values, unreadable


class TargetSpecError(InputError, ValueError):
    """A --target that names no model (exit 2 on the command line; a ValueError for library callers)."""


class TargetSpec(msgspec.Struct, frozen=True):
    kind: str  # gguf | directory | hf_cache
    path: Path  # the .gguf file, or the model directory


# What a loader opens by name in a model directory (transformers' AutoConfig, AutoModel, AutoTokenizer and
# GenerationConfig, and our own readers): each must be a regular file of a sane size, so a FIFO, a device or a
# multi-gigabyte "tokenizer.json" is refused by name before any library opens it (a FIFO would block it forever).
LOADER_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
LOADER_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".safetensors", ".gguf")
LOADER_FILE_LIMIT = 128 << 20  # the largest tokenizer.json of a 256k vocabulary is ~35 MB
TEMPLATE_DIR = "additional_chat_templates"  # transformers reads every *.jinja in it


def guard_loader_files(root: Path, spec: str) -> None:
    """Refuse (InputError, naming the file) a model directory entry a loader would open that is not a regular
    file (a FIFO, device or socket; a directory where a loader file is expected) or, for the metadata and
    tokenizer files, that is larger than LOADER_FILE_LIMIT. Weights are size-checked by their own readers."""
    try:
        entries = sorted(root.iterdir())
        templates = root / TEMPLATE_DIR
        if templates.is_dir():
            entries += sorted(templates.iterdir())
    except OSError as exc:
        raise InputError(f"cannot list target {spec!r}: {exc.strerror or exc}") from None
    for entry in entries:
        name = entry.name
        read_by_name = name in LOADER_FILES or name.endswith(LOADER_SUFFIXES)
        if not read_by_name:
            continue
        rel = str(entry.relative_to(root))
        try:
            mode = entry.stat().st_mode
        except OSError:
            mode = (
                None  # a dangling link or a loop: refused (by regular_size) where a loader opens it by name
            )
        if name not in LOADER_FILES and (mode is None or stat.S_ISDIR(mode)):
            continue  # a folder, or a broken link, that merely ends in .json is nothing a loader opens
        size = regular_size(entry, what=f"target {spec!r}: {rel}")
        if not name.endswith((".safetensors", ".gguf")) and size > LOADER_FILE_LIMIT:
            raise too_large(f"target {spec!r}: {rel}", size, LOADER_FILE_LIMIT)


def resolve_target_spec(spec: str) -> TargetSpec:
    """A .gguf file, a Hugging Face model directory (one holding a single .gguf and no config.json counts as that
    GGUF), or a repo id in the local Hugging Face cache. Every file a loader opens by name is a regular file
    (guard_loader_files)."""
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and (path.exists() or path.is_symlink()) and not path.is_dir():
        regular_size(path, what=f"target {spec!r}")  # a FIFO or device named .gguf: refused by kind
    if path.is_file():
        if path.suffix == ".gguf":
            return TargetSpec("gguf", path)
        raise TargetSpecError(
            f"target {spec!r} is a file but not a .gguf; pass a model directory, a repo id in the "
            "local Hugging Face cache, or a GGUF file"
        )
    root, _ = resolve_path(spec, "target")
    guard_loader_files(root, spec)
    if not (root / "config.json").is_file():
        ggufs = sorted(root.glob("*.gguf"))
        if len(ggufs) == 1:
            return TargetSpec("gguf", ggufs[0])
        raise TargetSpecError(
            f"target {spec!r} has no config.json; expected a Hugging Face model directory or a .gguf file"
        )
    return TargetSpec("directory" if path.is_dir() else "hf_cache", root)


def read_target(spec: str) -> TargetInfo:
    resolved = resolve_target_spec(spec)
    if resolved.kind == "gguf":
        return read_gguf_target(resolved.path)
    root = resolved.path
    config_path = root / "config.json"
    doc, _ = load_json_object(
        read_small(config_path, f"target {spec}/config.json"), f"target {spec}/config.json"
    )
    if is_drafter(doc):  # the drafter passed twice, or PATH and --target swapped
        raise TargetSpecError(
            f"target {spec!r} is a drafter, not a target (its config.json has "
            f"{'dflash_config' if 'dflash_config' in doc else 'a drafter architecture'}); "
            f"--target takes the model the drafter drafts for"
        )
    nested = doc.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else doc
    special: dict[str, int] = {}
    sources = [doc, text]
    generation = root / "generation_config.json"
    if generation.is_file():
        with contextlib.suppress(InputError):
            sources.append(
                load_json_object(read_small(generation, "generation_config.json"), "generation_config.json")[
                    0
                ]
            )
    for src in sources:
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            for i, value in enumerate(_ids(src.get(key))):
                special.setdefault(f"{key[:-9]}{'' if i == 0 else i}", value)
    rows = width = None
    for st in sorted(root.glob("*.safetensors")):
        try:
            tensors, _ = read_header(st, st.name)
        except InputError:
            continue
        for name, info in tensors.items():
            if name.endswith("embed_tokens.weight") and len(info.shape) == 2:
                rows, width = info.shape
                break
        if rows is not None:
            break
    archs = doc.get("architectures")
    theta = text.get("rope_theta")
    geo, unreadable = _geometry(
        text, {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "vocab_size": "vocab_size"}
    )
    return TargetInfo(
        label=spec,
        architecture=archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        hidden_size=geo["hidden_size"],
        num_layers=geo["num_layers"],
        vocab_size=geo["vocab_size"],
        unreadable=unreadable,
        embedding_rows=rows,
        embedding_width=width,
        special_ids=special,
        rope_theta=float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None,
        max_positions=_int(text.get("max_position_embeddings")),
    )


# ---------------------------------------------------------------- GGUF (header only)


def read_gguf_target(path: Path) -> TargetInfo:
    """Model geometry and special token ids from a GGUF file's header, which must describe the model it holds
    (gguf_header.read_model: limits, typed metadata, every expected tensor present once in its shape, data inside
    the file): a file smoke would refuse before loading it (no weights, a block count or shapes its tensors do not
    have) is refused here too, with the same message (GGUFError, an InputError)."""
    layout = read_model(path)
    theta = layout.rope_theta
    special = {
        name: layout.special_ids[key]
        for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))
        if key in layout.special_ids
    }
    return TargetInfo(
        label=str(path),
        architecture=layout.architecture,
        hidden_size=layout.hidden_size,
        num_layers=layout.block_count,
        vocab_size=layout.vocab_size if layout.vocab_size is not None else layout.vocab_rows,
        embedding_rows=layout.vocab_rows,
        embedding_width=layout.hidden_size,
        special_ids=special,
        rope_theta=theta,
        max_positions=layout.context_length,
    )
