"""Drafter configs for a target, a Drafter built straight from one, and the export in the layout NVIDIA
ModelOpt's LiLiCorr exporter writes: config.json (Qwen3-style, a `dflash_config` with the eight `lilicorr_*`
keys, the top-level `block_size` and no nested one) and one model.safetensors whose head tensors carry the
training module's Sequential names (`feature_mlp.0/1/3`, `layers.N.mlp.0/2`). `lilicorr-ckpt convert`
turns it into the layout the serving stacks load."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from msgspec import Struct
from safetensors.torch import save_file

from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
from lilicorr_ckpt.checkpoint.manifest import legacy_name
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_runtime.model.drafter import Drafter, backbone_spec


class DrafterShape(Struct, frozen=True, kw_only=True):
    """The drafter's own choices; everything else is copied from the target."""

    num_layers: int = 1
    intermediate_size: int | None = None  # None: the target's
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = ()  # () -> spread over the target's layers
    mask_token_id: int = 0
    candidate_topk: int = 8
    head_hidden_size: int = 256
    head_num_layers: int = 2
    head_num_heads: int = 4
    head_mlp_ratio: float = 2.0
    head_factor_dim: int = 256
    vector_eps: float = 1e-6
    logit_scale: float = 8.0


def spread_taps(num_target_layers: int, count: int = 5) -> tuple[int, ...]:
    """`count` tap layers spread evenly from layer 1 to the one below the last. The last layer is never tapped:
    SGLang captures layer i's hidden state as layer i+1's input, so it has no feature for the last layer and
    refuses such a drafter."""
    high = max(num_target_layers - 2, 0)
    low = min(1, high)
    return tuple(sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)}))


def drafter_config(target_config: Any, shape: DrafterShape) -> dict[str, Any]:
    """config.json for a LiLiCorr drafter of `target_config` (a transformers text config), ModelOpt style."""
    t = target_config
    hidden = t.hidden_size
    heads = t.num_attention_heads
    taps = list(shape.target_layer_ids or spread_taps(t.num_hidden_layers))
    rope_theta = getattr(t, "rope_theta", None)
    if rope_theta is None:
        rope_theta = (getattr(t, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return {
        "architectures": ["LiLiCorrDraftModel"],
        "model_type": "qwen3",
        "block_size": shape.block_size,
        "hidden_size": hidden,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(t, "num_key_value_heads", None) or heads,
        "head_dim": getattr(t, "head_dim", None) or hidden // heads,
        "intermediate_size": shape.intermediate_size or t.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": float(t.rms_norm_eps),
        "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": float(rope_theta),  # the target's: never a default
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_target_layers": t.num_hidden_layers,
        "layer_types": ["full_attention"] * shape.num_layers,
        "dflash_config": {
            "mask_token_id": shape.mask_token_id,
            "target_layer_ids": taps,
            "causal": False,
            "projector_type": "lilicorr",
            "lilicorr_enabled": True,
            "lilicorr_candidate_topk": shape.candidate_topk,
            "lilicorr_hidden_size": shape.head_hidden_size,
            "lilicorr_num_layers": shape.head_num_layers,
            "lilicorr_num_heads": shape.head_num_heads,
            "lilicorr_mlp_ratio": shape.head_mlp_ratio,
            "lilicorr_factor_dim": shape.head_factor_dim,
            "lilicorr_vector_eps": shape.vector_eps,
            "lilicorr_logit_scale": shape.logit_scale,
        },
    }


def build_drafter(config: dict[str, Any]) -> Drafter:
    """A freshly initialised Drafter for a config.json dict (fp32, on the CPU)."""
    parsed = parse_config(json.dumps(config).encode())
    if parsed.issues:
        raise ValueError("drafter config is invalid: " + "; ".join(i.describe() for i in parsed.issues))
    geometry = resolve_geometry(parsed.config)
    return Drafter(geometry, backbone_spec(parsed.config, geometry.num_layers or 0))


EXPORT_FILES = ("config.json", "model.safetensors")


class OutputExists(ValueError):
    """The export directory exists and holds something that is not an earlier export."""


def _check_output(out_dir: Path) -> None:
    """An existing OUT is replaced only when it is empty or holds nothing but an earlier export's two files; a
    missing OUT is made, so none of its parents may be a file."""
    for parent in out_dir.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputExists(f"{out_dir}: {parent} is a file, not a directory; choose another --out")
            break
    if not (out_dir.exists() or out_dir.is_symlink()):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise OutputExists(f"{out_dir} exists and is not a directory")
    others = sorted(
        e.name + ("/" if e.is_dir(follow_symlinks=False) else "")
        for e in os.scandir(out_dir)
        if e.name not in EXPORT_FILES or not e.is_file(follow_symlinks=False)
    )
    if others:
        raise OutputExists(
            f"{out_dir} holds {shorten(others, 4, quote='')}, which an export did not write; export replaces only an "
            "earlier export (config.json and model.safetensors): choose another --out"
        )


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def normal_mode(path: Path) -> None:
    """0666 less the umask (safetensors writes its files 0600), as any other file the user makes."""
    os.chmod(path, 0o666 & ~_umask())


def export_modelopt(
    drafter: Drafter, config: dict[str, Any], out_dir: str | Path, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Write config.json + model.safetensors as ModelOpt's LiLiCorr exporter does, atomically (a sibling
    temporary directory renamed into place). An existing OUT must be empty or an earlier export."""
    out_dir = Path(out_dir)
    _check_output(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # unpredictable names, created by this process alone (mkdtemp: mode 0700, O_EXCL semantics): nothing planted
    # beside OUT can be written through or removed
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:100]}.export-", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        tensors = {}
        for name, value in drafter.state_dict().items():
            stored = (
                legacy_name(f"lilicorr.{name[len('lilicorr.') :]}") if name.startswith("lilicorr.") else name
            )
            tensors[stored] = value.detach().to("cpu", dtype).contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        normal_mode(tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:100]}.old-", dir=out_dir.parent))
            out_dir.rename(old)  # onto the empty directory mkdtemp made
            tmp.rename(out_dir)
            shutil.rmtree(old)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
