"""Target adapter: an HF transformers causal LM seen as the decoder needs it.

(`model` may also be target/native.py's NativeCausalLM, which only the fast path subclass, target/fast.py, runs.)
Exposes the logits and the hidden states after chosen layers (HF `hidden_states[i + 1]`), the input
embedding table, the lm_head, and a KV cache that is cropped after partial acceptance. Loading one (and choosing
the fast path when it has one) is target/load.py's.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

if (
    TYPE_CHECKING
):  # transformers is imported where its cache is made: a target built without it never needs it
    from transformers import DynamicCache, PreTrainedModel


class TargetStep:
    """One target forward: fp32 logits [n, V] and, when asked for, features [n, T·M]."""

    __slots__ = ("features", "logits")

    def __init__(self, logits: torch.Tensor, features: torch.Tensor | None):
        self.logits = logits
        self.features = features


class TargetModel:
    def __init__(
        self, model: PreTrainedModel | Any, tokenizer: Any = None, eos_token_ids: Sequence[int] = ()
    ):
        self.model = model.eval()
        config = model.config.get_text_config()
        self.config = config
        self.hidden_size: int = config.hidden_size
        self.num_layers: int = config.num_hidden_layers
        self.embed_tokens: torch.nn.Module = model.get_input_embeddings()
        self.lm_head: torch.nn.Module = model.get_output_embeddings()
        self.vocab_size: int = self._embedding_table.shape[0]
        self.tokenizer = tokenizer
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        # transformers renamed the cache argument (past_key_values -> cache); take whichever this version has
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens whose K/V the cache holds
        self.path = (
            "transformers"  # which forward runs: "fast" (target.fast.FastTarget) or transformers' eager one
        )
        self.path_note = "transformers eager forward"
        self.load_note = "transformers"  # how the weights were read (load_target sets it)

    @property
    def _embedding_table(self) -> torch.Tensor:
        """The input embedding's weight (a Module's attribute is `Tensor | Module` to a type checker)."""
        return cast(torch.Tensor, self.embed_tokens.weight)

    @property
    def device(self) -> torch.device:
        return self._embedding_table.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embedding_table.dtype

    def reserve(self, rows: int) -> None:
        """A hint that the next request needs `rows` cached tokens (a static cache allocates them once)."""

    def reset(self) -> None:
        from transformers import DynamicCache

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
        out = self.model(
            input_ids=ids.to(self.device).view(1, -1),
            use_cache=True,
            output_hidden_states=layer_ids is not None,
            **kwargs,
        )
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
            self.cache.crop(
                -drop
            )  # a negative count removes tokens, in every transformers version we support
            self.length = length
