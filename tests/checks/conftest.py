from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures


@pytest.fixture
def ckpt(tmp_path):
    """ckpt(config=None, **write_checkpoint kwargs) -> a fresh checkpoint directory under tmp_path."""
    counter = itertools.count()

    def make(config=None, **kw) -> Path:
        return fixtures.write_checkpoint(tmp_path / f"ckpt{next(counter)}", config, **kw)

    return make
