"""Triton for the kernel tests: natively on CUDA, else in its interpreter (TRITON_INTERPRET=1, set here before
Triton is imported, and on Triton's knobs in case something imported it first). Import this before any kernel
module, and pass each kernel module the test imports through `fresh`."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
if not CUDA and hasattr(triton, "knobs"):
    triton.knobs.runtime.interpret = True
DEVICE = "cuda" if CUDA else "cpu"


def fresh(module: ModuleType) -> ModuleType:
    """The module, reloaded off CUDA so that its kernels are decorated in interpreter mode (it may have been
    imported in compiled mode by another test file)."""
    return module if CUDA else importlib.reload(module)
