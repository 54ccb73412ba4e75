from __future__ import annotations

import os
from pathlib import Path

import pytest

# Without a GPU, Triton kernels run in its interpreter. The choice is made when a function is decorated,
# including triton.language's own helpers, so it must be set before anything (transformers, torch)
# imports triton: here, the first conftest pytest loads.
if not any(Path("/dev").glob("nvidia[0-9]*")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lilicorr_ckpt import fixtures


@pytest.fixture
def make_ckpt(tmp_path):
    """make_ckpt(name="ckpt", config=None, **write_checkpoint kwargs) -> Path"""
    def make(name: str = "ckpt", config=None, **kw):
        return fixtures.write_checkpoint(tmp_path / name, config, **kw)
    return make
