"""Every check validate runs. The catalogue (ids, severities, summaries, fix hints) is data at the top;
each check below reads the shared Context and emits findings by rule id."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import LILICORR_KEYS
from lilicorr_ckpt.checkpoint.geometry import head_declared, routed_by_projector
from lilicorr_ckpt.checkpoint.load import Checkpoint
from lilicorr_ckpt.checkpoint.manifest import (
    FLOAT_DTYPES,
    KV_SCALE_SUFFIXES,
    QUANT_SUFFIXES,
    ExpectedTensor,
    component_of_name,
    quant_scheme,
)
from lilicorr_ckpt.checkpoint.names import observed_scheme as observed_scheme_of
from lilicorr_ckpt.checkpoint.quant import MATCHERS, QuantConfig, excluded_by, pattern_problems
from lilicorr_ckpt.checkpoint.target import TargetInfo
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checks.findings import RULES, Finding, rule
from lilicorr_ckpt.profiles import RuntimeProfile, matches_any

# ---------------------------------------------------------------- catalogue
CFG = "config"
rule("LC001", "config-field-type", "error", CFG, "A config.json field has the wrong JSON type.",
     "Write the value with the type the loaders cast to (integers for sizes and ids, numbers for eps/scale).")
rule("LC002", "config-duplicate-key", "warning", CFG, "config.json repeats a key; readers keep only the last one.",
     "Remove the duplicate so every reader sees the same value.")
rule("LC003", "config-unknown-key", "info", CFG, "A key no loader reads (kept, not an error).",
     "Nothing to do unless it is a misspelling of a key the loaders read.")
rule("LC010", "architecture", "error", CFG, "`architectures` is missing or names no DFlash-family drafter.",
     'Set "architectures": ["LiLiCorrDraftModel"] (or DFlashDraftModel for a head-free draft).')
rule("LC011", "architecture-head-mismatch", "error", CFG,
     "The declared architecture and the head it carries disagree.",
     "Declare LiLiCorrDraftModel for a checkpoint with lilicorr.* tensors, DFlashDraftModel for one without.")
rule("LC012", "family-backbone-only", "info", CFG,
     "A sibling DFlash-family head (DFlash2, DSpark, Domino): only the backbone is checked.",
     "Nothing to do; head checks for this family are not implemented yet.")
rule("LC013", "head-geometry-unused", "warning", CFG,
     "DFlashDraftModel is declared with lilicorr_* geometry: the loaders that select the class from architectures "
     "never build the head.", "Declare LiLiCorrDraftModel, or drop the lilicorr_* keys for a head-free draft.")
rule("LC101", "lilicorr-key-missing", "error", CFG, "A required lilicorr_* geometry key is missing from dflash_config.",
     "Add every lilicorr_* key to dflash_config with the values the head was trained with.")
rule("LC102", "lilicorr-key-not-finite", "error", CFG, "A lilicorr_* value is NaN or infinite.",
     "Write the finite value the head was trained with.")
rule("LC103", "lilicorr-value-range", "error", CFG, "A lilicorr_* value is out of its range (must be > 0).",
     "Write the trained value; every lilicorr_* key except hidden_size must be positive.")
rule("LC104", "topk-power-of-two", "error", CFG,
     "lilicorr_candidate_topk is not a power of two <= 16, which the runtime's fused top-k requires.",
     "Retrain/export with K in {1, 2, 4, 8, 16}, or serve with a runtime that accepts any K.")
rule("LC105", "head-width", "error", CFG, "lilicorr_hidden_size is negative, or 0 where the runtime refuses 0.",
     "Write the head's real width (the exporter writes the width, never 0).")
rule("LC106", "heads-divide-width", "error", CFG, "lilicorr_num_heads does not divide the head width.",
     "Use a head count that divides lilicorr_hidden_size.")
rule("LC107", "vector-eps-range", "error", CFG, "lilicorr_vector_eps is outside (0, 0.5), which TensorRT-LLM refuses.",
     "Write the trained vector_eps; it must lie in (0, 0.5).")
rule("LC108", "lilicorr-disabled", "error", CFG, "lilicorr_enabled is false on a LiLiCorrDraftModel.",
     "Set lilicorr_enabled true, or declare DFlashDraftModel and drop the head tensors.")
rule("LC110", "block-size-missing", "error", CFG, "block_size is absent and the runtime refuses the config (see LC125 for those that assume a default).",
     "Write dflash_config.block_size (and the top-level block_size for older readers).")
rule("LC111", "block-size-conflict", "warning", CFG,
     "dflash_config.block_size and the top-level block_size disagree (the nested one wins).",
     "Make both keys hold the trained block size.")
rule("LC112", "block-size-range", "error", CFG, "block_size must be an integer >= 2 for a LiLiCorr drafter.",
     "Write the trained block size (16 for the published recipes).")
rule("LC113", "target-layer-ids", "error", CFG,
     "target_layer_ids is missing, empty, negative, duplicated or out of range.",
     "Write the exact target layer ids the drafter was trained on (HF convention: id i reads the output of layer i).")
rule("LC114", "target-layer-ids-order", "warning", CFG, "target_layer_ids is not ascending.",
     "Check the order: fc's input columns follow the list order, so the order must be the trained one.")
rule("LC115", "mask-token", "error", CFG, "mask_token_id is missing or outside the vocabulary.",
     "Write dflash_config.mask_token_id: the id the drafter was trained with, < vocab_size.")
rule("LC116", "conv-geometry", "error", CFG,
     "conv_kernel_size / conv_group_size are inconsistent (set alone, negative, kernel > block, width not divisible).",
     "Write both keys as trained, or neither for a convolution-free drafter.")
rule("LC117", "causal", "error", CFG, "The draft is declared causal, which TensorRT-LLM refuses.",
     "Set dflash_config.causal (and is_causal) to false.")
rule("LC118", "backbone-geometry", "error", CFG, "A backbone geometry key is missing or invalid.",
     "Write the draft's hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size.")
rule("LC119", "attention-windows", "error", CFG, "layer_types / sliding_window are inconsistent.",
     "Give one layer_types entry per draft layer and a sliding_window when any layer is sliding_attention.")
rule("LC120", "draft-vocabulary", "error", CFG, "A reduced or remapped draft vocabulary; LiLiCorr needs the full target vocabulary.",
     "Drop draft_vocab_size / draft_id_to_target_id and train with the target vocabulary.")
rule("LC121", "fp16-dtype", "warning", CFG, "The draft is stored as float16, which overflows in DFlash drafting.",
     "Export bfloat16.")
rule("LC122", "vocab-size", "error", CFG, "vocab_size is missing; candidates and mask ids cannot be checked.",
     "Write the target's vocab_size.")
rule("LC123", "output-multiplier", "error", CFG, "output_multiplier is not > 0, which SGLang's DFlash config parser "
     "requires.", "Remove output_multiplier (default 1) or write the positive value the drafter was trained with.")

rule("LC124", "topk-exceeds-vocab", "warning", CFG,
     "lilicorr_candidate_topk exceeds vocab_size: MLX refuses it; the other runtimes document no check.",
     "Write the trained K; it cannot exceed the vocabulary.")
rule("LC125", "block-size-defaulted", "warning", CFG,
     "block_size is absent and the runtime silently assumes its default.",
     "Write dflash_config.block_size (and the top-level block_size for older readers).")
rule("LC126", "block-size-top-level-only", "info", CFG, "block_size is only at the top level of config.json.",
     "Write it in dflash_config too.")
rule("LC127", "mask-token-top-level-only", "info", CFG,
     "mask_token_id is only at the top level; MLX-style readers require it in dflash_config.",
     "Write dflash_config.mask_token_id too.")
rule("LC128", "causal-ignored", "warning", CFG,
     "The draft is declared causal; this runtime drafts non-causally within the block whatever it says.",
     "Set dflash_config.causal (and is_causal) to false.")

COV = "coverage"
rule("LC201", "head-missing", "error", COV, "Head tensors the geometry requires are missing.",
     "Export the full head; a draft with no LiLiCorr head should declare DFlashDraftModel.")
rule("LC202", "head-surplus", "error", COV, "Head tensors the geometry does not build (they would be dropped or refused).",
     "Check lilicorr_hidden_size, lilicorr_num_layers and lilicorr_factor_dim against the tensors.")
rule("LC203", "backbone-missing", "error", COV, "Backbone tensors are missing.",
     "Export every layer's attention, MLP and norm weights plus fc, hidden_norm and norm.")
rule("LC204", "unexpected-tensor", "error", COV, "A tensor no loader reads; SGLang drops it silently.",
     "Remove it, or fix the config so that the module it belongs to is built.")
rule("LC205", "conv-dropped", "error", COV, "Convolution tensors are present but the conv keys are absent or 0: every one would be dropped silently.",
     "Write conv_kernel_size and conv_group_size in dflash_config.")
rule("LC206", "conv-missing", "error", COV, "The conv keys are set but the checkpoint has no convolution tensors (kernel_projection would stay random).",
     "Export the convolution tensors, or remove conv_kernel_size / conv_group_size.")
rule("LC207", "conv-partial", "error", COV, "Only some convolution tensors are present.",
     "Export all 4 tensors per layer (base_kernel and kernel_projection for attention_conv and mlp_conv).")
rule("LC208", "shape", "error", COV, "A tensor's shape differs from what the config implies.",
     "Fix the config geometry or re-export the tensor.")
rule("LC209", "dtype", "error", COV, "A tensor's dtype is not allowed for it.",
     "Store floating-point tensors as bf16/fp16/fp32; quantized weights need their scales and metadata.")
rule("LC210", "legacy-names", "warning", COV, "Legacy Sequential MLP names in the head (not every runtime renames them).",
     "Run `lilicorr-ckpt convert` to write the named-MLP layout.")
rule("LC211", "name-collision", "error", COV, "Two tensors map to the same name after the loaders' renaming.",
     "Keep one of them.")
rule("LC212", "training-prefix", "error", COV, "Tensor names still carry a training prefix (dflash_module./eagle_module.) no loader strips.",
     "Run `lilicorr-ckpt convert` (it strips training prefixes).")
rule("LC213", "model-prefix", "info", COV, "Tensor names carry a `model.` prefix (every loader strips it).",
     "Nothing to do.")
rule("LC214", "mixed-float-dtypes", "warning", COV, "Floating-point tensors use more than one dtype.",
     "Export every float tensor in the model dtype.")
rule("LC215", "coverage-skipped", "info", COV, "Coverage of a component was not checked because its geometry is incomplete.",
     "Fix the geometry findings first.")

rule("LC216", "legacy-names-renamed", "info", COV,
     "Legacy Sequential MLP names in the head, which every selected runtime renames.",
     "Nothing to do; `lilicorr-ckpt convert` writes the named-MLP layout.")

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
rule("LC319", "hf-quant-config-missing", "warning", QNT, "config.json declares quantization but hf_quant_config.json is absent.",
     "Write hf_quant_config.json (the nested ModelOpt form) beside config.json; some readers only look there.")

rule("LC322", "quant-method-missing", "warning", QNT,
     "config.json quantization_config has no quant_method; this runtime derives one, others may not.",
     'Write the flat form with "quant_method": "modelopt_fp4" (NVFP4) or "modelopt" (FP8).')
rule("LC323", "exclusion-unmatched", "info", QNT,
     "An exclusion pattern matches no module of this drafter under any runtime (a base-model or training-time name).",
     "Nothing to do unless it was meant to exclude a drafter module.")

HEAD = "lm_head"
rule("LC401", "own-head-missing", "error", HEAD, "has_own_lm_head is true but lm_head.weight is absent.",
     "Export lm_head.weight [vocab, hidden], or drop has_own_lm_head to borrow the target's head.")
rule("LC402", "own-head-undeclared", "error", HEAD, "lm_head tensors are present but has_own_lm_head is not true: TRT ignores them, vLLM uses them.",
     'Set "has_own_lm_head": true, or remove lm_head.*.')
rule("LC403", "own-head-unconfirmed", "warning", HEAD, "The runtime's support for a drafter-owned lm_head is not confirmed.",
     "Test the runtime, or borrow the target's head.")

TGT = "target"
rule("LC501", "target-hidden-size", "error", TGT, "The draft and target hidden sizes differ.",
     "Validate against the target the drafter was trained for.")
rule("LC502", "target-layer-range", "error", TGT, "A target_layer_id is not a layer of the target.",
     "Ids use the HF convention: id i reads the output of target layer i (hidden_states[i+1]); valid ids are 0..L-1.")
rule("LC503", "target-vocab", "error", TGT, "The draft and target vocabularies differ.",
     "LiLiCorr scores candidates with the target's embeddings; the vocabularies must be identical.")
rule("LC504", "target-mask-token", "error", TGT, "mask_token_id is outside the target's embedding table or is a special token.",
     "Use a dedicated mask token that exists in the target embedding and is not eos/bos/pad.")
rule("LC505", "target-layer-count", "warning", TGT, "num_target_layers differs from the target's layer count.",
     "Write the target's num_hidden_layers.")
rule("LC506", "target-rope", "warning", TGT, "rope_theta differs from the target's (the exporter copies it).",
     "Check that this is the right target.")
rule("LC507", "target-unchecked", "warning", TGT,
     "A target compatibility check did not run: the target's config lacks the value it needs, or gives it with the "
     "wrong type.", "Point --target at the target's own Hugging Face directory (or GGUF file), with integer geometry.")

FIL = "files"
rule("LC601", "pickle-files", "warning", FIL, "Pickle weight files (*.bin, *.pt, ...) next to the safetensors; never unpickled here.",
     "Publish safetensors only.")
rule("LC602", "index-missing-shard", "error", FIL, "The index names a shard file that does not exist.",
     "Upload the shard or regenerate the index.")
rule("LC603", "index-tensor-not-in-shard", "error", FIL, "The index places a tensor in a shard that does not hold it.",
     "Regenerate the index from the shards.")
rule("LC604", "shard-tensor-not-in-index", "error", FIL, "A shard holds a tensor the index does not list.",
     "Regenerate the index from the shards.")
rule("LC605", "duplicate-tensor", "error", FIL, "The same tensor is stored in more than one file.",
     "Keep one copy.")
rule("LC606", "index-total-size", "warning", FIL, "The index's total_size differs from the bytes the shards hold.",
     "Regenerate the index.")
rule("LC607", "unreferenced-shard", "warning", FIL, "A safetensors file the index does not reference.",
     "Delete it; loaders that glob *.safetensors may load it.")
rule("LC608", "no-weights", "error", FIL, "No safetensors weights found.", "Export model.safetensors.")
rule("LC609", "header-duplicate-key", "error", FIL,
     "A safetensors header names the same tensor twice; every loader keeps one entry silently, not the same one.",
     "Re-export the file: each tensor name once per header.")

DEEP = "deep"
rule("LC701", "non-finite", "error", DEEP, "A tensor contains NaN or Inf.", "Re-export from a healthy training checkpoint.")
rule("LC702", "all-zero", "warning", DEEP, "A weight tensor is all zeros (untrained or lost in export).",
     "Check the export; an all-zero kernel_projection is the untrained initialisation.")
rule("LC703", "all-zero-scale", "error", DEEP,
     "A quantization scale tensor is all zeros: the module dequantizes to zero and outputs only its bias.",
     "Re-export the module; ModelOpt clamps NVFP4 weight_scale to [2^-9, 448] and derives the other scales from "
     "non-zero amax values.")
rule("LC704", "negative-scale", "error", DEEP,
     "A quantization scale holds negative values: the weights (or activations) it scales change sign.",
     "Re-export the module; every ModelOpt scale is an amax ratio (>= 0), and NVFP4 block scales are clamped to "
     "[2^-9, 448].")


# ---------------------------------------------------------------- context


class Context:
    """One checkpoint being judged: what was read, the runtimes it is judged for, and the findings so far."""

    def __init__(self, checkpoint: Checkpoint, *, profiles: list[RuntimeProfile], target: TargetInfo | None,
                 deep: bool):
        self.checkpoint = checkpoint
        self.source = checkpoint.source
        self.parsed = checkpoint.parsed
        self.config = checkpoint.parsed.config
        self.geometry = checkpoint.geometry
        self.manifest = checkpoint.manifest
        self.table = checkpoint.table
        self.names = checkpoint.names
        self.quant_configs = checkpoint.quant_configs
        self.quant_problems = checkpoint.quant_problems
        self.quant = checkpoint.quant
        self.profiles = profiles
        self.target = target
        self.deep = deep
        self.findings: list[Finding] = []

    @property
    def runtime_names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def emit(self, rule_id: str, message: str, *, fix: str | None = None,
             file: str | None = None, pointer: str | None = None, expected: Any = None, actual: Any = None,
             runtimes: Iterable[str] = (), subjects: Iterable[str] = ()) -> None:
        r = RULES[rule_id]
        runtimes = sorted(p for p in runtimes if p in self.runtime_names)
        self.findings.append(Finding(
            rule=r.id, name=r.name, severity=r.severity, message=message, fix=fix or r.fix,
            file=file, pointer=pointer, expected=None if expected is None else str(expected),
            actual=None if actual is None else str(actual), runtimes=runtimes, subjects=list(subjects)))

    def emit_for(self, rule_id: str, profiles: list[RuntimeProfile], message: str, **kw: Any) -> None:
        """Emit once for the profiles among those selected; nothing when none is selected."""
        names = [p.name for p in profiles if p.name in self.runtime_names]
        if names:
            self.emit(rule_id, message, runtimes=names, **kw)


CHECKS: list[Callable[[Context], None]] = []


def check(fn: Callable[[Context], None]) -> Callable[[Context], None]:
    CHECKS.append(fn)
    return fn


def _shorten(items: list[str], n: int = 6) -> str:
    items = list(items)
    shown = ", ".join(f"`{x}`" for x in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def _is_pow2(k: int) -> bool:
    return k > 0 and k & (k - 1) == 0


# ---------------------------------------------------------------- config checks


@check
def config_schema(ctx: Context) -> None:
    for issue in ctx.parsed.issues:
        ctx.emit("LC001", f"config.json {issue.describe()}", file="config.json", pointer=issue.path,
                 expected=issue.expected, actual=issue.found)
    for key in ctx.parsed.duplicate_keys:
        ctx.emit("LC002", f"config.json repeats the key `{key}`; JSON readers keep the last value",
                 file="config.json", subjects=[key])
    interesting = [k for k in ctx.parsed.unknown_keys if "lilicorr" in k or "conv" in k or "block" in k
                   or "target" in k or "mask" in k]
    for key in interesting:
        ctx.emit("LC003", f"config.json key {key} is not read by any loader (misspelt?)", file="config.json",
                 pointer=key)


@check
def architecture(ctx: Context) -> None:
    cfg = ctx.config
    arch = cfg.architecture
    has_head_tensors = any(n.startswith("lilicorr.") for n in ctx.names.by_canonical)
    if cfg.architectures is None or not cfg.architectures:
        if not ctx.parsed.invalid("$.architectures"):
            ctx.emit("LC010", "config.json has no `architectures`; loaders select the drafter class from it",
                     file="config.json", pointer="$.architectures", expected='["LiLiCorrDraftModel"]', actual="absent")
        return
    if cfg.family is None:
        ctx.emit("LC010", f"architectures[0] is `{arch}`, not a DFlash-family drafter the loaders know",
                 file="config.json", pointer="$.architectures[0]",
                 expected="LiLiCorrDraftModel | DFlashDraftModel", actual=arch)
        return
    if cfg.family in ("dflash2", "dspark", "domino"):
        ctx.emit("LC012", f"{arch} recognised: backbone, convolution and file checks only; its head is not checked",
                 file="config.json", pointer="$.architectures[0]")
    if cfg.family == "lilicorr" and cfg.dflash.lilicorr_enabled is False:
        ctx.emit("LC108", "dflash_config.lilicorr_enabled is false on LiLiCorrDraftModel: SGLang parses the "
                 "config as plain DFlash and the model then raises; vLLM refuses it",
                 file="config.json", pointer="$.dflash_config.lilicorr_enabled", expected="true", actual="false")
    routers = [p for p in ctx.profiles if p.projector_type_routes]
    others = [p for p in ctx.profiles if not p.projector_type_routes]
    if routed_by_projector(cfg) and has_head_tensors:
        ctx.emit_for("LC011", others, f"architectures declares {arch} but the checkpoint has lilicorr.* head "
                     "tensors: these loaders select the class from architectures, build no head and drop them "
                     "silently (TensorRT-LLM routes it to LiLiCorr through dflash_config.projector_type / "
                     "lilicorr_enabled)", file="config.json", pointer="$.architectures[0]",
                     expected="LiLiCorrDraftModel", actual=arch)
    elif routed_by_projector(cfg) and head_declared(cfg):
        ctx.emit_for("LC013", others, "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
                     file="config.json", pointer="$.architectures[0]",
                     expected="LiLiCorrDraftModel", actual=arch)
        if ctx.table.tensors:
            ctx.emit_for("LC011", routers, "DFlashDraftModel with dflash_config.projector_type \"lilicorr\" (or "
                         "lilicorr_enabled true): TensorRT-LLM routes it to LiLiCorr, but the checkpoint has no "
                         "lilicorr.* tensors", file="config.json", pointer="$.dflash_config.projector_type",
                         expected="lilicorr.* tensors", actual="none")
    elif cfg.family != "lilicorr" and has_head_tensors:
        ctx.emit("LC011", f"architectures declares {arch} but the checkpoint has lilicorr.* head tensors: the "
                 "loader builds no head and drops them silently", file="config.json", pointer="$.architectures[0]",
                 expected="LiLiCorrDraftModel", actual=arch)
    elif cfg.family == "lilicorr" and not has_head_tensors and ctx.table.tensors:
        ctx.emit("LC011", "LiLiCorrDraftModel declared but the checkpoint has no lilicorr.* tensors "
                 "(a draft with no LiLiCorr head should declare DFlashDraftModel)",
                 file="config.json", pointer="$.architectures[0]", expected="lilicorr.* tensors", actual="none")
    elif cfg.family == "dflash" and head_declared(cfg):
        ctx.emit("LC013", "DFlashDraftModel declared with lilicorr_* geometry: the head is never built",
                 file="config.json", pointer="$.architectures[0]",
                 expected="LiLiCorrDraftModel", actual=arch)


@check
def lilicorr_geometry(ctx: Context) -> None:
    g = ctx.geometry
    if not g.lilicorr_enabled or not (ctx.config.family in ("lilicorr", None) or routed_by_projector(ctx.config)):
        return
    d = msgspec.structs.asdict(ctx.config.dflash)
    for key in LILICORR_KEYS:
        path = f"$.dflash_config.{key}"
        value = d[key]
        if value is None:
            if ctx.parsed.invalid(path):
                continue
            top = ctx.parsed.raw.get(key)
            where = " (it is at the top level; loaders read it only from dflash_config)" if top is not None else ""
            ctx.emit("LC101", f"dflash_config.{key} is missing{where}: every loader refuses a LiLiCorr config "
                     "without it (no default: a guess would load cleanly and score a different function)",
                     file="config.json", pointer=path, expected="present", actual="absent", subjects=[key])
            continue
        if isinstance(value, float) and not math.isfinite(value):
            ctx.emit("LC102", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                     expected="a finite number", actual=value, subjects=[key])
            continue
        if key == "lilicorr_hidden_size":
            if value < 0:
                ctx.emit("LC105", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                         expected=">= 0", actual=value, subjects=[key])
            elif value == 0:
                refuse = [p for p in ctx.profiles if not p.hidden_size_zero_ok]
                ctx.emit_for("LC105", refuse, f"dflash_config.{key} is 0, which TensorRT-LLM refuses "
                             f"(SGLang and vLLM read it as the draft width {g.hidden_size})",
                             file="config.json", pointer=path, expected=f">= 1 (the real width, {g.hidden_size})",
                             actual=0, subjects=[key])
            continue
        if value <= 0:
            ctx.emit("LC103", f"dflash_config.{key} is {value}", file="config.json", pointer=path,
                     expected="> 0", actual=value, subjects=[key])
    k = d["lilicorr_candidate_topk"]
    if isinstance(k, int) and k > 0:
        bad = [p for p in ctx.profiles if p.topk_power_of_two_max is not None
               and (not _is_pow2(k) or k > p.topk_power_of_two_max)]
        if bad:
            ctx.emit_for("LC104", bad, f"lilicorr_candidate_topk is {k}: the fused candidate top-k holds its tiles "
                         "in one Triton lane group, so it must be a power of two <= 16",
                         file="config.json", pointer="$.dflash_config.lilicorr_candidate_topk",
                         expected="one of 1, 2, 4, 8, 16", actual=k)
        if g.vocab_size is not None and k > g.vocab_size:
            # format.md §1.2: only MLX (not a --runtime profile) is documented to refuse K > V
            ctx.emit("LC124", f"lilicorr_candidate_topk {k} exceeds vocab_size {g.vocab_size}: MLX refuses it; "
                     "SGLang, vLLM and TensorRT-LLM document no check (a top-K over fewer than K tokens)",
                     file="config.json", pointer="$.dflash_config.lilicorr_candidate_topk",
                     expected=f"<= {g.vocab_size}", actual=k)
    n, h = g.head_num_heads, g.head_hidden_size
    if n is not None and h is not None and h % n:
        ctx.emit("LC106", f"lilicorr_num_heads {n} does not divide the head width {h}", file="config.json",
                 pointer="$.dflash_config.lilicorr_num_heads", expected=f"a divisor of {h}", actual=n)
    if g.head_mlp_width == 0:
        ctx.emit("LC103", f"int(lilicorr_hidden_size * lilicorr_mlp_ratio) is 0 (h={h}, ratio={g.head_mlp_ratio})",
                 file="config.json", pointer="$.dflash_config.lilicorr_mlp_ratio", expected="> 0", actual=0)
    eps = d["lilicorr_vector_eps"]
    if isinstance(eps, float) and math.isfinite(eps) and eps > 0 and eps >= 0.5:
        ctx.emit_for("LC107", [p for p in ctx.profiles if p.vector_eps_below_half],
                     f"lilicorr_vector_eps is {eps}", file="config.json",
                     pointer="$.dflash_config.lilicorr_vector_eps", expected="in (0, 0.5)", actual=eps)


@check
def block_size(ctx: Context) -> None:
    cfg = ctx.config
    nested, top = cfg.dflash.block_size, cfg.block_size
    if nested is None and top is None:
        if ctx.parsed.invalid("$.block_size") or ctx.parsed.invalid("$.dflash_config.block_size"):
            return
        for p in ctx.profiles:
            if p.block_size_default is None:
                ctx.emit("LC110", f"block_size is absent: {p.display} refuses the config", runtimes=[p.name],
                         file="config.json", pointer="$.dflash_config.block_size", expected="present", actual="absent")
            else:
                ctx.emit("LC125", f"block_size is absent: {p.display} silently assumes {p.block_size_default}",
                         runtimes=[p.name], file="config.json",
                         pointer="$.dflash_config.block_size", expected="present", actual="absent")
        return
    if nested is not None and top is not None and nested != top:
        ctx.emit("LC111", f"dflash_config.block_size is {nested} but the top-level block_size is {top}; "
                 f"SGLang, vLLM and TRT use {nested}, older readers {top}", file="config.json",
                 pointer="$.block_size", expected=nested, actual=top)
    value = nested if nested is not None else top
    minimum = 2 if ctx.geometry.lilicorr_enabled else 1
    if value < minimum:
        ctx.emit("LC112", f"block_size is {value}", file="config.json",
                 pointer="$.dflash_config.block_size" if nested is not None else "$.block_size",
                 expected=f">= {minimum}", actual=value)
    elif nested is None:
        ctx.emit("LC126", "block_size is only at the top level; write it in dflash_config too",
                 file="config.json", pointer="$.dflash_config.block_size")


@check
def target_layer_ids(ctx: Context) -> None:
    cfg = ctx.config
    ids = cfg.dflash.target_layer_ids if cfg.dflash.target_layer_ids is not None else cfg.target_layer_ids
    path = "$.dflash_config.target_layer_ids" if cfg.dflash.target_layer_ids is not None else "$.target_layer_ids"
    if ids is None:
        if ctx.parsed.invalid("$.target_layer_ids") or ctx.parsed.invalid("$.dflash_config.target_layer_ids"):
            return
        fallbacks = "; ".join(f"{p.display} {p.target_layer_ids_fallback}" for p in ctx.profiles)
        ctx.emit("LC113", f"target_layer_ids is missing ({fallbacks}); wrong taps load cleanly and collapse acceptance",
                 file="config.json", pointer="$.dflash_config.target_layer_ids", expected="the trained ids",
                 actual="absent")
        return
    if not ids:
        ctx.emit("LC113", "target_layer_ids is empty", file="config.json", pointer=path,
                 expected="at least one id", actual="[]")
        return
    negative = [i for i in ids if i < 0]
    if negative:
        ctx.emit("LC113", f"target_layer_ids has negative ids {negative} (they would wrap around silently)",
                 file="config.json", pointer=path, expected="ids >= 0", actual=ids)
    seen: set[int] = set()
    dups = sorted({i for i in ids if i in seen or seen.add(i)})
    if dups:
        ctx.emit("LC113", f"target_layer_ids repeats {dups}", file="config.json", pointer=path,
                 expected="unique ids", actual=ids)
    n = ctx.geometry.num_target_layers
    if n is not None:
        out = [i for i in ids if i >= n]
        if out:
            shifted = " (they look shifted by +1: ids are 'output of layer i', 0-based)" if max(ids) == n else ""
            ctx.emit("LC113", f"target_layer_ids {out} are >= num_target_layers {n}{shifted}", file="config.json",
                     pointer=path, expected=f"ids in 0..{n - 1}", actual=ids)
    if not negative and not dups and list(ids) != sorted(ids):
        ctx.emit("LC114", f"target_layer_ids {ids} is not ascending", file="config.json", pointer=path)


@check
def mask_token(ctx: Context) -> None:
    cfg = ctx.config
    mask = cfg.dflash.mask_token_id if cfg.dflash.mask_token_id is not None else cfg.mask_token_id
    if mask is None:
        if ctx.parsed.invalid("$.dflash_config.mask_token_id") or ctx.parsed.invalid("$.mask_token_id"):
            return
        what = "; ".join(f"{p.display} {p.mask_token_fallback}" for p in ctx.profiles)
        ctx.emit("LC115", f"mask_token_id is missing ({what})", file="config.json",
                 pointer="$.dflash_config.mask_token_id", expected="the trained mask id", actual="absent")
        return
    if mask < 0:
        ctx.emit("LC115", f"mask_token_id is {mask}", file="config.json", pointer="$.dflash_config.mask_token_id",
                 expected=">= 0", actual=mask)
    elif cfg.vocab_size is not None and mask >= cfg.vocab_size:
        ctx.emit("LC115", f"mask_token_id {mask} is not below vocab_size {cfg.vocab_size}", file="config.json",
                 pointer="$.dflash_config.mask_token_id", expected=f"< {cfg.vocab_size}", actual=mask)
    elif cfg.dflash.mask_token_id is None:
        ctx.emit("LC127", "mask_token_id is only at the top level; MLX-style readers require it in dflash_config",
                 file="config.json", pointer="$.dflash_config.mask_token_id")


@check
def conv_geometry(ctx: Context) -> None:
    d = ctx.config.dflash
    taps, group = d.conv_kernel_size, d.conv_group_size
    for key, value in (("conv_kernel_size", taps), ("conv_group_size", group)):
        if value is not None and value < 0:
            ctx.emit("LC116", f"dflash_config.{key} is {value}", file="config.json",
                     pointer=f"$.dflash_config.{key}", expected=">= 0", actual=value)
    t, gsz = taps or 0, group or 0
    if (t > 0) != (gsz > 0):
        strict = [p for p in ctx.profiles if p.conv_keys_both_or_neither or t > 0]
        shown = [("absent" if v is None else v) for v in (taps, group)]
        ctx.emit_for("LC116", strict, f"conv_kernel_size is {shown[0]} and conv_group_size is {shown[1]}: both or neither",
                     file="config.json", pointer="$.dflash_config.conv_kernel_size",
                     expected="both > 0 or both 0", actual=f"{shown[0]}/{shown[1]}")
    if t > 0:
        b = ctx.geometry.block_size
        if b is not None and t > b:
            ctx.emit_for("LC116", [p for p in ctx.profiles if p.conv_kernel_within_block],
                         f"conv_kernel_size {t} exceeds block_size {b}", file="config.json",
                         pointer="$.dflash_config.conv_kernel_size", expected=f"<= {b}", actual=t)
    m = ctx.geometry.hidden_size
    if gsz > 0 and m is not None and m % gsz:
        ctx.emit("LC116", f"hidden_size {m} is not divisible by conv_group_size {gsz}", file="config.json",
                 pointer="$.dflash_config.conv_group_size", expected=f"a divisor of {m}", actual=gsz)


@check
def backbone_config(ctx: Context) -> None:
    cfg = ctx.config
    if cfg.dflash.causal is True or cfg.is_causal is True:
        key = "$.dflash_config.causal" if cfg.dflash.causal else "$.is_causal"
        refuse = [p for p in ctx.profiles if p.refuses_causal]
        others = [p for p in ctx.profiles if not p.refuses_causal]
        for group, rule_id in ((refuse, "LC117"), (others, "LC128")):
            ctx.emit_for(rule_id, group, "the draft is declared causal; TensorRT-LLM refuses it (\"requires "
                         "non-causal\"), the other stacks draft non-causally within the block whatever it says",
                         file="config.json", pointer=key, expected="false", actual="true")
    if cfg.output_multiplier is not None and not (cfg.output_multiplier > 0):
        ctx.emit_for("LC123", [p for p in ctx.profiles if p.output_multiplier_positive],
                     f"output_multiplier is {cfg.output_multiplier}: SGLang's DFlash config parser requires it "
                     "> 0 (default 1)", file="config.json", pointer="$.output_multiplier", expected="> 0",
                     actual=cfg.output_multiplier)
    for key, value in (("hidden_size", cfg.hidden_size), ("num_hidden_layers", cfg.num_hidden_layers),
                       ("num_attention_heads", cfg.num_attention_heads), ("intermediate_size", cfg.intermediate_size)):
        if ctx.parsed.invalid(f"$.{key}"):
            continue
        if value is None or value < 1:
            ctx.emit("LC118", f"{key} is {'absent' if value is None else value}", file="config.json",
                     pointer=f"$.{key}", expected=">= 1", actual="absent" if value is None else value)
    g = ctx.geometry
    if cfg.num_key_value_heads is not None and g.num_heads and (cfg.num_key_value_heads < 1
                                                               or g.num_heads % cfg.num_key_value_heads):
        ctx.emit("LC118", f"num_key_value_heads {cfg.num_key_value_heads} does not divide num_attention_heads "
                 f"{g.num_heads}", file="config.json", pointer="$.num_key_value_heads")
    if cfg.head_dim is None and g.hidden_size and g.num_heads and g.hidden_size % g.num_heads:
        ctx.emit("LC118", "head_dim is absent and hidden_size is not divisible by num_attention_heads",
                 file="config.json", pointer="$.head_dim")
    if cfg.vocab_size is None and not ctx.parsed.invalid("$.vocab_size"):
        ctx.emit("LC122", "vocab_size is absent", file="config.json", pointer="$.vocab_size")
    if cfg.layer_types is not None and g.num_layers is not None and len(cfg.layer_types) != g.num_layers:
        ctx.emit("LC119", f"layer_types has {len(cfg.layer_types)} entries for {g.num_layers} draft layers",
                 file="config.json", pointer="$.layer_types", expected=g.num_layers, actual=len(cfg.layer_types))
    if cfg.layer_types and "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        ctx.emit("LC119", "a layer is sliding_attention but sliding_window is not set", file="config.json",
                 pointer="$.sliding_window")
    if cfg.dflash.use_swa and not (cfg.dflash.swa_window_size or cfg.sliding_window):
        ctx.emit("LC119", "dflash_config.use_swa is true but neither swa_window_size nor sliding_window is set",
                 file="config.json", pointer="$.dflash_config.swa_window_size")
    unknown = sorted({t for t in cfg.layer_types or [] if t not in ("full_attention", "sliding_attention")})
    if unknown:
        ctx.emit("LC119", f"unknown layer_types {unknown}", file="config.json", pointer="$.layer_types")
    if cfg.draft_id_to_target_id is not None or (cfg.draft_vocab_size is not None and cfg.vocab_size is not None
                                                 and cfg.draft_vocab_size != cfg.vocab_size):
        ctx.emit("LC120", "the config declares a reduced/remapped draft vocabulary; LiLiCorr drafts over the full "
                 "target vocabulary", file="config.json", pointer="$.draft_vocab_size")
    if (cfg.model_dtype or "").lower() in ("float16", "fp16", "half"):
        ctx.emit("LC121", "torch_dtype is float16; DFlash drafts overflow in fp16 (acceptance fell to 0.06 of 15 "
                 "in lmdeploy#4991)", file="config.json", pointer="$.torch_dtype")


# ---------------------------------------------------------------- coverage checks


def _family_tensor(ctx: Context, name: str) -> bool:
    return any(name.startswith(p) for p in ctx.manifest.family_prefixes)


@check
def coverage(ctx: Context) -> None:
    m, view = ctx.manifest, ctx.names
    present = view.by_canonical
    for component, reason in m.incomplete.items():
        ctx.emit("LC215", f"{component} tensors not checked: {reason}")
    for key, reason in m.implausible.items():  # a layer count the files cannot hold: reported, never expanded
        ctx.emit("LC118" if key == "num_hidden_layers" else "LC103", reason, file="config.json", pointer=f"$.{key}")
    if view.training_prefixed:
        ctx.emit("LC212", f"{len(view.training_prefixed)} tensor names keep a training prefix, e.g. "
                 f"{_shorten(view.training_prefixed, 3)}: no loader strips it, so SGLang drops them all",
                 subjects=view.training_prefixed)
    if view.model_prefixed:
        ctx.emit("LC213", f"{len(view.model_prefixed)} tensor names carry a `model.` prefix (stripped by loaders)")
    for canonical, names in view.collisions.items():
        ctx.emit("LC211", f"{_shorten(names)} all map to `{canonical}` after renaming; TensorRT-LLM refuses this",
                 subjects=names)
    if view.legacy:
        unconfirmed = [p for p in ctx.profiles if p.legacy_mlp_names != "renamed"]
        message = (f"{len(view.legacy)} head tensors use the legacy Sequential names ({_shorten(view.legacy, 3)}); "
                   "SGLang and TRT rename them, vLLM's newest revision expects the named form")
        if unconfirmed:
            ctx.emit_for("LC210", unconfirmed, message, subjects=view.legacy)
        else:
            ctx.emit("LC216", message, subjects=view.legacy)

    expected = m.tensors
    # quantized modules legitimately replace .weight's dtype/shape and add scale tensors
    missing: dict[str, list[str]] = {}
    for name, tensor in expected.items():
        if tensor.component in m.incomplete:
            continue
        if name not in present:
            missing.setdefault(tensor.component, []).append(name)
    [n for n in present if ".attention_conv." in n or ".mlp_conv." in n]
    conv_expected = [n for n, t in expected.items() if t.component == "conv"]
    if missing.get("head") and not (routed_by_projector(ctx.config) and not any(
            n.startswith("lilicorr.") for n in present)):  # LC011 says the head is absent
        names = missing["head"]
        ctx.emit("LC201", f"missing {len(names)} head tensors: {_shorten(names)}", subjects=names,
                 expected=f"{len(m.names('head'))} lilicorr.* tensors",
                 actual=f"{len(m.names('head')) - len(names)} present")
    fused = _fused_qkv(ctx)  # fused qkv_proj tensor -> the q/k/v tensors it stands for
    split = {n for parts in fused.values() for n in parts}
    strict = [p for p in ctx.profiles if not p.accepts_fused_qkv]
    if missing.get("backbone"):
        names = [n for n in missing["backbone"] if n not in split]
        if names:
            ctx.emit("LC203", f"missing {len(names)} backbone tensors: {_shorten(names)}", subjects=names)
        names = [n for n in missing["backbone"] if n in split]
        if names:
            ctx.emit_for("LC203", strict, f"missing {len(names)} backbone tensors: {_shorten(names)} (stored fused "
                         f"as {_shorten(sorted(fused), 2)}, which only TensorRT-LLM splits)", subjects=names)
    if missing.get("lm_head"):
        ctx.emit_for("LC401", [p for p in ctx.profiles if p.owned_lm_head == "supported"],
                     "has_own_lm_head is true but lm_head.weight is absent: vLLM and TRT refuse the load",
                     pointer="lm_head.weight", subjects=missing["lm_head"])
    if conv_expected and "conv" not in m.incomplete:
        gone = missing.get("conv", [])
        if len(gone) == len(conv_expected):
            g = ctx.geometry
            ctx.emit("LC206", f"conv_kernel_size {g.conv_kernel_size} / conv_group_size {g.conv_group_size} build "
                     f"{len(conv_expected)} convolution tensors but the checkpoint has none: kernel_projection "
                     "would stay at random initialisation", file="config.json",
                     pointer="$.dflash_config.conv_kernel_size", subjects=gone)
        elif gone:
            ctx.emit("LC207", f"convolution coverage is partial: missing {_shorten(gone)} (check conv_kernel_size, "
                     "conv_group_size and num_hidden_layers)", subjects=gone)

    # surplus: present tensors the manifest does not explain
    surplus: dict[str, list[str]] = {}
    for name in present:
        if name in expected or _family_tensor(ctx, name):
            continue
        if m.module_of(name) is not None:
            continue  # a scale tensor of a known module: judged by the quantization checks
        component = component_of_name(name)
        if component in m.incomplete or (component == "fc" and "backbone" in m.incomplete):
            continue  # its geometry is unknown: LC215 says so, and the geometry findings say why
        if component == "head":
            key = "head" if ctx.geometry.lilicorr_enabled else None  # LC011 / LC108 cover undeclared heads
        elif component in ("conv", "lm_head"):
            key = component
        else:
            key = "other"
        if key:
            surplus.setdefault(key, []).append(name)
    if surplus.get("head"):
        names = surplus["head"]
        g = ctx.geometry
        token = [n for n in names if n.startswith("lilicorr.token_proj.")]
        if token and g.head_hidden_size == g.hidden_size:
            raw = g.head_hidden_size_raw
            ctx.emit("LC202", f"`lilicorr.token_proj.*` is present but the head is as wide as the draft "
                     f"(lilicorr_hidden_size {raw} -> h = {g.head_hidden_size} = hidden_size), so token_proj is the "
                     "identity and its weights would be dropped", file="config.json",
                     pointer="$.dflash_config.lilicorr_hidden_size", subjects=token,
                     expected=f"lilicorr_hidden_size = {_token_proj_width(ctx)}" if _token_proj_width(ctx) else None)
            names = [n for n in names if n not in token]
        if names:
            ctx.emit("LC202", f"{len(names)} head tensors the geometry does not build: {_shorten(names)}",
                     subjects=names)
    if surplus.get("conv"):
        names = surplus["conv"]
        if not ctx.geometry.has_conv:
            d = ctx.config.dflash
            hint = _conv_hint(ctx, names)
            if ctx.geometry.conv_kernel_size > 0:
                # the kernel size is set: the missing/zero group size is the cause (LC116), not the kernel size
                group = d.conv_group_size if d.conv_group_size is not None else "absent"
                ctx.emit("LC205", f"{len(names)} convolution tensors are present and conv_kernel_size is "
                         f"{d.conv_kernel_size}, but conv_group_size is {group}: no convolution is built for these "
                         f"tensors until conv_group_size is set{hint}", file="config.json",
                         pointer="$.dflash_config.conv_group_size", subjects=names)
            else:
                ctx.emit("LC205", f"{len(names)} convolution tensors are present but conv_kernel_size is "
                         f"{d.conv_kernel_size if d.conv_kernel_size is not None else 'absent'}: every one would be "
                         f"dropped silently and the draft would serve as its convolution-free parent{hint}",
                         file="config.json", pointer="$.dflash_config.conv_kernel_size", subjects=names)
        else:
            ctx.emit("LC207", f"convolution tensors the geometry does not build: {_shorten(names)} (check "
                     "conv_kernel_size, conv_group_size and num_hidden_layers)", subjects=names)
    if surplus.get("lm_head") and not ctx.geometry.has_own_lm_head:
        names = surplus["lm_head"]
        ctx.emit("LC402", "lm_head tensors are present but has_own_lm_head is not true: TensorRT-LLM ignores them "
                 "and uses the target's head, vLLM treats any lm_head tensor as owned", file="config.json",
                 pointer="$.has_own_lm_head", subjects=names, expected="true", actual=ctx.config.has_own_lm_head)
    if surplus.get("other"):
        names = [n for n in surplus["other"] if n not in fused]
        if len(names) < len(surplus["other"]):
            qkv = [n for n in surplus["other"] if n in fused]
            ctx.emit_for("LC204", strict, f"{len(qkv)} fused q/k/v tensors ({_shorten(qkv)}): TensorRT-LLM splits "
                         "them, the other loaders read only separate q_proj/k_proj/v_proj", subjects=qkv)
    if surplus.get("other") and names:
        embed = [n for n in names if "embed_tokens" in n]
        note = " (drafters borrow the target's embeddings; embed_tokens is never loaded)" if embed else ""
        ctx.emit("LC204", f"{len(names)} tensors no loader reads{note}: {_shorten(names)}", subjects=names)

    _shapes_and_dtypes(ctx)


def _fused_qkv(ctx: Context) -> dict[str, list[str]]:
    """Float `layers.i.self_attn.qkv_proj.{weight,bias}` standing in for absent q/k/v tensors (format.md §2.1:
    TensorRT-LLM accepts and splits them), with the shape the manifest's separate tensors stack to."""
    present, expected = ctx.names.by_canonical, ctx.manifest.tensors
    out: dict[str, list[str]] = {}
    for name, info in present.items():
        m = re.fullmatch(r"(layers\.\d+\.self_attn\.)qkv_proj\.(weight|bias)", name)
        if not m or info.dtype not in FLOAT_DTYPES:
            continue
        parts = [f"{m.group(1)}{x}_proj.{m.group(2)}" for x in "qkv"]
        if not all(p in expected and p not in present for p in parts):
            continue
        shapes = [expected[p].shape for p in parts]
        if tuple(info.shape) == (sum(s[0] for s in shapes), *shapes[0][1:]):
            out[name] = parts
    return out


def _token_proj_width(ctx: Context) -> int | None:
    info = ctx.names.by_canonical.get("lilicorr.token_proj.weight")
    return info.shape[0] if info is not None and len(info.shape) == 2 else None


def _conv_hint(ctx: Context, names: list[str]) -> str:
    m = ctx.geometry.hidden_size
    for n in names:
        info = ctx.names.by_canonical[n]
        if n.endswith("base_kernel") and len(info.shape) == 3:
            taps = info.shape[1]
            for k in names:
                p = ctx.names.by_canonical[k]
                if k.endswith("kernel_projection.weight") and len(p.shape) == 2 and m and taps:
                    groups = p.shape[0] // (2 * taps)
                    if groups and m % groups == 0:
                        return f" (the tensors imply conv_kernel_size {taps}, conv_group_size {m // groups})"
            return f" (the tensors imply conv_kernel_size {taps})"
    return ""


def observed_scheme(ctx: Context, module: str) -> str:
    return observed_scheme_of(ctx.names, module)


def _expected_quant_form(ctx: Context, module: str, kind: str) -> dict[str, ExpectedTensor] | None:
    qc = ctx.quant
    scheme = qc.scheme_for(module) if qc else None  # the declared layout wins over what is on disk
    if scheme is None:
        scheme = quant_scheme("NVFP4" if kind == "nvfp4" else "FP8")
    assert scheme is not None
    return ctx.manifest.quantized_form(module, scheme)


def _shapes_and_dtypes(ctx: Context) -> None:
    m, present = ctx.manifest, ctx.names.by_canonical
    float_dtypes: dict[str, int] = {}
    for name, tensor in m.tensors.items():
        info = present.get(name)
        if info is None:
            continue
        if tensor.module and name == f"{tensor.module}.weight" and info.dtype in ("U8", "F8_E4M3"):
            continue  # quantized weight: checked against its quantized form below
        if info.dtype not in tensor.dtypes:
            hint = " (a quantized dtype on a module that cannot carry quantization)" if info.dtype in (
                "U8", "F8_E4M3") else ""
            ctx.emit("LC209", f"`{name}` is {info.dtype}{hint}", file=info.file, pointer=name,
                     expected="/".join(sorted(tensor.dtypes)), actual=info.dtype, subjects=[name])
        else:
            float_dtypes[info.dtype] = float_dtypes.get(info.dtype, 0) + 1
        if not tensor.shape_ok(info.shape):
            ctx.emit("LC208", _shape_message(ctx, name, tensor, info), file=info.file, pointer=name,
                     expected=list(tensor.shape), actual=list(info.shape), subjects=[name])
    if len(float_dtypes) > 1:
        ctx.emit("LC214", "floating-point tensors mix dtypes: " + ", ".join(f"{k} x{v}" for k, v in
                                                                            sorted(float_dtypes.items())))


def _shape_message(ctx: Context, name: str, tensor: ExpectedTensor, info: TensorInfo) -> str:
    g = ctx.geometry
    base = f"`{name}` is {list(info.shape)}, the config implies {list(tensor.shape)}"
    if name == "fc.weight" and len(info.shape) == 2 and g.hidden_size and info.shape[0] == g.hidden_size \
            and g.target_layer_ids is not None:
        taps = info.shape[1] / g.hidden_size
        return (base + f": fc reads {taps:g} target layers but target_layer_ids lists {len(g.target_layer_ids)} "
                f"({list(g.target_layer_ids)})")
    if tensor.component == "conv":
        return base + (f" (conv_kernel_size {g.conv_kernel_size}, conv_group_size {g.conv_group_size}: base_kernel is "
                       "[2, taps, M], kernel_projection [2*taps*M/group, M])")
    if name.startswith("lilicorr.") and g.head_hidden_size and len(info.shape) == len(tensor.shape):
        return base + (f" (lilicorr_hidden_size resolves to {g.head_hidden_size}; K={g.candidate_topk}, "
                       f"B={g.block_size}, N={g.head_num_heads}, F={g.head_factor_dim}, R={g.head_mlp_width})")
    return base


# ---------------------------------------------------------------- quantization checks


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
            ctx.emit("LC311", f"{len(quantized)} modules hold quantized weights ({_shorten(sorted(quantized), 3)}) "
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
        # for some algorithms (modelopt_nvfp4.md §1.5)
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
            ctx.emit_for("LC303", [p for p in ctx.profiles if p.name == "vllm"],
                         f"{src}: the nested form lacks {list(doc.missing_keys)}", file=src)


def _flat_form_reading(ctx: Context, qc: QuantConfig) -> None:
    """What the runtimes that read only part of the flat form see (modelopt_nvfp4.md §2.2)."""
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
        ctx.emit("LC318", f"{len(kv)} KV-cache scale tensors ({_shorten(kv, 3)}) but {qc.source} sets no "
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


# ---------------------------------------------------------------- owned head


@check
def owned_head(ctx: Context) -> None:
    if ctx.geometry.has_own_lm_head and "lm_head.weight" in ctx.names.by_canonical:
        ctx.emit_for("LC403", [p for p in ctx.profiles if p.owned_lm_head != "supported"],
                     "the checkpoint owns its lm_head; SGLang's LiLiCorr candidate path resolves the target's head "
                     "(owned-head support unconfirmed)", pointer="lm_head.weight")


# ---------------------------------------------------------------- target


@check
def target_compat(ctx: Context) -> None:
    t, g = ctx.target, ctx.geometry
    if t is None:
        return
    where = f"target {t.label}"
    if t.unreadable:
        what = "; ".join(f"{key} {found}" for key, found in t.unreadable.items())
        skipped = [check for keys, check in ((("hidden_size", "embedding_length"), "hidden size"),
                                             (("num_hidden_layers", "block_count"), "layer ids and count"),
                                             (("vocab_size",), "vocabulary"))
                   if any(k.rsplit(".", 1)[-1] in keys for k in t.unreadable)]
        if t.vocab_size is None and t.embedding_rows is None:
            skipped.append("mask token range")
        ctx.emit("LC507", f"{where}: {what}; not checked against the drafter: {', '.join(skipped)}",
                 subjects=sorted(t.unreadable))
    if t.hidden_size is not None and g.hidden_size is not None and t.hidden_size != g.hidden_size:
        ctx.emit("LC501", f"draft hidden_size {g.hidden_size} != {where} hidden_size {t.hidden_size}",
                 file="config.json", pointer="$.hidden_size", expected=t.hidden_size, actual=g.hidden_size)
    if t.embedding_width is not None and g.hidden_size is not None and t.embedding_width != g.hidden_size \
            and t.embedding_width != t.hidden_size:
        ctx.emit("LC501", f"{where} embedding width {t.embedding_width} != draft hidden_size {g.hidden_size}",
                 expected=g.hidden_size, actual=t.embedding_width)
    if t.num_layers is not None and g.target_layer_ids:
        out = [i for i in g.target_layer_ids if i >= t.num_layers]
        if out:
            shifted = (" — the ids look shifted by +1 (a 'before layer i' convention); id i reads the output of "
                       "target layer i, i.e. HF hidden_states[i+1]") if max(g.target_layer_ids) == t.num_layers else ""
            ctx.emit("LC502", f"target_layer_ids {out} are not layers of {where}, which has {t.num_layers} layers "
                     f"(valid ids 0..{t.num_layers - 1}; id i reads the output of target layer i){shifted}",
                     file="config.json", pointer="$.dflash_config.target_layer_ids",
                     expected=f"ids < {t.num_layers}", actual=list(g.target_layer_ids))
    if t.num_layers is not None and g.num_target_layers is not None and t.num_layers != g.num_target_layers:
        ctx.emit("LC505", f"num_target_layers is {g.num_target_layers} but {where} has {t.num_layers} layers",
                 file="config.json", pointer="$.num_target_layers", expected=t.num_layers, actual=g.num_target_layers)
    if t.vocab_size is not None and g.vocab_size is not None and t.vocab_size != g.vocab_size:
        ctx.emit("LC503", f"draft vocab_size {g.vocab_size} != {where} vocab_size {t.vocab_size}",
                 file="config.json", pointer="$.vocab_size", expected=t.vocab_size, actual=g.vocab_size)
    if t.embedding_rows is not None and g.vocab_size is not None and t.embedding_rows != g.vocab_size:
        strict = [p for p in ctx.profiles if p.embedding_rows_equal_vocab]
        ctx.emit_for("LC503", strict, f"{where}'s input embedding has {t.embedding_rows} rows but the draft "
                     f"vocab_size is {g.vocab_size}: {' and '.join(p.display for p in strict)} requires "
                     "num_embeddings == V", pointer="embed_tokens.weight",
                     expected=g.vocab_size, actual=t.embedding_rows)
    rows = t.embedding_rows if t.embedding_rows is not None else t.vocab_size
    mask = g.mask_token_id
    if mask is not None and rows is not None and mask >= rows:
        ctx.emit("LC504", f"mask_token_id {mask} is outside {where}'s embedding table ({rows} rows)",
                 file="config.json", pointer="$.dflash_config.mask_token_id", expected=f"< {rows}", actual=mask)
    if mask is not None:
        hits = sorted(k for k, v in t.special_ids.items() if v == mask)
        if hits:
            ctx.emit("LC504", f"mask_token_id {mask} is {where}'s {'/'.join(hits)} token; the mask must be a "
                     "dedicated token", file="config.json", pointer="$.dflash_config.mask_token_id", actual=mask)
    theta = ctx.config.rope_theta
    if t.rope_theta is not None and theta is not None and not math.isclose(t.rope_theta, theta, rel_tol=1e-6):
        ctx.emit("LC506", f"rope_theta {theta:g} differs from {where}'s {t.rope_theta:g}", file="config.json",
                 pointer="$.rope_theta", expected=t.rope_theta, actual=theta)


# ---------------------------------------------------------------- files


@check
def files(ctx: Context) -> None:
    s, src = ctx.table.shards, ctx.source
    if src.pickles:
        ctx.emit("LC601", f"pickle files present (not opened): {_shorten([src.rel(p) for p in src.pickles])}",
                 subjects=[src.rel(p) for p in src.pickles])
    if not src.safetensors and not s.has_index:
        ctx.emit("LC608", "no *.safetensors file in the checkpoint")
    elif not ctx.table.tensors:
        ctx.emit("LC608", "the checkpoint holds no tensors")
    for shard, names in s.missing_shards.items():
        ctx.emit("LC602", f"the index places {len(names)} tensors in `{shard}`, which does not exist",
                 file="model.safetensors.index.json", pointer=shard, subjects=names)
    if s.index_only:
        names = sorted(s.index_only)
        ctx.emit("LC603", f"{len(names)} tensors listed in the index are not in their shard: "
                 + ", ".join(f"`{n}` ({s.index_only[n]})" for n in names[:5]), file="model.safetensors.index.json",
                 subjects=names)
    for name, (listed, real) in sorted(s.misplaced.items()):
        ctx.emit("LC603", f"the index places `{name}` in `{listed}` but it is in `{real}`",
                 file="model.safetensors.index.json", pointer=name, subjects=[name])
    if s.shard_only:
        names = sorted(s.shard_only)
        ctx.emit("LC604", f"{len(names)} tensors in the shards are missing from the index (a loader that trusts "
                 f"the index skips them): {_shorten(names)}", file="model.safetensors.index.json", subjects=names)
    for name, holders in sorted(s.duplicates.items()):
        ctx.emit("LC605", f"`{name}` is stored in {', '.join(holders)}", pointer=name, subjects=[name])
    if s.total_size_declared is not None and s.total_size_declared != s.total_size_actual:
        ctx.emit("LC606", f"index total_size is {s.total_size_declared} but the shards hold {s.total_size_actual} "
                 "tensor bytes", file="model.safetensors.index.json", pointer="$.metadata.total_size",
                 expected=s.total_size_actual, actual=s.total_size_declared)
    for rel in s.unreferenced:
        ctx.emit("LC607", f"`{rel}` is not referenced by the index", file=rel)
    for rel, names in ctx.table.duplicate_keys.items():
        ctx.emit("LC609", f"the header of `{rel}` names {_shorten(names)} more than once", file=rel, subjects=names)


def run_checks(ctx: Context) -> list[Finding]:
    for fn in CHECKS:
        fn(ctx)
    if ctx.deep:
        from lilicorr_ckpt.checks.deep import deep_checks

        deep_checks(ctx)
    return ctx.findings
