"""Building blocks shared by the backbone and the head: Qwen3-style RMSNorm and rotary embeddings."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .ops import rms_norm


class RMSNorm(nn.Module):
    """Qwen3RMSNorm semantics (as training and TRT compute it): fp32 reduction, cast back, then x weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RopeUnsupported(ValueError):
    pass


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                             max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin) for the draft's rope config.

    Supports the default rope, `linear` and `yarn` scaling; other types are refused rather than guessed.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    base = 1.0 / (theta ** exponents)  # [head_dim/2]
    kind = None if not scaling else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return base.float(), 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return (base / factor).float(), 1.0
    if kind == "yarn":
        return _yarn(base, head_dim, theta, factor, scaling, max_position_embeddings)
    raise RopeUnsupported(f"rope_scaling type {kind!r} is not supported by the reference runtime "
                          "(supported: default, linear, yarn)")


def _yarn(base: torch.Tensor, dim: int, theta: float, factor: float, scaling: dict[str, Any],
          max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    # YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, ramp in between.
    original = int(scaling.get("original_max_position_embeddings") or max_position_embeddings)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1.0 - ramp  # 1 = extrapolate (keep the original frequency)
    inv_freq = (base / factor) * (1 - keep) + base * keep
    return inv_freq.float(), float(attention)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [n] (or [b, n], one row of positions per sequence) int64 -> cos, sin [n, head_dim] ([b, 1, n,
    head_dim], broadcasting over the heads), NeoX layout: the two halves repeat."""
    if positions.dim() == 2:
        cos, sin = rope_cos_sin(positions.reshape(-1), inv_freq, scale, dtype)
        shape = (positions.shape[0], 1, positions.shape[1], cos.shape[-1])
        return cos.view(shape), sin.view(shape)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [n, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, n, hd], cos/sin [n, hd] or [b, 1, n, hd]: NeoX rotation over the full head_dim."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
