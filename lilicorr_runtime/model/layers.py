"""The RMSNorm module shared by the backbone and the head (Qwen3RMSNorm semantics)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.draft import rms_norm


class RMSNorm(nn.Module):
    """Qwen3RMSNorm semantics (as training and TRT compute it): fp32 reduction, cast back, then x weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
