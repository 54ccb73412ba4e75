"""Shared by the runtime tests: tiny random targets built from transformers configs (no downloads),
drafter configs that match them, and a chi-square test."""

from __future__ import annotations

from typing import Any

import torch
import transformers

from lilicorr_ckpt import fixtures
from lilicorr_runtime import TargetModel

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def tiny_target(
    arch: str = "llama",
    *,
    vocab: int = 16,
    hidden: int = 64,
    layers: int = 4,
    seed: int = 0,
    init: float = 0.3,
) -> TargetModel:
    """A random target. The small vocabulary lets random drafters get blocks partly accepted, so the
    crop-after-rejection paths run; the wide init keeps its greedy continuations from collapsing into
    one repeated token."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=init,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = (
        None  # HF generate must not stop early: tests compare fixed lengths
    )
    return TargetModel(model, None, ())


def small_config(**kwargs: Any) -> dict[str, Any]:
    """fixtures.draft_config for the 16-token tiny targets (vocab 16, mask token 15)."""
    dflash = {"mask_token_id": 15, **kwargs.pop("dflash", {})}
    return fixtures.draft_config(vocab_size=kwargs.pop("vocab_size", 16), dflash=dflash, **kwargs)


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's test; cells with tiny expectation are pooled so the chi-square approximation holds."""
    n = observed.sum()
    expected = expected_probs.double() * n
    big = expected >= 5
    obs = torch.cat([observed.double()[big], observed.double()[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
