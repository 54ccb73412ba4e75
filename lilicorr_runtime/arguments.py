"""Argument normalisation shared by the public entry points: the dtype spellings and devices `load_drafter`
and `load_target` accept, and integer arguments."""

from __future__ import annotations

from typing import TypeVar

import torch

# the ops check their integer arguments with it too (ops/core.py, the lowest layer, defines it)
from .ops.core import as_int as as_int

T = TypeVar("T")

# name (lower case, an optional "torch." prefix stripped) -> dtype
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SPELLINGS = "float32 (fp32), bfloat16 (bf16) or float16 (fp16)"


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A supported torch.dtype from a torch.dtype or one of its names ("bfloat16", "bf16", "torch.float16", ...).

    Raises ValueError naming the value for anything else."""
    if isinstance(dtype, torch.dtype):
        if dtype in SUPPORTED_DTYPES:
            return dtype
        raise ValueError(
            f"dtype {dtype} is not supported; use torch.float32, torch.bfloat16 or torch.float16 "
            f"(or a name: {SPELLINGS})"
        )
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        key = key.removeprefix("torch.")
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
    raise ValueError(f"dtype must be a torch.dtype or a name: {SPELLINGS}; got {dtype!r}")


def known(value: T | None, what: str) -> T:
    """`value`, which the caller has already required to be present (a geometry size the loader refuses a checkpoint
    without), typed as present; ValueError naming `what` if it is None after all."""
    if value is None:
        raise ValueError(f"{what} is not set")
    return value


def resolve_device(device: str | torch.device) -> torch.device:
    """A torch.device this machine has; ValueError for a bad spelling or a CUDA device torch cannot see."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be a torch.device or a name such as 'cpu' or 'cuda:0'; got {device!r}"
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA devices")
    return dev
