"""SGLang, as its released wheel loads a drafter: the profile, and how it matches quantization exclusions.

Exclusions (modelopt_quant.py ModelOptQuantConfig._get_quant_method): a module is built unquantized when a
pattern names it, or one of its ancestors, literally on dotted boundaries (quantization/utils.py is_layer_skipped;
a fused q/k/v or gate/up module through its shards, which must agree), or when a pattern read as a regex (`.`
literal, `*` -> `.*`) fullmatches its whole name or one of its dotted components (is_layer_excluded). Names carry
no `model.` prefix and no renumbering; outside LiLiCorr, the draft builds its decoder layers with empty prefixes.
"""

from __future__ import annotations

import functools
import re

from lilicorr_ckpt.runtimes.base import (
    CONV_KERNEL_PROJECTIONS,
    FEATURE_MLP,
    HEAD_RAW_LINEARS,
    Bump,
    Exclusion,
    RuntimeProfile,
    release_chain,
)

# speculative/dspark_components/dspark_config.py parse_dspark_draft_config (the keys every release reads alike): the
# prefixed dspark_block_size / dspark_markov_rank / dspark_noise_token_id through int() (null: absent), the prefixed
# and top-level markov_head_type through str().lower() (only vanilla, gated or rnn builds); models/dspark.py
# build_markov_head reads the top-level markov_rank through int() again (`getattr(config, "markov_rank", 0)`)
_DSPARK_READS: tuple[tuple[str, str, str], ...] = (
    ("$.dspark_block_size", "dspark", "int()?"),
    ("$.dspark_markov_rank", "dspark", "int()?"),
    ("$.dspark_noise_token_id", "dspark", "int()?"),
    ("$.dspark_markov_head_type", "dspark", "str()"),
    ("$.markov_head_type", "dspark", "str()"),
    ("$.markov_rank", "dspark", "int()-bool"),  # int(true) == 1: a rank no trained head has; null: int(None)
)

FIRST = RuntimeProfile(
    name="sglang",
    engine_id="sglang",
    engine="SGLang",
    version="0.5.21",
    released=True,
    source="",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=16,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    # lilicorr.py LiLiCorrLayer / LiLiCorrHead build the MLPs as nn.Sequential (feature_mlp.0/1/3,
    # layers.N.mlp.0/2), and load_weights renames nothing: check_head_weight_coverage refuses the named form
    head_mlp_naming="sequential",
    legacy_mlp_names="refused",
    owned_lm_head="dropped",  # dflash.py DFlashDraftModel has no lm_head parameter; load_weights drops it
    # lilicorr.py builds every head linear as an nn.Linear, and dflash.py DFlashDraftModel (no
    # supports_quantization) builds fc as an nn.Linear and its decoder layers with empty prefixes, for every family
    float_forced=("lilicorr.*", *CONV_KERNEL_PROJECTIONS),
    float_required=(),
    quant_unconfirmed=("lm_head",),
    quantizable_families=(),
    unquantizable_float=("fc",),
    nested_quant_method_algos=None,
    output_multiplier_nested_positive=True,  # parse_dflash_draft_config reads dflash_config only
    # modelopt_quant.py ModelOptFp4Config.from_config, flat form: exclusions from `ignore`, else
    # `modules_to_not_convert`, else `exclude_modules`; ModelOptFp8Config.from_config reads `ignore` only. The group
    # size comes from the top level, else the first config group's weights, else 16 for NVFP4.
    flat_exclusions_key="ignore",  # ModelOptFp4Config.from_config, flat form: `config.get("ignore", [])`
    # configs/model_config.py ModelConfig._parse_quant_hf_config hoists a nested block's quant_algo into config.json's
    # quantization_config, so from_config takes the flat path and finds no exclusion key at the top level
    flattens_inline_nested=True,
    # model_config.py ModelConfig._verify_quantization / modelopt_quant.py ModelOptFp4Config.from_config: "ModelOpt
    # currently only supports: FP8, NVFP4, NVFP4_AWQ, W4A16_NVFP4"; ModelOptFp8Config takes plain FP8 only, and
    # MIXED_PRECISION has its own config class
    quant_algos=("FP8", "NVFP4", "NVFP4_AWQ", "W4A16_NVFP4", "MIXED_PRECISION"),
    # ModelOptNvFp4A16LinearMethod / ModelOptFp4LinearMethod.process_weights_after_loading (Marlin: every W4A16
    # model, NVFP4 below SM100): "NVFP4 Marlin requires group_size=16"
    nvfp4_group_size=16,
    # the same methods take weight_scale_2.max() for a fused qkv_proj / gate_up_proj
    fused_global_scale="max",
    flat_group_size_default=16,
    flat_group_size_from_config_groups=True,
    causal="ignores",  # dflash.py: dflash_config.causal is never read; full layers run ENCODER_ONLY
    # dflash.py _get_dflash_attention_type: the text config's is_causal decides full layers (DECODER when true),
    # for every config whose layer_types is known (Qwen3Config always fills it)
    causal_top_level="honours",
    # dflash.py DFlashMLP.__init__: "Only silu is supported for now"
    extra_hidden_acts=(),
    # dflash.py builds RMSNorm (x * w) whatever use_gemma_norm says, and the rotary over the whole head whatever
    # rope_scaling's rope_dim says
    gemma_norm_read=False,
    rope_dim_read=False,
    # speculative/dspark_components/dspark_config.py _get_dspark_config reads dspark_config only: a markov_head_type
    # inside dflash_config is not seen ("DSpark requires markov_head_type when markov_rank > 0"), and the top-level
    # mask_token_id wins over dflash_config's
    markov_head_type_nested_read=False,
    markov_head_type_required=True,
    dspark_mask_token_first="top-level",
    # speculative/dspark_components/dspark_config.py parse_dspark_draft_config: dspark_config's keys first
    dspark_config_read=True,
    dspark_reads=_DSPARK_READS
    + (
        # the top-level mask_token_id is read (int()) unless dspark_config or dspark_noise_token_id gives one;
        # dflash_config's Markov keys are not read
        ("$.mask_token_id", "dspark", "int()?"),
        ("$.dflash_config.markov_*", "dspark", "unread"),
    ),
    # models/dspark.py build_confidence_head: None while speculative/ragged_verify.py read_ragged_verify_mode() is
    # STATIC (environ.py SGLANG_RAGGED_VERIFY_MODE, default "static"), and DSparkDraftMixin.load_weights then skips
    # every confidence_head.* tensor; otherwise a head is built whatever enable_confidence_head says (hasattr only:
    # a warning when absent), [1, hidden_size (+ markov_rank when bool(confidence_head_with_markov), default
    # markov_rank > 0)], and _load_confidence_weights refuses an unknown or missing tensor (default_weight_loader
    # a misshaped one). Alike in 0.5.21-0.5.23
    dspark_confidence_head="unbuilt",
    # layers/parameter.py copy_with_check / BasevLLMParameter loaders: `param.data.copy_(loaded_weight)` checks the
    # shape, not the dtype (a cast)
    scale_dtype_cast=True,
    dspark_confidence_option="SGLANG_RAGGED_VERIFY_MODE=cap-accept or compact",
    # transformers' AutoConfig (through HfModelConfigParser.parse) refuses a config without model_type
    speculators_format="refused",
    # models/dflash.py EntryClass lists DFlashDraftModel, DFlashLagunaForCausalLM, MuseGlimmerAssistantModel and
    # DFlash2DraftModel only: the DFlash2 aliases fall back to TransformersForCausalLM, which has no draft head
    routes=(
        ("dflash2", "DFlash2BeamDraftModel", "refuses", "models/dflash.py EntryClass does not register it"),
        (
            "dflash2",
            "MiniMaxDFlash2DraftModel",
            "refuses",
            "models/dflash.py EntryClass does not register it",
        ),
    ),
    num_target_layers_positive=True,
    use_swa="ignored",  # read only for the Nemotron-3.5 layout
    swa_window_zero="ignored",
    integral_float_mask_token="refuses",  # parse_dflash_draft_config: "mask_token_id must be an integer"
    # utils/hf_transformers/config.py get_config -> AutoConfig.from_pretrained: transformers 5 (the wheel pins
    # 5.19.0) builds a strict config class, whose int fields refuse 2.0; the DFlash parser casts the rest
    integral_float_typed="config-class",
    layer_types_length_exact=True,  # the same config class: validate_layer_type
    sliding_window_needs_flag=True,  # Qwen3Config: sliding_window if use_sliding_window else None
    tensor_aliases=(
        "encoder",
    ),  # dflash.py DFlashDraftModel.load_weights renames the native export's encoder.*
    # load_weights drops every unexpected weight; the rotary caches take no part in the drafted function (rebuilt
    # from the rope config)
    inert_tensors=(
        "*rotary_emb.inv_freq",
        "*rotary_pos_emb.inv_freq",
        "*rotary_emb.cos_cached",
        "*rotary_emb.sin_cached",
    ),
    reads_draft_vocab=False,  # no draft-vocabulary key is read by dflash.py, lilicorr.py or the worker
    # layers/linear.py MergedColumnParallelLinear / RowParallelLinear.weight_loader: a loaded weight narrower than
    # the parameter is zero-padded (pad_or_narrow_weight; on CPU narrow_padded_param_and_loaded_weight)
    intermediate_size_absent="padded",
    # models/qwen3.py Qwen3Model.forward (and every target's layer loop): `if i in self.layers_to_capture`
    captures_in_layer_order=True,
    # set_dflash_layers_to_capture stores id + 1; only these targets (EntryClass names) also capture after their
    # last layer (`if self.end_layer in self.layers_to_capture` or the like)
    final_layer_capture_architectures=(
        "Gemma3ForCausalLM",
        "Gemma4ForCausalLM",
        "GptOssForCausalLM",
        "LagunaForCausalLM",
        "Lfm2ForCausalLM",
        "Lfm2MoeForCausalLM",
        "MiMoV2FlashForCausalLM",
        "MiMoV2ForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
    ),
    # weight_utils.get_quant_config: hf_config.quantization_config first, the config files only without it
    quant_config_read="config.json",
    sliding_semantics="causally, over the last w tokens",  # dflash.py: sliding layers DECODER, window_left w-1
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    lilicorr_disabled='parses the config as plain DFlash and then raises ("requires the lilicorr_* geometry fields")',
    unknown_tensors="dropped",  # DFlashDraftModel.load_weights: "Ignore unexpected weights"
    legacy_duplicate="refuses",  # check_head_weight_coverage: the legacy name is a tensor with no parameter
    undeclared_lm_head="dropped",  # no lm_head parameter
    selector_check="pair",  # parse_dflash_draft_config: "selector needs rank and top_k together"
    selector_required=True,  # DFlash2DraftModel.__init__: "DFlash selector draft requires dflash_config.selector_rank"
    markov_rank_top_level=True,  # build_markov_head: "DSpark requires markov_rank > 0"
    markov_head_types=("vanilla", "gated", "rnn"),
    domino_checks=True,  # parse_dflash_draft_config and the Domino model tests
    # utils/hf_transformers/config.py get_config builds transformers' strict Qwen3Config (the wheel pins transformers 5)
    config_class_strict=True,
    # configs/model_config.py ModelConfig.__init__ -> utils/hf_transformers/common.py get_hf_text_config: `elif
    # hasattr(config, "text_config"): assert hasattr(config.text_config, "num_attention_heads")`, null included
    text_config_null_refused=("text_config",),
    # models/dflash.py DFlashAttention: a per-head sink parameter when parse_dflash_draft_config's
    # attention_sink_bias is true (the top-level add_swa_attention_sink_bias is not read)
    attention_sinks_built=True,
    config_reads=(
        # speculative/dflash_utils.py parse_dflash_draft_config: mask_token must be a non-empty string (null: the
        # default), attention_value_scale int|float|None, `float(final_logit_softcapping or 0.0)`
        ("$.dflash_config.mask_token", "*", "str+"),
        ("$.mask_token", "*", "str+"),
        ("$.dflash_config.attention_value_scale", "*", "number?"),
        ("$.dflash_config.final_logit_softcapping", "*", "float()|falsy"),
        ("$.dflash_config.output_multiplier", "*", "float()"),  # parse_dflash_draft_config: float(...)
        # parse_dflash_draft_config: dflash_config.get("attention_sink_bias", False) must be a bool (null too)
        ("$.dflash_config.attention_sink_bias", "*", "bool"),
        # parse_dflash_draft_config: _parse_optional_int(dflash_config block_size, else the top-level one)
        # (models/lilicorr.py sizes the head by it: null (the default 16, not the top-level value) and
        # int(true) == 1 build a head no trained LiLiCorr tensor fits)
        ("$.dflash_config.block_size", "lilicorr", "int()-bool"),
        ("$.dflash_config.block_size", "*", "int()?"),
        # another head kind's keys: the Domino keys only under projector_type domino, the DSpark keys by
        # models/dspark.py only, the LiLiCorr keys by models/lilicorr.py (and DFlashDraftModel's routing)
        ("$.dflash_config.gru_hidden_dim", "!domino", "unread"),
        ("$.dflash_config.emb_dim", "!domino", "unread"),
        ("$.dflash_config.pure_draft_prefix_len", "!domino", "unread"),
        ("$.gru_hidden_dim", "!domino", "unread"),
        ("$.emb_dim", "!domino", "unread"),
        ("$.pure_draft_prefix_len", "!domino", "unread"),
        ("$.dflash_config.markov_*", "!dspark", "unread"),
        ("$.markov_*", "!dspark", "unread"),
        # models/dspark.py build_confidence_head: neither is read under the default SGLANG_RAGGED_VERIFY_MODE (no
        # confidence head); with ragged verification enable_confidence_head only through hasattr and
        # confidence_head_with_markov through bool() (LC229 says what that builds)
        ("$.enable_confidence_head", "*", "unread"),
        ("$.confidence_head_with_markov", "*", "unread"),
        ("$.dflash_config.lilicorr_*", "dflash2,dspark", "unread"),
        ("$.dflash_config.projector_type", "lilicorr,dspark", "unread"),  # routed by architecture
        # parse_dflash_draft_config: `projector_type == "domino"` (any other value is plain DFlash)
        ("$.dflash_config.projector_type", "*", "equals"),
        ("$.projector_type", "*", "equals"),
        # lilicorr_utils.py _parse_lilicorr_config: `required(key, cast)` casts each lilicorr_* value with int() or
        # float() (a numeric string loads, null does not); a bool is cast to 1, a size or ratio no trained head
        # has (refused here, where the ranges below cannot see it); the ranges are the geometry rules'
        *(
            (f"$.dflash_config.lilicorr_{key}", "*", "int()-bool")
            for key in ("candidate_topk", "hidden_size", "num_layers", "num_heads", "factor_dim")
        ),
        ("$.dflash_config.lilicorr_mlp_ratio", "*", "float()-bool"),
        ("$.dflash_config.lilicorr_vector_eps", "*", "float()"),
        ("$.dflash_config.lilicorr_logit_scale", "*", "float()"),
        # lilicorr_utils.py _parse_lilicorr_config: `enabled is not None and not bool(enabled)` turns the head off
        ("$.dflash_config.lilicorr_enabled", "*", "truth?"),
        # parse_dflash_draft_config: _parse_optional_int (null: absent) for Domino's emb_dim, num_target_layers
        # (dflash_config's, else the top-level one), and the convolution and selector sizes of every head kind
        # (`dflash_cfg.get(key, 0)`), whose pair checks run on the cast values; the geometry rules judge the cast
        # value for these releases (checks/casts.py)
        ("$.dflash_config.emb_dim", "domino", "int()?"),
        ("$.emb_dim", "domino", "int()?"),
        # the same _parse_optional_int for gru_hidden_dim and pure_draft_prefix_len, dflash_config's value else the
        # top-level one (`dflash_cfg.get(key, top-level)`: a top-level value is not read beside a nested one);
        # int(true) == 1 is a GRU width no trained head has (the geometry rules see the cast width)
        ("$.dflash_config.gru_hidden_dim", "domino", "int()-bool"),
        ("$.gru_hidden_dim", "domino", "else:int()-bool"),
        ("$.dflash_config.pure_draft_prefix_len", "domino", "int()?"),
        ("$.pure_draft_prefix_len", "domino", "else:int()?"),
        ("$.dflash_config.num_target_layers", "*", "int()?"),
        ("$.num_target_layers", "*", "int()?"),
        *(
            (f"$.dflash_config.{key}", "*", "int()?")
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
        ),
        # dflash.py reads only the text config's is_causal; dflash_config.causal is never read (causal="ignores")
        ("$.dflash_config.causal", "*", "unread"),
        # dflash_utils.py: `sample_from_anchor is False`; `is_causal` / dflash_config causal as flags
        ("$.dflash_config.sample_from_anchor", "*", "truth"),
        ("$.sample_from_anchor", "*", "truth"),
        ("$.is_causal", "*", "truth"),
        # read only without a dflash_config value, or not at all: dflash_config's block_size, mask_token_id and
        # target_layer_ids win; swa_window_size only for a sliding layer; no top-level flag of these is read
        ("$.block_size", "*", "unread"),
        ("$.mask_token_id", "*", "unread"),
        ("$.target_layer_ids", "*", "unread"),
        ("$.dflash_config.swa_window_size", "*", "unread"),
        ("$.eagle_aux_hidden_state_layer_ids", "*", "unread"),
        # models/dflash.py sizes fc from the draft's hidden_size and the tap count: no module reads it
        ("$.target_hidden_size", "*", "unread"),
        # transformers modeling_rope_utils.py RotaryEmbeddingConfigMixin: `rope_parameters = rope_scaling or
        # rope_parameters` (a falsy rope_scaling is absent)
        ("$.rope_scaling", "*", "schema|falsy"),
        # models/dflash.py DFlashDraftModel has no lm_head parameter (owned_lm_head="dropped"): no module reads it
        ("$.has_own_lm_head", "*", "unread"),
        ("$.output_multiplier", "*", "unread"),
        ("$.final_logit_softcapping", "*", "unread"),
        ("$.attention_sink_bias", "*", "unread"),
        ("$.rope_theta", "*", "unread"),  # transformers folds it into rope_parameters unchecked
        ("$.dspark_bonus_anchor", "*", "unread"),  # no SGLang module reads it
        ("$.dflash_config.use_swa", "*", "unread"),  # use_swa="ignored" (outside the Nemotron-3.5 layout)
        ("$.dflash_config.use_aux_hidden_state", "*", "unread"),  # fc is built whatever it says
        ("$.use_aux_hidden_state", "*", "unread"),
        # configs/model_config.py _get_and_verify_dtype maps a string dtype and passes any other value to
        # torch.set_default_dtype (a TypeError at the model build); a string is judged by LC005
        ("$.torch_dtype", "*", "str?"),
        ("$.dtype", "*", "str?"),
    ),
    domino_dims_required=True,
    mask_token_fallback="resolves the `<|MASK|>` token through the tokenizer",
    target_layer_ids_fallback="guesses them with build_target_layer_ids (wrong for 14 of 20 published "
    "checkpoints)",
)

# each later release: what it changed from the one before (docs/validate.md has the audit of each)
BUMPS: tuple[Bump, ...] = (
    Bump(
        version="0.5.22",
        fields={
            "head_mlp_naming": "named",
            "float_forced": HEAD_RAW_LINEARS + FEATURE_MLP + CONV_KERNEL_PROJECTIONS,
            "quantizable_families": ("lilicorr",),
        },
        notes=(
            "models/lilicorr.py: the head's MLPs are LiLiCorrMLP (up_proj / down_proj) and feature_norm, the "
            "Sequential names refused by check_head_weight_coverage",
            "models/lilicorr.py LiLiCorrDraftModel.supports_quantization: a LiLiCorr draft builds fc, its decoder "
            "layers (under their layer paths) and the head's ReplicatedLinears through the quant config; "
            "factor_input_proj, out_head, in_head, feature_mlp and the conv kernel projections stay nn.Linear",
        ),
    ),
    Bump(
        version="0.5.23",
        fields={
            "extra_hidden_acts": ("swigluoai",),
            "flat_exclusions_by_algo": tuple(
                (algo, ("ignore", "modules_to_not_convert", "exclude_modules"))
                for algo in ("NVFP4", "NVFP4_AWQ", "W4A16_NVFP4")
            ),
            "gemma_norm_read": True,
            "rope_dim_read": True,
            "markov_head_type_nested_read": True,
            "dspark_mask_token_first": "dflash_config",
            "dspark_reads": _DSPARK_READS
            + (
                # dflash_config merged under dspark_config: its Markov keys are read first (markov_rank int(),
                # markov_head_type str()), its mask_token_id before the top-level one
                ("$.mask_token_id", "dspark", "else:int()?"),
                ("$.dflash_config.markov_rank", "dspark", "int()?"),
                ("$.dflash_config.markov_head_type", "dspark", "str()"),
            ),
            "routes": (),
            "final_layer_capture_architectures": (
                "Gemma3ForCausalLM",
                "Gemma4ForCausalLM",
                "GptOssForCausalLM",
                "LagunaForCausalLM",
                "Lfm2ForCausalLM",
                "Lfm2MoeForCausalLM",
                "MiMoV2FlashForCausalLM",
                "MiMoV2ForCausalLM",
                "MiniMaxM3SparseForConditionalGeneration",
                "NemotronHForCausalLM",
                "NemotronHPuzzleForCausalLM",
            ),
        },
        notes=(
            "models/dflash.py DFlashMLP.__init__: swigluoai built (swiglu_alpha / swiglu_limit read)",
            "layers/quantization/modelopt_quant.py ModelOptFp4Config.from_config: flat exclusions from ignore, "
            "else modules_to_not_convert, else exclude_modules",
            "models/dflash.py DFlashAttention / DFlashDraftModel: use_gemma_norm builds GemmaRMSNorm; "
            "rope_scaling.rope_dim sets the rotary width",
            "speculative/dspark_components/dspark_config.py _get_dspark_config: dflash_config merged under "
            "dspark_config (a nested markov_head_type is read; dflash_config's mask_token_id wins)",
            "models/dflash.py EntryClass: DFlash2BeamDraftModel and MiniMaxDFlash2DraftModel registered",
            "models/minimax_m3_vl.py MiniMaxM3SparseForConditionalGeneration: captures after its last layer",
        ),
    ),
)

RELEASES = release_chain(FIRST, BUMPS, "the released wheel sglang=={version} (PyPI)")


_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_DECODER_SUBLAYER = re.compile(r"layers\.\d+\.(self_attn|mlp)")
_SHARD_OF = {shard: fused for fused, shards in _FUSED.items() for shard in shards}


def _built(module: str) -> tuple[str, tuple[str, ...]]:
    """(the name SGLang builds the module under, the checkpoint names of its shards): q/k/v and gate/up are fused
    (also under a bare name, as the families with empty layer prefixes build them)."""
    head, _, leaf = module.rpartition(".")
    fused = _SHARD_OF.get(leaf)
    if fused is None or (head and not _DECODER_SUBLAYER.fullmatch(head)):  # the head's MLPs are not fused
        return module, ()
    base = f"{head}." if head else ""
    return base + fused, tuple(base + shard for shard in _FUSED[fused])


def _on_path(pattern: str, name: str) -> bool:
    """quantization/utils.py `_module_path_match`: a literal pattern naming the module or one of its ancestors,
    on dotted boundaries (no wildcards)."""
    pattern, name = pattern.rstrip("."), name.rstrip(".")
    return name == pattern or name.startswith(pattern + ".") or f".{pattern}." in f".{name}."


# re's own cache holds 512 patterns: past that, every pattern was compiled again for every module
@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _regex_hit(prefix: str, patterns: tuple[str, ...]) -> str | None:
    """modelopt_quant.py ModelOptQuantConfig.is_layer_excluded: each pattern as a regex (`.` literal, `*` -> `.*`)
    fullmatched against the whole name or any one of its dotted components."""
    candidates = [prefix] + (
        [prefix[len("language_model.") :]] if prefix.startswith("language_model.") else []
    )
    for p in patterns:
        rx = _regex(p)
        for c in candidates:
            if rx.fullmatch(c) or any(rx.fullmatch(part) for part in c.split(".")):
                return p
    return None


def match_exclusion(
    module: str,
    patterns: tuple[str, ...],
    num_target_layers: int | None,
    profile: RuntimeProfile | None = None,
) -> Exclusion:
    """Whether SGLang treats `module` as excluded from quantization (ModelOptQuantConfig._get_quant_method: the
    layer is unquantized when quantization/utils.py is_layer_skipped or is_layer_excluded says so). `module` is
    the canonical name, or the bare `q_proj` / `o_proj` / ... of a family built with empty layer prefixes."""
    name, shards = _built(module)
    if shards:
        # is_layer_skipped: each shard against the literal paths; shards must agree ("Detected some but not all
        # shards of ... are quantized", a ValueError at model construction)
        hits = [next((p for p in patterns if _on_path(p, shard)), None) for shard in shards]
        if any(hits) and not all(hits):
            named = [s for s, h in zip(shards, hits, strict=True) if h]
            return Exclusion(
                True,
                name,
                None,
                f"the exclusions name {', '.join(f'`{s}`' for s in named)} but not "
                f'every shard of `{name}`: SGLang refuses the model ("Detected some but not all shards '
                f'of {name} are quantized")',
            )
        if all(hits):
            return Exclusion(True, name, hits[0])
    else:
        hit = next((p for p in patterns if _on_path(p, name)), None)
        if hit is not None:
            return Exclusion(True, name, hit)
    hit = _regex_hit(name, patterns)
    return Exclusion(hit is not None, name, hit)
