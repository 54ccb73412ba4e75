"""Loading a target: an HF causal LM from a local directory, an offline HF cache repo id or a .gguf file, refused
when it lacks weights its config describes, and run on the fast path (target/fast.py) when its architecture has
one, else on transformers' eager forward (target/fast.py `TargetModel`).

A Llama / Qwen2 / Qwen3 the fast path runs is built without transformers (target/native.py: config, safetensors or
GGUF weights, stop ids, tokenizer); anything that route does not map exactly is loaded through transformers as
before (a GGUF read directly where target/gguf_direct.py maps it, else by transformers' GGUF loader), and
transformers is imported only then."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lilicorr_ckpt.checkpoint import resolve_target_spec
from lilicorr_ckpt.checkpoint.target import InputError, TargetSpecError
from lilicorr_ckpt.checkpoint.text import shorten

from .. import settings
from ..arguments import resolve_device, resolve_dtype
from . import gguf_direct
from .fast import FastTarget, TargetModel, fast_path_problem
from .native import NotMapped, build_from_directory, build_from_gguf

if TYPE_CHECKING:  # transformers is imported by the functions that build through it
    from transformers import PreTrainedModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _eos_ids(model: PreTrainedModel) -> tuple[int, ...]:
    for source in (model.generation_config, model.config):
        value = None if source is None else source.eos_token_id
        if value is not None:
            return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)
    return ()


class _DropLoadReport(logging.Filter):
    """Drops transformers' weight-loading report (v5 "LOAD REPORT", v4 "Some weights of ..."): load_target raises
    its own error naming what is missing or misshapen, and ignores unexpected extra tensors."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "LOAD REPORT" not in message and not message.startswith("Some weights of")


@contextlib.contextmanager
def _quiet_load_report() -> Iterator[None]:
    logger, drop = logging.getLogger("transformers.modeling_utils"), _DropLoadReport()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


_GGUF_LOAD = threading.Lock()  # one GGUF load at a time holds gguf's patched entry points (below)


@contextlib.contextmanager
def _one_gguf_parse(path: Path) -> Iterator[None]:
    """While `path` loads, transformers' own GGUF code runs on one parse of it.

    One `from_pretrained` and one `AutoTokenizer.from_pretrained` of a GGUF each build a `gguf.GGUFReader` of
    the file (the config, the weights, the tokenizer's config again: three), and each reader walks every
    metadata field in Python (about 2 s for SmolLM2's 49,152-token vocabulary and 48,900 merges). The weights'
    name map then builds gguf's `TensorNameMap` once per submodule (about 400 times for a 30-layer Llama, 4 s).
    Here the first reader of `path` is kept and handed to every later one transformers opens on it (read-only:
    mode "r"), and the name map is built once per (architecture, layer count). Both are looked up in the
    `gguf` module at call time by transformers, so they are replaced there for the duration and restored after.
    transformers still does all the work itself: the model, the tokenizer and the errors for a bad file are
    those of a plain load. Another file, another mode, a reader that fails to build: passed through unchanged."""
    try:
        import gguf
    except ImportError:  # transformers says what to install
        yield
        return
    original_reader, original_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    target = os.path.realpath(path)
    readers: list[Any] = []
    name_maps: dict[tuple[Any, int], Any] = {}

    def is_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        file: Any = args[0] if args else kwargs.get("path")
        mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
        try:
            return mode == "r" and os.path.realpath(os.fspath(file)) == target
        except TypeError:  # not a path: the reader's own error
            return False

    # a subclass of the reader class found at run time (a variable base, which mypy does not type)
    class SharedReader(original_reader):  # type: ignore[misc, valid-type]
        # __new__ returns an instance of the original class, so Python does not run __init__ on it again
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if not is_target(args, kwargs):
                return original_reader(*args, **kwargs)
            if not readers:
                readers.append(original_reader(*args, **kwargs))  # an exception is raised as before, not kept
            return readers[0]

    def shared_name_map(arch: Any, n_blocks: int) -> Any:
        key = (arch, n_blocks)
        if key not in name_maps:
            name_maps[key] = original_name_map(arch, n_blocks)
        return name_maps[key]

    with _GGUF_LOAD:
        # the module's own names, patched for the load (mypy does not type an assignment to a class name)
        gguf.GGUFReader, gguf.get_tensor_name_map = SharedReader, shared_name_map  # type: ignore[misc]
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_name_map  # type: ignore[misc]
            # the reader maps the whole file: let it go now, not when a garbage collection reaches SharedReader
            readers.clear()
            name_maps.clear()


def _unloaded_weights(info: dict[str, Any]) -> list[str]:
    """What transformers' loading info says was not loaded from the checkpoint: missing tensors (they would run
    randomly initialised) and tensors whose stored shape differs from the model's. Tied weights
    (tie_word_embeddings) are not reported missing by transformers; unexpected extra tensors are ignored."""
    problems = []
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        problems.append(f"missing {shorten(missing, 8, quote='')}")
    for entry in sorted(info.get("mismatched_keys") or (), key=str):
        if isinstance(entry, (tuple, list)) and len(entry) == 3:
            name, stored, expected = entry
            problems.append(
                f"{name} has shape {list(stored)} in the checkpoint, the config needs {list(expected)}"
            )
        else:
            problems.append(f"{entry} has an unexpected shape")
    problems.extend(str(m) for m in info.get("error_msgs") or ())
    return problems


def _load_gguf_directly(
    path: Path, dtype: torch.dtype, want_tokenizer: bool
) -> tuple[PreTrainedModel, list[str], Any] | str:
    """(model, unloaded-weight problems, tokenizer) of a GGUF read by target/gguf_direct.py, or why not (a str)
    when that route does not map the file (transformers loads it then) or LILICORR_GGUF_LOADER=transformers asks
    for transformers' own route. A malformed file raises gguf_direct.GGUFError (a ValueError) naming the problem."""
    if settings.gguf_loader() == "transformers":
        return f"{settings.GGUF_LOADER.name}=transformers"
    from transformers import AutoConfig, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config_kwargs, state, tok = gguf_direct.read_target(path, dtype, with_tokenizer=want_tokenizer)
    except gguf_direct.Unsupported as why:
        return str(why)
    config = AutoConfig.for_model(**config_kwargs)
    config._name_or_path = str(path.parent)  # as transformers names a GGUF's model: by its directory
    # the lazy mapping's values are model classes (transformers types them as tuples of types)
    model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is None:
        return f"no causal LM class for {type(config).__name__}"
    with torch.device("meta"):
        model = model_class(config)
    expected = dict(model.state_dict())
    tied = bool(getattr(config, "tie_word_embeddings", False))
    problems: list[str] = []
    missing = sorted(n for n in expected if n not in state and not (tied and n == "lm_head.weight"))
    if missing:
        problems.append(f"missing {shorten(missing, 8, quote='')}")
    for name in sorted(set(state) & set(expected)):
        if tuple(state[name].shape) != tuple(expected[name].shape):
            problems.append(
                f"{name} has shape {list(state[name].shape)} in the checkpoint, the config needs "
                f"{list(expected[name].shape)}"
            )
    if problems:
        return model, problems, tok
    model.load_state_dict({n: t for n, t in state.items() if n in expected}, strict=False, assign=True)
    if tied:
        model.tie_weights()
    # modules whose buffers are made at construction (the rotary embedding's inverse frequencies) are built again,
    # for real, on the CPU
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)):
                if not hasattr(child, "rope_type"):
                    return f"{type(child).__name__} has a buffer made at construction"
                setattr(parent, child_name, type(child)(config=config))
    if any(t.is_meta for t in model.parameters()) or any(t.is_meta for t in model.buffers()):
        return "a weight the file does not hold and the model does not build"
    model.config.dtype = dtype
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.eval()
    return model, problems, tok


def _native_target(
    resolved: Any, dtype: torch.dtype, device: torch.device, tokenizer: bool, has_tokenizer: bool
) -> FastTarget | str:
    """The target built without transformers (target/native.py), or why not (a str): the loader then builds it
    through transformers. A GGUF whose header is malformed raises GGUFError here, as on every route."""
    if resolved.kind == "gguf" and settings.gguf_loader() == "transformers":
        return f"{settings.GGUF_LOADER.name}=transformers"
    want = tokenizer and has_tokenizer
    try:
        if resolved.kind == "gguf":
            built = build_from_gguf(resolved.path, dtype, want)
        else:
            built = build_from_directory(resolved.path, dtype, want)
    except NotMapped as why:
        return str(why)
    except InputError as exc:
        if isinstance(exc, ValueError):  # GGUFError: as every route raises it
            raise
        # a config, generation config or tokenizer file that is not sound JSON (or not a regular file), named: a
        # ValueError for the runtime's callers, as transformers' own errors for it were, an InputError for smoke
        raise TargetSpecError(str(exc)) from None
    note = "read directly from the GGUF" if resolved.kind == "gguf" else "read directly from the safetensors"
    note += ", built without transformers"
    tok = built.tokenizer
    if want and tok is None:  # a directory tokenizer transformers builds by a class of its own
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(resolved.path), local_files_only=True)
        note += f"; tokenizer by transformers ({built.tokenizer_note})"
    eos = built.eos_token_ids
    if tok is not None and eos and tok.eos_token_id not in eos:
        # GGUF conversion can mislabel eos (SmolLM2 reports <|im_start|>); the generation config is right
        tok.eos_token = tok.convert_ids_to_tokens(eos[0])
    target = FastTarget(built.model.to(device), tok, eos)
    target.load_note = note
    return target


def load_target(
    spec: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer: bool = True,
    fast: bool | None = None,
    native: bool | None = None,
) -> TargetModel:
    """An HF causal LM from a local directory, an offline HF cache repo id, or a .gguf file.

    dtype is a torch.dtype or a name (float32/fp32, bfloat16/bf16, float16/fp16). The checkpoint must hold every
    weight the config describes, in its shape: a missing or misshapen tensor (which transformers would initialise
    at random) raises ValueError naming it. The tokenizer is loaded when the source has one (and `tokenizer`);
    otherwise `tokenizer` is None and the caller works in token ids.

    native: None (default) builds a Llama, Qwen2 or Qwen3 that the fast path runs without transformers
    (target/native.py: the same weights, rotary frequencies, stop ids and tokens as the transformers route, which
    the tests check), whenever its source maps exactly, and through transformers otherwise; True requires that
    route (ValueError naming why not); False always builds through transformers. `load_note` on the result says
    which route read the weights, and why not the direct one.

    A .gguf file of a Llama, Qwen2 or Qwen3 with a GPT-2-style byte-level tokenizer is read directly
    (target/gguf_direct.py: the same config, weights and tokenizer as transformers' GGUF loader builds, in about
    a tenth of its time); another GGUF goes through transformers' loader, parsed once. A file that is not a
    well-formed GGUF raises ValueError naming what is wrong with it.

    fast: None (default) runs the fast path (`target.fast.FastTarget`: static KV cache, CUDA graphs on a GPU)
    whenever the architecture has one and transformers' eager forward otherwise (`path_note` says which and
    why); True requires the fast path (ValueError naming why not); False always runs transformers (and so builds
    through it)."""
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    resolved = resolve_target_spec(str(spec))  # TargetSpecError (a ValueError) for a non-GGUF file
    if resolved.kind == "gguf":
        has_tokenizer = True  # the GGUF carries its tokenizer
    else:
        has_tokenizer = any((resolved.path / name).is_file() for name in TOKENIZER_FILES)
    if fast is False and native:
        raise ValueError("native=True builds a target for the fast path only; it cannot run with fast=False")
    why_not = None
    if fast is not False and native is not False:
        built = _native_target(resolved, dtype, device, tokenizer, has_tokenizer)
        if isinstance(built, FastTarget):
            return built
        if native:
            raise ValueError(f"target {str(spec)!r} cannot be built without transformers: {built}")
        why_not = built
    target = _transformers_target(spec, resolved, dtype, device, tokenizer, has_tokenizer, fast)
    if why_not is not None:
        target.load_note += f" (not built without transformers: {why_not})"
    return target


def _transformers_target(
    spec: str | Path,
    resolved: Any,
    dtype: torch.dtype,
    device: torch.device,
    tokenizer: bool,
    has_tokenizer: bool,
    fast: bool | None,
) -> TargetModel:
    """The target built through transformers: its model class, its loader (or gguf_direct's tensors) and its
    tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": True}
    if resolved.kind == "gguf":
        source, kwargs["gguf_file"] = str(resolved.path.parent), resolved.path.name
    else:
        source = str(resolved.path)
    direct = _load_gguf_directly(resolved.path, dtype, tokenizer) if resolved.kind == "gguf" else None
    if isinstance(direct, str):
        load_note, direct = f"transformers' GGUF loader ({direct})", None
    else:
        load_note = "read directly from the GGUF" if direct is not None else "transformers"
    # a GGUF the direct route does not map is parsed once for the model and the tokenizer: see _one_gguf_parse
    parse_once = resolved.kind == "gguf" and direct is None
    model: Any  # a PreTrainedModel (transformers' stubs type neither the loading-info tuple nor `to` right)
    with _one_gguf_parse(resolved.path) if parse_once else contextlib.nullcontext():
        if direct is not None:
            model, problems, direct_tokenizer = direct
        else:
            # a size mismatch is reported (and refused below, naming every tensor) rather than raised by
            # transformers
            with _quiet_load_report():
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    source, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
                )
                model, info = loaded  # (model, loading info) with output_loading_info
            problems = _unloaded_weights(info)
        if problems:
            drafter = getattr(model.config, "dflash_config", None) is not None
            hint = (
                " (its config has a dflash_config: this looks like a drafter checkpoint, not a target)"
                if drafter
                else ""
            )
            raise ValueError(
                f"target {str(spec)!r} does not hold the weights its config describes{hint}: "
                + "; ".join(problems)
                + " (transformers would fill them with random values)"
            )
        model = model.to(device)
        eos = _eos_ids(model)
        tok = None
        if tokenizer and has_tokenizer:
            tok = direct_tokenizer if direct is not None else AutoTokenizer.from_pretrained(source, **kwargs)
            if eos and tok.eos_token_id not in eos:
                # GGUF conversion can mislabel eos (SmolLM2 reports <|im_start|>); the generation config is right
                tok.eos_token = tok.convert_ids_to_tokens(eos[0])
    if fast is not False:
        problem = fast_path_problem(model)
        if problem is None:
            target: TargetModel = FastTarget(model, tok, eos)
        elif fast:
            raise ValueError(f"target {str(spec)!r} has no fast path: {problem}")
        else:
            target = TargetModel(model, tok, eos)
            target.path_note = f"transformers eager forward ({problem})"
    else:
        target = TargetModel(model, tok, eos)
    target.load_note = load_note
    return target
