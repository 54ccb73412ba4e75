"""Torch dequantizers with the names and signatures of lilicorr_ckpt.checkpoint.numerics (the numpy ones, which
the tests hold these to): NVFP4 weight = E2M1 code value x e4m3 block scale x weight_scale_2; FP8 weight = e4m3
value x its scale (a scalar, one per output channel, or one per 128x128 block)."""

from __future__ import annotations

import numpy as np
import torch

from lilicorr_ckpt.checkpoint.numerics import e2m1_decode

# E2M1 code -> value, numerics' decoding of the 16 codes (code 8, -0, decodes to +0 as in ModelOpt)
E2M1_VALUES = torch.from_numpy(e2m1_decode(np.arange(16, dtype=np.uint8)))


def nvfp4_dequantize(
    packed: torch.Tensor, scale_codes: torch.Tensor, scale_2: torch.Tensor | float, group_size: int = 16
) -> torch.Tensor:
    """uint8 [o, i/2] (element 2j in the low nibble), e4m3 block scales [o, i/group], fp32 scalar -> fp32 [o, i]."""
    o, half = packed.shape
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(o, 2 * half).long()
    values = E2M1_VALUES.to(packed.device)[codes]  # [o, i]
    block = scale_codes.float() * torch.as_tensor(scale_2, dtype=torch.float32).reshape(())  # [o, i/group]
    return (values.view(o, -1, group_size) * block[..., None]).reshape(o, 2 * half)


def fp8_dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [o, i] with a scalar, per-channel [o] / [o, 1] or 128x128-block [o/128, 1, i/128, 1] scale."""
    w = codes.float()
    s = scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 4:
        o, i = w.shape
        blocks = s.reshape(s.shape[0], s.shape[2])  # [ceil(o/128), ceil(i/128)]
        full = blocks.repeat_interleave(128, 0).repeat_interleave(128, 1)[:o, :i]
        return w * full
    return w * s.reshape(-1)[:, None]
