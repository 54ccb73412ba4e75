"""Coverage rules (LC2xx): which tensors the geometry builds, which are missing or surplus, shapes and dtypes."""

from __future__ import annotations

import json
import re

from lilicorr_ckpt.checkpoint.geometry import routed_by_projector
from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, ExpectedTensor, component_of_name, legacy_name
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check, coverage_effect, silently_initialised
from lilicorr_ckpt.checks.context import names as names_of
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.checks.sibling_quant import quantized_sibling_linears
from lilicorr_ckpt.families import SIBLINGS, dspark, sibling_owner
from lilicorr_ckpt.runtimes import RuntimeProfile, matches_any

# ---------------------------------------------------------------- catalogue
COV = "coverage"
rule(
    "LC201",
    "head-missing",
    "error",
    COV,
    "Head tensors the geometry requires are missing.",
    "Export the full head; a draft with no LiLiCorr head should declare DFlashDraftModel.",
    doc="Lists the tensors the declared head implies (from the config: the LiLiCorr head's `lilicorr.*` "
    "modules, per head layer and per projection, or the DFlash2 / DSpark / Domino head's) and fires when "
    "any of them is absent, naming them. Skipped when the head's geometry is incomplete (LC215) and for "
    "DFlashDraftModel with a LiLiCorr projector marker but no `lilicorr.*` tensor at all (LC011 reports "
    "that).",
    why="A head parameter without its tensor serves at its initialisation. Most releases check head coverage "
    'and refuse: SGLang\'s head weight coverage check, TensorRT-LLM ("head weight mismatch"), vLLM up to the '
    'release that dropped its check ("coverage mismatch"); later vLLM releases load the checkpoint and serve '
    "the head wrong. The message names what each judged release does.",
    example='    "dflash_config": {"lilicorr_num_layers": 2, ...}\n\n'
    "with `lilicorr.layers.0.*` present and `lilicorr.layers.1.attn.in_proj_weight`, "
    "`lilicorr.layers.1.mlp.up_proj.weight`, ... missing.",
)
rule(
    "LC202",
    "head-surplus",
    "error",
    COV,
    "Head tensors the geometry does not build (they would be dropped or refused).",
    "Check lilicorr_hidden_size, lilicorr_num_layers and lilicorr_factor_dim against the tensors.",
    doc="Fires for head tensors that the declared geometry does not build: `lilicorr.*` names outside the "
    "expected list (a head layer beyond lilicorr_num_layers, a module the head does not have), "
    "`lilicorr.token_proj.*` when the head is as wide as the draft (lilicorr_hidden_size equal to "
    "hidden_size, or 0), and a sibling head's tensors beyond its geometry. Scale tensors of quantized "
    "modules are judged by the quantization rules instead.",
    why='Every loader refuses a head tensor it has no parameter for: SGLang ("has no parameter for"), vLLM, '
    'TensorRT-LLM ("unexpected="). When the head is as wide as the draft, token_proj is the identity '
    "and has no parameter. Surplus head tensors often mean the config describes another head than the one "
    "trained (narrower, fewer layers).",
    example='    "hidden_size": 2048,\n    "dflash_config": {"lilicorr_hidden_size": 0, ...}\n\n'
    "with `lilicorr.token_proj.weight` [1024, 2048]: the head was trained 1024 wide, so "
    "lilicorr_hidden_size should be 1024.",
)
rule(
    "LC203",
    "backbone-missing",
    "error",
    COV,
    "Backbone tensors are missing.",
    "Export every layer's attention, MLP and norm weights plus fc, hidden_norm and norm.",
    doc="Fires when backbone tensors the config implies are absent: per draft layer `input_layernorm`, "
    "`self_attn.q_proj` / `k_proj` / `v_proj` / `o_proj` (with biases under attention_bias), `q_norm`, "
    "`k_norm`, `post_attention_layernorm`, `mlp.gate_proj` / `up_proj` / `down_proj`; then `fc.weight`, "
    "`hidden_norm.weight` and `norm.weight`. A float fused `layers.i.self_attn.qkv_proj.weight` of the "
    "stacked q/k/v shape stands in for the three (every audited runtime splits it).",
    why="The draft layers are the DFlash backbone the head reads. A parameter without its tensor keeps its "
    "random initialisation in a loader that does not check coverage, and is refused by one that does; "
    "either way the draft is not served as trained.",
    example='    "num_hidden_layers": 2\n\n'
    "with `layers.1.mlp.down_proj.weight` (or `fc.weight`) missing from the files.",
)
rule(
    "LC204",
    "unexpected-tensor",
    "error",
    COV,
    "A tensor no loader reads; some runtimes drop it silently, others refuse it.",
    "Remove it, or fix the config so that the module it belongs to is built.",
    doc="Fires for tensors that no module of the declared drafter reads: not in the expected list, not a "
    "scale tensor of a known linear module, and not a head, convolution or lm_head tensor (those have "
    "their own rules; a draft `embed_tokens.weight` is LC218). A layer beyond num_hidden_layers and a "
    "`mask_hidden` tensor are typical.",
    why="What the loaders do with an unknown tensor differs: SGLang drops it silently, so whatever it was "
    "trained to do is lost (a rotary `inv_freq` buffer, which it rebuilds from the rope config, is the "
    "one tensor it may drop harmlessly, so it is not reported for SGLang); vLLM refuses some outright (it asserts there is no `mask_hidden` weight). "
    "Often the tensor belongs to a module the config does not build, which means the config is not the "
    "trained one.",
    example="    mask_hidden                             [1, 2048]\n    layers.2.self_attn.q_proj.weight      "
    '  with "num_hidden_layers": 2',
)
rule(
    "LC205",
    "conv-dropped",
    "error",
    COV,
    "Convolution tensors are present but the conv keys are absent or 0: every one would be dropped silently.",
    "Write conv_kernel_size and conv_group_size in dflash_config.",
    doc="Fires when convolution tensors (`layers.i.attention_conv.*` and `layers.i.mlp_conv.*`: base_kernel "
    "and kernel_projection.weight) are present but the convolution is not configured: conv_kernel_size "
    "absent or 0, or conv_kernel_size set while conv_group_size is absent or 0. The message says which "
    "values the tensors' shapes imply.",
    why="The convolution is built only from the two keys. SGLang's convolution coverage check refuses the "
    'checkpoint (the geometry "cannot be inferred") and vLLM refuses it; a loader without that check '
    "drops the tensors and serves the convolution-free parent, a different function.",
    example="    layers.0.attention_conv.base_kernel              [2, 4, 2048]\n    "
    "layers.0.attention_conv.kernel_projection.weight [256, 2048]\n\n"
    "with no conv_kernel_size / conv_group_size: the shapes imply conv_kernel_size 4, conv_group_size "
    "64.",
)
rule(
    "LC206",
    "conv-missing",
    "error",
    COV,
    "The conv keys are set but the checkpoint has no convolution tensors (kernel_projection would stay random).",
    "Export the convolution tensors, or remove conv_kernel_size / conv_group_size.",
    doc="Fires when conv_kernel_size and conv_group_size are both set (and hidden_size divides by the group "
    "size) but the checkpoint holds none of the convolution tensors they imply (4 per draft layer: "
    "base_kernel and kernel_projection.weight of attention_conv and mlp_conv).",
    why='The convolution would serve at its initialisation. SGLang refuses (the convolution "would serve at its '
    'random initialization"), and so do TensorRT-LLM and the vLLM releases with a coverage check; a vLLM '
    "release without one serves it wrong. The message names what each judged release does.",
    example='    "dflash_config": {"conv_kernel_size": 4, "conv_group_size": 64}\n\n'
    "and no `*_conv.*` tensor in the files.",
)
rule(
    "LC207",
    "conv-partial",
    "error",
    COV,
    "Only some convolution tensors are present.",
    "Export all 4 tensors per layer (base_kernel and kernel_projection for attention_conv and mlp_conv).",
    doc="With the convolution configured, fires when only some of the expected convolution tensors are "
    "present, and when convolution tensors are present that the geometry does not build (a layer beyond "
    "num_hidden_layers, a name the convolution does not have).",
    why="A convolution with part of its tensors serves partly at its initialisation, and extra ones are "
    "another geometry's; loaders that check convolution coverage refuse both. Often conv_kernel_size, "
    "conv_group_size or num_hidden_layers differs from the trained value.",
    example='    "num_hidden_layers": 2, "dflash_config": {"conv_kernel_size": 4, "conv_group_size": '
    "64}\n\n"
    "with `layers.1.mlp_conv.kernel_projection.weight` missing.",
)
rule(
    "LC208",
    "shape",
    "error",
    COV,
    "A tensor's shape differs from what the config implies.",
    "Fix the config geometry or re-export the tensor.",
    doc="Compares every expected tensor that is present with the shape the config implies and fires on each "
    "difference. Quantized weights (U8 / F8_E4M3) are compared in their quantized form by LC304 instead. "
    "The message explains the common cases: fc.weight's width against the number of target_layer_ids, the "
    "convolution shapes, the head's dimensions (K, B, N, F, R).",
    why="Loaders copy each tensor into a parameter built from the config and refuse a mismatch: for fc.weight "
    'SGLang says "fc.weight shape mismatch" and vLLM refuses too. TensorRT-LLM takes fc\'s input width '
    "from the checkpoint instead, so a wrong target_layer_ids loads there and is wrong at run time.",
    example='    "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33]}\n\n'
    "with `fc.weight` [2048, 8192]: fc reads 4 target layers but the list names 5 (expected [2048, "
    "10240]).",
)
rule(
    "LC209",
    "dtype",
    "error",
    COV,
    "A tensor's dtype is not allowed for it.",
    "Store floating-point tensors as bf16/fp16/fp32; quantized weights need their scales and metadata.",
    doc="Fires when an expected tensor's dtype is not one allowed for it: the floating-point dtypes (F16, "
    "BF16, F32, F64) for norms, biases, embeddings, bare parameters such as "
    "`lilicorr.layers.i.attn.in_proj_weight` and every sibling head tensor, or a quantized dtype (U8, "
    "F8_E4M3) on a tensor that is not a quantizable linear weight. Quantized linear weights themselves "
    "are judged by the quantization rules.",
    why="These tensors are plain float parameters in every loader read. A quantized in_proj_weight is refused "
    "by SGLang (a bare parameter), vLLM and TensorRT-LLM (a size mismatch); an FP8 copy of the same shape "
    "could be cast silently, which is worse. The sibling heads' selector, Markov and GRU tensors are "
    "never quantized by the loaders either.",
    example="    lilicorr.layers.0.attn.in_proj_weight   F8_E4M3 [3072, 1024]",
)
rule(
    "LC211",
    "name-collision",
    "error",
    COV,
    "Two tensors map to the same name after the loaders' renaming.",
    "Keep one of them.",
    doc="Fires when two tensor names become the same name after the loaders' renaming: the prefixes "
    "`dflash_module.`, `eagle_module.` and `model.` stripped, and the legacy Sequential head names mapped "
    "to the named-MLP ones.",
    why="SGLang refuses (the legacy name has no parameter: check_head_weight_coverage); vLLM refuses; "
    'TensorRT-LLM refuses ("Duplicate LiLiCorr parameter").',
    example="    lilicorr.feature_mlp.1.weight\n    lilicorr.feature_mlp.up_proj.weight\n\n"
    "(the legacy and the new name of one tensor), or `fc.weight` beside `model.fc.weight`.",
)
rule(
    "LC212",
    "training-prefix",
    "error",
    COV,
    "Tensor names still carry a training prefix (dflash_module./eagle_module.) no loader strips.",
    "Run `lilicorr-ckpt convert` (it strips training prefixes).",
    doc="Fires when tensor names still carry a training-wrapper prefix, `dflash_module.` or `eagle_module.` "
    "(also under `model.`), as a checkpoint saved from the training module does.",
    why="No loader strips these prefixes. SGLang matches no parameter and drops every tensor, serving the "
    "draft at its initialisation without an error; vLLM refuses the checkpoint.",
    example="    dflash_module.fc.weight\n    dflash_module.lilicorr.out_head.weight",
)
rule(
    "LC213",
    "model-prefix",
    "info",
    COV,
    "Tensor names carry a `model.` prefix (every loader strips it).",
    "Nothing to do.",
    doc="Fires when tensor names carry a `model.` prefix.",
    why="Every audited loader (SGLang, vLLM, TensorRT-LLM) strips it, so nothing breaks. It is reported "
    "because the checks judge the stripped names, and a tool that does not strip the prefix sees other "
    "names than the report.",
    example="    model.layers.0.self_attn.q_proj.weight",
)
rule(
    "LC214",
    "mixed-float-dtypes",
    "warning",
    COV,
    "Floating-point tensors use more than one dtype.",
    "Export every float tensor in the model dtype.",
    doc="Counts the floating-point dtypes of the expected tensors (those whose dtype is allowed for them) and "
    "fires when there is more than one.",
    why="A loader copying into parameters of the serving dtype casts each tensor, so a mix loads. It can mean "
    "that part of the checkpoint comes from another export or a merge, and float32 tensors take twice the "
    "bytes of bfloat16 ones.",
    example="    floating-point tensors mix dtypes: BF16 x210, F32 x14",
)
rule(
    "LC215",
    "coverage-skipped",
    "info",
    COV,
    "Coverage of a component was not checked because its geometry is incomplete.",
    "Fix the geometry findings first.",
    doc="Fires for each component (backbone, fc, convolution, head, lm_head) whose expected tensors could not "
    "be listed because the geometry is incomplete: a key missing, a layer count beyond the tensors "
    "present, hidden_size not divisible by conv_group_size. That component's missing and surplus tensors "
    "are then not judged.",
    why="By itself it breaks nothing: the geometry findings (LC1xx) explain the gap. It says which coverage "
    "checks did not run, so that an empty coverage section is not mistaken for a complete one.",
    example="    head tensors not checked: LiLiCorr geometry is incomplete",
)

rule(
    "LC217",
    "legacy-names-refused",
    "error",
    COV,
    "Legacy Sequential MLP names in the head, for which the runtime has no parameter (it does not rename them).",
    "Run `lilicorr-ckpt convert` to write the named-MLP layout.",
    doc="Fires when head tensors use the legacy Sequential names (`lilicorr.feature_mlp.0` / `.1` / `.3`, "
    "`lilicorr.layers.i.mlp.0` / `.2`), for the runtimes that do not rename them: SGLang and vLLM.",
    why="SGLang's LiLiCorrDraftModel.load_weights renames nothing, so check_head_weight_coverage finds "
    "the named-MLP parameters missing; vLLM's named-MLP revision has no parameter for the Sequential "
    "names. Both refuse the checkpoint. TensorRT-LLM renames them (LC216).",
    example="    lilicorr.feature_mlp.0.weight\n    lilicorr.feature_mlp.1.weight\n    "
    "lilicorr.feature_mlp.3.weight",
)
rule(
    "LC228",
    "named-names-refused",
    "error",
    COV,
    "Named-MLP head names, for a runtime release that builds the head's MLPs under the Sequential names.",
    "Write the legacy layout for that release (`lilicorr-ckpt convert SRC DST --naming sequential`), or serve "
    "a release that reads the named form.",
    doc="Fires when head tensors use the named-MLP names (`lilicorr.feature_norm`, `lilicorr.feature_mlp.up_proj` "
    "/ `down_proj`, `lilicorr.layers.i.mlp.up_proj` / `down_proj`), for the runtime releases whose head builds "
    "those MLPs as nn.Sequential (their parameters are `feature_mlp.0` / `.1` / `.3` and `layers.i.mlp.0` / "
    "`.2`) and rename nothing on load: the first SGLang release with LiLiCorr.",
    why="Such a release has no parameter for the named tensors, and its head weight coverage check finds the "
    "Sequential parameters missing: it refuses the checkpoint at load. The later releases read only the named "
    "form (LC217), so one checkpoint cannot serve both; `--runtime` picks the release to judge for.",
    example="    lilicorr.feature_norm.weight\n    lilicorr.feature_mlp.up_proj.weight\n    "
    "lilicorr.layers.0.mlp.down_proj.weight",
)
rule(
    "LC218",
    "embed-tokens-copy",
    "warning",
    COV,
    "The draft carries its own embed_tokens.weight: the runtimes disagree on using it (dropped, used as the "
    "draft's input table, or replaced by the target's).",
    "Drop it unless it is the target's table; drafters borrow the target's embeddings.",
    doc="Fires when the draft carries its own `embed_tokens.weight` (after prefix stripping).",
    why="The runtimes disagree on it: SGLang drops it, vLLM uses it as the draft's own input embedding, "
    "TensorRT-LLM loads it and then replaces it with the target's. The same checkpoint serves the same "
    "function on all three only if the table is the target's, unchanged.",
    example="    model.embed_tokens.weight   BF16 [151936, 2048]",
)
rule(
    "LC219",
    "embedding-4d-loaded",
    "info",
    COV,
    "lilicorr.slot_embedding / rank_embedding stored 4-D (without the leading singleton), which this runtime loads "
    "(its own parameter layout).",
    "Nothing to do for this runtime; `lilicorr-ckpt convert` writes the 5-D layout.",
    doc="Fires when `lilicorr.slot_embedding` or `lilicorr.rank_embedding` is stored as the 4-D layout "
    "(the 5-D shape without its leading singleton), for the runtimes whose own parameter is 4-D: "
    "TensorRT-LLM. The runtimes with a 5-D parameter report the same tensor as LC208.",
    why="TensorRT-LLM builds these embeddings 4-D and squeezes a 5-D tensor to fit, so it loads either "
    "layout. SGLang and vLLM build them 5-D and their weight loaders refuse the 4-D tensor: a checkpoint "
    "stored this way serves only on TensorRT-LLM.",
    example="    lilicorr.slot_embedding   BF16 [1, 15, 1, 1024]\n\n"
    "where the 5-D layout for block size 16 and head width 1024 is [1, 1, 15, 1, 1024].",
)
rule(
    "LC229",
    "opt-in-head-defect",
    "warning",
    COV,
    "A defect in a head the runtime release does not build or read with its default settings (DSpark's confidence "
    "head): it loads, and the option that turns the head on refuses it or serves the head wrong.",
    "Export the head the config declares (or drop its tensors and its flags) before serving with that option.",
    doc="For a DSpark head in the served layout, judges `confidence_head.*` against what each release builds "
    "from the config as it reads it (RuntimeProfile dspark_confidence_head): SGLang builds no confidence head "
    "unless ragged verification is on and skips its tensors; vLLM builds it when enable_confidence_head is truthy "
    "and reads it only under adaptive verification. A tensor missing, surplus, misshaped or quantized for the "
    "head built by default is an error (LC201 / LC202 / LC208 / LC209); one that matters only with the option on "
    "is this warning, which names the option and what the release then does.",
    why="With the release's defaults the drafted tokens do not depend on the confidence head, so the checkpoint "
    "serves as trained. Turning the option on builds (or reads) the head: SGLang then refuses a missing, unknown "
    "or misshaped confidence tensor, and vLLM serves a missing one at its initial value (or runs without it).",
    example='    "enable_confidence_head": true, "confidence_head_with_markov": true, "markov_rank": 8\n\n'
    "with `confidence_head.proj.weight` [1, 64] where hidden_size 64 + markov_rank 8 builds [1, 72]: SGLang "
    "loads it (no head by default); with SGLANG_RAGGED_VERIFY_MODE=compact it refuses.",
)
rule(
    "LC225",
    "inert-tensor-dropped",
    "info",
    COV,
    "A tensor no module reads, which the runtime drops knowingly: it takes no part in the drafted function.",
    "Nothing to do for this runtime; remove it for the runtimes that refuse it (LC204).",
    doc="Fires for tensors no module of the declared drafter reads that the runtime drops on purpose, as no "
    "part of the drafted function: for vLLM a `t2d` table (training-only) and recomputed rotary caches "
    "(`rotary_emb.inv_freq`, `cos_cached`, `sin_cached`). The runtimes that do not drop them report LC204.",
    why="vLLM's DFlash loader skips any name containing `t2d` (qwen3_dflash.py `load_weights`) and its "
    "AutoWeightsLoader drops the rotary caches it recomputes, so the checkpoint loads and serves the "
    "trained function there.",
    example="    t2d                       BOOL [151936]\n    rotary_emb.inv_freq        F32 [64]",
)
rule(
    "LC226",
    "tensor-alias-renamed",
    "info",
    COV,
    "Backbone tensors use an alias (midlayer.*, encoder.fc, encoder.output_norm_enc) that the runtime renames.",
    "Nothing to do for this runtime; `lilicorr-ckpt convert` writes the canonical names.",
    doc="Fires when tensor names use an alias of a backbone module: `midlayer.*` for the draft's layer 0, "
    "`encoder.fc.*` for fc, `encoder.output_norm_enc.*` for hidden_norm, for the runtimes that rename that "
    "alias on load: vLLM (both families).",
    why="vLLM's DFlash model renames them before loading (qwen3_dflash.py "
    "`DFlashQwen3Model.hf_to_vllm_mapper`), so the checkpoint loads there. A runtime without the rename "
    "has no parameter for the alias (LC227).",
    example="    midlayer.self_attn.q_proj.weight   (read as layers.0.self_attn.q_proj.weight)\n    "
    "encoder.fc.weight                  (read as fc.weight)",
)
rule(
    "LC227",
    "tensor-alias-refused",
    "error",
    COV,
    "Backbone tensors use an alias (midlayer.*, encoder.fc, encoder.output_norm_enc) the runtime does not rename: "
    "it has no parameter for them.",
    "Run `lilicorr-ckpt convert` to write the canonical names.",
    doc="Fires when tensor names use an alias of a backbone module (see LC226) that the runtime does not "
    "rename.",
    why="Without the rename the loader finds no module of that name: it refuses the tensor or drops it, and "
    "the module it stands for is then missing. Which aliases each runtime renames is recorded from its "
    "loader (RuntimeProfile.tensor_aliases).",
    example="    midlayer.mlp.down_proj.weight   (no midlayer module: the draft's layer is layers.0)",
)
rule(
    "LC216",
    "legacy-names-renamed",
    "info",
    COV,
    "Legacy Sequential MLP names in the head, which every selected runtime renames.",
    "Nothing to do; `lilicorr-ckpt convert` writes the named-MLP layout.",
    doc="Fires when head tensors use the legacy Sequential names of the training module "
    "(`lilicorr.feature_mlp.0` / `.1` / `.3`, `lilicorr.layers.i.mlp.0` / `.2`), for the runtimes that "
    "rename them to the named-MLP layout: TensorRT-LLM.",
    why="Nothing breaks on this runtime: TensorRT-LLM renames them on load. SGLang and vLLM do not (LC217), "
    "so the checkpoint is portable only once renamed.",
    example="    lilicorr.feature_mlp.1.weight     (read as lilicorr.feature_mlp.up_proj.weight)\n    "
    "lilicorr.layers.0.mlp.2.weight    (read as lilicorr.layers.0.mlp.down_proj.weight)",
)


# ---------------------------------------------------------------- checks


@check
def coverage(ctx: Context) -> None:
    """The present tensors against the manifest: what is not checked, names the loaders rewrite, what is missing
    (LC201-LC207, LC401), what the geometry does not build (LC202-LC207, LC218, LC402-LC407, and the unread
    names), then shapes and dtypes."""
    _unchecked(ctx)
    _name_notes(ctx)
    missing = _missing(ctx)
    fused = _fused_qkv(ctx)  # fused qkv_proj tensor -> the q/k/v tensors it stands for
    strict = [p for p in ctx.profiles if not p.accepts_fused_qkv]
    _missing_head(ctx, missing.get("head", []))
    _missing_backbone(ctx, missing.get("backbone", []), fused, strict)
    if missing.get("lm_head"):
        _missing_lm_head(ctx, missing["lm_head"])
    _missing_conv(ctx, missing.get("conv", []))
    surplus = _surplus(ctx)
    if surplus.get("head"):
        _surplus_head(ctx, surplus["head"])
    if surplus.get("conv"):
        _surplus_conv(ctx, surplus["conv"])
    if surplus.get("lm_head") and not ctx.geometry.has_own_lm_head:
        _surplus_lm_head(ctx, surplus["lm_head"])
    if surplus.get("other"):
        _surplus_other(ctx, surplus["other"], fused, strict)
    _shapes_and_dtypes(ctx)
    _confidence_head(ctx)


def _unchecked(ctx: Context) -> None:
    """LC215: components whose geometry is unknown; a layer count the files cannot hold (reported, never
    expanded)."""
    m = ctx.manifest
    for component, reason in m.incomplete.items():
        ctx.emit("LC215", f"{component} tensors not checked: {reason}")
    for key, reason in m.implausible.items():
        ctx.emit(
            "LC118" if key == "num_hidden_layers" else "LC103", reason, file="config.json", pointer=f"$.{key}"
        )


def _name_notes(ctx: Context) -> None:
    """LC211-LC213, LC216, LC217, LC226, LC227: names the loaders strip, rename, merge or refuse."""
    view = ctx.names
    if view.training_prefixed:
        ctx.emit(
            "LC212",
            f"{len(view.training_prefixed)} tensor names keep a training prefix, e.g. "
            f"{shorten(view.training_prefixed, 3)}: no loader strips it" + _unknown_tensors(ctx),
            subjects=view.training_prefixed,
        )
    if view.model_prefixed:
        ctx.emit(
            "LC213", f"{len(view.model_prefixed)} tensor names carry a `model.` prefix (stripped by loaders)"
        )
    for canonical, names in view.collisions.items():
        overwrite = [p for p in ctx.profiles if p.legacy_duplicate == "overwrites"]
        refuse = [p for p in ctx.profiles if p.legacy_duplicate == "refuses"]
        ctx.emit(
            "LC211",
            f"{shorten(names)} all map to `{canonical}` after renaming: "
            + "; ".join(
                part
                for part in (
                    f"{names_of(refuse, 'refuses|refuse')} this" if refuse else "",
                    f"{names_of(overwrite, 'keeps|keep')} whichever loads last" if overwrite else "",
                )
                if part
            ),
            subjects=names,
        )
    sequential = [p for p in ctx.profiles if p.head_mlp_naming == "sequential"]
    legacy_spelled = set(view.legacy)
    named = sorted(
        name
        for canonical, name in view.actual.items()
        if legacy_name(canonical) != canonical and name not in legacy_spelled
    )
    if named and sequential:
        ctx.emit_for(
            "LC228",
            sequential,
            f"{len(named)} head tensors use the named-MLP names ({shorten(named, 3)}): "
            f"{names_of(sequential, 'builds|build')} the head's MLPs as nn.Sequential "
            "(feature_mlp.0/1/3, layers.N.mlp.0/2) and renames nothing, so its head coverage check refuses the "
            "load",
            subjects=named,
        )
    if view.legacy:
        refusing = [
            p for p in ctx.profiles if p.legacy_mlp_names == "refused" and p.head_mlp_naming == "named"
        ]
        renaming = [p for p in ctx.profiles if p.legacy_mlp_names == "renamed"]
        head = f"{len(view.legacy)} head tensors use the legacy Sequential names ({shorten(view.legacy, 3)})"
        ctx.emit_for(
            "LC217",
            refusing,
            f"{head}: {names_of(refusing, 'does not rename|do not rename')} "
            "them and has no parameter for them",
            subjects=view.legacy,
        )
        ctx.emit_for(
            "LC216",
            renaming,
            f"{head}: {names_of(renaming, 'renames|rename')} them to the named-MLP layout",
            subjects=view.legacy,
        )
    for family, aliased in view.aliased.items():
        renaming = [p for p in ctx.profiles if family in p.tensor_aliases]
        refusing = [p for p in ctx.profiles if family not in p.tensor_aliases]
        what = f"{len(aliased)} tensors use the `{family}` alias ({shorten(aliased, 3)})"
        ctx.emit_for(
            "LC226",
            renaming,
            f"{what}: {names_of(renaming, 'renames|rename')} them on load",
            subjects=aliased,
        )
        ctx.emit_for(
            "LC227",
            refusing,
            f"{what}: {names_of(refusing, 'does not rename|do not rename')} them and has "
            "no parameter of that name",
            subjects=aliased,
        )


def _missing(ctx: Context) -> dict[str, list[str]]:
    """The manifest's tensors absent from the files, by component (components not checked left out). Quantized
    modules legitimately replace .weight's dtype/shape and add scale tensors: the quantization checks judge them."""
    m, present = ctx.manifest, ctx.names.by_canonical
    missing: dict[str, list[str]] = {}
    apart = _confidence_apart(ctx)
    for name, tensor in m.tensors.items():
        if (
            tensor.component not in m.incomplete
            and name not in present
            and not (apart and name.startswith(_CONF))
        ):
            missing.setdefault(tensor.component, []).append(name)
    return missing


def _missing_head(ctx: Context, names: list[str]) -> None:
    """LC201 (unless LC011 says the whole head is absent)."""
    m, present = ctx.manifest, ctx.names.by_canonical
    if not names or (routed_by_projector(ctx.config) and not any(n.startswith("lilicorr.") for n in present)):
        return  # the second: LC011 says the head is absent
    family = ctx.geometry.family if ctx.geometry.family in SIBLINGS else None
    what = f"{family} head" if family else "lilicorr.*"
    ctx.emit(
        "LC201",
        f"missing {len(names)} {family + ' ' if family else ''}head tensors: {shorten(names)}"
        + ("" if family else coverage_effect(ctx)),
        silent_for=() if family else silently_initialised(ctx),
        subjects=names,
        expected=f"{len(m.names('head'))} {what} tensors",
        actual=f"{len(m.names('head')) - len(names)} present",
    )


def _missing_backbone(
    ctx: Context, missing: list[str], fused: dict[str, list[str]], strict: list[RuntimeProfile]
) -> None:
    """LC203: backbone tensors absent, or stored fused where a runtime does not split them."""
    split = {n for parts in fused.values() for n in parts}
    names = [n for n in missing if n not in split]
    if names:
        ctx.emit("LC203", f"missing {len(names)} backbone tensors: {shorten(names)}", subjects=names)
    names = [n for n in missing if n in split]
    if names:
        ctx.emit_for(
            "LC203",
            strict,
            f"missing {len(names)} backbone tensors: {shorten(names)} (stored fused "
            f"as {shorten(sorted(fused), 2)}, which "
            + " and ".join(p.display for p in strict)
            + " does not split)",
            subjects=names,
        )


def _missing_lm_head(ctx: Context, missing: list[str]) -> None:
    """LC401: has_own_lm_head without the tensor."""
    loaders = [p for p in ctx.profiles if p.owned_lm_head == "supported"]
    refusing = [p for p in loaders if p.head_coverage == "refused"]
    serving = [p for p in loaders if p.head_coverage != "refused"]
    effects = ([names_of(refusing, "refuses|refuse") + " the load"] if refusing else []) + (
        [names_of(serving, "serves|serve") + " the head at its initial values (a silent mis-load)"]
        if serving
        else []
    )
    ctx.emit_for(
        "LC401",
        loaders,
        "has_own_lm_head is true but lm_head.weight is absent: " + "; ".join(effects) if loaders else "",
        silent_for=[p.name for p in serving],
        pointer="lm_head.weight",
        subjects=missing,
    )


def _missing_conv(ctx: Context, gone: list[str]) -> None:
    """LC206 / LC207: none, or only some, of the convolution tensors the geometry builds."""
    m = ctx.manifest
    conv_expected = m.names("conv")
    if not conv_expected or "conv" in m.incomplete:
        return
    if len(gone) == len(conv_expected):
        g = ctx.geometry
        ctx.emit(
            "LC206",
            f"conv_kernel_size {g.conv_kernel_size} / conv_group_size {g.conv_group_size} build "
            f"{len(conv_expected)} convolution tensors but the checkpoint has none, so kernel_projection "
            "would stay at its initialisation" + coverage_effect(ctx),
            silent_for=silently_initialised(ctx),
            file="config.json",
            pointer="$.dflash_config.conv_kernel_size",
            subjects=gone,
        )
    elif gone:
        ctx.emit(
            "LC207",
            f"convolution coverage is partial: missing {shorten(gone)} (check conv_kernel_size, "
            "conv_group_size and num_hidden_layers)" + coverage_effect(ctx),
            subjects=gone,
            silent_for=silently_initialised(ctx),
        )


def _quantized_siblings(ctx: Context) -> tuple[str, ...]:
    """The sibling-head linears a loader may build through the quant config (families QUANT_LINEARS) whose weight
    is stored quantized: sibling_quant.py judges each per release, in the layout that release builds."""
    return quantized_sibling_linears(ctx)


def _surplus(ctx: Context) -> dict[str, list[str]]:
    """Present tensors the manifest does not explain, by what judges them: "head", "conv", "lm_head", "other"."""
    m = ctx.manifest
    surplus: dict[str, list[str]] = {}
    apart = _confidence_apart(ctx)
    quantized = tuple(f"{m}." for m in _quantized_siblings(ctx))
    for name in ctx.names.by_canonical:
        if apart and name.startswith(_CONF):
            continue  # _confidence_head judges it per release
        if quantized and name.startswith(quantized):
            continue  # sibling_quant.py judges it per release
        if name in m.tensors or m.module_of(name) is not None:
            continue  # expected, or a scale tensor of a known module (judged by the quantization checks)
        key = _surplus_key(ctx, name)
        if key:
            surplus.setdefault(key, []).append(name)
    return surplus


def _surplus_key(ctx: Context, name: str) -> str | None:
    m = ctx.manifest
    component = component_of_name(name)
    if component in m.incomplete or (component == "fc" and "backbone" in m.incomplete):
        return None  # its geometry is unknown: LC215 says so, and the geometry findings say why
    if component == "head":
        sibling_name = not name.startswith("lilicorr.")
        # LC011 / LC108 / LC016 cover heads the architecture does not declare
        return (
            "head"
            if (ctx.geometry.lilicorr_enabled and not sibling_name)
            or (sibling_name and ctx.geometry.family in SIBLINGS and not _foreign(ctx, name))
            else None
        )
    if component in ("conv", "lm_head"):
        return component
    return "other"


def _surplus_head(ctx: Context, names: list[str]) -> None:
    """LC202: head tensors the geometry does not build (token_proj on a head as wide as the draft, apart)."""
    g = ctx.geometry
    token = [n for n in names if n.startswith("lilicorr.token_proj.")]
    if token and g.head_hidden_size == g.hidden_size:
        raw = g.head_hidden_size_raw
        ctx.emit(
            "LC202",
            f"`lilicorr.token_proj.*` is present but the head is as wide as the draft "
            f"(lilicorr_hidden_size {raw} -> h = {g.head_hidden_size} = hidden_size), so token_proj is the "
            "identity and its weights would be dropped",
            file="config.json",
            pointer="$.dflash_config.lilicorr_hidden_size",
            subjects=token,
            expected=f"lilicorr_hidden_size = {_token_proj_width(ctx)}" if _token_proj_width(ctx) else None,
        )
        names = [n for n in names if n not in token]
    if names:
        ctx.emit(
            "LC202",
            f"{len(names)} head tensors the geometry does not build: {shorten(names)}",
            subjects=names,
        )


def _surplus_conv(ctx: Context, names: list[str]) -> None:
    """LC205 / LC207: convolution tensors with no convolution declared, or beyond the ones declared."""
    if not ctx.geometry.has_conv:
        d = ctx.config.dflash
        hint = _conv_hint(ctx, names)
        if ctx.geometry.conv_kernel_size > 0:
            # the kernel size is set: the missing/zero group size is the cause (LC116), not the kernel size
            group = d.conv_group_size if d.conv_group_size is not None else "absent"
            ctx.emit(
                "LC205",
                f"{len(names)} convolution tensors are present and conv_kernel_size is "
                f"{d.conv_kernel_size}, but conv_group_size is {group}: no convolution is built for these "
                f"tensors until conv_group_size is set{hint}",
                file="config.json",
                pointer="$.dflash_config.conv_group_size",
                subjects=names,
            )
        else:
            ctx.emit(
                "LC205",
                f"{len(names)} convolution tensors are present but conv_kernel_size is "
                f"{d.conv_kernel_size if d.conv_kernel_size is not None else 'absent'}: every one would be "
                f"dropped silently and the draft would serve as its convolution-free parent{hint}",
                file="config.json",
                pointer="$.dflash_config.conv_kernel_size",
                subjects=names,
            )
    else:
        ctx.emit(
            "LC207",
            f"convolution tensors the geometry does not build: {shorten(names)} (check "
            "conv_kernel_size, conv_group_size and num_hidden_layers)",
            subjects=names,
        )


def _surplus_lm_head(ctx: Context, names: list[str]) -> None:
    """LC405 (DSpark's frozen copy of the target's head) / LC402 / LC406 / LC407: lm_head tensors without
    has_own_lm_head."""
    if ctx.geometry.family == dspark.NAME:
        ctx.emit(
            "LC405",
            "a DSpark drafter carries lm_head tensors without has_own_lm_head, as DeepSpec exports a "
            f"frozen copy of the target's head: {_undeclared_head(ctx)}; the same function only if it is the "
            "target's head unchanged",
            file="config.json",
            pointer="$.has_own_lm_head",
            subjects=names,
        )
        return
    owning = [p for p in ctx.profiles if p.undeclared_lm_head == "owned"]
    dropping = [p for p in ctx.profiles if p.undeclared_lm_head == "dropped"]
    ignoring = [p for p in ctx.profiles if p not in owning and p not in dropping]
    for rule_id, profiles in (("LC402", ignoring), ("LC406", owning)):
        ctx.emit_for(
            rule_id,
            profiles,
            f"lm_head tensors are present but has_own_lm_head is not true: {_undeclared_head(ctx)}",
            file="config.json",
            pointer="$.has_own_lm_head",
            subjects=names,
            expected="true",
            actual=ctx.config.has_own_lm_head,
        )
    ctx.emit_for(
        "LC407",
        dropping,
        f"lm_head tensors without has_own_lm_head: {names_of(dropping, 'has|have')} "
        "no lm_head parameter for the draft, drops them and scores candidates with the target's head, as "
        "the config declares",
        file="config.json",
        pointer="$.has_own_lm_head",
        subjects=names,
    )


def _surplus_other(
    ctx: Context, other: list[str], fused: dict[str, list[str]], strict: list[RuntimeProfile]
) -> None:
    """LC204 (fused q/k/v a runtime does not split), LC218 (embed_tokens), then the names no loader reads."""
    names = [n for n in other if n not in fused]
    if len(names) < len(other):
        qkv = [n for n in other if n in fused]
        ctx.emit_for(
            "LC204",
            strict,
            f"{len(qkv)} fused q/k/v tensors ({shorten(qkv)}) that "
            + " and ".join(p.display for p in strict)
            + " does not split",
            subjects=qkv,
        )
    embed = [n for n in names if n == "embed_tokens.weight"]
    if embed:
        uses = {
            "dropped": "drops it",
            "used": "uses it as the draft's own input embedding",
            "replaced": "loads it, then replaces it with the target's",
        }
        ctx.emit(
            "LC218",
            "the draft carries embed_tokens.weight: "
            + "; ".join(f"{p.display} {uses[p.embed_tokens_copy]}" for p in ctx.profiles),
            pointer="embed_tokens.weight",
            subjects=embed,
        )
        names = [n for n in names if n not in embed]
    if names:
        _unread(ctx, names)


def _unread(ctx: Context, names: list[str]) -> None:
    """Tensors no module reads: LC204 where the runtime refuses or silently loses them, LC225 where it drops them
    knowingly (RuntimeProfile.inert_tensors)."""
    dropped = {p.name: [n for n in names if matches_any(n, p.inert_tensors)] for p in ctx.profiles}
    if not any(dropped.values()):
        ctx.emit("LC204", f"{len(names)} tensors no loader reads: {shorten(names)}", subjects=names)
        return
    refused: dict[tuple[str, ...], list[RuntimeProfile]] = {}
    inert: dict[tuple[str, ...], list[RuntimeProfile]] = {}
    for p in ctx.profiles:
        rest = tuple(n for n in names if n not in dropped[p.name])
        if rest:
            refused.setdefault(rest, []).append(p)
        if dropped[p.name]:
            inert.setdefault(tuple(dropped[p.name]), []).append(p)
    for group, profiles in refused.items():
        ctx.emit_for(
            "LC204",
            profiles,
            f"{len(group)} tensors no loader reads: {shorten(list(group))}",
            subjects=list(group),
        )
    for group, profiles in inert.items():
        ctx.emit_for(
            "LC225",
            profiles,
            f"{len(group)} tensors no module reads ({shorten(list(group))}): "
            f"{names_of(profiles, 'drops|drop')} them, as no part of the drafted function",
            subjects=list(group),
        )


def _unknown_tensors(ctx: Context) -> str:
    """What each runtime does with tensors it has no parameter for (RuntimeProfile.unknown_tensors)."""
    said = {"dropped": "drops them all (the draft serves its initialisation)", "refused": "refuses them"}
    parts = [f"{p.display} {said[p.unknown_tensors]}" for p in ctx.profiles if p.unknown_tensors in said]
    return ": " + "; ".join(parts) if parts else ""


def _undeclared_head(ctx: Context) -> str:
    """What each runtime does with lm_head tensors when has_own_lm_head is not true."""
    said = {
        "dropped": "drops them (no lm_head parameter) and uses the target's head",
        "owned": "treats any lm_head tensor as the draft's own head",
        "ignored": "ignores them and uses the target's head",
    }
    return "; ".join(f"{p.display} {said[p.undeclared_lm_head]}" for p in ctx.profiles)


# buffers a model derives from its config (the rotary inverse frequencies): a runtime that drops unknown tensors
# loses nothing by dropping them


def _foreign(ctx: Context, name: str) -> bool:
    """A sibling-head tensor of another family than the one declared (LC016 reports it)."""
    return sibling_owner(name) != ctx.geometry.family


def _fused_qkv(ctx: Context) -> dict[str, list[str]]:
    """Float `layers.i.self_attn.qkv_proj.{weight,bias}` standing in for absent q/k/v tensors (every runtime
    resolves it to its fused qkv_proj and splits it), with the shape the manifest's separate tensors stack to."""
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


def _shapes_and_dtypes(ctx: Context) -> None:
    m, present = ctx.manifest, ctx.names.by_canonical
    float_dtypes: dict[str, int] = {}
    apart = _confidence_apart(ctx)
    quantized = tuple(f"{m}." for m in _quantized_siblings(ctx))
    for name, tensor in m.tensors.items():
        info = present.get(name)
        if info is None or (quantized and name.startswith(quantized)):
            continue  # (a quantized sibling linear: sibling_quant.py judges it per release)
        if apart and name.startswith(_CONF):
            if info.dtype in FLOAT_DTYPES:
                float_dtypes[info.dtype] = float_dtypes.get(info.dtype, 0) + 1
            continue  # _confidence_head judges its shape and dtype per release
        if tensor.module and name == f"{tensor.module}.weight" and info.dtype in ("U8", "F8_E4M3"):
            continue  # quantized weight: checked against its quantized form below
        if info.dtype not in tensor.dtypes:
            hint = (
                " (a quantized dtype on a module that cannot carry quantization)"
                if info.dtype in ("U8", "F8_E4M3")
                else ""
            )
            ctx.emit(
                "LC209",
                f"`{name}` is {info.dtype}{hint}",
                file=info.file,
                pointer=name,
                expected="/".join(sorted(tensor.dtypes)),
                actual=info.dtype,
                subjects=[name],
            )
        elif info.dtype in FLOAT_DTYPES:  # an index table (d2t) is not a float tensor
            float_dtypes[info.dtype] = float_dtypes.get(info.dtype, 0) + 1
        if not tensor.shape_ok(info.shape) and not _embedding_4d(ctx, name, tensor, info):
            ctx.emit(
                "LC208",
                _shape_message(ctx, name, tensor, info),
                file=info.file,
                pointer=name,
                expected=list(tensor.shape),
                actual=list(info.shape),
                subjects=[name],
            )
    if len(float_dtypes) > 1:
        ctx.emit(
            "LC214",
            "floating-point tensors mix dtypes: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(float_dtypes.items())),
        )


def _embedding_4d(ctx: Context, name: str, tensor: ExpectedTensor, info: TensorInfo) -> bool:
    """A slot/rank embedding stored 4-D: LC208 for the runtimes whose 5-D parameter refuses it, LC219 for those that
    load it (RuntimeProfile.embeddings_4d). False when the shape is not the 4-D layout."""
    if (
        name not in ("lilicorr.slot_embedding", "lilicorr.rank_embedding")
        or len(tensor.shape) != 5
        or tuple(info.shape) != tensor.shape[:1] + tensor.shape[2:]
    ):
        return False
    refuse = [p for p in ctx.profiles if not p.embeddings_4d]
    load = [p for p in ctx.profiles if p.embeddings_4d]
    base = f"`{name}` is {list(info.shape)}, the 5-D layout is {list(tensor.shape)}"
    ctx.emit_for(
        "LC208",
        refuse,
        f"{base}: {names_of(refuse, 'builds|build')} the 5-D parameter and its weight "
        "loader refuses the 4-D tensor" + (f" ({names_of(load, 'loads|load')} it)" if load else ""),
        file=info.file,
        pointer=name,
        expected=list(tensor.shape),
        actual=list(info.shape),
        subjects=[name],
    )
    ctx.emit_for(
        "LC219",
        load,
        f"{base}: {names_of(load, 'loads|load')} the 4-D layout, its own parameter shape",
        file=info.file,
        pointer=name,
        subjects=[name],
    )
    return True


def _shape_message(ctx: Context, name: str, tensor: ExpectedTensor, info: TensorInfo) -> str:
    g = ctx.geometry
    base = f"`{name}` is {list(info.shape)}, the config implies {list(tensor.shape)}"
    if (
        name == "fc.weight"
        and len(info.shape) == 2
        and g.hidden_size
        and info.shape[0] == g.hidden_size
        and g.target_layer_ids is not None
    ):
        taps = info.shape[1] / g.hidden_size
        return (
            base + f": fc reads {taps:g} target layers but target_layer_ids lists {len(g.target_layer_ids)} "
            f"({list(g.target_layer_ids)})"
        )
    if tensor.component == "conv":
        return base + (
            f" (conv_kernel_size {g.conv_kernel_size}, conv_group_size {g.conv_group_size}: base_kernel is "
            "[2, taps, M], kernel_projection [2*taps*M/group, M])"
        )
    if name.startswith("lilicorr.") and g.head_hidden_size and len(info.shape) == len(tensor.shape):
        return base + (
            f" (lilicorr_hidden_size resolves to {g.head_hidden_size}; K={g.candidate_topk}, "
            f"B={g.block_size}, N={g.head_num_heads}, F={g.head_factor_dim}, R={g.head_mlp_width})"
        )
    return base


# ---------------------------------------------------------------- DSpark's confidence head, per release

_CONF = "confidence_head."


def _confidence_apart(ctx: Context) -> bool:
    """DSpark in the served layout: confidence_head.* is judged per release by _confidence_head, not by the
    manifest's checks (each release builds the head from the config as it reads it, or not at all)."""
    g = ctx.geometry
    return g.family == "dspark" and g.dspark_layout == "served" and "head" not in ctx.manifest.incomplete


def _confidence_width(ctx: Context, p: RuntimeProfile, opted_in: bool) -> int | None:
    """The width of the confidence head `p` builds (its weight is [1, width]), None for no head: with its defaults,
    or with RuntimeProfile.dspark_confidence_option on (`opted_in`)."""
    g, raw = ctx.geometry, ctx.parsed.raw
    hidden, rank = g.hidden_size or 0, g.markov_rank or 0
    if p.dspark_confidence_head == "unbuilt":
        # models/dspark.py build_confidence_head: none under the default SGLANG_RAGGED_VERIFY_MODE; otherwise built
        # whatever enable_confidence_head says, `bool(getattr(config, "confidence_head_with_markov", rank > 0))`
        if not opted_in:
            return None
        key = "confidence_head_with_markov"
        with_markov = bool(raw[key]) if key in raw else rank > 0
    elif p.dspark_confidence_head == "flagged":
        # models/qwen3_dspark.py Qwen3DSparkModel.__init__: `if getattr(config, "enable_confidence_head", False)`,
        # `if getattr(config, "confidence_head_with_markov", False)` (Python truth values: "0", NaN and [0] are true)
        if not raw.get("enable_confidence_head"):
            return None
        with_markov = bool(raw.get("confidence_head_with_markov"))
    else:  # not established: the manifest's head
        if not g.confidence_head:
            return None
        with_markov = g.confidence_with_markov
    return hidden + rank if with_markov else hidden


def _confidence_defects(ctx: Context, width: int) -> dict[str, list[str]]:
    """What a built head [1, width] (+ bias) finds wrong in the confidence_head.* tensors: {rule: [what]}."""
    present = {n: i for n, i in ctx.names.by_canonical.items() if n.startswith(_CONF)}
    expected = {f"{_CONF}proj.weight": (1, width), f"{_CONF}proj.bias": (1,)}
    out: dict[str, list[str]] = {}
    missing = [n for n in expected if n not in present]
    if missing:
        out["LC201"] = [f"missing {shorten(missing)}"]
    surplus = sorted(n for n in present if n not in expected)
    if surplus:
        out["LC202"] = [f"{shorten(surplus)} has no parameter"]
    for name, shape in expected.items():
        info = present.get(name)
        if info is None:
            continue
        if tuple(info.shape) != shape:
            out.setdefault("LC208", []).append(f"`{name}` is {list(info.shape)} where {list(shape)} is built")
        if info.dtype not in FLOAT_DTYPES:
            out.setdefault("LC209", []).append(f"`{name}` is {info.dtype} where a float parameter is built")
    return out


def _confidence_head(ctx: Context) -> None:
    """DSpark's confidence head per release (RuntimeProfile dspark_confidence_head): a defect in the head a release
    builds with its defaults is an error (LC201 / LC202 / LC208 / LC209); one only its opt-in would meet is LC229,
    naming the option."""
    if not _confidence_apart(ctx):
        return
    present = sorted(n for n in ctx.names.by_canonical if n.startswith(_CONF))
    errors: dict[tuple[str, str], list[RuntimeProfile]] = {}
    warnings: dict[str, list[RuntimeProfile]] = {}
    for p in ctx.profiles:
        width = _confidence_width(ctx, p, opted_in=False)
        if width is not None:
            found = _confidence_defects(ctx, width)
            missing = found.pop("LC201", None)
            if missing and p.dspark_confidence_head_missing in ("dropped", "initialised"):
                # read only under the opt-in: models/qwen3_dspark.py load_weights drops a head with no tensor
                # (dropped) or keeps it at its initial values (initialised, or when only part of it is missing)
                gone = not present and p.dspark_confidence_head_missing == "dropped"
                effect = (
                    "drops the head and verifies without it"
                    if gone
                    else "serves the missing parameters at their initial values"
                )
                warnings.setdefault(
                    f"{missing[0]} of the confidence head it builds [1, {width}] (enable_confidence_head is "
                    f"{_shown(ctx, 'enable_confidence_head')}): loaded, and read only with "
                    f"{p.dspark_confidence_option}, where it {effect}",
                    [],
                ).append(p)
            elif missing:
                found["LC201"] = missing
            for rule_id, what in found.items():
                errors.setdefault(
                    (rule_id, "; ".join(what) + f" (the confidence head [1, {width}])"), []
                ).append(p)
            continue
        if not p.dspark_confidence_option:
            continue
        opted = _confidence_width(ctx, p, opted_in=True)
        if opted is None:
            if present:
                warnings.setdefault(
                    f"enable_confidence_head is {_shown(ctx, 'enable_confidence_head')}: builds no confidence "
                    f"head and skips {shorten(present)}, so {p.dspark_confidence_option} verifies without the "
                    "trained one",
                    [],
                ).append(p)
            continue
        found = _confidence_defects(ctx, opted)
        if found:
            summary = "; ".join(w for ws in found.values() for w in ws)
            warnings.setdefault(
                f"the confidence head is not built with the defaults (its tensors are skipped), so this loads; "
                f"with {p.dspark_confidence_option} the release builds one [1, {opted}] and refuses the load: "
                f"{summary}",
                [],
            ).append(p)
    for (rule_id, message), profiles in errors.items():
        ctx.emit_for(rule_id, profiles, message, subjects=present)
    for message, profiles in warnings.items():
        ctx.emit_for("LC229", profiles, f"{names_of(profiles)}: {message}", subjects=present)


def _shown(ctx: Context, key: str) -> str:
    raw = ctx.parsed.raw
    return json.dumps(raw[key])[:40] if key in raw else "absent"
