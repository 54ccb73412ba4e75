"""Build the drafter a checkpoint describes and load its tensors through the manifest (quantized weights
dequantized). Judging the checkpoint is not done here: the caller validates first (lilicorr_ckpt.smoke.load)."""

from __future__ import annotations

from collections import defaultdict

import torch
from safetensors import safe_open

from lilicorr_ckpt.checkpoint import Checkpoint
from lilicorr_ckpt.checkpoint.names import observed_scheme
from lilicorr_ckpt.checkpoint.numerics import scale_defects
from lilicorr_ckpt.checkpoint.text import shorten

from ..arguments import resolve_device, resolve_dtype
from ..ops.core import RopeUnsupported
from .codecs import fp8_dequantize, nvfp4_dequantize
from .drafter import Drafter, backbone_spec

SCALES = ("weight_scale", "weight_scale_2")  # the scales dequantization reads (input_scale is unused)


class CheckpointRefused(Exception):
    """The checkpoint cannot be served: validate refuses it for the runtime profile, or the reference runtime
    cannot build what it describes (message: what was found and what to do)."""


def build_drafter(
    checkpoint: Checkpoint, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu"
) -> Drafter:
    """The drafter of a checkpoint already read (and, by the caller, validated)."""
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    ckpt, label = checkpoint, checkpoint.source.label
    manifest = ckpt.manifest
    if manifest.family_prefixes:
        # the sibling heads (DFlash2, DSpark, Domino) are not implemented: running only their backbone
        # would silently compute a different drafter
        raise CheckpointRefused(
            f"{label}: {ckpt.parsed.config.architecture} carries a {ckpt.geometry.family} head, "
            "which the reference runtime does not implement (LiLiCorr and plain DFlash only)"
        )
    if manifest.incomplete:
        raise CheckpointRefused(f"{label}: geometry is incomplete: {manifest.incomplete}")
    if ckpt.geometry.draft_vocab_size is not None:
        # its drafter scores over the target's vocabulary: a reduced draft head and its d2t map are not built
        raise CheckpointRefused(
            f"{label}: a reduced draft vocabulary (draft_vocab_size {ckpt.geometry.draft_vocab_size} of "
            f"{ckpt.geometry.vocab_size}), which the reference runtime does not implement"
        )
    try:
        drafter = Drafter(ckpt.geometry, backbone_spec(ckpt.parsed.config, ckpt.geometry.num_layers or 0))
    except RopeUnsupported as e:
        raise CheckpointRefused(f"{label}: {e}") from None

    view = ckpt.names
    by_file: dict[str, list[str]] = defaultdict(list)
    for canonical, info in view.by_canonical.items():
        by_file[info.file].append(canonical)
    raw: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with safe_open(str(ckpt.source.root / file), framework="pt") as f:
            for canonical in names:
                raw[canonical] = f.get_tensor(view.actual[canonical])

    # numerics' scale policy, as validate --deep and convert's repairs apply it
    bad_scales = [
        f"{key} ({defects.describe()})"
        for key in sorted(raw)
        if key.rpartition(".")[2] in SCALES and (defects := scale_defects([raw[key].float().numpy()]))
    ]
    if bad_scales:
        raise CheckpointRefused(
            f"{label}: quantization scales that are NaN, infinite, negative or all zero: "
            f"{shorten(bad_scales, 5, quote='')}; `lilicorr-ckpt validate --deep` lists them"
        )
    state: dict[str, torch.Tensor] = {}
    for name, expected in manifest.tensors.items():
        module = expected.module
        if module is not None and name == f"{module}.weight":
            kind = observed_scheme(view, module)
            if kind == "nvfp4":
                scales = raw[f"{module}.weight_scale"]
                state[name] = nvfp4_dequantize(
                    raw[name],
                    scales,
                    raw[f"{module}.weight_scale_2"],
                    raw[name].shape[1] * 2 // scales.shape[1],
                )
                continue
            if kind == "fp8":
                state[name] = fp8_dequantize(raw[name], raw[f"{module}.weight_scale"])
                continue
        state[name] = raw[name].float()
    # a NaN or infinite weight (stored so, or scales whose product overflows) would decode to garbage tokens
    broken = [name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if broken:
        raise CheckpointRefused(
            f"{label}: NaN or infinite values in {shorten(broken, 5, quote='')}; "
            "`lilicorr-ckpt validate --deep` lists them"
        )
    # activations are not fake-quantized: input_scale tensors are validated but unused
    drafter.load_state_dict(state, strict=True)
    return drafter.place(dtype, device).eval()
