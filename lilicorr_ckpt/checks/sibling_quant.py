"""The quantization of a sibling head's linears (LC305, LC307): the ones a loader builds through the draft's quant
config, which the manifest lists as plain tensors (so the per-module rules in quantization.py never see them).

Each family's QUANT_LINEARS (lilicorr_ckpt/families) names, per engine, the head linears its loader builds through
the quant config and the config layout that selects that class: vLLM builds DSpark's `markov_head.markov_w2` as a
ParallelLMHead with the draft's quant config (served as `model.markov_head.markov_w2`), SGLang only in the
Nemotron-3.5 layout (Nemotron35VanillaMarkov's ReplicatedLinear; VanillaMarkov's nn.Linear otherwise). Stored in
float and matched by no exclusion as that release matches it (runtimes.excluded_by), such a linear is built
quantized and the float weight meets a packed NVFP4 or FP8 parameter (LC307). Built NVFP4, its in_features (the
Markov rank) must be a multiple of the group size, whatever it is stored as: the build refuses it otherwise
(LC305). Stored quantized, such a linear is judged per release (quantized_siblings): in the layout the scheme builds
where that release builds it quantized (LC208 otherwise), refused where it builds it in float (LC209)."""

from __future__ import annotations

from typing import Any

from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.context import names as _names
from lilicorr_ckpt.checks.quantization import copy_read_by
from lilicorr_ckpt.families import FAMILIES
from lilicorr_ckpt.runtimes import RuntimeProfile, excluded_by

FLOAT_DTYPES = ("F32", "BF16", "F16")


QUANTIZED_DTYPES = ("U8", "F8_E4M3")


def _table(ctx: Context) -> Any:
    family = ctx.geometry.family
    return FAMILIES[family].QUANT_LINEARS if family is not None and family in FAMILIES else {}


def quantized_sibling_linears(ctx: Context) -> tuple[str, ...]:
    """The sibling-head linears some engine builds through the quant config (QUANT_LINEARS) whose weight is
    stored quantized (the manifest lists them as float tensors: coverage.py leaves them to quantized_siblings)."""
    modules = sorted({module for rows in _table(ctx).values() for module, _, _ in rows})
    return tuple(
        m
        for m in modules
        if (info := ctx.names.by_canonical.get(f"{m}.weight")) is not None and info.dtype in QUANTIZED_DTYPES
    )


@check
def quantized_siblings(ctx: Context) -> None:
    """LC208 / LC209: a sibling linear stored quantized, per release: where the release builds it through the quant
    config (QUANT_LINEARS, matched by no exclusion) the stored layout must be the one that scheme builds (the packed
    weight and its scales); where it builds it in float (another layout's class, an exclusion, no quantization),
    the packed weight meets a float parameter and its scales have none."""
    modules = quantized_sibling_linears(ctx)
    if not modules:
        return
    family = ctx.geometry.family
    table = _table(ctx)
    archs = ctx.parsed.raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    for module in modules:
        expected = ctx.manifest.tensors.get(f"{module}.weight")
        stored = ctx.names.by_canonical[f"{module}.weight"]
        if expected is None or len(expected.shape) != 2:
            continue
        found: dict[tuple[str, str], list[RuntimeProfile]] = {}
        for p in ctx.profiles:
            if family is None or p.sibling_route(family, arch)[0] == "refuses":
                continue
            qc = copy_read_by(ctx, p)
            read = qc.read_by(p) if qc is not None and qc.quant_algo is not None else None
            row = next(
                (
                    (where, selects)
                    for m, selects, where in table.get(p.engine_id, ())
                    if m == module and (selects is None or selects(ctx.parsed.raw))
                ),
                None,
            )
            scheme = read.scheme_for(module) if read is not None and row is not None else None
            excluded = (
                read is not None
                and excluded_by(p, module, read.exclude, ctx.geometry.num_target_layers).excluded
            )
            if scheme is None or excluded or row is None:
                why = (
                    "excludes it from quantization"
                    if excluded
                    else "builds it as a float linear"
                    + ("" if read is None else " (not through the quant config, in this layout)")
                )
                found.setdefault(
                    (
                        "LC209",
                        f"`{module}.weight` is stored quantized ({stored.dtype} {list(stored.shape)}) but {{who}} "
                        f"{why}: the packed weight meets a float [{expected.shape[0]}, {expected.shape[1]}] "
                        "parameter and its scales have none",
                    ),
                    [],
                ).append(p)
                continue
            problem = _layout_problem(ctx, module, scheme, expected.shape)
            if problem:
                found.setdefault(
                    ("LC208", f"`{module}` is built {scheme.algo} by {{who}} ({row[0]}) but {problem}"), []
                ).append(p)
        for (rule_id, text), profiles in found.items():
            verb = "builds|build" if rule_id == "LC208" else ""
            who = _names(profiles, verb) if verb else _names(profiles)
            ctx.emit_for(
                rule_id,
                profiles,
                text.replace("{who}", who),
                pointer=f"{module}.weight",
                subjects=[f"{module}.weight"],
                file=stored.file,
            )


def _layout_problem(ctx: Context, module: str, scheme: Any, shape: tuple[int, ...]) -> str:
    """What in the stored quantized layout of `module` differs from what `scheme` builds for a [out, in] linear."""
    out, inn = shape
    present = ctx.names.by_canonical
    weight = present[f"{module}.weight"]
    want = (out, inn // 2) if scheme.packed else (out, inn)
    if weight.dtype != scheme.weight_dtype or tuple(weight.shape) != want:
        return f"its weight is {weight.dtype} {list(weight.shape)} where {scheme.weight_dtype} {list(want)} is built"
    scale = present.get(f"{module}.weight_scale")
    if scale is None:
        return "its weight_scale is absent"
    if scheme.nvfp4 and tuple(scale.shape) != (out, inn // scheme.group_size):
        return f"its weight_scale is {list(scale.shape)} where {[out, inn // scheme.group_size]} is built"
    for leaf, needed in (("weight_scale_2", scheme.weight_scale_2), ("input_scale", scheme.input_scale)):
        if needed and f"{module}.{leaf}" not in present:
            return f"its {leaf} is absent"
    return ""


@check
def sibling_quantization(ctx: Context) -> None:
    family = ctx.geometry.family
    table = FAMILIES[family].QUANT_LINEARS if family is not None and family in FAMILIES else {}
    if family is None or not table:
        return
    archs = ctx.parsed.raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    # (rule, module, served name, the loader's statement, detail, the config read) -> the releases it holds for
    found: dict[tuple[str, str, str, str, str, str], list[RuntimeProfile]] = {}
    for p in ctx.profiles:
        if p.sibling_route(family, arch)[0] == "refuses":  # LC014 says so; its linears are never built
            continue
        qc = copy_read_by(ctx, p)
        if qc is None or qc.quant_algo is None:
            continue
        read = qc.read_by(p)
        for module, selects, where in table.get(p.engine_id, ()):
            if selects is not None and not selects(ctx.parsed.raw):
                continue
            stored = ctx.names.by_canonical.get(f"{module}.weight")
            expected = ctx.manifest.tensors.get(f"{module}.weight")
            scheme = read.scheme_for(module)
            if stored is None or expected is None or scheme is None:
                continue
            exclusion = excluded_by(p, module, read.exclude, ctx.geometry.num_target_layers)
            if exclusion.excluded:
                continue
            if stored.dtype in FLOAT_DTYPES:
                consequence = (
                    "the float weight meets its packed NVFP4 parameter and the load fails"
                    if scheme.nvfp4
                    else "the float weight is cast into its FP8 parameter and served with scales at their "
                    "initial values"
                )
                found.setdefault(
                    ("LC307", module, exclusion.prefix, where, consequence, qc.source), []
                ).append(p)
            in_features = expected.shape[-1]
            if scheme.nvfp4 and in_features % scheme.group_size:
                detail = f"in_features {in_features} % {scheme.group_size} != 0"
                found.setdefault(("LC305", module, exclusion.prefix, where, detail, qc.source), []).append(p)
    for (rule_id, module, served, where, detail, source), profiles in found.items():
        if rule_id == "LC307":
            text = (
                f"`{module}` is stored in float but {_names(profiles, 'builds|build')} it quantized and no "
                f"exclusion matches it as `{served}` ({where}): {detail}"
            )
        else:
            text = (
                f"`{module}` is built NVFP4 by {_names(profiles)} ({where}) but its {detail}: no NVFP4 "
                "layer can be built for it (the model build refuses it); exclude it"
            )
        ctx.emit_for(
            rule_id,
            profiles,
            text,
            pointer=module,
            subjects=[f"{module}.weight"],
            file=source if rule_id == "LC307" else None,
        )
