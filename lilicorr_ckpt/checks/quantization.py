"""Quantization rules (LC3xx): metadata forms, each runtime's reading of it, and every module's stored state."""

from __future__ import annotations

import re

from lilicorr_ckpt.checkpoint.manifest import KV_SCALE_SUFFIXES, QUANT_SUFFIXES, ExpectedTensor, quant_scheme
from lilicorr_ckpt.checkpoint.names import observed_scheme as observed_scheme_of
from lilicorr_ckpt.checkpoint.quant import MATCHERS, QuantConfig, excluded_by, pattern_problems
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.profiles import matches_any

# ---------------------------------------------------------------- catalogue
QNT = "quantization"
rule("LC301", "quant-config-disagree", "error", QNT, "hf_quant_config.json and config.json quantization_config disagree.",
     "Make both describe the same algorithm, group size and exclusions (`lilicorr-ckpt convert` rewrites both).")
rule("LC302", "quant-method", "error", QNT, "config.json quantization_config has no quant_method the runtime can use.",
     'Write the flat form with "quant_method": "modelopt_fp4" (NVFP4) or "modelopt" (FP8).')
rule("LC303", "quant-config-keys", "error", QNT, "The nested quantization form lacks keys vLLM requires.",
     "Write group_size, kv_cache_quant_algo and exclude_modules (null is allowed).")
rule("LC304", "quant-tensors", "error", QNT, "A quantized module lacks a scale tensor, or a scale/weight has the wrong dtype or shape.",
     "Re-export the module with its weight, weight_scale, weight_scale_2 (and input_scale for W4A4).")
rule("LC305", "nvfp4-in-features", "error", QNT, "An NVFP4 module's in_features is not a multiple of the group size.",
     "Exclude the module from quantization.")
rule("LC306", "must-be-float", "error", QNT, "A module the runtime builds unquantized (or whose raw weight it slices) is stored quantized.",
     "Exclude it from quantization and store it in the model dtype (`lilicorr-ckpt convert` repairs it).",
     doc="""Some modules are always built as plain floating-point layers by the runtime, whatever the quantization
config says (the LiLiCorr head's small projections, norms, fc), or the runtime slices their raw weight
(e.g. splitting a fused projection by rows). A packed NVFP4 weight (uint8, two values per byte) or an FP8
weight then meets a float parameter of twice (or the same) width and a different dtype: the loader
refuses the checkpoint with a shape or dtype mismatch, or, where it copies bytes, loads garbage.

Example: `lilicorr.feature_mlp.up_proj.weight` stored as U8 [R, F/2] with weight_scale / weight_scale_2,
while vLLM builds feature_mlp unquantized: the load fails on the [R, F] float parameter.""")
rule("LC307", "unprotected-float", "error", QNT, "A module stored in float that the runtime would build quantized (no exclusion matches it).",
     "Add an exclusion pattern that matches the module as the runtime names it (index-free, e.g. `*self_attn.q_proj`).")
rule("LC308", "excluded-but-quantized", "error", QNT, "An excluded or float module ships quantized weights or scale tensors.",
     "Drop the scales (the lm_head.input_scale trap) or remove the module from the exclusions.")
rule("LC309", "float-not-excluded", "warning", QNT, "A module the runtime always builds in float is not in the exclusions.",
     "List it in `ignore`/`exclude_modules` so other readers agree.")
rule("LC310", "exclusion-pattern", "warning", QNT, "An exclusion pattern no runtime can match as written (training prefix, layer index, base-model name).",
     "Strip training prefixes, drop base-model names and use index-free suffix wildcards.")
rule("LC311", "quant-without-metadata", "error", QNT, "Quantized tensors but no quantization metadata.",
     "Write hf_quant_config.json and config.json quantization_config.")
rule("LC312", "quant-algo", "error", QNT, "The quantization algorithm is missing or not one the drafter loaders support.",
     "Use NVFP4, W4A16_NVFP4 or FP8.")
rule("LC313", "fused-shards-disagree", "error", QNT, "The exclusions name some but not all parts of a fused module.",
     "Exclude all of q/k/v (gate/up) or none.")
rule("LC314", "quant-unconfirmed", "warning", QNT, "A quantized module whose quantized loading is not confirmed for this runtime.",
     "Keep it in the model dtype, or test the runtime yourself.")
rule("LC315", "w4a16-input-scale", "warning", QNT, "A W4A16 module ships an input_scale the runtime has no parameter for.",
     "Drop input_scale for weight-only NVFP4.")
rule("LC316", "quant-config-unreadable", "error", QNT, "A quantization config cannot be interpreted.",
     "Write the nested ModelOpt form in hf_quant_config.json and the flat form in config.json.")
rule("LC317", "quant-unused", "warning", QNT, "Quantization metadata is present but no tensor is quantized.",
     "Remove the metadata, or export the quantized weights.")
rule("LC318", "kv-cache-scales", "warning", QNT, "KV-cache scales (k_scale / v_scale) without FP8 KV-cache quantization declared.",
     "Declare kv_cache_quant_algo, or drop the k_scale / v_scale tensors.")
rule("LC320", "flat-exclusions-key", "error", QNT,
     "The flat quantization_config lists its exclusions under `exclude_modules`, but the runtime reads only `ignore` "
     "from the flat form: it would build the float modules quantized.",
     "Rename `exclude_modules` to `ignore` in config.json's quantization_config (keep `exclude_modules` in "
     "hf_quant_config.json).")
rule("LC321", "flat-group-size", "error", QNT,
     "The flat quantization_config has no top-level group_size, and the runtime's default (16) differs from the "
     "group size the weights were quantized with.",
     "Write the group size at the top level of config.json's quantization_config.")
rule("LC324", "flat-group-size-missing", "error", QNT,
     "The flat NVFP4 quantization_config gives no group size (neither top-level group_size nor config_groups' "
     "weights), which the runtime refuses (\"requires group_size\").",
     "Write the group size at the top level of config.json's quantization_config.")
rule("LC319", "hf-quant-config-missing", "warning", QNT, "config.json declares quantization but hf_quant_config.json is absent.",
     "Write hf_quant_config.json (the nested ModelOpt form) beside config.json; some readers only look there.")

rule("LC322", "quant-method-missing", "warning", QNT,
     "config.json quantization_config has no quant_method; this runtime derives one, others may not.",
     'Write the flat form with "quant_method": "modelopt_fp4" (NVFP4) or "modelopt" (FP8).')
rule("LC323", "exclusion-unmatched", "info", QNT,
     "An exclusion pattern matches no module of this drafter under any runtime (a base-model or training-time name).",
     "Nothing to do unless it was meant to exclude a drafter module.")



# ---------------------------------------------------------------- checks


def observed_scheme(ctx: Context, module: str) -> str:
    return observed_scheme_of(ctx.names, module)


def _expected_quant_form(ctx: Context, module: str, kind: str) -> dict[str, ExpectedTensor] | None:
    qc = ctx.quant
    scheme = qc.scheme_for(module) if qc else None  # the declared layout wins over what is on disk
    if scheme is None:
        scheme = quant_scheme("NVFP4" if kind == "nvfp4" else "FP8")
    assert scheme is not None
    return ctx.manifest.quantized_form(module, scheme)




def _module_group(module: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", module)


@check
def quantization(ctx: Context) -> None:
    m = ctx.manifest
    for src, problems in ctx.quant_problems.items():
        for problem in problems:
            ctx.emit("LC316", problem, file=src)
    docs = ctx.quant_configs
    if "config.json" in docs and "hf_quant_config.json" in docs:
        a, b = docs["config.json"], docs["hf_quant_config.json"]
        diffs = []
        if a.quant_algo != b.quant_algo:
            diffs.append(f"quant_algo {a.quant_algo} vs {b.quant_algo}")
        if (a.group_size or 16) != (b.group_size or 16):
            diffs.append(f"group_size {a.group_size} vs {b.group_size}")
        if set(a.exclude) != set(b.exclude):
            only_a, only_b = sorted(set(a.exclude) - set(b.exclude)), sorted(set(b.exclude) - set(a.exclude))
            diffs.append(f"exclusions differ (only in config.json: {only_a[:4]}, only in hf_quant_config.json: "
                         f"{only_b[:4]})")
        if diffs:
            ctx.emit("LC301", "hf_quant_config.json and config.json quantization_config disagree: " + "; ".join(diffs),
                     file="config.json", pointer="$.quantization_config")
    if "config.json" in docs and "hf_quant_config.json" not in docs and "hf_quant_config.json" not in ctx.quant_problems:
        ctx.emit("LC319", "config.json has a quantization_config but there is no hf_quant_config.json",
                 file="hf_quant_config.json")
    qc = ctx.quant
    quantized = {mod: observed_scheme(ctx, mod) for mod in m.modules}
    quantized = {mod: s for mod, s in quantized.items() if s in ("nvfp4", "fp8")}
    if qc is None:
        if quantized:
            ctx.emit("LC311", f"{len(quantized)} modules hold quantized weights ({shorten(sorted(quantized), 3)}) "
                     "but there is no quantization_config / hf_quant_config.json: \"Packed or FP8 LiLiCorr weights "
                     "require quantization metadata\"", subjects=sorted(quantized))
        return
    _quant_config_form(ctx, qc)
    if qc.quant_algo is None:
        ctx.emit("LC312", f"{qc.source} names no quant_algo", file=qc.source)
        return
    if qc.quant_algo != "MIXED_PRECISION" and quant_scheme(qc.quant_algo) is None:
        ctx.emit("LC312", f"quant_algo {qc.quant_algo} is not one the drafter loaders support", file=qc.source,
                 expected="NVFP4 | W4A16_NVFP4 | FP8", actual=qc.quant_algo)
        return
    if not quantized:
        ctx.emit("LC317", f"{qc.source} declares {qc.quant_algo} but no tensor is quantized", file=qc.source)
    for pattern in qc.exclude:
        problems = pattern_problems(pattern)
        if "training_prefix" in problems:
            ctx.emit("LC310", f"exclusion `{pattern}` keeps a training prefix; no runtime matches it",
                     file=qc.source, subjects=[pattern])
        elif "layer_index" in problems:
            ctx.emit("LC310", f"exclusion `{pattern}` names a layer index; vLLM renumbers draft layers "
                     "(model.layers.{num_target_layers+i}) and a glob like `layers.1*` also hits layers.1x",
                     file=qc.source, subjects=[pattern])
        elif not any(excluded_by(matcher, module, (pattern,), m.geometry.num_target_layers).excluded
                     for module in m.modules for matcher in MATCHERS):
            ctx.emit("LC323", f"exclusion `{pattern}` matches no module of this drafter under any runtime "
                     "(a base-model or training-time name?)", file=qc.source, subjects=[pattern])
    _module_states(ctx, qc, quantized)


def _quant_config_form(ctx: Context, qc: QuantConfig) -> None:
    cfg_qc = ctx.quant_configs.get("config.json")
    if cfg_qc is not None and cfg_qc.quant_method is None:
        derivers = [p for p in ctx.profiles if p.nested_quant_method_algos is not None]
        failing = [p for p in derivers if cfg_qc.form == "flat"
                   or cfg_qc.producer != "modelopt" or cfg_qc.quant_algo not in (p.nested_quant_method_algos or ())]
        others = [p for p in ctx.profiles if p.nested_quant_method_algos is None]
        if failing:
            ctx.emit_for("LC302", failing, f"config.json quantization_config ({cfg_qc.form} form, {cfg_qc.quant_algo}) "
                         "has no quant_method and vLLM cannot derive one (\"Unknown ModelOpt quant algo\")",
                         file="config.json", pointer="$.quantization_config.quant_method")
        if others or (derivers and not failing):
            ctx.emit_for("LC322", others + ([] if failing else derivers),
                         f"config.json quantization_config ({cfg_qc.form} form) has no quant_method; "
                         "write the flat form with one", file="config.json",
                         pointer="$.quantization_config.quant_method")
    hf_qc = ctx.quant_configs.get("hf_quant_config.json")
    if cfg_qc is None and "config.json" not in ctx.quant_problems and hf_qc is not None and hf_qc.quant_method is None:
        # config.json has no quantization_config: vLLM reads hf_quant_config.json and derives quant_method only
        # for some algorithms
        failing = [p for p in ctx.profiles if p.reads_hf_quant_config and p.nested_quant_method_algos is not None
                   and (hf_qc.form == "flat" or hf_qc.producer != "modelopt"
                        or hf_qc.quant_algo not in p.nested_quant_method_algos)]
        ctx.emit_for("LC302", failing, f"config.json has no quantization_config and hf_quant_config.json "
                     f"({hf_qc.form} form, {hf_qc.quant_algo}, producer {hf_qc.producer}) has no quant_method: vLLM "
                     f"derives one only for modelopt {', '.join(failing[0].nested_quant_method_algos or ())} "
                     "(\"Unknown ModelOpt quant algo\")" if failing else "", file="hf_quant_config.json",
                     pointer="$.quant_method")
    if cfg_qc is not None and cfg_qc.form == "flat":
        _flat_form_reading(ctx, cfg_qc)
    for src, doc in ctx.quant_configs.items():
        if doc.form == "nested" and doc.missing_keys and doc.quant_algo and "NVFP4" in doc.quant_algo:
            ctx.emit_for("LC303", [p for p in ctx.profiles if p.nested_form_keys_required],
                         f"{src}: the nested form lacks {list(doc.missing_keys)}", file=src)


def _flat_form_reading(ctx: Context, qc: QuantConfig) -> None:
    """What the runtimes that read only part of the flat form see (SGLang and vLLM read `ignore` only; vLLM the
    top-level group_size, default 16; SGLang the top level or config_groups, no default)."""
    if qc.exclude_key == "exclude_modules" and qc.exclude:
        readers = [p for p in ctx.profiles if p.flat_exclusions_key not in (None, "exclude_modules")]
        for key in sorted({p.flat_exclusions_key for p in readers if p.flat_exclusions_key}):
            mine = [p for p in readers if p.flat_exclusions_key == key]
            ctx.emit_for("LC320", mine, f"config.json quantization_config (flat form) lists {len(qc.exclude)} "
                         f"exclusions under `exclude_modules` and has no `{key}`: "
                         f"{' and '.join(p.display for p in mine)} reads `{key}` only, so it sees no exclusion and "
                         "would build every float module quantized", file="config.json",
                         pointer=f"$.quantization_config.{key}", expected=f"`{key}`", actual="`exclude_modules`")
    scheme = qc.scheme_for("") if qc.quant_algo != "MIXED_PRECISION" else None
    if scheme is None or not scheme.nvfp4 or qc.top_group_size is not None:
        return
    if qc.nested_group_size is None:
        strict = [p for p in ctx.profiles if p.flat_group_size_required]
        ctx.emit_for("LC324", strict, "config.json quantization_config (flat form) gives no group size: "
                     + " and ".join(p.display for p in strict) + " refuses NVFP4 without one (\"requires "
                     "group_size\")", file="config.json", pointer="$.quantization_config.group_size",
                     expected="group_size", actual="absent")
    hf_qc = ctx.quant_configs.get("hf_quant_config.json")
    intended = qc.nested_group_size or (hf_qc.group_size if hf_qc is not None else None)
    for p in ctx.profiles:
        default = p.flat_group_size_default
        if default is None or intended is None or intended == default:
            continue
        where = ("config_groups.group_0.weights" if qc.nested_group_size else "hf_quant_config.json")
        ctx.emit("LC321", f"config.json quantization_config (flat form) has no top-level group_size: {p.display} "
                 f"uses {default}, but the group size is {intended} (in {where}), so every NVFP4 weight_scale "
                 f"fails its [out, in/{default}] shape", runtimes=[p.name], file="config.json",
                 pointer="$.quantization_config.group_size", expected=intended, actual="absent")


def _module_states(ctx: Context, qc: QuantConfig, quantized: dict[str, str]) -> None:
    m, present = ctx.manifest, ctx.names.by_canonical
    n_target = ctx.geometry.num_target_layers
    grouped: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    notes: dict[tuple[str, str, tuple[str, ...]], str] = {}

    def note(rule_id: str, module: str, runtimes: list[str], detail: str = "") -> None:
        key = (rule_id, _module_group(module), tuple(runtimes))
        grouped.setdefault(key, []).append(module)
        if detail:
            notes.setdefault(key, detail)

    kv = [f"{mod}.{s}" for mod in m.modules for s in KV_SCALE_SUFFIXES if f"{mod}.{s}" in present]
    if kv and not qc.kv_cache_quant_algo:
        ctx.emit("LC318", f"{len(kv)} KV-cache scale tensors ({shorten(kv, 3)}) but {qc.source} sets no "
                 "kv_cache_quant_algo", subjects=kv)
    for module, mod in m.modules.items():
        state = observed_scheme(ctx, module)
        if state == "missing" or mod.component in m.incomplete:
            continue
        scales = [s for s in QUANT_SUFFIXES if f"{module}.{s}" in present]
        scheme = qc.scheme_for(module)
        if state in ("nvfp4", "fp8"):
            _scale_tensors(ctx, module, state)
            if state == "nvfp4" and scheme is not None and mod.in_features % scheme.group_size:
                note("LC305", module, [], f"in_features {mod.in_features} % {scheme.group_size} != 0")
        elif scales:
            ctx.emit("LC308", f"`{module}` is stored in float but ships {', '.join(scales)}: runtimes that build it "
                     f"unquantized have no parameter for them (the lm_head.input_scale trap)",
                     pointer=module, subjects=[f"{module}.{s}" for s in scales])
        for p in ctx.profiles:
            forced = matches_any(module, p.float_forced)
            required = matches_any(module, p.float_required)
            exclusion = excluded_by(p.exclusion_matcher, module, qc.read_by(p).exclude, n_target)
            if exclusion.conflict:
                note("LC313", module, [p.name], exclusion.conflict)
            if state in ("nvfp4", "fp8"):
                if forced or required:
                    note("LC306", module, [p.name])
                elif scheme is None:
                    note("LC308", module, [p.name], f"{qc.quant_algo} in {qc.source} does not quantize it")
                elif exclusion.excluded:
                    note("LC308", module, [p.name], f"`{exclusion.pattern}` matches it as `{exclusion.prefix}`")
                elif not p.may_quantize(module):
                    note("LC314", module, [p.name])
            elif state == "float":
                would_quantize = scheme is not None and not forced and not exclusion.excluded
                if would_quantize:
                    note("LC307", module, [p.name], f"{p.display} names it `{exclusion.prefix}`")
                elif (forced or required) and not exclusion.excluded and scheme is not None:
                    note("LC309", module, [p.name])

    messages = {
        "LC305": "NVFP4 needs in_features divisible by the group size",
        "LC306": "must stay floating point for this runtime (it builds the module unquantized whatever the quant "
                 "config says, or slices its raw weight), but is stored quantized",
        "LC307": "is stored in float but the runtime would build it quantized: no exclusion matches it",
        "LC308": "is excluded from quantization but stored quantized: the runtime builds a float layer and the "
                 "packed weight fails its shape check",
        "LC309": "is always built in float by the runtime but is not in the exclusions",
        "LC313": "",
        "LC314": "is quantized, and this runtime's support for that is not confirmed",
    }
    merged: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for (rule_id, group, runtimes), modules in grouped.items():
        # fold runtimes that flag the same modules into one finding
        key = (rule_id, group, tuple(sorted(modules)))
        merged.setdefault(key, []).extend(runtimes)
    for (rule_id, group, modules), runtimes in merged.items():
        detail = next((notes[k] for k in notes if k[0] == rule_id and k[1] == group), "")
        label = group if len(modules) > 1 else modules[0]
        count = f" ({len(modules)} modules)" if len(modules) > 1 else ""
        text = f"`{label}`{count} {messages[rule_id]}".rstrip()
        if rule_id == "LC313":
            text = f"`{label}`: {detail}"
        elif detail:
            text += f" ({detail})"
        if label.startswith("lm_head") and rule_id == "LC307":
            text += "; a bf16 owned head must be listed in the exclusions"
        ctx.emit(rule_id, text, pointer=label, runtimes=sorted(set(runtimes)), subjects=list(modules),
                 file=qc.source if rule_id in ("LC307", "LC309") else None)


def _scale_tensors(ctx: Context, module: str, state: str) -> None:
    present = ctx.names.by_canonical
    form = _expected_quant_form(ctx, module, state)
    assert form is not None
    for name, tensor in form.items():
        info = present.get(name)
        if info is None:
            if name.endswith(".input_scale"):
                ctx.emit("LC304", f"`{module}` is quantized with activation scaling but has no input_scale "
                         "(static formats without it degrade silently or fail with KeyError)",
                         pointer=name, subjects=[name])
            else:
                ctx.emit("LC304", f"`{module}` is quantized but `{name}` is missing", pointer=name, subjects=[name])
            continue
        if info.dtype not in tensor.dtypes or not tensor.shape_ok(info.shape):
            ctx.emit("LC304", f"`{name}` is {info.dtype} {list(info.shape)}, expected "
                     f"{'/'.join(sorted(tensor.dtypes))} {list(tensor.shape)}", file=info.file, pointer=name,
                     expected=f"{'/'.join(sorted(tensor.dtypes))} {list(tensor.shape)}",
                     actual=f"{info.dtype} {list(info.shape)}", subjects=[name])
    extra = [f"{module}.{s}" for s in QUANT_SUFFIXES if f"{module}.{s}" in present and f"{module}.{s}" not in form]
    for name in extra:
        if name.endswith("input_scale"):
            ctx.emit("LC315", f"`{name}` is present but the scheme is weight-only", pointer=name, subjects=[name])
        else:
            ctx.emit("LC304", f"`{name}` does not belong to the {state} layout", pointer=name, subjects=[name])
