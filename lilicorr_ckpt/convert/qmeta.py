"""Quantization metadata: what the source declares, what its tensors say, and what the output writes.

The tensors are the truth. ModelOpt's exclusion list is written for the wrapped training model
(`dflash_module.` names next to the target's own `model.*` / `lm_head`), so it is interpreted only to
report where it disagreed; the output's exclusions are recomputed from which modules are stored in
float.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.manifest import Manifest, legacy_name
from lilicorr_ckpt.checkpoint.quant import (
    TRAINING_PREFIXES,
    QuantConfig,
    parse_quant_config,
    strip_training_prefix,
    summarize_exclusions,
)
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.errors import ConversionRefused
from lilicorr_ckpt.runtimes import MATCHERS, excluded_by

NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
WEIGHT_KIND = {"U8": "nvfp4", "F8_E4M3": "fp8"}


class SourceQuant(msgspec.Struct, kw_only=True):
    algo: str | None
    group_size: int | None
    kv_cache_quant_algo: str | None
    producer: dict[str, Any] | None
    exclude: tuple[str, ...]
    forms: dict[str, str]  # file -> nested | flat


def quant_method(algo: str) -> str:
    return "modelopt_fp4" if "NVFP4" in algo or "FP4" in algo else "modelopt"


def read_source_quant(docs: dict[str, Any]) -> SourceQuant | None:
    """Merge config.json's quantization_config and hf_quant_config.json; refuse when they contradict."""
    parsed: dict[str, QuantConfig] = {}
    problems: list[str] = []
    for src, doc in docs.items():
        qc, issues = parse_quant_config(doc, src)
        problems += issues
        if qc is not None:
            parsed[src] = qc
    if problems:
        raise ConversionRefused("the source's quantization metadata cannot be interpreted", problems)
    if not parsed:
        return None
    algos = {qc.quant_algo for qc in parsed.values() if qc.quant_algo}
    if len(algos) > 1:
        raise ConversionRefused(
            "config.json and hf_quant_config.json name different quantization algorithms",
            [f"{src}: quant_algo {qc.quant_algo}" for src, qc in sorted(parsed.items())],
        )
    groups = {qc.group_size for qc in parsed.values() if qc.group_size}
    if len(groups) > 1:
        raise ConversionRefused(
            "config.json and hf_quant_config.json name different group sizes",
            [f"{src}: group_size {qc.group_size}" for src, qc in sorted(parsed.items())],
        )
    primary = parsed.get("hf_quant_config.json") or parsed["config.json"]
    producer = None
    for src in ("hf_quant_config.json", "config.json"):
        doc = docs.get(src)
        if isinstance(doc, dict) and isinstance(doc.get("producer"), dict):
            producer = doc["producer"]
            break
    exclude: list[str] = []
    for qc in parsed.values():
        exclude += [p for p in qc.exclude if p not in exclude]
    return SourceQuant(
        algo=next(iter(algos), None),
        group_size=next(iter(groups), None),
        kv_cache_quant_algo=primary.kv_cache_quant_algo,
        producer=producer,
        exclude=tuple(exclude),
        forms={src: qc.form for src, qc in sorted(parsed.items())},
    )


def module_state(tensors: dict[str, TensorInfo], module: str) -> str:
    """float | nvfp4 | fp8 | missing | other, from the (canonical) weight's dtype."""
    info = tensors.get(f"{module}.weight")
    if info is None:
        return "missing"
    if info.dtype in ("F16", "BF16", "F32", "F64"):
        return "float"
    return WEIGHT_KIND.get(info.dtype, "other")


def infer_algo(tensors: dict[str, TensorInfo], quantized: dict[str, str]) -> str:
    """The ModelOpt quant_algo the tensor layout implies (used only when no metadata names one)."""
    kinds = set(quantized.values())
    if kinds == {"nvfp4"}:
        with_input = [m for m in quantized if f"{m}.input_scale" in tensors]
        return "NVFP4" if with_input else "W4A16_NVFP4"
    scale_shapes = {
        len(tensors[f"{m}.weight_scale"].shape) for m in quantized if f"{m}.weight_scale" in tensors
    }
    if (
        scale_shapes <= {0}
        or scale_shapes == {0, 1}
        and all(
            tensors[f"{m}.weight_scale"].shape in ((), (1,))
            for m in quantized
            if f"{m}.weight_scale" in tensors
        )
    ):
        return "FP8"
    if scale_shapes == {4}:
        return "FP8_PB_WO"
    return "FP8_PER_CHANNEL_PER_TOKEN"


def infer_group_size(tensors: dict[str, TensorInfo], quantized: dict[str, str]) -> int | None:
    for module, kind in sorted(quantized.items()):
        w, s = tensors.get(f"{module}.weight"), tensors.get(f"{module}.weight_scale")
        if (
            kind == "nvfp4"
            and w is not None
            and s is not None
            and len(w.shape) == 2
            and len(s.shape) == 2
            and s.shape[1]
            and (w.shape[1] * 2) % s.shape[1] == 0
        ):
            return (w.shape[1] * 2) // s.shape[1]
    return None


class ExclusionReading(msgspec.Struct, kw_only=True):
    source: list[str]
    stripped: dict[str, str]  # original -> pattern without the training prefix
    dropped: dict[str, str]  # original -> why it does not describe the drafter
    kept: list[str]  # drafter-relative patterns, ModelOpt prefix-wildcard semantics


def read_exclusions(patterns: tuple[str, ...]) -> ExclusionReading:
    has_training = any(p.lstrip("*").startswith(TRAINING_PREFIXES) for p in patterns)
    stripped: dict[str, str] = {}
    dropped: dict[str, str] = {}
    kept: list[str] = []
    for p in patterns:
        body = p.lstrip("*")
        if body.startswith(TRAINING_PREFIXES):
            new = strip_training_prefix(p)
            stripped[p] = new
            kept.append(new)
        elif has_training:
            dropped[p] = "base-model name: ModelOpt lists the wrapped target's modules next to the drafter's"
        elif body.startswith("model."):
            dropped[p] = "base-model name (`model.` prefix): it describes the target, not the drafter"
        else:
            kept.append(p)
    return ExclusionReading(source=list(patterns), stripped=stripped, dropped=dropped, kept=kept)


def declared_excluded(modules: list[str], kept: list[str]) -> set[str]:
    """Modules the source's (stripped) exclusions name, with ModelOpt's fnmatch semantics."""
    return {m for m in modules if any(fnmatch.fnmatchcase(m, p) for p in kept)}


def _safe_everywhere(pattern: str, quantized: set[str], manifest: Manifest) -> bool:
    n_target = manifest.geometry.num_target_layers
    return not any(
        excluded_by(matcher, q, (pattern,), n_target).excluded for q in quantized for matcher in MATCHERS
    )


EMBED_EXCLUSION = "*embed_tokens*"


def _cover(module: str, patterns: list[str], quantized: set[str], manifest: Manifest) -> list[str]:
    """Patterns that exclude `module` under every release's matcher and no quantized module: the shortest safe
    `*suffix`, else the name itself, else the name and its `model.` form."""
    n_target = manifest.geometry.num_target_layers
    segments = module.split(".")
    candidates = [["*" + ".".join(segments[-k:])] for k in range(1, len(segments) + 1)]
    candidates += [[module], [module, "model." + module]]
    for candidate in candidates:
        if all(_safe_everywhere(p, quantized, manifest) for p in candidate) and all(
            excluded_by(matcher, module, tuple(patterns + candidate), n_target).excluded
            for matcher in MATCHERS
        ):
            return candidate
    raise ConversionRefused(
        f"no exclusion pattern excludes {module} under every runtime without excluding a quantized module",
        [f"dequantize the modules it shares a name with (--dequantize), or store {module} quantized"],
    )


def check_exclusions(
    patterns: list[str], float_modules: set[str], quantized: set[str], manifest: Manifest
) -> list[str]:
    """What every release's matcher gets wrong about `patterns`: a float module it would build quantized, or a
    quantized one it would build in float (each a load failure). Empty when they mean the same everywhere."""
    n_target = manifest.geometry.num_target_layers
    problems: list[str] = []
    for matcher in MATCHERS:
        for module in sorted(float_modules):
            if not excluded_by(matcher, module, tuple(patterns), n_target).excluded:
                problems.append(f"{matcher.display} would build {module} quantized (it is stored in float)")
        for module in sorted(quantized):
            hit = excluded_by(matcher, module, tuple(patterns), n_target)
            if hit.excluded:
                problems.append(
                    f"{matcher.display} would build {module} in float ({hit.pattern!r} excludes it; it is stored "
                    "quantized)"
                )
    return problems


def output_exclusions(
    manifest: Manifest,
    float_modules: set[str],
    quantized: set[str],
    naming: str,
    extra_float: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """Index-free suffix wildcards for every float module (fused aliases included); with sequential naming,
    patterns for the legacy head names too, so readers that build `feature_mlp.1` match them. `extra_float`: float
    linears the manifest lists as plain tensors (a sibling head's: DSpark's markov_head.markov_w2, which vLLM
    builds through the quant config). The result is checked against every release's matcher."""
    # the drafter has no embed_tokens (it reads the target's), but a runtime that builds one must not build it
    # quantized: ModelOpt's own drafter export excludes it by default, and so does this one
    patterns = sorted(set(summarize_exclusions(manifest, float_modules, quantized)) | {EMBED_EXCLUSION})
    for module in sorted(extra_float):
        patterns = sorted(set(patterns) | set(_cover(module, patterns, quantized, manifest)))
    problems = check_exclusions(patterns, float_modules | set(extra_float), quantized, manifest)
    if problems:
        uncovered = sorted(
            m
            for m in float_modules | set(extra_float)
            if not all(
                excluded_by(p, m, tuple(patterns), manifest.geometry.num_target_layers).excluded
                for p in MATCHERS
            )
        )
        kinds = sorted(
            {".".join("*" if part.isdigit() else part for part in m.split(".")) for m in uncovered}
        )
        fix = (
            "fix: the runtimes match some modules by kind, not by layer (SGLang builds a draft's decoder layers "
            "without their index; vLLM matches q/k/v and gate/up as one fused linear): store each kind in float "
            "in every layer or in none, e.g. " + " ".join(f"--dequantize '{k}'" for k in kinds[:3])
        )
        raise ConversionRefused(
            "the output's exclusions would not mean the same to every runtime release",
            problems + ([fix] if kinds else []),
        )
    if naming != "sequential":
        return patterns
    legacy = {m: legacy_name(m + ".weight")[: -len(".weight")] for m in sorted(float_modules)}
    legacy = {m: lm for m, lm in legacy.items() if lm != m}
    quantized_all = quantized | {legacy_name(q + ".weight")[: -len(".weight")] for q in quantized}
    extra: list[str] = []
    for lm in legacy.values():
        if any(fnmatch.fnmatchcase(lm, p) for p in patterns + extra):
            continue
        wildcard = "*" + lm.rsplit(".", 2)[-2] + "*"  # *feature_mlp*, or *mlp* for lattice layers
        if not any(fnmatch.fnmatchcase(q, wildcard) for q in quantized_all) and _safe_everywhere(
            wildcard, quantized, manifest
        ):
            extra.append(wildcard)
        else:
            extra.append(lm)
    return sorted(set(patterns) | set(extra))


def output_quant_docs(
    algo: str,
    group_size: int | None,
    kv_cache_quant_algo: str | None,
    producer: dict[str, Any] | None,
    exclude: list[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flat config.json quantization_config, nested hf_quant_config.json) for the output."""
    producer = dict(producer) if producer else {"name": "modelopt"}
    quantization: dict[str, Any] = {"quant_algo": algo, "kv_cache_quant_algo": kv_cache_quant_algo}
    if algo in NVFP4_ALGOS or group_size is not None:
        quantization["group_size"] = group_size or 16
    quantization["exclude_modules"] = list(exclude)
    nested = {"producer": producer, "quantization": quantization}
    flat: dict[str, Any] = {"quant_method": quant_method(algo), "quant_algo": algo}
    if "group_size" in quantization:
        flat["group_size"] = quantization["group_size"]
    flat["kv_cache_quant_algo"] = kv_cache_quant_algo
    flat["kv_cache_scheme"] = kv_cache_quant_algo
    flat["ignore"] = list(exclude)
    flat["producer"] = producer
    return flat, nested
