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


def tiny_target(arch: str = "llama", *, vocab: int = 16, hidden: int = 64, layers: int = 4, seed: int = 0,
                init: float = 0.3) -> TargetModel:
    """A random target. The small vocabulary lets random drafters get blocks partly accepted, so the
    crop-after-rejection paths run; the wide init keeps its greedy continuations from collapsing into
    one repeated token."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, vocab_size=vocab,
                        max_position_embeddings=1024, tie_word_embeddings=False,
                        initializer_range=init)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = None  # HF generate must not stop early: tests compare fixed lengths
    return TargetModel(model, None, ())


def small_config(**kwargs: Any) -> dict[str, Any]:
    """fixtures.draft_config for the 16-token tiny targets (vocab 16, mask token 15)."""
    dflash = {"mask_token_id": 15, **kwargs.pop("dflash", {})}
    return fixtures.draft_config(vocab_size=kwargs.pop("vocab_size", 16), dflash=dflash, **kwargs)


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
