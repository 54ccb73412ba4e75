"""Quantization rules (LC3xx): metadata forms, each runtime's reading of it, and every module's stored state."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from lilicorr_ckpt.checkpoint.manifest import (
    KV_SCALE_SUFFIXES,
    QUANT_SUFFIXES,
    ExpectedTensor,
    QuantScheme,
    quant_scheme,
)
from lilicorr_ckpt.checkpoint.names import observed_scheme as observed_scheme_of
from lilicorr_ckpt.checkpoint.numerics import decode, e4m3_decode, e4m3_encode
from lilicorr_ckpt.checkpoint.quant import QuantConfig, pattern_problems
from lilicorr_ckpt.checkpoint.readfile import open_regular_file
from lilicorr_ckpt.checkpoint.tensors import TensorInfo, read_f32_scalars
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.context import names as _names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.runtimes import MATCHERS, RuntimeProfile, excluded_by, fused_name, matches_any

# ---------------------------------------------------------------- catalogue
QNT = "quantization"
rule(
    "LC301",
    "quant-config-disagree",
    "warning",
    QNT,
    "hf_quant_config.json and config.json quantization_config disagree; runtimes that read different copies see different quantization.",
    "Make both describe the same algorithm, group size and exclusions (`lilicorr-ckpt convert` rewrites both).",
    doc="When both config.json's `quantization_config` and hf_quant_config.json are present and readable, "
    "compares them and fires when the algorithm (`quant_algo`), the group size (absent counts as 16) or "
    "the set of exclusions differ.",
    why="The runtimes do not read the same file: SGLang and vLLM read config.json's quantization_config and "
    "fall back to hf_quant_config.json only when config.json has none; TensorRT-LLM reads "
    "hf_quant_config.json first and only warns when the inline copy differs. Two descriptions mean one "
    "runtime may quantize a module that another keeps in float, or use another group size. Each runtime's "
    "modules and scales are judged on the copy it reads, so what breaks a loader is reported for that "
    "runtime (LC304-LC318); this warning says the two copies describe different checkpoints.",
    example='    config.json           "quantization_config": {"quant_algo": "NVFP4", "group_size": '
    '16, "ignore": ["*q_proj", ...]}\n    hf_quant_config.json  "quantization": '
    '{"quant_algo": "NVFP4", "group_size": 32, "exclude_modules": ["*q_proj", ...]}',
)
rule(
    "LC302",
    "quant-method",
    "error",
    QNT,
    "config.json quantization_config has no quant_method the runtime can use.",
    'Write the flat form with "quant_method": "modelopt_fp4" (NVFP4) or "modelopt" (FP8).',
    doc="Fires when config.json's quantization_config has no `quant_method`, for the runtimes that derive one "
    "but cannot here: vLLM derives it only for the nested ModelOpt form (producer modelopt) of FP8, "
    "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4 and MIXED_PRECISION (model_arch_config_convertor.py "
    "`_normalize_quantization_config`), so it fires for the flat form, another producer or "
    "another algorithm. Also fires when config.json has no quantization_config and vLLM, reading "
    "hf_quant_config.json instead, cannot derive a method from it. Where vLLM can derive the method, "
    "LC322 applies.",
    why="vLLM picks its quantization method from quant_method. Without one, and without a method it can "
    'derive, it refuses the checkpoint ("Unknown ModelOpt quant algo").',
    example='    "quantization_config": {"quant_algo": "NVFP4", "group_size": 16, "ignore": '
    '["*q_proj", "*k_proj", "*v_proj"]}\n\n'
    '(the flat form with no "quant_method": "modelopt_fp4").',
)
rule(
    "LC303",
    "quant-config-keys",
    "error",
    QNT,
    "The nested quantization form lacks keys the runtime's nested-form parser requires.",
    "Write group_size, kv_cache_quant_algo and exclude_modules (null is allowed).",
    doc='Fires for a quantization document in the nested ModelOpt form (`{"producer": ..., '
    '"quantization": {...}}`, in either file) whose NVFP4 `quantization` object lacks `group_size`, '
    "`kv_cache_quant_algo` or `exclude_modules`, for the runtimes that require them: vLLM.",
    why="vLLM's nested-form parser reads these three keys directly and refuses the document when one is "
    "absent; null is accepted.",
    example='    hf_quant_config.json:\n    {"producer": {"name": "modelopt"},\n     "quantization": '
    '{"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}\n\n'
    '(no kv_cache_quant_algo; write "kv_cache_quant_algo": null).',
)
rule(
    "LC304",
    "quant-tensors",
    "error",
    QNT,
    "A quantized module lacks a scale tensor, or a scale/weight has the wrong dtype or shape.",
    "Re-export the module with its weight, weight_scale, weight_scale_2 (and input_scale for W4A4).",
    doc="For every linear module whose weight is stored quantized (U8: packed NVFP4; F8_E4M3: FP8), compares "
    "its tensors with the layout of the scheme the config declares for it: the weight ([out, in/2] U8 for "
    "NVFP4, [out, in] F8_E4M3 for FP8), `weight_scale` (F8_E4M3 [out, in/group] for NVFP4, F32 scalar, "
    "per-channel [out] or 128-block per FP8 variant), `weight_scale_2` (F32 scalar, NVFP4) and "
    "`input_scale` (F32 scalar, schemes that quantize activations). Fires for each missing tensor, each "
    "wrong dtype or shape, and each scale tensor the layout does not have (an input_scale on a "
    "weight-only scheme is LC315).",
    why="The scales are trained checkpoint data, not something a loader can recompute. Without weight_scale_2 "
    'an NVFP4 module is refused everywhere: SGLang, vLLM ("NVFP4 scales are trained checkpoint data"), '
    'TensorRT-LLM ("linear layer is missing"). A missing input_scale in a static-activation format '
    "fails with a KeyError or degrades silently where a default is used.",
    example="    lilicorr.context_proj.weight         U8      [1024, 1024]\n    "
    "lilicorr.context_proj.weight_scale   F8_E4M3 [1024, 128]\n\n"
    "and no `lilicorr.context_proj.weight_scale_2`.",
)
rule(
    "LC329",
    "scale-dtype-cast",
    "warning",
    QNT,
    "A quantization scale stored in another float dtype than its parameter's (a BF16 NVFP4 weight_scale), which "
    "the runtime casts on load: every stored value survives the cast, so the module serves as stored.",
    "Store the scale in its layout's dtype (F8_E4M3 block scales for NVFP4); `lilicorr-ckpt convert` does.",
    doc="For a quantized module's weight_scale stored in a float dtype (F16, BF16, F32) where the layout has "
    "F8_E4M3, with the right shape: reads the scale's values and, for the runtimes that copy a scale of another "
    "dtype into the parameter with a cast (RuntimeProfile scale_dtype_cast), fires when every value is one E4M3 "
    "holds. When the cast would change a value, or the values cannot be read (a Hub repository read "
    "headers-only), it is LC304 instead.",
    why="SGLang's weight loaders and vLLM's AutoWeightsLoader copy the tensor into the F8_E4M3 parameter "
    '(vLLM logs "Attempted to load weight ... with dtype"): a value E4M3 holds is kept, so nothing changes; '
    "a value it cannot hold is rounded, and the module then serves other weights than the checkpoint's.",
    example="    fc.weight_scale   BF16 [1024, 128]   (values 0.5, 1.0, 0.375, ...)\n\n"
    "where the NVFP4 layout has F8_E4M3 [1024, 128].",
)
rule(
    "LC305",
    "nvfp4-in-features",
    "error",
    QNT,
    "An NVFP4 module's in_features is not a multiple of the group size.",
    "Exclude the module from quantization.",
    doc="Fires for a module stored as NVFP4 whose in_features is not a multiple of the scheme's group size "
    "(16 unless the config says otherwise), and for a sibling head's linear that a runtime builds NVFP4 through "
    "the quant config, whatever it is stored as (DSpark's `markov_head.markov_w2`, whose in_features is the "
    "Markov rank: vLLM always, SGLang in the Nemotron-3.5 layout; checks/sibling_quant.py).",
    why="NVFP4 stores one block scale per group_size input columns; a width that does not divide cannot be "
    "packed in whole blocks, so the weight_scale shape the runtimes expect does not exist and the load "
    "fails. The LiLiCorr head's feature_mlp.up_proj reads 5 features and can never be NVFP4.",
    example="    lilicorr.layers.0.attn.out_proj.weight   U8 [40, 20]     (in_features 40, group size 16)",
)
rule(
    "LC306",
    "must-be-float",
    "error",
    QNT,
    "A module the runtime builds unquantized (or whose raw weight it slices) is stored quantized.",
    "Exclude it from quantization and store it in the model dtype (`lilicorr-ckpt convert` repairs it).",
    doc="For each selected runtime, fires for every linear module stored quantized (U8 or F8_E4M3 weight) "
    "that the runtime builds in floating point whatever the quantization config says, or whose raw weight "
    "it slices and so needs in float. SGLang builds `lilicorr.factor_input_proj`, `out_head`, `in_head`, "
    "`lilicorr.feature_mlp.*` and the convolutions' `kernel_projection` unquantized (and, outside "
    "LiLiCorr, `fc`); vLLM builds `factor_input_proj`, `out_head` and `in_head` unquantized; TensorRT-LLM "
    "slices the raw q/k/v weight into its fused context-KV buffer.",
    why="A packed NVFP4 weight (uint8, two values per byte) or an FP8 weight meets a float parameter of "
    "another shape or dtype. For q/k/v: TensorRT-LLM crashes with an untyped error when it slices the raw "
    "weight; SGLang and vLLM serve them quantized (SGLang builds them through the quant "
    "config, vLLM's qwen3_dflash.py `_build_context_kv_buffers` runs a quantized qkv_proj through its "
    "quant method). For factor_input_proj / out_head / "
    "in_head: SGLang and vLLM refuse (plain linears); TensorRT-LLM loads them quantized. For feature_mlp: "
    "SGLang refuses; vLLM and TensorRT-LLM follow the config.",
    example="    lilicorr.out_head.weight           U8      [F, h/2]\n    lilicorr.out_head.weight_scale     "
    "F8_E4M3 [F, h/16]\n    lilicorr.out_head.weight_scale_2   F32     []\n\n"
    "SGLang and vLLM build out_head as a float [F, h] layer and refuse it.",
)
rule(
    "LC307",
    "unprotected-float",
    "error",
    QNT,
    "A module stored in float that the runtime would build quantized (no exclusion matches it).",
    "Add an exclusion pattern that matches the module as the runtime names it (index-free, e.g. `*self_attn.q_proj`).",
    doc="For each selected runtime, fires for every linear module stored in float that the runtime would "
    "build quantized: the config's scheme applies to it, the runtime does not force it to float, and no "
    "exclusion pattern matches the module as that runtime names it. The names differ per runtime: vLLM "
    "prefixes `model.`, renumbers draft layer i to `model.layers.{num_target_layers+i}` and fuses q/k/v "
    "into `qkv_proj`; SGLang fuses without renumbering; TensorRT-LLM matches `name` or `model.name`. The "
    "message gives the name the pattern has to match. Also judged: the sibling heads' linears a runtime builds "
    "through the quant config though the manifest lists them as plain tensors (the families' QUANT_LINEARS): "
    "DSpark's `markov_head.markov_w2`, a ParallelLMHead in vLLM (`model.markov_head.markov_w2`: NVFP4 fails the "
    "load, FP8 casts the float weight and serves it with initial scales), a ReplicatedLinear in SGLang's "
    "Nemotron-3.5 layout (Nemotron35VanillaMarkov; every other config builds an nn.Linear).",
    why="The runtime builds a quantized layer and expects a packed weight and its scales; it finds a float "
    "weight and no scales, and the load fails. An exclusion that looks right (a base-model name, a "
    "pattern with a layer index) often matches nothing in one runtime's naming.",
    example='    "ignore": ["*q_proj", "*k_proj", "*v_proj", "*qkv_proj", "*in_head", '
    '"*lilicorr.out_head", "*factor_input_proj"]\n\n'
    "with `lilicorr.feature_mlp.up_proj.weight` stored in BF16: vLLM and TensorRT-LLM would build "
    "feature_mlp quantized (SGLang builds it in float: LC309).",
)
rule(
    "LC308",
    "excluded-but-quantized",
    "error",
    QNT,
    "An excluded or float module ships quantized weights or scale tensors.",
    "Drop the scales (the lm_head.input_scale trap) or remove the module from the exclusions.",
    doc="Fires for a module stored in float that ships `weight_scale`, `weight_scale_2` or `input_scale` "
    "tensors (for every runtime), and, per runtime, for a module stored quantized that the runtime builds "
    "in float because an exclusion matches it as that runtime names it, or because the config's scheme "
    "does not quantize it (a MIXED_PRECISION config without an entry for it).",
    why="The runtime builds a float layer: a packed weight fails its shape check, and scale tensors have no "
    "parameter to load into, so strict loaders refuse them (the classic case is an `lm_head.input_scale` "
    "left beside a bfloat16 lm_head).",
    example='    "ignore": [..., "*self_attn.o_proj"]\n\n'
    "with `layers.0.self_attn.o_proj.weight` stored as U8: every runtime builds o_proj in float.",
)
rule(
    "LC309",
    "float-not-excluded",
    "warning",
    QNT,
    "A module the runtime always builds in float is not in the exclusions.",
    "List it in `ignore`/`exclude_modules` so other readers agree.",
    doc="Per runtime, fires for a module stored in float that the runtime always builds in float (or needs in "
    "float), while the config's scheme would apply to it and no exclusion lists it.",
    why="It loads on this runtime, which ignores the config for the module. But the config says the module is "
    "quantized: a runtime that follows the config for it builds a quantized layer and fails (LC307), and "
    "tools that read the config (converters, inspectors) are misled. Listing it makes every reader agree.",
    example='    "ignore": ["*q_proj", "*k_proj", "*v_proj", "*qkv_proj", "*in_head", '
    '"*lilicorr.out_head", "*factor_input_proj"]\n\n'
    "with feature_mlp stored in BF16: SGLang builds it in float anyway (LC309); vLLM and TensorRT-LLM "
    "fail on it (LC307).",
)
rule(
    "LC310",
    "exclusion-pattern",
    "warning",
    QNT,
    "An exclusion pattern no runtime can match as written (training prefix, layer index, base-model name).",
    "Strip training prefixes, drop base-model names and use index-free suffix wildcards.",
    doc="Fires for an exclusion pattern that keeps a training prefix (`dflash_module.` or `eagle_module.`, at "
    "the start or after a dot), or that names a draft backbone layer index (`layers.0.`, not "
    "`lilicorr.layers.N`), or that has a digit followed by `*`.",
    why="No runtime strips training prefixes from exclusion patterns, so such a pattern matches nothing. A "
    "layer index is matched differently per runtime: vLLM names draft layer i `model.layers.{num_target_"
    "layers+i}` and renumbers an index below num_target_layers in the pattern alike (models/utils.py "
    "`map_draft_quant_config`), so `layers.0.` means the draft's layer 0 there while `model.layers.4.` is "
    "taken as written; a glob such as `layers.1*` also hits layers 10-19. Where the pattern misses, the "
    "module it was meant to keep in float is built quantized (LC307, LC306).",
    example='    "ignore": ["dflash_module.lilicorr.out_head", "model.layers.0.self_attn.q_proj"]',
)
rule(
    "LC311",
    "quant-without-metadata",
    "error",
    QNT,
    "Quantized tensors but no quantization metadata.",
    "Write hf_quant_config.json and config.json quantization_config.",
    doc="Fires when linear modules are stored quantized (U8 or F8_E4M3 weights) but there is no quantization "
    "metadata: neither config.json's quantization_config nor hf_quant_config.json.",
    why="Without metadata every runtime builds float layers and refuses the packed weights (TensorRT-LLM: "
    '"Packed or FP8 LiLiCorr weights require quantization metadata").',
    example="    lilicorr.context_proj.weight         U8 [1024, 1024]\n\n"
    "with no quantization_config in config.json and no hf_quant_config.json.",
)
rule(
    "LC312",
    "quant-algo",
    "error",
    QNT,
    "The quantization algorithm is missing or not one the drafter loaders support.",
    "Use NVFP4, W4A16_NVFP4 or FP8.",
    doc="Fires when the quantization config a runtime reads (config.json's quantization_config first for "
    "SGLang and vLLM, hf_quant_config.json first for TensorRT-LLM) names no `quant_algo`, or one whose tensor layout the drafter loaders do not "
    "support (NVFP4, W4A16_NVFP4, FP8 and its per-channel and block variants, or MIXED_PRECISION with "
    "per-layer entries). The per-module checks do not run then.",
    why="A runtime cannot build quantized layers for an algorithm it does not know, and refuses the config; "
    "an absent algorithm leaves nothing to build from.",
    example='    "quantization_config": {"quant_method": "modelopt", "quant_algo": "W8A16", '
    '"ignore": ["lm_head"]}',
)
rule(
    "LC313",
    "fused-shards-disagree",
    "error",
    QNT,
    "The exclusions name some but not all parts of a fused module.",
    "Exclude all of q/k/v (gate/up) or none.",
    doc="For SGLang, fires when the exclusions name some but not all shards of a fused module on its module "
    "path (q_proj / k_proj / v_proj of `qkv_proj`, gate_proj / up_proj of `gate_up_proj`).",
    why="A fused layer has one quantization state for all its shards: SGLang checks each shard against "
    "the literal exclusion paths (quantization/utils.py `is_layer_skipped`) and refuses the model when they "
    'disagree ("Detected some but not all shards of ... are quantized"). vLLM\'s draft has no '
    "packed-module mapping and matches the fused name alone (LC307 where the module is then built "
    "quantized).",
    example='    "quantization_config": {"ignore": ["layers.0.self_attn.q_proj"], ...}\n\n'
    "excludes the q shard of draft layer 0's `qkv_proj` but not k and v.",
)
rule(
    "LC314",
    "quant-unconfirmed",
    "warning",
    QNT,
    "A quantized module whose quantized loading is not confirmed for this runtime.",
    "Keep it in the model dtype, or test the runtime yourself.",
    doc="Per runtime, fires for a module stored quantized, with the config quantizing it and no exclusion "
    "matching, whose quantized loading is not confirmed for that runtime: for SGLang an owned `lm_head` "
    "(which it drops anyway: LC404).",
    why="SGLang's draft builds no lm_head, so how a quantized one would load is not established from its "
    "code; the drafter is refused for the owned head itself (LC404).",
    example="    lm_head.weight   U8 [512, 32]\n\n"
    "with has_own_lm_head true, under an NVFP4 config that does not exclude it.",
)
rule(
    "LC315",
    "w4a16-input-scale",
    "warning",
    QNT,
    "A W4A16 module ships an input_scale the runtime has no parameter for.",
    "Drop input_scale for weight-only NVFP4.",
    doc="Fires for a quantized module that has an `input_scale` tensor when its scheme quantizes weights only "
    "(W4A16_NVFP4; also FP8_PER_CHANNEL_PER_TOKEN and FP8_PB_WO, whose activations are not statically "
    "scaled).",
    why="The runtime's layer for a weight-only scheme has no input_scale parameter: a loader that refuses "
    "unknown tensors refuses the checkpoint, one that skips them drops the scale. Weight-only NVFP4 "
    "without input_scale loads on every audited runtime.",
    example='    "quant_algo": "W4A16_NVFP4"\n\nwith `fc.input_scale` F32 [] beside `fc.weight` U8.',
)
rule(
    "LC316",
    "quant-config-unreadable",
    "error",
    QNT,
    "A quantization config cannot be interpreted.",
    "Write the nested ModelOpt form in hf_quant_config.json and the flat form in config.json.",
    doc="Fires for each quantization document that cannot be interpreted: not a JSON object, neither the "
    "nested ModelOpt form (`{producer, quantization}`) nor the flat form (`{quant_algo, ignore, "
    "quant_method}`), or an exclusion list (`exclude_modules`, `ignore`) that is not a list of strings.",
    why="A runtime that reads the document cannot tell which modules are quantized or how, and refuses the "
    "checkpoint or treats it as unquantized; the checker cannot judge the modules against it either.",
    example='    hf_quant_config.json:  {"algo": "NVFP4"}',
)
rule(
    "LC317",
    "quant-unused",
    "warning",
    QNT,
    "Quantization metadata is present but no tensor is quantized.",
    "Remove the metadata, or export the quantized weights.",
    doc="Fires when a quantization config with a supported algorithm is in effect but no linear module's "
    "weight is stored quantized (all are float).",
    why="Runtimes follow the metadata: they build quantized layers for every module not excluded and then "
    "find float weights without scales, so the load fails (LC307 names the modules). The metadata can be "
    "left over from an export that was dequantized afterwards.",
    example='    hf_quant_config.json  "quantization": {"quant_algo": "NVFP4", ...}\n\n'
    "with every weight in BF16.",
)
rule(
    "LC318",
    "kv-cache-scales",
    "warning",
    QNT,
    "KV-cache scales (k_scale / v_scale) without FP8 KV-cache quantization declared.",
    "Declare kv_cache_quant_algo, or drop the k_scale / v_scale tensors.",
    doc="Fires when `k_scale` / `v_scale` tensors are present on the draft's attention modules but the "
    "quantization config in effect sets no `kv_cache_quant_algo`.",
    why="These scales calibrate an FP8 KV cache. With no KV-cache quantization declared the runtime runs an "
    "unquantized cache and has no parameter for them: a strict loader refuses them, another drops them. "
    "If the cache was meant to be FP8, the declaration is what is missing.",
    example='    layers.0.self_attn.k_proj.k_scale   F32 []\n\nwith "kv_cache_quant_algo": null.',
)
rule(
    "LC320",
    "flat-exclusions-key",
    "error",
    QNT,
    "The flat quantization_config lists its exclusions under a key the runtime does not read for this algorithm: "
    "it would build the float modules quantized.",
    "Write the exclusions under `ignore` in config.json's quantization_config (keep `exclude_modules` in "
    "hf_quant_config.json).",
    doc="Fires when config.json's quantization_config is in the flat form and lists exclusions, but none under "
    "the keys a runtime release reads for its quant_algo (each release's keys are its profile's: the newer "
    "vLLM releases read `ignore`, else `exclude_modules`, the older `ignore` only; the newer SGLang releases "
    "read `ignore`, else `modules_to_not_convert`, else `exclude_modules` for NVFP4 / W4A16_NVFP4, the older "
    "`ignore` only, and `ignore` only for FP8). A runtime takes the first of its keys that is present, even an "
    "empty list. The message names the releases that miss them.",
    why="SGLang's ModelOptFp8Config.from_config reads `ignore` only (default: none); its "
    "ModelOptFp4Config.from_config and vLLM's ModelOptQuantConfigBase.from_config fall back to the other keys "
    "only from the releases that added the fallback (`lilicorr-ckpt validate --runtime every` judges each). A "
    "runtime that sees no exclusion builds every float module quantized; the load then fails on the modules "
    "stored in float (LC307).",
    example='    "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",\n'
    '                            "exclude_modules": ["lm_head", "*q_proj", "*k_proj", '
    '"*v_proj"]}',
)
rule(
    "LC321",
    "flat-group-size",
    "error",
    QNT,
    "The flat quantization_config has no top-level group_size, and the runtime's default (16) differs from the "
    "group size the weights were quantized with.",
    "Write the group size at the top level of config.json's quantization_config.",
    doc="For config.json's flat NVFP4 quantization_config without a top-level `group_size`, fires for each "
    "runtime that then uses a default (16) when the group size the weights were quantized with differs: "
    "the one in `config_groups.group_0.weights.group_size` (which SGLang reads before its default, vLLM "
    "not), else hf_quant_config.json's.",
    why="vLLM reads the flat form's top-level group_size only, defaulting to 16, and expects every NVFP4 "
    "weight_scale to be [out, in/16]; weights quantized with 32-column groups have [out, in/32] and fail "
    "the shape check.",
    example='    "quantization_config": {"quant_method": "modelopt_fp4", "quant_algo": "NVFP4", '
    '"ignore": [...],\n                            "config_groups": {"group_0": {"weights": '
    '{"group_size": 32}}}}',
)
rule(
    "LC325",
    "nvfp4-group-size",
    "error",
    QNT,
    "NVFP4 weights quantized with a group size other than 16, which the runtime's NVFP4 kernels refuse.",
    "Re-quantize with group_size 16 (ModelOpt's NVFP4 default).",
    doc="Fires when the quantization config a runtime reads declares NVFP4 or W4A16_NVFP4 with a group size "
    "other than 16, for the runtimes whose NVFP4 path requires 16: SGLang.",
    why="SGLang serves W4A16_NVFP4 on every GPU, and NVFP4 on SM80-SM90, through its Marlin kernels; "
    "ModelOptNvFp4A16LinearMethod / ModelOptFp4LinearMethod.process_weights_after_loading refuse any other "
    'group size ("NVFP4 Marlin requires group_size=16") after the weights have loaded.',
    example='    "quantization_config": {"quant_method": "modelopt_fp4", "quant_algo": "W4A16_NVFP4", '
    '"group_size": 32, ...}',
)
rule(
    "LC326",
    "inline-nested-exclusions-lost",
    "warning",
    QNT,
    "config.json's quantization_config is the nested ModelOpt form; the runtime flattens it and reads none of its "
    "exclusions.",
    "Write the flat form in config.json (quant_method, quant_algo, group_size and `ignore` at the top level); "
    "keep the nested form in hf_quant_config.json.",
    doc="Fires when config.json's quantization_config is the nested form ({producer, quantization: {...}}) and "
    "lists exclusions, for the runtimes that flatten it before reading it: SGLang.",
    why="SGLang's ModelConfig._parse_quant_hf_config copies the nested block's quant_algo to the top of "
    "quantization_config; ModelOptFp4Config / ModelOptFp8Config.from_config then take the flat path and "
    "look for `ignore` (NVFP4 also `modules_to_not_convert`, `exclude_modules`) at the top level, where "
    "there is none. Every module the exclusions protected is built quantized (LC307 names the ones stored "
    "in float), and NVFP4's group size becomes 16.",
    example='    "quantization_config": {"producer": {"name": "modelopt"},\n'
    '                            "quantization": {"quant_algo": "NVFP4", "exclude_modules": '
    '["*q_proj", ...]}}',
)
rule(
    "LC319",
    "hf-quant-config-missing",
    "warning",
    QNT,
    "config.json declares quantization but hf_quant_config.json is absent.",
    "Write hf_quant_config.json (the nested ModelOpt form) beside config.json; some readers only look there.",
    doc="Fires when config.json has a quantization_config but the checkpoint has no hf_quant_config.json.",
    why="ModelOpt exports write both files. A reader that looks only at hf_quant_config.json sees an "
    "unquantized checkpoint and builds float layers for the packed weights.",
    example='    config.json  "quantization_config": {"quant_method": "modelopt_fp4", "quant_algo": '
    '"NVFP4", ...}\n\n'
    "and no hf_quant_config.json beside it.",
)

rule(
    "LC322",
    "quant-method-missing",
    "warning",
    QNT,
    "config.json quantization_config has no quant_method; this runtime derives one, others may not.",
    'Write the flat form with "quant_method": "modelopt_fp4" (NVFP4) or "modelopt" (FP8).',
    doc="Fires when config.json's quantization_config has no `quant_method`, for the runtimes not known to "
    "derive one (SGLang, TensorRT-LLM), and also for vLLM when it can derive one (the nested ModelOpt "
    "form of FP8 or NVFP4; where it cannot, LC302 applies).",
    why="Only vLLM is known to derive a method (for ModelOpt's nested FP8 and NVFP4 forms); for SGLang and "
    "TensorRT-LLM no derivation is recorded. Whether the checkpoint loads then depends on each reader's "
    "fallback, where the flat form with an explicit quant_method reads the same everywhere.",
    example='    "quantization_config": {"producer": {"name": "modelopt"},\n                          '
    '  "quantization": {"quant_algo": "NVFP4", "group_size": 16, ...}}',
)
rule(
    "LC323",
    "exclusion-unmatched",
    "info",
    QNT,
    "An exclusion pattern matches no module of this drafter under any runtime (a base-model or training-time name).",
    "Nothing to do unless it was meant to exclude a drafter module.",
    doc="Fires for an exclusion pattern (with no training prefix or layer index: those are LC310) that "
    "matches no linear module of this drafter under any runtime's matching.",
    why="Harmless by itself: typically a base-model pattern carried over from the target's export. But a "
    "pattern meant for a drafter module that matches nothing is silent too, and that module is then "
    "quantized (LC307 says where that fails).",
    example='    "ignore": [..., "model.embed_tokens"]',
)


# ---------------------------------------------------------------- checks


def observed_scheme(ctx: Context, module: str) -> str:
    return observed_scheme_of(ctx.names, module)


def _expected_quant_form(
    ctx: Context, module: str, kind: str, qc: QuantConfig | None
) -> dict[str, ExpectedTensor] | None:
    scheme = qc.scheme_for(module) if qc else None  # the declared layout wins over what is on disk
    if scheme is None:
        scheme = quant_scheme("NVFP4" if kind == "nvfp4" else "FP8")
    assert scheme is not None
    return ctx.manifest.quantized_form(module, scheme)


def _module_group(module: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", module)


def copy_read_by(ctx: Context, p: RuntimeProfile) -> QuantConfig | None:
    """The quantization config `p`'s runtime acts on (RuntimeProfile.quant_config_read)."""
    inline, file = ctx.quant_configs.get("config.json"), ctx.quant_configs.get("hf_quant_config.json")
    if (
        p.quant_config_read == "hf_quant_config.json"
        and file is not None
        and (file.quant_algo is not None or inline is None)
    ):
        return file
    return inline or file


rule(
    "LC328",
    "scale-encoding",
    "error",
    QNT,
    "The quantization config names a weight_scale_encoding the runtime release does not decode.",
    "Store the block scales plainly (remove weight_scale_encoding), or use an encoding the release decodes.",
    doc="Fires when the quantization config a runtime release acts on (flat, or nested under `quantization`) "
    "sets `weight_scale_encoding` to a value that release does not decode, for the releases that decode some "
    "encodings (vLLM from the release that added CSF-compressed NVFP4 scales). The releases that decode none "
    "never read the key: they take the scale tensors as plain, and compressed scale streams are then tensors "
    "they have no parameter for (LC204).",
    why='A decoding release refuses an unknown encoding at start-up ("unsupported weight_scale_encoding"). '
    "validate does not model the compressed streams themselves: their tensors are judged as unknown names.",
    example='    "quantization_config": {"quant_algo": "NVFP4", "weight_scale_encoding": "zstd"}',
)


rule(
    "LC327",
    "fused-global-scales-differ",
    "error",
    QNT,
    "Linears the runtime fuses (q/k/v, gate/up) carry different NVFP4 weight_scale_2: it serves every shard with the "
    "largest, which rescales the others' weights.",
    "Run `lilicorr-ckpt convert`, which re-quantizes each fused group's shards to one shared weight_scale_2 "
    "(ModelOpt 0.48's LiLiCorr export quantizes every shard on its own amax).",
    doc="Reads the 4-byte weight_scale_2 of each NVFP4 q/k/v and gate/up shard (a few bytes per layer, never a "
    "weight; not from a Hub repo read headers-only) and fires when the shards of one layer's fused linear "
    "differ, for the runtimes that fuse them into one linear with one global scale: SGLang and vLLM (vLLM "
    "logs a warning and loads).",
    why="Both build q/k/v as one QKVParallelLinear and gate/up as one MergedColumnParallelLinear and serve it "
    "with `weight_scale_2.max()` (SGLang's ModelOptFp4LinearMethod / ModelOptNvFp4A16LinearMethod, vLLM's "
    "KNvfp4Static.process, which only warns), so a shard quantized with a smaller global scale is served "
    "multiplied by the ratio. ModelOpt unifies the amax of such linears for a target model "
    "(preprocess_linear_fusion), but its pass never reaches a DFlash draft: its drafter exports come out with "
    "shards that differ, load cleanly and serve another function. `lilicorr-ckpt convert` re-quantizes each "
    "group to one shared scale.",
    example="    layers.0.mlp.gate_proj.weight_scale_2   F32 []   8.5e-05\n"
    "    layers.0.mlp.up_proj.weight_scale_2     F32 []   9.4e-05",
)


def _without_method(doc: Any) -> bool:
    """A quantization config object a reader of `quant_cfg.get("quant_method", "")` finds no method in: no
    quant_method (or an empty one) and not ModelOpt's nested form (a producer or a `quantization` object)."""
    return (
        isinstance(doc, dict)
        and doc.get("quant_method", "") == ""
        and "producer" not in doc
        and not isinstance(doc.get("quantization"), dict)
    )


@check
def quantization(ctx: Context) -> None:
    for src, problems in ctx.quant_problems.items():
        # an object with no quant_method in config.json: read as no quantization by some releases
        # (RuntimeProfile.quant_config_without_method), its quant method "" refused by the others
        # (with an hf_quant_config.json beside it, those releases still read config.json's: the file's
        # quantization is then not the one they build)
        docs = ctx.checkpoint.quant_docs
        methodless = (
            src == "config.json" and "hf_quant_config.json" not in docs and _without_method(docs.get(src))
        )
        refusing = [
            p for p in ctx.profiles if not methodless or p.quant_config_without_method != "unquantized"
        ]
        for problem in problems:
            if len(refusing) == len(ctx.profiles):
                ctx.emit("LC316", problem, file=src)
            else:
                ctx.emit_for(
                    "LC316",
                    refusing,
                    f"{problem}: it names no quant_method, which {_names(refusing, 'refuses|refuse')} as an unknown "
                    "(empty) quantization method; the other runtimes read it as no quantization",
                    file=src,
                )
    docs = ctx.quant_configs
    disagree = False
    if "config.json" in docs and "hf_quant_config.json" in docs:
        a, b = docs["config.json"], docs["hf_quant_config.json"]
        diffs = []
        if a.quant_algo != b.quant_algo:
            diffs.append(f"quant_algo {a.quant_algo} vs {b.quant_algo}")
        if (a.group_size or 16) != (b.group_size or 16):
            diffs.append(f"group_size {a.group_size} vs {b.group_size}")
        if set(a.exclude) != set(b.exclude):
            only_a, only_b = sorted(set(a.exclude) - set(b.exclude)), sorted(set(b.exclude) - set(a.exclude))
            diffs.append(
                f"exclusions differ (only in config.json: {only_a[:4]}, only in hf_quant_config.json: "
                f"{only_b[:4]})"
            )
        if diffs:
            disagree = True
            who = []
            for src in ("hf_quant_config.json", "config.json"):
                mine = [p for p in ctx.profiles if copy_read_by(ctx, p) is docs[src]]
                authority = [p for p in mine if p.quant_config_read == src == "hf_quant_config.json"]
                if mine:
                    who.append(
                        f"{_names(mine, 'acts|act')} on {src}"
                        + (
                            f" ({_names(authority, 'treats|treat')} it as authoritative and only logs a warning about the "
                            "inline copy)"
                            if authority
                            else ""
                        )
                    )
            ctx.emit(
                "LC301",
                "hf_quant_config.json and config.json quantization_config disagree: "
                + "; ".join(diffs)
                + ". "
                + ", ".join(who)
                + "; each runtime is judged on the copy it reads",
                file="config.json",
                pointer="$.quantization_config",
            )
    if (
        "config.json" in docs
        and "hf_quant_config.json" not in docs
        and "hf_quant_config.json" not in ctx.quant_problems
    ):
        ctx.emit(
            "LC319",
            "config.json has a quantization_config but there is no hf_quant_config.json",
            file="hf_quant_config.json",
        )
    if ctx.quant is not None:
        _quant_config_form(ctx, ctx.quant)
    _scale_encoding(ctx)
    _fused_global_scales(ctx)
    quantized = {mod: observed_scheme(ctx, mod) for mod in ctx.manifest.modules}
    quantized = {mod: s for mod, s in quantized.items() if s in ("nvfp4", "fp8")}
    if not disagree:
        _judge(ctx, ctx.quant, ctx.profiles, [], quantized)
        return
    groups: dict[int, tuple[QuantConfig | None, list[RuntimeProfile]]] = {}
    for p in ctx.profiles:
        qc = copy_read_by(ctx, p)
        groups.setdefault(id(qc), (qc, []))[1].append(p)
    for qc, profiles in groups.values():
        _judge(ctx, qc, profiles, [p.name for p in profiles] if len(groups) > 1 else [], quantized)


def _fused_global_scales(ctx: Context) -> None:
    """LC327: the NVFP4 shards of a linear a runtime fuses, quantized with different global scales (their scalar
    weight_scale_2 values read: 4 bytes a shard)."""
    fusing = [p for p in ctx.profiles if p.fused_global_scale == "max"]
    if not fusing or ctx.headers_only:
        return
    groups: dict[str, list[str]] = {}
    scale_infos = []
    for module in ctx.manifest.modules:
        fused = fused_name(module)
        weight = ctx.names.by_canonical.get(f"{module}.weight")
        scale = ctx.names.by_canonical.get(f"{module}.weight_scale_2")
        if fused is not None and weight is not None and weight.dtype == "U8" and scale is not None:
            groups.setdefault(fused[0], []).append(module)
            scale_infos.append(ctx.table.tensors[scale.name])
    if not groups:
        return
    values = read_f32_scalars(ctx.source.root, scale_infos)
    for name, shards in sorted(groups.items()):
        found = {m: values.get(ctx.names.by_canonical[f"{m}.weight_scale_2"].name) for m in sorted(shards)}
        if len(shards) > 1 and None not in found.values() and len(set(found.values())) > 1:
            shown = ", ".join(f"{m.rsplit('.', 1)[-1]} {v:.6g}" for m, v in found.items())
            ctx.emit_for(
                "LC327",
                fusing,
                f"`{name}`'s shards have different weight_scale_2 ({shown}): "
                f"{_names(fusing, 'serves|serve')} the fused weight with the largest, so the other shards' "
                "weights are scaled up by the ratio",
                pointer=f"{sorted(shards)[0]}.weight_scale_2",
                subjects=[f"{m}.weight_scale_2" for m in sorted(shards)],
            )


def _scale_encoding(ctx: Context) -> None:
    """LC328: a weight_scale_encoding the release acting on that copy refuses. A release that reads no encoding
    ignores the key (its scale tensors are judged as plain: compressed streams are unknown tensors, LC204)."""
    by: dict[str, list[RuntimeProfile]] = {}
    for p in ctx.profiles:
        qc = copy_read_by(ctx, p)
        if (
            qc is not None
            and qc.scale_encoding is not None
            and p.nvfp4_scale_encodings
            and qc.scale_encoding not in p.nvfp4_scale_encodings
        ):
            by.setdefault(f"{qc.source}\0{qc.scale_encoding}", []).append(p)
    for key, profiles in by.items():
        source, value = key.split("\0")
        known = sorted({e for p in profiles for e in p.nvfp4_scale_encodings})
        ctx.emit_for(
            "LC328",
            profiles,
            f"weight_scale_encoding is {value!r} in {source}: {_names(profiles, 'decodes|decode')} only "
            f"{', '.join(known)} and {'refuses' if len(profiles) == 1 else 'refuse'} it at start-up",
            file=source,
            pointer="$.weight_scale_encoding",
            expected=" | ".join(known),
            actual=value,
        )


def _judge(
    ctx: Context,
    qc: QuantConfig | None,
    profiles: list[RuntimeProfile],
    scope: list[str],
    quantized: dict[str, str],
) -> None:
    """The quantized state of every module against `qc`, for the runtimes that read it (`scope`: their names when
    the runtimes read different copies, else empty: the findings hold for every runtime)."""
    m = ctx.manifest
    if qc is None:
        if quantized:
            ctx.emit(
                "LC311",
                f"{len(quantized)} modules hold quantized weights ({shorten(sorted(quantized), 3)}) "
                'but there is no quantization_config / hf_quant_config.json: "Packed or FP8 LiLiCorr weights '
                'require quantization metadata"',
                subjects=sorted(quantized),
                runtimes=scope,
            )
        return
    if qc.quant_algo is None:
        ctx.emit("LC312", f"{qc.source} names no quant_algo", file=qc.source, runtimes=scope)
        return
    if qc.quant_algo != "MIXED_PRECISION" and quant_scheme(qc.quant_algo) is None:
        ctx.emit(
            "LC312",
            f"quant_algo {qc.quant_algo} is not one the drafter loaders support",
            file=qc.source,
            expected="NVFP4 | W4A16_NVFP4 | FP8",
            actual=qc.quant_algo,
            runtimes=scope,
        )
        return
    refusing = [p for p in profiles if p.quant_algos is not None and qc.quant_algo not in p.quant_algos]
    if refusing:
        ctx.emit_for(
            "LC312",
            refusing,
            f"quant_algo {qc.quant_algo} is not one {_names(refusing, 'loads|load')}: "
            f"{_names(refusing, 'refuses|refuse')} it at start-up",
            file=qc.source,
            expected=" | ".join(refusing[0].quant_algos or ()),
            actual=qc.quant_algo,
        )
        profiles = [p for p in profiles if p not in refusing]
        scope = [p.name for p in profiles] if scope else scope
        if not profiles:
            return
    for p in profiles:
        group = qc.read_by(p).group_size or 16
        if p.nvfp4_group_size is not None and "NVFP4" in qc.quant_algo and group != p.nvfp4_group_size:
            ctx.emit(
                "LC325",
                f"{qc.quant_algo} with group_size {group}: {p.display}'s NVFP4 kernels (Marlin) "
                f'require {p.nvfp4_group_size} ("NVFP4 Marlin requires group_size={p.nvfp4_group_size}", '
                "after the weights load)",
                runtimes=[p.name],
                file=qc.source,
                expected=p.nvfp4_group_size,
                actual=group,
            )
    if not quantized:
        ctx.emit(
            "LC317",
            f"{qc.source} declares {qc.quant_algo} but no tensor is quantized",
            file=qc.source,
            runtimes=scope,
        )
    for pattern in qc.exclude:
        problems = pattern_problems(pattern)
        if "training_prefix" in problems:
            ctx.emit(
                "LC310",
                f"exclusion `{pattern}` keeps a training prefix; no runtime matches it",
                file=qc.source,
                subjects=[pattern],
                runtimes=scope,
            )
        elif "layer_index" in problems:
            renumber = [p for p in ctx.profiles if p.renumbers_draft_layers]
            ctx.emit(
                "LC310",
                f"exclusion `{pattern}` names a layer index"
                + (
                    f"; {_names(renumber, 'names|name')} draft layer i model.layers.{{num_target_layers+i}} and "
                    "renumbers an index below num_target_layers in the pattern alike"
                    if renumber
                    else ""
                )
                + "; a glob like `layers.1*` also hits layers.1x",
                file=qc.source,
                subjects=[pattern],
                runtimes=scope,
            )
        elif not any(
            excluded_by(matcher, module, (pattern,), m.geometry.num_target_layers).excluded
            for module in m.modules
            for matcher in MATCHERS
        ):
            ctx.emit(
                "LC323",
                f"exclusion `{pattern}` matches no module of this drafter under any runtime "
                "(a base-model or training-time name?)",
                file=qc.source,
                subjects=[pattern],
                runtimes=scope,
            )
    _module_states(ctx, qc, quantized, profiles, scope)


def _quant_config_form(ctx: Context, qc: QuantConfig) -> None:
    cfg_qc = ctx.quant_configs.get("config.json")
    if cfg_qc is not None and cfg_qc.quant_method is None:
        derivers = [p for p in ctx.profiles if p.nested_quant_method_algos is not None]
        failing = [
            p
            for p in derivers
            if cfg_qc.form == "flat"
            or cfg_qc.producer != "modelopt"
            or cfg_qc.quant_algo not in (p.nested_quant_method_algos or ())
        ]
        others = [p for p in ctx.profiles if p.nested_quant_method_algos is None]
        if failing:
            ctx.emit_for(
                "LC302",
                failing,
                f"config.json quantization_config ({cfg_qc.form} form, {cfg_qc.quant_algo}) "
                f"has no quant_method and {_names(failing, 'cannot derive|cannot derive')} one "
                '("Unknown ModelOpt quant algo")',
                file="config.json",
                pointer="$.quantization_config.quant_method",
            )
        if others or (derivers and not failing):
            ctx.emit_for(
                "LC322",
                others + ([] if failing else derivers),
                f"config.json quantization_config ({cfg_qc.form} form) has no quant_method; "
                "write the flat form with one",
                file="config.json",
                pointer="$.quantization_config.quant_method",
            )
    hf_qc = ctx.quant_configs.get("hf_quant_config.json")
    if (
        cfg_qc is None
        and "config.json" not in ctx.quant_problems
        and hf_qc is not None
        and hf_qc.quant_method is None
    ):
        # config.json has no quantization_config: vLLM reads hf_quant_config.json and derives quant_method only
        # for some algorithms
        failing = [
            p
            for p in ctx.profiles
            if p.reads_hf_quant_config
            and p.nested_quant_method_algos is not None
            and (
                hf_qc.form == "flat"
                or hf_qc.producer != "modelopt"
                or hf_qc.quant_algo not in p.nested_quant_method_algos
            )
        ]
        ctx.emit_for(
            "LC302",
            failing,
            f"config.json has no quantization_config and hf_quant_config.json "
            f"({hf_qc.form} form, {hf_qc.quant_algo}, producer {hf_qc.producer}) has no quant_method: "
            f"{_names(failing, 'derives|derive')} one only for modelopt {', '.join(failing[0].nested_quant_method_algos or ())} "
            '("Unknown ModelOpt quant algo")'
            if failing
            else "",
            file="hf_quant_config.json",
            pointer="$.quant_method",
        )
    if cfg_qc is not None and cfg_qc.form == "flat":
        _flat_form_reading(ctx, cfg_qc)
    if cfg_qc is not None and cfg_qc.form == "nested" and cfg_qc.exclude:
        flattening = [p for p in ctx.profiles if p.flattens_inline_nested and copy_read_by(ctx, p) is cfg_qc]
        ctx.emit_for(
            "LC326",
            flattening,
            f"config.json's quantization_config is the nested ModelOpt form with "
            f"{len(cfg_qc.exclude)} exclusions: {_names(flattening, 'flattens|flatten')} it first (its "
            "quant_algo copied to the top level) and then finds no exclusion list there, so every module "
            "they protect is built quantized",
            file="config.json",
            pointer="$.quantization_config",
            expected="the flat form with `ignore`",
            actual="the nested form",
        )
    for src, doc in ctx.quant_configs.items():
        if doc.form == "nested" and doc.missing_keys and doc.quant_algo and "NVFP4" in doc.quant_algo:
            ctx.emit_for(
                "LC303",
                [p for p in ctx.profiles if p.nested_form_keys_required],
                f"{src}: the nested form lacks {list(doc.missing_keys)}",
                file=src,
            )


def _flat_form_reading(ctx: Context, qc: QuantConfig) -> None:
    """What the runtimes that read only part of the flat form see (RuntimeProfile.flat_exclusion_keys: vLLM reads
    `ignore` only, SGLang `ignore`, `modules_to_not_convert`, `exclude_modules` for NVFP4; the group size from
    the top level, SGLang also config_groups, default 16)."""
    listed = [(key, patterns) for key, patterns in qc.flat_lists if patterns]
    if listed:
        lost: dict[tuple[str, ...], list[RuntimeProfile]] = {}
        for p in ctx.profiles:
            if copy_read_by(ctx, p) is qc and not qc.read_by(p).exclude:
                lost.setdefault(p.flat_exclusion_keys(qc.quant_algo), []).append(p)
        where = " and ".join(f"`{key}`" for key, _ in listed)
        count = sum(len(patterns) for _, patterns in listed)
        for keys, mine in lost.items():
            read = ", else ".join(f"`{k}`" for k in keys)
            used = qc.flat_exclusions_for(mine[0])[0]
            how = (
                f"`{used}`, present and empty, the first of {read}"
                if used
                else f"{read}, none of which is present"
            )
            ctx.emit_for(
                "LC320",
                mine,
                f"config.json quantization_config (flat form) lists {count} exclusions "
                f"under {where}, but {_names(mine, 'reads|read')} them from {how}: it sees no exclusion "
                "and would build every float module quantized",
                file="config.json",
                pointer=f"$.quantization_config.{used or keys[0]}",
                expected=f"`{keys[0]}`",
                actual=where,
            )
    scheme = qc.scheme_for("") if qc.quant_algo != "MIXED_PRECISION" else None
    if scheme is None or not scheme.nvfp4 or qc.top_group_size is not None:
        return
    hf_qc = ctx.quant_configs.get("hf_quant_config.json")
    intended = qc.nested_group_size or (hf_qc.group_size if hf_qc is not None else None)
    for p in ctx.profiles:
        default = p.flat_group_size_default
        if default is None or intended is None or qc.read_by(p).group_size == intended:
            continue
        where = "config_groups.group_0.weights" if qc.nested_group_size else "hf_quant_config.json"
        ctx.emit(
            "LC321",
            f"config.json quantization_config (flat form) has no top-level group_size: {p.display} "
            f"uses {default}, but the group size is {intended} (in {where}), so every NVFP4 weight_scale "
            f"fails its [out, in/{default}] shape",
            runtimes=[p.name],
            file="config.json",
            pointer="$.quantization_config.group_size",
            expected=intended,
            actual="absent",
        )


_STATE_MESSAGES = {
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


class _Notes:
    """Per-module verdicts, grouped by rule, module group and runtimes, so that one finding names them all."""

    def __init__(self) -> None:
        self.grouped: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
        self.details: dict[tuple[str, str, tuple[str, ...]], str] = {}

    def note(self, rule_id: str, module: str, runtimes: list[str], detail: str = "") -> None:
        key = (rule_id, _module_group(module), tuple(runtimes))
        self.grouped.setdefault(key, []).append(module)
        if detail:
            self.details.setdefault(key, detail)

    def emit(self, ctx: Context, qc: QuantConfig) -> None:
        merged: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
        for (rule_id, group, runtimes), modules in self.grouped.items():
            # fold runtimes that flag the same modules into one finding
            key = (rule_id, group, tuple(sorted(modules)))
            merged.setdefault(key, []).extend(runtimes)
        for (rule_id, group, flagged), flagging in merged.items():
            detail = next((self.details[k] for k in self.details if k[0] == rule_id and k[1] == group), "")
            label = group if len(flagged) > 1 else flagged[0]
            count = f" ({len(flagged)} modules)" if len(flagged) > 1 else ""
            text = f"`{label}`{count} {_STATE_MESSAGES[rule_id]}".rstrip()
            if rule_id == "LC313":
                text = f"`{label}`: {detail}"
            elif detail:
                text += f" ({detail})"
            if label.startswith("lm_head") and rule_id == "LC307":
                text += "; a bf16 owned head must be listed in the exclusions"
            ctx.emit(
                rule_id,
                text,
                pointer=label,
                runtimes=sorted(set(flagging)),
                subjects=list(flagged),
                file=qc.source if rule_id in ("LC307", "LC309") else None,
            )


def _module_states(
    ctx: Context, qc: QuantConfig, quantized: dict[str, str], profiles: list[RuntimeProfile], scope: list[str]
) -> None:
    m, present = ctx.manifest, ctx.names.by_canonical
    notes = _Notes()
    kv = [f"{mod}.{s}" for mod in m.modules for s in KV_SCALE_SUFFIXES if f"{mod}.{s}" in present]
    if kv and not qc.kv_cache_quant_algo:
        ctx.emit(
            "LC318",
            f"{len(kv)} KV-cache scale tensors ({shorten(kv, 3)}) but {qc.source} sets no "
            "kv_cache_quant_algo",
            subjects=kv,
            runtimes=scope,
        )
    for module, mod in m.modules.items():
        state = observed_scheme(ctx, module)
        if state == "missing" or mod.component in m.incomplete:
            continue
        scales = [s for s in QUANT_SUFFIXES if f"{module}.{s}" in present]
        scheme = qc.scheme_for(module)
        if state in ("nvfp4", "fp8"):
            _scale_tensors(ctx, module, state, qc, scope)
            if state == "nvfp4" and scheme is not None and mod.in_features % scheme.group_size:
                notes.note(
                    "LC305", module, scope, f"in_features {mod.in_features} % {scheme.group_size} != 0"
                )
        elif scales:
            ctx.emit(
                "LC308",
                f"`{module}` is stored in float but ships {', '.join(scales)}: runtimes that build it "
                f"unquantized have no parameter for them (the lm_head.input_scale trap)",
                pointer=module,
                subjects=[f"{module}.{s}" for s in scales],
                runtimes=scope,
            )
        for p in profiles:
            _runtime_state(ctx, qc, p, module, state, scheme, notes)
    notes.emit(ctx, qc)


def _runtime_state(
    ctx: Context,
    qc: QuantConfig,
    p: RuntimeProfile,
    module: str,
    state: str,
    scheme: QuantScheme | None,
    notes: _Notes,
) -> None:
    """LC306-LC309, LC313, LC314: how runtime `p` builds `module` against how it is stored (`state`)."""
    family = ctx.geometry.family
    forced = p.builds_float(module, family)
    required = matches_any(module, p.float_required)
    exclusion = excluded_by(
        p, p.exclusion_name(module, family), qc.read_by(p).exclude, ctx.geometry.num_target_layers
    )
    if exclusion.conflict:
        notes.note("LC313", module, [p.name], exclusion.conflict)
    if state in ("nvfp4", "fp8"):
        if forced or required:
            notes.note("LC306", module, [p.name])
        elif scheme is None:
            notes.note("LC308", module, [p.name], f"{qc.quant_algo} in {qc.source} does not quantize it")
        elif exclusion.excluded:
            notes.note("LC308", module, [p.name], f"`{exclusion.pattern}` matches it as `{exclusion.prefix}`")
        elif not p.may_quantize(module, family):
            notes.note("LC314", module, [p.name])
    elif state == "float":
        would_quantize = scheme is not None and not forced and not exclusion.excluded
        if would_quantize:
            notes.note("LC307", module, [p.name], f"{p.display} names it `{exclusion.prefix}`")
        elif (forced or required) and not exclusion.excluded and scheme is not None:
            notes.note("LC309", module, [p.name])


def _scale_tensors(ctx: Context, module: str, state: str, qc: QuantConfig, scope: list[str]) -> None:
    present = ctx.names.by_canonical
    form = _expected_quant_form(ctx, module, state, qc)
    assert form is not None
    for name, tensor in form.items():
        info = present.get(name)
        if info is None:
            if name.endswith(".input_scale"):
                ctx.emit(
                    "LC304",
                    f"`{module}` is quantized with activation scaling but has no input_scale "
                    "(static formats without it degrade silently or fail with KeyError)",
                    pointer=name,
                    subjects=[name],
                    runtimes=scope,
                )
            else:
                ctx.emit(
                    "LC304",
                    f"`{module}` is quantized but `{name}` is missing",
                    pointer=name,
                    subjects=[name],
                    runtimes=scope,
                )
            continue
        if (
            info.dtype not in tensor.dtypes
            and tensor.shape_ok(info.shape)
            and _cast_judged(ctx, name, info, tensor.dtypes, scope)
        ):
            continue
        if info.dtype not in tensor.dtypes or not tensor.shape_ok(info.shape):
            ctx.emit(
                "LC304",
                f"`{name}` is {info.dtype} {list(info.shape)}, expected "
                f"{'/'.join(sorted(tensor.dtypes))} {list(tensor.shape)}",
                file=info.file,
                pointer=name,
                expected=f"{'/'.join(sorted(tensor.dtypes))} {list(tensor.shape)}",
                actual=f"{info.dtype} {list(info.shape)}",
                subjects=[name],
                runtimes=scope,
            )
    extra = [
        f"{module}.{s}" for s in QUANT_SUFFIXES if f"{module}.{s}" in present and f"{module}.{s}" not in form
    ]
    for name in extra:
        if name.endswith("input_scale"):
            ctx.emit(
                "LC315",
                f"`{name}` is present but the scheme is weight-only",
                pointer=name,
                subjects=[name],
                runtimes=scope,
            )
        else:
            ctx.emit(
                "LC304",
                f"`{name}` does not belong to the {state} layout",
                pointer=name,
                subjects=[name],
                runtimes=scope,
            )


_CAST_READ_LIMIT = 64 << 20  # the bytes of one mis-typed scale validate reads to judge its cast


def _cast_judged(
    ctx: Context, name: str, info: TensorInfo, dtypes: frozenset[str] | set[str], scope: list[str]
) -> bool:
    """A float scale where the layout has F8_E4M3 (same shape), for the runtimes that copy it into the parameter
    with a cast (RuntimeProfile scale_dtype_cast: SGLang's layers/parameter.py, vLLM's models/utils.py
    AutoWeightsLoader._load_module): LC329 when every value survives the cast, LC304 naming the rounding when some
    does not. True when every selected runtime in `scope` was judged here; the others (and a scale whose values
    cannot be read) are LC304's as before."""
    selected = [p for p in ctx.profiles if not scope or p.name in scope]
    casting = [p for p in selected if p.scale_dtype_cast]
    if not casting or set(dtypes) != {"F8_E4M3"} or info.dtype not in ("F16", "BF16", "F32"):
        return False
    exact = _e4m3_exact(ctx, info)
    if exact is None:
        return False
    changed, example = exact
    if changed:
        ctx.emit(
            "LC304",
            f"`{name}` is {info.dtype} where the layout has F8_E4M3: {_names(casting, 'casts|cast')} it into the "
            f"F8_E4M3 parameter, which rounds {changed} of its values (e.g. {example}): the module serves other "
            "weights than the checkpoint's (a silent mis-load)",
            file=info.file,
            pointer=name,
            expected="F8_E4M3",
            actual=info.dtype,
            subjects=[name],
            runtimes=[p.name for p in casting],
            silent_for=[p.name for p in casting],
        )
    else:
        ctx.emit(
            "LC329",
            f"`{name}` is {info.dtype} where the layout has F8_E4M3: {_names(casting, 'casts|cast')} it into the "
            "F8_E4M3 parameter, and every value is one E4M3 holds, so the module serves as stored",
            file=info.file,
            pointer=name,
            expected="F8_E4M3",
            actual=info.dtype,
            subjects=[name],
            runtimes=[p.name for p in casting],
        )
    return len(casting) == len(selected)


def _e4m3_exact(ctx: Context, info: TensorInfo) -> tuple[int, str] | None:
    """(how many values an E4M3 cast changes, one shown) for a float tensor, or None when its bytes cannot be read
    here (a Hub repository read headers-only, a tensor past _CAST_READ_LIMIT, a short file)."""
    size = info.end - info.start
    if ctx.headers_only or size > _CAST_READ_LIMIT:
        return None
    try:
        with open_regular_file(ctx.source.root / info.file, what=info.file) as handle:
            if info.end > os.fstat(handle.fileno()).st_size:
                return None
            handle.seek(info.start)
            raw = handle.read(size)
    except (OSError, InputError):
        return None
    if len(raw) != size:
        return None
    values = decode(raw, info.dtype)
    back = e4m3_decode(e4m3_encode(values))
    differs = ~((back == values) | (np.isnan(back) & np.isnan(values)))
    count = int(differs.sum())
    if not count:
        return 0, ""
    first = float(values[differs][0])
    return count, f"{first:.6g} -> {float(back[differs][0]):.6g}"
