"""Validate, then build: the one place a checkpoint is judged before the reference runtime builds it."""

from __future__ import annotations

from pathlib import Path

import torch

from lilicorr_ckpt.checkpoint import Checkpoint, load_checkpoint
from lilicorr_ckpt.checks.run import require_valid
from lilicorr_ckpt.errors import CheckpointInvalid, UsageError
from lilicorr_ckpt.report.validate import finding_lines
from lilicorr_ckpt.runtimes import select_profiles
from lilicorr_runtime.arguments import resolve_device, resolve_dtype
from lilicorr_runtime.model.drafter import Drafter
from lilicorr_runtime.model.load import CheckpointRefused, build_drafter


def _check_runtime(runtime: object) -> None:
    """A runtime selection as validate takes it; UsageError (naming the supported releases) otherwise."""
    if not isinstance(runtime, str):
        raise UsageError(f"runtime must be a runtime selection such as 'all' or 'vllm'; got {runtime!r}")
    select_profiles(runtime)


def build_valid_drafter(
    checkpoint: Checkpoint,
    *,
    runtime: str = "all",
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> Drafter:
    """The drafter of a checkpoint validate accepts for `runtime`; CheckpointRefused (validate's error lines)
    otherwise."""
    _check_runtime(runtime)
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    try:
        require_valid(checkpoint, runtime)
    except CheckpointInvalid as exc:
        lines = [line for f in exc.report.findings if f.severity == "error" for line in finding_lines(f)]
        raise CheckpointRefused(f"{exc.summary[:-1]}:\n" + "\n".join(lines)) from None
    return build_drafter(checkpoint, dtype, device)


def load_drafter(
    path: str | Path,
    *,
    runtime: str = "all",
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> Drafter:
    """Read a checkpoint, refuse it as validate does for `runtime` (sglang, vllm, trtllm or all), and build its
    drafter. dtype: a torch.dtype or a name (float32/fp32, bfloat16/bf16, float16/fp16). Either one out of range
    raises ValueError."""
    _check_runtime(runtime)
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    return build_valid_drafter(load_checkpoint(str(path)), runtime=runtime, dtype=dtype, device=device)
