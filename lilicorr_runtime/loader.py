"""Load a drafter checkpoint through the manifest, strictly: whatever `validate` refuses for the
selected runtime profile is refused here too, with the same error lines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from lilicorr_ckpt.profiles import RUNTIME_CHOICES
from lilicorr_ckpt.report import finding_lines
from lilicorr_ckpt.rules import name_view, observed_scheme_of
from lilicorr_ckpt.validate import load_checkpoint, validate

from .arguments import resolve_device, resolve_dtype
from .dflash import Drafter, backbone_spec
from .layers import RopeUnsupported

# E2M1 code -> value: sign bit 3, magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


class CheckpointRefused(Exception):
    """The checkpoint fails validation for the selected runtime profile (message: validate's error lines)."""


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """uint8 [o, i/2] (element 2j in the low nibble), e4m3 block scales [o, i/g], fp32 scalar -> fp32 [o, i]."""
    o, half = packed.shape
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(o, 2 * half).long()
    values = E2M1_VALUES.to(packed.device)[codes]
    groups = scales.shape[1]
    block = scales.float() * scale_2.float().reshape(())  # [o, groups]
    return (values.view(o, groups, -1) * block[..., None]).reshape(o, 2 * half)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [o, i] with a scalar, per-channel [o] or 128x128-block [o/128, 1, i/128, 1] scale."""
    w = weight.float()
    s = scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 1:
        return w * s[:, None]
    o, i = w.shape
    blocks = s.reshape(s.shape[0], s.shape[2])  # [o/128, i/128]
    return (w.view(o // 128, 128, i // 128, 128) * blocks[:, None, :, None]).reshape(o, i)


def load_drafter(path: str | Path, *, runtime: str = "all", dtype: torch.dtype | str = torch.float32,
                 device: str | torch.device = "cpu") -> Drafter:
    """Build the drafter a checkpoint describes and load its tensors (quantized weights dequantized).

    runtime: the validate profile the checkpoint must pass (sglang, vllm, trtllm or all); dtype: a torch.dtype
    or a name (float32/fp32, bfloat16/bf16, float16/fp16). Either one out of range raises ValueError."""
    if not isinstance(runtime, str) or runtime not in RUNTIME_CHOICES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIME_CHOICES)}; got {runtime!r}")
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    ckpt = load_checkpoint(str(path))
    report = validate(str(path), runtime=runtime, checkpoint=ckpt)
    if report.summary.errors:
        lines = [line for f in report.findings if f.severity == "error" for line in finding_lines(f)]
        raise CheckpointRefused(f"{path} is refused for runtime {runtime!r}:\n" + "\n".join(lines))
    manifest = ckpt.manifest
    if manifest.family_prefixes:
        # the sibling heads (DFlash2, DSpark, Domino) are not implemented: running only their backbone
        # would silently compute a different drafter
        raise CheckpointRefused(f"{path}: {ckpt.parsed.config.architecture} carries a {ckpt.geometry.family} head, "
                                "which the reference runtime does not implement (LiLiCorr and plain DFlash only)")
    if manifest.incomplete:
        raise CheckpointRefused(f"{path}: geometry is incomplete: {manifest.incomplete}")
    try:
        drafter = Drafter(ckpt.geometry, backbone_spec(ckpt.parsed.config, ckpt.geometry.num_layers or 0))
    except RopeUnsupported as e:
        raise CheckpointRefused(f"{path}: {e}") from None

    view = name_view(ckpt.table)
    by_file: dict[str, list[str]] = defaultdict(list)
    for canonical, info in view.by_canonical.items():
        by_file[info.file].append(canonical)
    raw: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with safe_open(str(ckpt.source.root / file), framework="pt") as f:
            for canonical in names:
                raw[canonical] = f.get_tensor(view.actual[canonical])

    state: dict[str, torch.Tensor] = {}
    for name, expected in manifest.tensors.items():
        module = expected.module
        if module is not None and name == f"{module}.weight":
            kind = observed_scheme_of(view, module)
            if kind == "nvfp4":
                state[name] = dequantize_nvfp4(raw[name], raw[f"{module}.weight_scale"],
                                               raw[f"{module}.weight_scale_2"])
                continue
            if kind == "fp8":
                state[name] = dequantize_fp8(raw[name], raw[f"{module}.weight_scale"])
                continue
        state[name] = raw[name].float()
    # a NaN or infinite weight (from a corrupt scale, or stored so) would decode silently to garbage tokens
    broken = [name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if broken:
        shown = ", ".join(broken[:5]) + (f" and {len(broken) - 5} more" if len(broken) > 5 else "")
        raise CheckpointRefused(f"{path}: NaN or infinite values in {shown} (for a quantized module: a NaN, infinite "
                                "or corrupt scale); `lilicorr-ckpt validate --deep` lists them")
    # activations are not fake-quantized: input_scale tensors are validated but unused
    drafter.load_state_dict(state, strict=True)
    return drafter.place(dtype, device).eval()
