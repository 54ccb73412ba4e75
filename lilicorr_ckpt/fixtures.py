"""Synthetic drafter checkpoints, generated through the manifest (tests, examples, benchmarks).

    from lilicorr_ckpt import fixtures
    cfg = fixtures.draft_config(conv=(4, 16))
    fixtures.write_checkpoint(tmp_path / "ckpt", cfg, quant="NVFP4")

Values are deterministic: each tensor is drawn from a generator seeded by (seed, tensor name).
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
from lilicorr_ckpt.checkpoint.manifest import Manifest, build_manifest, legacy_name, quant_scheme
from lilicorr_ckpt.checkpoint.numerics import bf16_bits, e4m3_encode, nvfp4_quantize
from lilicorr_ckpt.checkpoint.quant import summarize_exclusions
from lilicorr_ckpt.checkpoint.stwrite import Entry, write_file, write_sparse
from lilicorr_ckpt.families import FAMILIES, SIBLINGS
from lilicorr_ckpt.runtimes import PROFILES, fused_name

Tensors = dict[str, tuple[str, tuple[int, ...], bytes]]  # name -> (dtype, shape, raw bytes)

NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "U8": np.uint8,
    "I64": np.int64,
    "I32": np.int32,
}
TORCH_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def draft_config(
    *,
    head: bool = True,
    conv: tuple[int, int] | None = None,
    own_lm_head: bool = False,
    architecture: str | None = None,
    dflash: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A small, valid draft config.json as ModelOpt's LiLiCorrExporter writes it (override anything)."""
    cfg: dict[str, Any] = {
        "architectures": [architecture or ("LiLiCorrDraftModel" if head else "DFlashDraftModel")],
        "model_type": "qwen3",
        "block_size": 8,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_target_layers": 4,
        "layer_types": ["full_attention", "full_attention"],
        "dflash_config": {
            "mask_token_id": 511,
            "target_layer_ids": [0, 2],
            "block_size": 8,
            "causal": False,
        },
    }
    if head:
        cfg["dflash_config"].update(
            {
                "projector_type": "lilicorr",
                "lilicorr_enabled": True,
                "lilicorr_candidate_topk": 4,
                "lilicorr_hidden_size": 32,
                "lilicorr_num_layers": 2,
                "lilicorr_num_heads": 4,
                "lilicorr_mlp_ratio": 2.0,
                "lilicorr_factor_dim": 16,
                "lilicorr_vector_eps": 1e-6,
                "lilicorr_logit_scale": 10.0,
            }
        )
    if conv:
        cfg["dflash_config"]["conv_kernel_size"], cfg["dflash_config"]["conv_group_size"] = conv
    if own_lm_head:
        cfg["has_own_lm_head"] = True
    cfg["dflash_config"].update(dflash or {})
    for key, value in top.items():
        cfg[key] = value
    if "num_hidden_layers" in top and "layer_types" not in top:
        cfg["layer_types"] = ["full_attention"] * int(top["num_hidden_layers"])
    return cfg


# every published sibling-head layout, from the families' FIXTURES (name -> draft_config arguments)
_SIBLING_FIXTURES: dict[str, Mapping[str, Any]] = {
    name: arguments for family in SIBLINGS for name, arguments in FAMILIES[family].FIXTURES.items()
}
SIBLING_LAYOUTS = tuple(_SIBLING_FIXTURES)


def sibling_config(layout: str, **top: Any) -> dict[str, Any]:
    """A small, valid sibling-head draft config in one published layout (override anything at the top level).
    The layouts are the families' FIXTURES (lilicorr_ckpt/families: each is described there):

    - `dflash2`: DFlash2DraftModel, grouped convolutions plus the candidate selector (rank 8, top-k 4);
    - `dspark-deepspec`, `dspark-specforge`, `dspark-modelopt`: DeepSpec's served layout, SpecForge's, and
      Model-Optimizer's flat names (which no serving loader read accepts);
    - `domino`: DFlashDraftModel + projector_type "domino", prefix GRU and embed_proj (Gh 16, E 8).
    """
    if layout not in _SIBLING_FIXTURES:
        raise ValueError(f"unknown sibling layout {layout!r}; one of {', '.join(SIBLING_LAYOUTS)}")
    cfg = draft_config(**copy.deepcopy(dict(_SIBLING_FIXTURES[layout])))
    cfg.update(top)
    return cfg


def qwen3_8b_drafter_config(layers: int = 5) -> dict[str, Any]:
    """Full-size geometry of the paper's Qwen3-8B drafter (head width 1024, K 8, 2 head layers, B 16)."""
    return draft_config(
        hidden_size=4096,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        num_target_layers=36,
        block_size=16,
        rope_theta=1e6,
        dflash={
            "block_size": 16,
            "mask_token_id": 151669,
            "target_layer_ids": [1, 9, 17, 25, 33],
            "lilicorr_candidate_topk": 8,
            "lilicorr_hidden_size": 1024,
            "lilicorr_num_layers": 2,
            "lilicorr_num_heads": 8,
            "lilicorr_mlp_ratio": 2.0,
            "lilicorr_factor_dim": 1024,
        },
    )


def manifest_for(config: dict[str, Any]) -> Manifest:
    parsed = parse_config(json.dumps(config).encode())
    return build_manifest(resolve_geometry(parsed.config))


def _values(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or (leaf == "weight" and ".feature_norm" in name):
        return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("base_kernel"):
        # identity at tap 0 plus noise, as training initialises it
        out = 0.05 * rng.standard_normal(shape)
        out[:, 0, :] += 1.0
        return out.astype(np.float32)
    std = 0.02 if leaf in ("bias", "in_proj_bias") else 0.5 / np.sqrt(shape[-1] if shape else 1)
    return (std * rng.standard_normal(shape)).astype(np.float32)


def encode(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return bf16_bits(values).tobytes()
    return np.ascontiguousarray(values, dtype=NUMPY_DTYPES[dtype]).tobytes()


# modules any of the three stacks may load quantized (see lilicorr_ckpt/runtimes/); the default NVFP4 set
def servable_quantized(manifest: Manifest, group_size: int = 16) -> set[str]:
    return {
        m
        for m, mod in manifest.modules.items()
        if all(p.may_quantize(m, manifest.geometry.family) for p in PROFILES.values())
        and mod.in_features % group_size == 0
    }


# what ModelOpt's presets quantize in a drafter: every linear it can (all but the lm_head)
def modelopt_quantized(manifest: Manifest, group_size: int = 16) -> set[str]:
    return {m for m, mod in manifest.modules.items() if m != "lm_head" and mod.in_features % group_size == 0}


def checkpoint_tensors(
    config: dict[str, Any],
    *,
    dtype: str = "BF16",
    seed: int = 0,
    quant: str | None = None,
    quantize: set[str] | None = None,
    naming: str = "named",
    unify_fused: bool = True,
) -> Tensors:
    """Every tensor the manifest expects, optionally with `quantize` modules in the `quant` format. With
    `unify_fused` the NVFP4 shards of a linear the runtimes fuse (q/k/v, gate/up) share one weight_scale_2, as a
    serving checkpoint must (what `convert` writes); without it each shard is quantized alone, as ModelOpt's
    drafter exporter writes them (its fused-layer pass never reaches a draft)."""
    manifest = manifest_for(config)
    if manifest.incomplete:
        raise ValueError(f"config is incomplete for a fixture: {manifest.incomplete}")
    scheme = quant_scheme(quant) if quant else None
    if quant and scheme is None:
        raise ValueError(f"unsupported quant algo {quant!r}")
    quantize = (servable_quantized(manifest) if quantize is None else quantize) if scheme else set()
    shared = (
        fused_global_amax(manifest, quantize, seed)
        if scheme is not None and scheme.nvfp4 and unify_fused
        else {}
    )
    out: Tensors = {}
    for name, expected in manifest.tensors.items():
        values = _values(name, expected.shape, seed)
        module = expected.module
        if scheme and module in quantize and name == f"{module}.weight":
            out.update(_quantized(module, values, scheme, seed, shared.get(module)))
            continue
        out[name] = (dtype, expected.shape, encode(values, dtype))
    if naming == "sequential":
        out = {legacy_name(n): v for n, v in out.items()}
    return out


def fused_global_amax(manifest: Manifest, quantize: set[str], seed: int = 0) -> dict[str, float]:
    """module -> the weight amax its fused group (q/k/v, gate/up) shares: one NVFP4 weight_scale_2 per group."""
    shared: dict[str, float] = {}
    for shards in _fused_groups(quantize):
        amax = max(
            float(np.abs(_values(f"{m}.weight", manifest.tensors[f"{m}.weight"].shape, seed)).max())
            for m in shards
        )
        shared.update(dict.fromkeys(shards, amax))
    return shared


def _fused_groups(quantized: set[str]) -> list[tuple[str, ...]]:
    """The quantized modules a runtime fuses into one linear, each group complete (q/k/v, gate/up per layer)."""
    groups: dict[str, list[str]] = {}
    for module in quantized:
        fused = fused_name(module)
        if fused is not None and all(s in quantized for s in fused[1]):
            groups.setdefault(fused[0], list(fused[1]))
    return [tuple(g) for g in groups.values()]


def _quantized(
    module: str, weight: np.ndarray, scheme: Any, seed: int, global_amax: float | None = None
) -> Tensors:
    out: Tensors = {}
    o, i = weight.shape
    if scheme.nvfp4:
        packed, scales, scale_2 = nvfp4_quantize(weight, scheme.group_size, global_amax)
        out[f"{module}.weight"] = ("U8", (o, i // 2), packed.tobytes())
        out[f"{module}.weight_scale"] = ("F8_E4M3", (o, i // scheme.group_size), scales.tobytes())
        out[f"{module}.weight_scale_2"] = ("F32", (), np.float32(scale_2).tobytes())
    else:
        if scheme.weight_scale == "scalar":
            scale = np.float32(max(np.abs(weight).max(), 1e-12) / 448.0)
            codes = e4m3_encode(weight / scale)
            out[f"{module}.weight_scale"] = ("F32", (), scale.tobytes())
        else:
            scale = (np.maximum(np.abs(weight).max(axis=1), 1e-12) / 448.0).astype(np.float32)
            codes = e4m3_encode(weight / scale[:, None])
            out[f"{module}.weight_scale"] = ("F32", (o,), scale.tobytes())
        out[f"{module}.weight"] = ("F8_E4M3", (o, i), codes.tobytes())
    if scheme.input_scale:
        out[f"{module}.input_scale"] = ("F32", (), np.float32(0.01 + 0.001 * (seed % 7)).tobytes())
    return out


def quant_metadata(
    manifest: Manifest, quant: str, quantized: set[str], style: str = "serving", group_size: int = 16
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json quantization_config, hf_quant_config.json) as the serving stacks want them
    (`style="serving"`) or as ModelOpt's spec exporter writes them (`style="modelopt"`)."""
    excluded = set(manifest.modules) - quantized
    if style == "modelopt":
        exclude = sorted(
            {"dflash_module." + m for m in excluded} | {"lm_head", "model.embed_tokens", "model.layers.*"}
        )
    else:
        exclude = summarize_exclusions(manifest, excluded, quantized)
    nested = {
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {
            "quant_algo": quant,
            "kv_cache_quant_algo": None,
            "group_size": group_size,
            "exclude_modules": exclude,
        },
    }
    if style == "modelopt":
        return copy.deepcopy(nested), nested
    flat = {
        "quant_method": "modelopt_fp4" if "NVFP4" in quant else "modelopt",
        "quant_algo": quant,
        "group_size": group_size,
        "kv_cache_quant_algo": None,
        "ignore": exclude,
        "producer": {"name": "modelopt", "version": "0.47.0"},
    }
    return flat, nested


def save(
    path: Path,
    config: dict[str, Any],
    tensors: Tensors,
    *,
    shards: int = 1,
    hf_quant_config: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write config.json, the safetensors file(s) (+ index when sharded) and hf_quant_config.json."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if hf_quant_config is not None:
        (path / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=2) + "\n")
    meta = {"format": "pt", **(metadata or {})}
    if shards <= 1:
        write_file(path / "model.safetensors", tensors, meta)
        return path
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    for k in range(shards):
        part = names[k::shards]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_file(path / fname, {n: tensors[n] for n in part}, meta)
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(len(v[2]) for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return path


def write_checkpoint(
    path: Path,
    config: dict[str, Any] | None = None,
    *,
    dtype: str = "BF16",
    seed: int = 0,
    quant: str | None = None,
    quantize: set[str] | None = None,
    style: str = "serving",
    naming: str = "named",
    shards: int = 1,
    key_prefix: str = "",
    mutate: Callable[[Tensors], None] | None = None,
) -> Path:
    """A complete checkpoint directory. `style="modelopt"` reproduces ModelOpt's export quirks:
    nested quantization_config without quant_method, training-prefixed exclusions, every quantizable linear
    quantized (factor heads and q/k/v included), and the NVFP4 shards of each fused linear quantized alone
    (their weight_scale_2 differ)."""
    config = copy.deepcopy(config if config is not None else draft_config())
    if dtype in TORCH_DTYPE_NAMES:
        config["torch_dtype"] = TORCH_DTYPE_NAMES[dtype]
    manifest = manifest_for(config)
    hf_quant = None
    if quant:
        if quantize is None:
            quantize = modelopt_quantized(manifest) if style == "modelopt" else servable_quantized(manifest)
        qc, hf_quant = quant_metadata(manifest, quant, quantize, style)
        config["quantization_config"] = qc
    tensors = checkpoint_tensors(
        config,
        dtype=dtype,
        seed=seed,
        quant=quant,
        quantize=quantize,
        naming=naming,
        unify_fused=style != "modelopt",
    )
    if key_prefix:
        tensors = {key_prefix + n: v for n, v in tensors.items()}
    if mutate is not None:
        mutate(tensors)
    return save(path, config, tensors, shards=shards, hf_quant_config=hf_quant)


def write_sparse_checkpoint(path: Path, config: dict[str, Any], dtype: str = "BF16") -> Path:
    """A full-size checkpoint whose tensor data are file holes: real headers, no disk blocks."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    manifest = manifest_for(config)
    write_sparse(
        path / "model.safetensors",
        [Entry(n, dtype, t.shape) for n, t in manifest.tensors.items()],
        {"format": "pt"},
    )
    return path
