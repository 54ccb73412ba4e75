"""Target adapter: an HF transformers causal LM seen as the decoder needs it.

Exposes the logits and the hidden states after chosen layers (HF `hidden_states[i + 1]`), the input
embedding table, the lm_head, and a KV cache that is cropped after partial acceptance.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from lilicorr_ckpt.checkpoint import resolve_target_spec
from lilicorr_ckpt.checkpoint.text import shorten

from .arguments import resolve_device, resolve_dtype

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TargetStep:
    """One target forward: fp32 logits [n, V] and, when asked for, features [n, T·M]."""

    __slots__ = ("features", "logits")

    def __init__(self, logits: torch.Tensor, features: torch.Tensor | None):
        self.logits = logits
        self.features = features


class TargetModel:
    def __init__(self, model: PreTrainedModel, tokenizer: Any = None, eos_token_ids: Sequence[int] = ()):
        self.model = model.eval()
        config = model.config.get_text_config()
        self.config = config
        self.hidden_size: int = config.hidden_size
        self.num_layers: int = config.num_hidden_layers
        self.embed_tokens: torch.nn.Module = model.get_input_embeddings()
        self.lm_head: torch.nn.Module = model.get_output_embeddings()
        self.vocab_size: int = self.embed_tokens.weight.shape[0]
        self.tokenizer = tokenizer
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        # transformers renamed the cache argument (past_key_values -> cache); take whichever this version has
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens whose K/V the cache holds
        self.path = "transformers"  # which forward runs: "fast" (fast_target.FastTarget) or transformers' eager one
        self.path_note = "transformers eager forward"

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def reserve(self, rows: int) -> None:
        """A hint that the next request needs `rows` cached tokens (a static cache allocates them once)."""

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> raw embedding rows [..., M] (no model-specific input scaling)."""
        return self.embed_tokens(ids.to(self.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's lm_head on hidden [..., M] of any dtype -> fp32 logits [..., V]."""
        return self.lm_head(hidden.to(self.dtype)).float()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, layer_ids: Sequence[int] | None = None) -> TargetStep:
        """Run ids [n] at the positions after the cached ones and extend the cache."""
        if self.cache is None:
            self.reset()
        kwargs = {self._cache_kwarg: self.cache}
        out = self.model(input_ids=ids.to(self.device).view(1, -1), use_cache=True,
                         output_hidden_states=layer_ids is not None, **kwargs)
        self.length += ids.numel()
        features = None
        if layer_ids is not None:
            features = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)  # [n, T·M]
        return TargetStep(out.logits[0].float(), features)

    def crop(self, length: int) -> None:
        """Keep the first `length` cached tokens (drop the rejected tail of a verified block)."""
        assert self.cache is not None
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)  # a negative count removes tokens, in every transformers version we support
            self.length = length


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
            problems.append(f"{name} has shape {list(stored)} in the checkpoint, the config needs {list(expected)}")
        else:
            problems.append(f"{entry} has an unexpected shape")
    problems.extend(str(m) for m in info.get("error_msgs") or ())
    return problems


def load_target(spec: str | Path, *, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
                tokenizer: bool = True, fast: bool | None = None) -> TargetModel:
    """An HF causal LM from a local directory, an offline HF cache repo id, or a .gguf file.

    dtype is a torch.dtype or a name (float32/fp32, bfloat16/bf16, float16/fp16). The checkpoint must hold every
    weight the config describes, in its shape: a missing or misshapen tensor (which transformers would initialise
    at random) raises ValueError naming it. The tokenizer is loaded when the source has one (and `tokenizer`);
    otherwise `tokenizer` is None and the caller works in token ids.

    fast: None (default) runs the fast path (`fast_target.FastTarget`: static KV cache, CUDA graphs on a GPU)
    whenever the architecture has one and transformers' eager forward otherwise (`path_note` says which and
    why); True requires the fast path (ValueError naming why not); False always runs transformers."""
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    resolved = resolve_target_spec(str(spec))  # TargetSpecError (a ValueError) for a non-GGUF file
    kwargs: dict[str, Any] = {"local_files_only": True}
    if resolved.kind == "gguf":
        source, kwargs["gguf_file"] = str(resolved.path.parent), resolved.path.name
        has_tokenizer = True  # the GGUF carries its tokenizer
    else:
        source = str(resolved.path)
        has_tokenizer = any((resolved.path / name).is_file() for name in TOKENIZER_FILES)
    # a size mismatch is reported (and refused below, naming every tensor) rather than raised by transformers
    with _quiet_load_report():
        model, info = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, output_loading_info=True,
                                                           ignore_mismatched_sizes=True, **kwargs)
    problems = _unloaded_weights(info)
    if problems:
        drafter = getattr(model.config, "dflash_config", None) is not None
        hint = " (its config has a dflash_config: this looks like a drafter checkpoint, not a target)" if drafter \
            else ""
        raise ValueError(f"target {str(spec)!r} does not hold the weights its config describes{hint}: "
                         + "; ".join(problems) + " (transformers would fill them with random values)")
    model = model.to(device)
    eos = _eos_ids(model)
    tok = None
    if tokenizer and has_tokenizer:
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
        if eos and tok.eos_token_id not in eos:
            # GGUF conversion can mislabel eos (SmolLM2 reports <|im_start|>); the generation config is right
            tok.eos_token = tok.convert_ids_to_tokens(eos[0])
    if fast is not False:
        from .fast_target import FastTarget, fast_path_problem  # it imports this module

        problem = fast_path_problem(model)
        if problem is None:
            return FastTarget(model, tok, eos)
        if fast:
            raise ValueError(f"target {str(spec)!r} has no fast path: {problem}")
        target = TargetModel(model, tok, eos)
        target.path_note = f"transformers eager forward ({problem})"
        return target
    return TargetModel(model, tok, eos)
