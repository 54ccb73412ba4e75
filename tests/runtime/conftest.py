"""Session fixtures: drafter checkpoints written once per distinct request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lilicorr_ckpt import fixtures  # noqa: E402
from lilicorr_ckpt.smoke.load import load_drafter  # noqa: E402


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory):
    """drafter_dir(config, **write_kwargs) -> a checkpoint directory, written once per distinct request."""
    made: dict[str, Path] = {}

    def make(config: dict[str, Any] | None = None, **kwargs: Any) -> Path:
        config = config if config is not None else fixtures.draft_config()
        if any(callable(v) for v in kwargs.values()):  # a mutate closure: its repr's address can be reused
            return fixtures.write_checkpoint(tmp_path_factory.mktemp("drafter"), config, **kwargs)
        key = json.dumps([config, {k: str(v) for k, v in sorted(kwargs.items())}], sort_keys=True)
        if key not in made:
            made[key] = fixtures.write_checkpoint(tmp_path_factory.mktemp("drafter"), config, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def drafter(drafter_dir):
    """drafter(config=None, load_dtype=torch.float32, runtime="all", **write_kwargs) -> a loaded Drafter
    (validated for `runtime`: an owned lm_head is refused for SGLang, Sequential names for vLLM)."""

    def make(
        config: dict[str, Any] | None = None, load_dtype: Any = None, runtime: str = "all", **kwargs: Any
    ):
        path = drafter_dir(config, **kwargs)
        if load_dtype is None:
            return load_drafter(path, runtime=runtime)
        return load_drafter(path, dtype=load_dtype, runtime=runtime)

    return make
