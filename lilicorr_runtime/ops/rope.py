"""Rotary position embeddings, one implementation for the drafter and the target: the frequencies a drafter's
rope config gives, the cos/sin angles at positions, and the NeoX rotation (the two halves of each head rotated as
pairs). The tables are half a head wide ([..., hd/2]), as the Triton step kernel reads them
(ops/step_triton.py: `_rotate_rows`, the same rotation fused with the K/V write and the attention).

The drafter rotates in its weights' dtype with the angles rounded to it (as SGLang, vLLM and TensorRT-LLM compute
the DFlash backbone); the fast target rotates in fp32 and rounds once (ops/step.py: `rope_kv_reference`). Both
call `apply_rope`; only the dtype they hand it differs.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class RopeUnsupported(ValueError):
    pass


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin) for the draft's rope config.

    Supports the default rope, `linear` and `yarn` scaling; other types are refused rather than guessed.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    base = 1.0 / (theta**exponents)  # [head_dim/2]
    kind = None if not scaling else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return base.float(), 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    if kind == "linear":
        return (base / factor).float(), 1.0
    if kind == "yarn":
        return _yarn(base, head_dim, theta, factor, scaling, max_position_embeddings)
    raise RopeUnsupported(
        f"rope_scaling type {kind!r} is not supported by the reference runtime "
        "(supported: default, linear, yarn)"
    )


def _yarn(
    base: torch.Tensor,
    dim: int,
    theta: float,
    factor: float,
    scaling: dict[str, Any],
    max_position_embeddings: int,
) -> tuple[torch.Tensor, float]:
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


def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] (integer) -> fp32 cos, sin [..., hd/2], the attention scaling folded in."""
    freqs = positions.float()[..., None] * inv_freq.float()  # [..., hd/2]
    return freqs.cos() * scale, freqs.sin() * scale


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's angles: positions [n] (or [b, n], one row of positions per sequence) -> cos, sin [n, hd/2]
    ([b, 1, n, hd/2], broadcasting over the heads of x [b, heads, n, hd]), rounded to `dtype`."""
    cos, sin = rope_angles(positions, inv_freq, scale)
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    return cos.to(dtype), sin.to(dtype)


def rope_tables(inv_freq: torch.Tensor, scale: float, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's tables: fp32 cos and sin [positions, hd/2] of positions 0..positions-1, read by row (rope_kv)."""
    cos, sin = rope_angles(torch.arange(positions, device=inv_freq.device), inv_freq, scale)
    return cos.contiguous(), sin.contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., hd] rotated by cos/sin [..., hd/2] (broadcast against x's leading dimensions): NeoX halves, each
    pair (x_i, x_{i + hd/2}) turned by its angle, computed in the dtype of the inputs."""
    lo, hi = x.chunk(2, dim=-1)
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)
