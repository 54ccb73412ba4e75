"""Probe prompts as token ids, the one way both smoke modes make them: the reference runtime (smoke.run) and a
running engine (smoke.engine) must decode exactly the same prompt tokens for their acceptance to be comparable.

Torch-free: `tokenize_probes` takes any Hugging Face tokenizer; `load_tokenizer` loads the target's with
transformers alone (no model weights, no torch), for `smoke --engine`, where the target is served elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import load_json_object
from lilicorr_ckpt.checkpoint.source import read_small
from lilicorr_ckpt.checkpoint.target import TargetInfo, read_target, resolve_target_spec
from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.smoke.probes import Probe
from lilicorr_ckpt.smoke.profile import ChatTemplate, TargetRecord, TargetSource, Thinking, checkpoint_id

# the files transformers reads a tokenizer from; a directory with none of them has no tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TRANSFORMERS_HINT = (
    "smoke --engine tokenizes the probes with the target's own tokenizer and chat template: "
    "pip install transformers (torch is not needed)"
)


def tokenize_probes(
    tokenizer: Any, probes: Sequence[Probe], eos: Sequence[int]
) -> tuple[list[list[int]], ChatTemplate]:
    """Each probe's prompt token ids (chat: true through the target's chat template, with thinking disabled when
    the template has the switch; false as plain text), and what was applied."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one serves plain chat
        template = template.get("default") or next(iter(template.values()), None)
    switch = isinstance(template, str) and "enable_thinking" in template
    kwargs = {"enable_thinking": False} if switch else {}
    prompts, applied = [], 0
    for p in probes:
        try:
            if p.chat and template:
                ids = tokenizer.apply_chat_template(
                    [{"role": "user", "content": p.prompt}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=True,
                    **kwargs,
                )["input_ids"]
                applied += 1
            else:
                ids = tokenizer(p.prompt)["input_ids"]
        except Exception as exc:  # template errors come from jinja with many types
            raise InputError(
                f"probe {p.id}: the target's tokenizer cannot encode it: {type(exc).__name__}: {exc}"
            ) from None
        ids = [int(i) for i in ids]
        if not ids:
            raise InputError(f"probe {p.id} tokenizes to no tokens")
        prompts.append(ids)
    thinking: Thinking = "not-applied" if not applied else ("disabled" if switch else "no-switch")
    info = ChatTemplate(
        present=bool(template),
        applied_prompts=applied,
        raw_prompts=len(probes) - applied,
        thinking=thinking,
        template_kwargs=kwargs if applied else {},
        template_sha256=hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) else None,
        eos_token_ids=list(eos),
        eos_tokens=[str(t) for t in tokenizer.convert_ids_to_tokens(list(eos))],
    )
    return prompts, info


class TargetTokenizer(msgspec.Struct, frozen=True, kw_only=True):
    """The target as smoke --engine needs it: its tokenizer, where generation stops, and its identity."""

    tokenizer: Any
    eos_token_ids: tuple[
        int, ...
    ]  # the generation config's, as HF generate (and the reference runtime) stops
    record: TargetRecord
    vocab_size: int  # embedding rows when the weights' header was read, else the config's vocab_size


def _eos_from_json(doc: dict[str, Any]) -> tuple[int, ...] | None:
    value = doc.get("eos_token_id")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return (value,)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return tuple(value)
    return None


def _directory_eos(root: Path, spec: str) -> tuple[int, ...]:
    """generation_config.json's eos_token_id, else config.json's (its text_config's for a multimodal config): the
    order transformers builds a model's generation config in, which the reference runtime stops by."""
    for name in ("generation_config.json", "config.json"):
        path = root / name
        if not path.is_file():
            continue
        doc, _ = load_json_object(read_small(path, f"target {spec}/{name}"), f"target {spec}/{name}")
        found = _eos_from_json(doc)
        if found is None and isinstance(doc.get("text_config"), dict):
            found = _eos_from_json(doc["text_config"])
        if found is not None:
            return found
    return ()


def load_tokenizer(spec: str) -> TargetTokenizer:
    """The target's tokenizer and stop ids without its weights or torch: a model directory (config.json and the
    tokenizer files are enough), a repo id in the local Hugging Face cache, or a .gguf file."""
    resolved = resolve_target_spec(spec)  # TargetSpecError (an InputError) for what names no model
    try:
        with contextlib.redirect_stderr(
            io.StringIO()
        ):  # transformers' import-time notes are not ours to print
            from transformers import AutoConfig, AutoTokenizer
            from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise UsageError(f"{TRANSFORMERS_HINT} ({exc})") from None
    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"local_files_only": True}
    if resolved.kind == "gguf":
        source, kwargs["gguf_file"] = str(resolved.path.parent), resolved.path.name
    else:
        source = str(resolved.path)
        if not any((resolved.path / name).is_file() for name in TOKENIZER_FILES):
            raise InputError(
                f"target {spec!r} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}); smoke tokenizes "
                "the probe prompts with it"
            )
    info: TargetInfo = read_target(spec)  # the config (and the embedding's header when weights are there)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            eos = (
                _directory_eos(resolved.path, spec)
                if resolved.kind != "gguf"
                else _eos_from_json(
                    {"eos_token_id": AutoConfig.from_pretrained(source, **kwargs).eos_token_id}
                )
                or ()
            )
    except InputError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for a broken tokenizer
        raise InputError(
            f"cannot load the tokenizer of target {spec!r}: {type(exc).__name__}: {exc}"
        ) from None
    if eos and tokenizer.eos_token_id not in eos:
        # GGUF conversion can mislabel eos (SmolLM2 reports <|im_start|>); the generation config is right, and the
        # reference runtime corrects the tokenizer the same way
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos[0])
    missing = [
        key
        for key, value in (
            ("hidden_size", info.hidden_size),
            ("num_hidden_layers", info.num_layers),
            ("vocab_size", info.vocab_size or info.embedding_rows),
        )
        if value is None
    ]
    if missing:
        raise InputError(
            f"target {spec!r}: its config gives no {', '.join(missing)}; smoke --engine reads the "
            "target's geometry from it (the weights are not needed)"
        )
    vocab = info.embedding_rows or info.vocab_size
    assert info.hidden_size is not None and info.num_layers is not None and vocab is not None
    kind: TargetSource
    if resolved.kind == "gguf":
        kind, ident = "gguf", resolved.path.name
    elif resolved.kind == "directory":
        kind, ident = "directory", checkpoint_id(str(resolved.path))
    else:
        kind, ident = "hf_cache", spec
    record = TargetRecord(
        id=ident,
        source=kind,
        architecture=info.architecture,
        hidden_size=info.hidden_size,
        num_layers=info.num_layers,
        vocab_size=vocab,
        forward="served by the engine",
    )
    return TargetTokenizer(tokenizer=tokenizer, eos_token_ids=tuple(eos), record=record, vocab_size=vocab)
