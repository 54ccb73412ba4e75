"""Tiny random targets (built from transformers configs, no downloads) and fixture drafters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lilicorr_ckpt import fixtures  # noqa: E402
from lilicorr_runtime import TargetModel, load_drafter  # noqa: E402

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def tiny_target(arch: str = "llama", *, vocab: int = 512, hidden: int = 64, layers: int = 4, seed: int = 0,
                boost: float = 4.0) -> TargetModel:
    """A random target whose lm_head favours tokens 0-3, so that random drafters get some blocks accepted
    (the drafter reads logits through the same lm_head) and the partial-acceptance paths run."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, vocab_size=vocab,
                        max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        model.lm_head.weight[:4] *= boost
    return TargetModel(model, None, ())


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory):
    """drafter_dir(config, **write_kwargs) -> a checkpoint directory, written once per distinct request."""
    made: dict[str, Path] = {}

    def make(config: dict[str, Any] | None = None, **kwargs: Any) -> Path:
        config = config if config is not None else fixtures.draft_config()
        key = json.dumps([config, {k: str(v) for k, v in sorted(kwargs.items())}], sort_keys=True)
        if key not in made:
            made[key] = fixtures.write_checkpoint(tmp_path_factory.mktemp("drafter"), config, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def drafter(drafter_dir):
    """drafter(config=None, **write_kwargs) -> a loaded fp32 Drafter."""

    def make(config: dict[str, Any] | None = None, **kwargs: Any):
        return load_drafter(drafter_dir(config, **kwargs))

    return make
