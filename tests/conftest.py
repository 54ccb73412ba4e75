from __future__ import annotations

import pytest

from lilicorr_ckpt import fixtures


@pytest.fixture
def make_ckpt(tmp_path):
    """make_ckpt(name="ckpt", config=None, **write_checkpoint kwargs) -> Path"""
    def make(name: str = "ckpt", config=None, **kw):
        return fixtures.write_checkpoint(tmp_path / name, config, **kw)
    return make
