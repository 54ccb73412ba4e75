"""vLLM, as its released wheel loads a drafter: the profile, and how it matches quantization exclusions.

Every field comes from the wheel's sources (files under `vllm/`), executed on CPU by tests/conformance/vllm; the
comments name the deciding statement.

Exclusions (models/utils.py `map_draft_quant_config`, quantization/modelopt.py `is_layer_excluded`): the draft's
patterns are rewritten before matching. `X*` (X not ending in `.`) becomes `X` and `X.*`; the draft's renames
apply (`midlayer` -> `layers.0`, `encoder.fc` -> `fc`, `encoder.output_norm_enc` -> `hidden_norm`); a pattern
naming `layers.N` at its root (optionally after `model.` or `*`) is renumbered to the draft layer's runtime index
`layers.{num_target_layers+N}`; every pattern not starting with `*` or `model.` gets `model.` prepended. Module
names are `model.<name>` with the same renumbering, q/k/v fused to `qkv_proj` and gate/up to `gate_up_proj`; the
draft's quant config has no packed-module mapping, so a fused module matches only under its fused name: exact
match, then substring, then fnmatch. The lm_head's quant config is a fresh copy: its patterns are matched as
written. (vLLM renumbers the indices below the draft's layer count; here those below num_target_layers are, which
decides the same: a pattern left at an index below num_target_layers names no draft module either way, and one at
or above it is a runtime index, left as written by both.)
"""

from __future__ import annotations

import fnmatch
import re

from lilicorr_ckpt.runtimes.base import (
    HEAD_RAW_LINEARS,
    Bump,
    Exclusion,
    RuntimeProfile,
    fused_name,
    release_chain,
)

FIRST = RuntimeProfile(
    name="vllm",
    engine_id="vllm",
    engine="vLLM",
    version="0.31.0",
    released=True,
    source="",
    topk_power_of_two_max=16,  # lilicorr.py LiLiCorrHead.__init__: "must be a power of two <= 16"
    hidden_size_zero_ok=True,  # LiLiCorrHead: `config["lilicorr_hidden_size"] or model_hidden_size`
    vector_eps_below_half=False,
    block_size_default=None,  # lilicorr.py LiLiCorr.__init__: "requires 1 <= num_speculative_tokens < block_size"
    conv_keys_both_or_neither=True,  # LiLiCorr.__init__: "must enable both taps and group size"
    conv_kernel_within_block=False,
    legacy_mlp_names="refused",  # LiLiCorrHead's NemotronHMLP has no Sequential parameters (AutoWeightsLoader)
    owned_lm_head="supported",
    float_forced=HEAD_RAW_LINEARS,  # LiLiCorrHead: factor_input_proj, out_head, in_head built with quant_config=None
    # qwen3_dflash.py _build_context_kv_buffers runs a quantized qkv_proj through its quant method
    float_required=(),
    quant_unconfirmed=(),
    renumbers_draft_layers=True,
    # model_arch_config_convertor.py _normalize_quantization_config ("Unknown ModelOpt quant algo" for the rest)
    nested_quant_method_algos=("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4"),
    # qwen3_dflash.py DFlashQwen3Model.__init__ -> _add_global_draft_layer_exclusions: patterns kept as written,
    # plus a renumbered copy of each unrooted layers.N
    draft_exclusion_mapping="aliased",
    # config/speculative.py raises the draft's max_position_embeddings for eagle / eagle3 drafts only
    draft_positions_follow_target=False,
    # models/qwen3_dspark.py load_weights: a confidence head without tensors is turned off (confidence_head =
    # None); it is read only under enable_adaptive_verification, off by default
    dspark_confidence_head_missing="dropped",
    # models/qwen3_dspark.py Qwen3DSparkModel.__init__: a DSparkConfidenceHead (a float32 ReplicatedLinear with a
    # bias) only `if getattr(config, "enable_confidence_head", False)`, hidden_size wide plus markov_rank `if
    # getattr(config, "confidence_head_with_markov", False)`; Qwen3DSparkForCausalLM.load_weights maps its tensors
    # to None when no head is built (skipped) and loads them through AutoWeightsLoader when one is (a misshaped or
    # unknown name refused). v1/worker/gpu/spec_decode/dspark/speculator.py load_draft_model: use_confidence_head
    # only with SpeculativeConfig.enable_adaptive_verification (default False)
    dspark_confidence_head="flagged",
    # models/utils.py AutoWeightsLoader._load_module: a tensor of another dtype than its parameter is logged
    # ("Attempted to load weight ... with dtype ...") and copied in by the weight loader, a cast
    scale_dtype_cast=True,
    dspark_confidence_option="--speculative-config enable_adaptive_verification=true",
    # modelopt.py KNvfp4Static.process: `weight_scale_2.max()` over a fused linear's shards (a warning when they
    # differ); the other shards' block scales are not rescaled
    fused_global_scale="max",
    mask_token_fallback='has no fallback (spec_decode/utils.py get_parallel_drafting_token_id: "must specify")',
    target_layer_ids_fallback="falls back to the target's default taps (2, L/2, L-3) (eagle3_utils.py)",
    flat_exclusions_key="ignore",  # modelopt.py ModelOptQuantConfigBase.from_config: `config.get("ignore", [])`
    flat_group_size_default=16,  # ModelOptNvFp4Config._from_config: `if group_size is None: group_size = 16`
    reads_hf_quant_config=True,  # transformers_utils/config.py get_config: hf_quant_config.json without one inline
    nested_form_keys_required=True,  # _from_config: "NVFP4 quantization requires the following fields"
    causal="honours",  # qwen3_dflash.py _dflash_layer_causal: is_causal, then dflash_config.causal
    swa_window_size_read=True,  # qwen3_dflash.py _resolve_layer_attention reads swa_window_size first
    swa_window_zero="literal",
    integral_float_lilicorr="crashes",  # LiLiCorrHead: `candidate_topk & (candidate_topk - 1)`, range(num_layers)
    # transformers' Qwen3Config (vLLM's config class) refuses a float num_hidden_layers ("expected int")
    integral_float_backbone="refuses",
    integral_float_mask_token="casts",  # get_parallel_drafting_token_id: int(...)
    embed_tokens_copy="used",  # qwen3_dflash.py load_weights: includes_embed_tokens, the draft's own input table
    quant_config_read="config.json",  # get_quant_config: hf_config.quantization_config, else hf_quant_config.json
    # qwen3_dflash.py _resolve_layer_attention: sliding layers causal unless causal / is_causal says otherwise
    sliding_semantics="causally, over the last w tokens",
    # transformers' Qwen3Config fills rope_parameters (rope_theta 10000) before qwen3_dflash.py
    # set_default_rope_theta(config, 1e6) looks, so its 1e6 never applies to a Qwen3 draft
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    lilicorr_disabled='refuses it ("requires lilicorr_enabled=True")',
    dflash2_conv_indexed=True,  # qwen3_dflash2.py DFlash2Qwen3DecoderLayer: draft_config["conv_kernel_size"]
    unknown_tensors="refused",  # AutoWeightsLoader._load_module: "There is no module or parameter named"
    legacy_duplicate="refuses",  # no parameter for the legacy name
    undeclared_lm_head="owned",  # process_eagle_weight sets has_own_lm_head; load_dflash_model keeps a distinct head
    selector_check="indexed",  # qwen3_dflash2.py DFlash2Qwen3Model: int(draft_config["selector_rank"]), no range check
    markov_rank_top_level=True,  # qwen3_dspark.py Qwen3DSparkModel reads config.markov_rank
    markov_head_types=(
        "vanilla",
    ),  # qwen3_dspark.py builds DSparkMarkovHead only; markov_head_type is not read
    logit_scale_checked=False,  # LiLiCorrHead stores lilicorr_logit_scale without a check
    vector_eps_checked=False,  # LiLiCorrHead stores lilicorr_vector_eps without a check (F.normalize's eps)
    layer_types_length_exact=True,  # transformers' Qwen3Config: "num_hidden_layers must be equal to layer_types"
    sliding_window_needs_flag=True,  # Qwen3Config keeps sliding_window only with use_sliding_window
    # qwen3_dflash.py load_weights skips "t2d"; AutoWeightsLoader drops recomputed rotary caches
    inert_tensors=(
        "t2d",
        "*.t2d",
        "*rotary_emb.inv_freq",
        "*rotary_pos_emb.inv_freq",
        "*rotary_emb.cos_cached",
        "*rotary_emb.sin_cached",
    ),
    captures_in_layer_order=True,  # interfaces.py EagleModelMixin._set_aux_hidden_state_layers: sorted(set(layers))
    reads_eagle_aux_layer_ids=True,  # eagle3_utils.py get_eagle3_aux_layers_from_config reads it first
    tensor_aliases=("midlayer", "encoder"),  # qwen3_dflash.py DFlashQwen3Model.hf_to_vllm_mapper
    sample_from_anchor_refused=True,  # spec_decode/dflash/speculator.py DFlashSpeculator.__init__
    # qwen3_dflash.py DFlashQwen3DecoderLayer: make_attention_sink(num_heads) if dflash_config.get(
    # "attention_sink_bias", the top-level add_swa_attention_sink_bias)
    attention_sinks_built=True,
    attention_sinks_top_level=True,
    use_aux_hidden_state_read=True,  # qwen3_dflash.py: no fc without use_aux_hidden_state; load_weights drops "fc."
    # transformers_utils/config.py get_config builds transformers' strict Qwen3Config (the wheel pins transformers 5)
    config_class_strict=True,
    # qwen3_dflash.py DFlashQwen3Model.__init__: `getattr(self.config, "eagle_config", {})`, then `.update`/`.get`
    eagle_config_object=True,
    # qwen3_dflash.py DFlashQwen3Attention.__init__: `self.head_dim = head_dim or hidden_size // total_num_heads`
    head_dim_zero_derived=True,
    # config/speculative.py SpeculativeConfig.__post_init__: `n_predict = getattr(hf_config, "n_predict", None)`;
    # unless DSpark, num_speculative_tokens above it "must be divisible by n_predict"
    n_predict_families=("lilicorr", "dflash", "dflash2", "domino"),
    # qwen3_dflash2.py DFlash2Qwen3ForCausalLM: LogitsProcessor(scale=float(output_multiplier)) for the
    # candidates; logits_processor.py get_top_k_tokens (compute_candidates, every draft step) raises ValueError for a
    # scale <= 0 ("not supported for non-positive logit scaling factors"); no other head applies it
    output_multiplier_step_positive=("dflash2",),
    config_reads=(
        # another head kind's keys: each model class reads only its own (lilicorr.py the lilicorr_* and conv keys,
        # qwen3_dflash2.py the selector and conv keys, qwen3_dspark.py the Markov and confidence keys)
        ("$.dflash_config.lilicorr_*", "!lilicorr", "unread"),
        ("$.dflash_config.conv_*", "!lilicorr,dflash2", "unread"),
        ("$.dflash_config.selector_*", "!dflash2", "unread"),
        # (qwen3_dspark.py reads markov_rank at the top level only, markov_head_type nowhere: dflash_config's
        # Markov keys are unread for every head kind)
        ("$.dflash_config.markov_*", "*", "unread"),
        ("$.dflash_config.gru_hidden_dim", "*", "unread"),  # Domino is loaded as plain DFlash
        ("$.dflash_config.emb_dim", "*", "unread"),
        ("$.dflash_config.pure_draft_prefix_len", "*", "unread"),
        ("$.dflash_config.shift_label", "*", "unread"),
        # config/speculative.py _validate_qwen3_omni_dspark: read only for a Qwen3-Omni target
        ("$.dspark_bonus_anchor", "*", "unread"),
        ("$.markov_*", "!dspark", "unread"),
        # qwen3_dspark.py Qwen3DSparkModel.__init__: DSparkMarkovHead(..., config.markov_rank) and the confidence
        # head's `input_dim += config.markov_rank`, uncast: nn.Embedding(vocab, 8.0) is a TypeError at build
        ("$.markov_rank", "dspark", "int"),
        ("$.emb_dim", "*", "unread"),
        ("$.gru_hidden_dim", "*", "unread"),
        # lilicorr.py LiLiCorr.__init__: `if not draft_config.get("lilicorr_enabled", True)`
        ("$.dflash_config.lilicorr_enabled", "*", "truth"),
        # lilicorr.py LiLiCorrMLP: `int(hidden_size * mlp_ratio)`: true sizes the MLP at ratio 1 (the trained
        # tensors narrowed), a numeric string is repeated hidden_size times
        ("$.dflash_config.lilicorr_mlp_ratio", "*", "number"),
        # qwen3_dflash.py _dflash_layer_causal: `bool(is_causal)`, then `if override is not None`; the dflash
        # speculator's `if dflash_config.get("sample_from_anchor", False)`; _resolve_layer_attention's use_swa;
        # DFlashQwen3Model's use_aux_hidden_state; qwen3_dspark.py's confidence-head flags
        ("$.is_causal", "*", "truth"),
        ("$.dflash_config.causal", "*", "truth"),
        ("$.dflash_config.sample_from_anchor", "*", "truth"),
        ("$.dflash_config.use_swa", "*", "truth"),
        ("$.dflash_config.use_aux_hidden_state", "*", "truth"),
        ("$.use_aux_hidden_state", "*", "truth"),
        ("$.sample_from_anchor", "*", "truth"),
        ("$.enable_confidence_head", "*", "truth"),
        ("$.confidence_head_with_markov", "*", "truth"),
        # read only without a dflash_config value, or not at all: dflash_config's block_size, mask_token_id and
        # target_layer_ids win (lilicorr.py, eagle3_utils.py); swa_window_size only for a sliding layer; the
        # projector is chosen by architecture; output_multiplier and final_logit_softcapping from dflash_config
        # only (qwen3_dflash2.py); attention sinks from dflash_config / add_swa_attention_sink_bias
        ("$.block_size", "*", "unread"),
        # only lilicorr.py LiLiCorr.__init__ reads dflash_config.block_size (uncast); qwen3_dspark the top-level
        # one; DFlash and DFlash2 take the block from num_speculative_tokens
        ("$.dflash_config.block_size", "!lilicorr", "unread"),
        ("$.dflash_config.block_size", "lilicorr", "int"),  # `block_size - 1` slots, compared with `<`
        ("$.mask_token_id", "*", "unread"),
        ("$.target_layer_ids", "*", "unread"),
        ("$.num_target_layers", "*", "unread"),
        (
            "$.dflash_config.num_target_layers",
            "*",
            "unread",
        ),  # no DFlash-family module reads it at either level
        ("$.dflash_config.swa_window_size", "*", "unread"),
        ("$.dflash_config.projector_type", "*", "unread"),
        ("$.output_multiplier", "*", "unread"),
        ("$.final_logit_softcapping", "*", "unread"),
        ("$.attention_sink_bias", "*", "unread"),
        ("$.rope_theta", "*", "unread"),  # transformers folds it into rope_parameters unchecked
        ("$.torch_dtype", "*", "unread"),  # a string is judged by LC005
        # qwen3_dflash2.py DFlash2Qwen3ForCausalLM.__init__: float(output_multiplier), float(softcap or 0.0)
        ("$.dflash_config.output_multiplier", "dflash2", "float()"),
        # qwen3_dflash2.py DFlash2Qwen3Model.__init__: float(draft_config.get("input_embedding_scale", 1.0))
        ("$.dflash_config.input_embedding_scale", "dflash2", "float()"),
        ("$.dflash_config.final_logit_softcapping", "dflash2", "float()|falsy"),
        # qwen3_dflash.py _get_dflash_fc_input_size: `getattr(config, "target_hidden_size", None) or hidden_size`
        # times the feature count sizes fc (a falsy value is the draft's width, a truthy one is used uncast)
        ("$.target_hidden_size", "*", "int|falsy"),
        # transformers modeling_rope_utils.py RotaryEmbeddingConfigMixin: `rope_parameters = rope_scaling or
        # rope_parameters` (a falsy rope_scaling is absent); eagle3_utils.py get_eagle3_aux_layers_from_config:
        # `if not layer_ids:` falls back to dflash_config's taps
        ("$.rope_scaling", "*", "schema|falsy"),
        ("$.eagle_aux_hidden_state_layer_ids", "*", "schema|falsy"),
        # lilicorr.py LiLiCorrForCausalLM: `bool(getattr(config, "has_own_lm_head", False))`, qwen3_dflash.py the
        # lm_head's quant config `if getattr(config, "has_own_lm_head", False)`: a true value owns the head
        ("$.has_own_lm_head", "*", "flag"),
        # qwen3_dflash2.py DFlash2Qwen3DecoderLayer / DFlash2Qwen3Model: int(draft_config["conv_kernel_size"]),
        # int(draft_config["conv_group_size"]), int(draft_config["selector_rank"]), int(...["selector_top_k"])
        *((f"$.dflash_config.{key}", "dflash2", "int()") for key in ("conv_kernel_size", "conv_group_size")),
        *((f"$.dflash_config.{key}", "dflash2", "int()") for key in ("selector_rank", "selector_top_k")),
        # lilicorr.py LiLiCorr.__init__: `draft_config.get("conv_kernel_size", 0)` (and conv_group_size) compared
        # `< 0`, then as truth values (`bool(taps) != bool(groups)`), before anything casts them: null, a string or
        # a list fail at build (TypeError), a bool passes and becomes a 1-wide convolution no trained head has, a
        # NaN is neither negative nor 0 (it enables a convolution: LC116); where both enable one,
        # qwen3_dflash2.py DFlash2Qwen3DecoderLayer builds it from int() of each (2.0 is 2, NaN fails)
        *(
            (f"$.dflash_config.{key}", "lilicorr", "number>int()")
            for key in ("conv_kernel_size", "conv_group_size")
        ),
        # spec_decode/utils.py get_parallel_drafting_token_id: `int(dflash_config["mask_token_id"])`
        ("$.dflash_config.mask_token_id", "*", "int()"),
        # qwen3_dflash.py DFlashQwen3DecoderLayer: `getattr(config, "is_neox_style", True)` into get_rope (a key of
        # its cache), then _build_fused_kv_buffers asserts every layer's is_neox_style == the first's
        ("$.is_neox_style", "*", "truth=="),
        # config/speculative.py: "dspark_draft_topk must be between 1 and the draft vocabulary size"
        # (`not 1 <= topk <= vocab`: true and 2.0 pass it, then fail the first draft step's topk(), which takes an
        # int: spec_decode/dspark/speculator.py _sample_sequential_topk)
        ("$.dspark_draft_topk", "dspark", "count?"),
        # qwen3_dflash.py DFlashQwen3DecoderLayer: `make_attention_sink(...) if add_swa_attention_sink_bias`
        ("$.dflash_config.attention_sink_bias", "*", "flag"),
    ),
    # qwen3_dflash.py builds vLLM's RMSNorm (x * w) and get_rope over the whole head: neither use_gemma_norm nor
    # rope_dim is read
    gemma_norm_read=False,
    rope_dim_read=False,
    # transformers_utils/config.py maybe_override_with_speculators -> configs/speculators/algos.py update_dflash /
    # update_dflash2 / update_dspark translate dflash, dflash2 and dspark speculators configs
    speculators_format="translated",
    # qwen3_dflash.py DFlashQwen3ForCausalLM.compute_logits scatters the draft head's logits through
    # draft_id_to_target_id (load_weights reads d2t into it); spec_decode/dspark/speculator.py maps sampled ids
    # through map_draft_to_target. qwen3_dflash2.py compute_candidates takes the top-k rows of the draft lm_head
    # as candidate ids and never maps them
    draft_vocab_mapped=("dflash", "dspark"),
    draft_vocab_unmapped=("dflash2",),
    # transformers_utils/model_arch_config_convertor.py _normalize_quantization_config: `quant_cfg.get("quant_method",
    # "")`; config/model.py _verify_quantization: `quant_method if quant_method != "" else None` (no quantization)
    quant_config_without_method="unquantized",
    # qwen3_dflash.py DFlashQwen3ForCausalLM.__init__ / qwen3_dspark.py: LogitsProcessor(draft_vocab_size,
    # scale=getattr(config, "logit_scale", 1.0))
    logit_scale_read=True,
    # qwen3_dflash.py DFlashQwen3ForCausalLM.__init__ builds draft_id_to_target_id only when draft_vocab_size
    # differs from the target's vocabulary (lilicorr.py refuses that one); no module reads the config key
    reads_draft_id_map_key=False,
)

# each later release: what it changed from the one before (docs/validate.md has the audit of each)
BUMPS: tuple[Bump, ...] = (
    Bump(
        version="0.32.0",
        fields={},
        notes=(
            "no change that decides a drafter's verdict: qwen3_dflash.py (ROCm attention), modelopt.py (MoE "
            "activations, codecs) and transformers_utils/config.py (other model families) concern other models",
        ),
    ),
    Bump(
        version="0.33.0",
        fields={
            "flat_exclusions_key": None,
            "nested_quant_method_algos": (
                "FP8",
                "FP8_PER_CHANNEL_PER_TOKEN",
                "FP8_PB_WO",
                "NVFP4",
                "MIXED_PRECISION",
            ),
            "draft_exclusion_mapping": "mapped",
            "draft_positions_follow_target": True,
            "speculators_verifier_repo_only": True,
            "routes": (
                (
                    "dflash2",
                    "DFlash2BeamDraftModel",
                    "sliding-only",
                    "registry.py maps DFlash2BeamDraftModel to vllm.models.beam, a beam-search variant: "
                    "models/beam/nvidia/dflash2.py DFlash2BeamAttention asserts that every layer is "
                    "non-causal sliding-window attention (the rest of its loading was not audited)",
                ),
            ),
        },
        notes=(
            "layers/quantization/modelopt.py ModelOptQuantConfigBase.from_config: a flat config's exclusions "
            "fall back to exclude_modules when it has no ignore",
            "transformers_utils/model_arch_config_convertor.py _normalize_quantization_config: a nested "
            "MIXED_PRECISION config gets quant_method modelopt_mixed (was refused as an unknown algo)",
            "models/qwen3_dflash.py DFlashQwen3Model.__init__: models/utils.py map_draft_quant_config rewrites "
            "the draft's exclusions like its module names (X* split, midlayer/encoder renames, root layers.N "
            "renumbered, model. prefixed), replacing _add_global_draft_layer_exclusions",
            "config/speculative.py: every drafter's max_position_embeddings follows the target's context "
            "(config/vllm.py _limit_max_model_len_to_draft otherwise)",
            "models/registry.py: DFlash2BeamDraftModel registered (vllm.models.beam)",
            "transformers_utils/config.py maybe_override_with_speculators: a speculators verifier must name a "
            'Hub repo ("Speculators verifier must name a remote model repository"; validate_repo_id, and no '
            "local path of that name)",
        ),
    ),
    Bump(
        version="0.34.0",
        fields={
            "head_coverage": "initialised",
            "dflash2_nope_layers_key": "no_rope_layers",
            "dspark_vocab_tensors_required": False,
            "dspark_confidence_head_missing": "initialised",
            "nvfp4_scale_encodings": ("csf", "csf_32x2_v1"),
        },
        notes=(
            "models/lilicorr.py LiLiCorrForCausalLM.load_weights: the coverage check is gone; a missing head, "
            "convolution, owned lm_head or head scale tensor serves at its initial value (0.33 refused it: "
            '"LiLiCorr checkpoint coverage mismatch")',
            "config/speculative.py SpeculativeConfig.hf_config_override: DFlash2DraftModel with no_rope_layers "
            "becomes DFlash2RicursiveDraftModel (models/ricursive_dflash2.py), whose listed layers run without "
            "RoPE",
            "models/qwen3_dspark.py Qwen3DSparkForCausalLM.load_weights: the refusals of a vocabulary without "
            "embed_tokens / lm_head / d2t are gone (served at initial values, d2t as the identity), and a "
            "missing confidence head is no longer dropped",
            "layers/quantization/modelopt.py ModelOptNvFp4Config: weight_scale_encoding csf / csf_32x2_v1 "
            'decoded; any other value refused ("unsupported weight_scale_encoding")',
            "v1/worker/gpu/spec_decode/speculator_config.py: the method and the speculator come from the model "
            "class's declared speculator config (the same speculator for every head this tool models); an "
            "explicit method that disagrees is refused",
            "v1/worker/gpu/spec_decode/speculator_config.py SpeculatorConfig.resolve_num_speculative_tokens: the "
            "n_predict check moved here from SpeculativeConfig.__post_init__ (every head but DSpark, as before)",
            "the V1 model runner is gone: its mixed sliding/full refusal with it (every verdict here was the V2 "
            "runner's already)",
        ),
    ),
)

RELEASES = release_chain(FIRST, BUMPS, "the released wheel vllm=={version} (PyPI)")


_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")
# DFlashQwen3Model.hf_to_vllm_mapper's renames (the stacked q/k/v and gate/up maps are not applied to patterns)
_RENAMES = (
    (re.compile(r"(?<![A-Za-z0-9_])midlayer(?=\.|\*|$)"), "layers.0"),
    (re.compile(r"(?<![A-Za-z0-9_])encoder\.output_norm_enc(?=\.|\*|$)"), "hidden_norm"),
    (re.compile(r"(?<![A-Za-z0-9_])encoder\.fc(?=\.|\*|$)"), "fc"),
)
_ROOT_LAYER = re.compile(r"^((?:model\.)?\*?)layers\.(\d+)(?=\.|\*|$)")
_NOT_ROOTED = re.compile(r"^(?!\*|model(?:\.|\*|$))")


def _module_name(name: str, num_target_layers: int | None) -> str:
    """The runtime name of a draft module: `model.` prefixed, draft layer i renumbered after the target's."""
    if name == "lm_head" or name.startswith("lm_head."):
        return name
    m = _LAYER.match(name)
    if m and num_target_layers is not None:
        name = f"layers.{num_target_layers + int(m.group(1))}.{m.group(2)}"
    return "model." + name


def _split(patterns: list[str]) -> list[str]:
    """ModelOptQuantConfigBase.apply_vllm_mapper: `X*` (X not ending in `.`) stands for `X` and `X.*`."""
    out: list[str] = []
    for p in patterns:
        out += [p[:-1], p[:-1] + ".*"] if len(p) >= 2 and p[-1] == "*" and p[-2] != "." else [p]
    return out


def draft_patterns(patterns: tuple[str, ...], num_target_layers: int | None) -> list[str]:
    """The exclusions as the draft's quant config holds them after models/utils.py `map_draft_quant_config`."""
    out = []
    for p in _split(list(patterns)):
        for rx, new in _RENAMES:
            if rx.search(p):
                p = rx.sub(new, p)
        out.append(p)
    mapped = []
    for p in _split(out):
        if num_target_layers:
            p = _ROOT_LAYER.sub(
                lambda m: (
                    f"{m.group(1)}layers.{num_target_layers + int(m.group(2))}"
                    if int(m.group(2)) < num_target_layers
                    else m.group(0)
                ),
                p,
                count=1,
            )
        mapped.append(_NOT_ROOTED.sub("model.", p, count=1))
    return mapped


def _hit(prefix: str, patterns: list[str]) -> str | None:
    """modelopt.py is_layer_excluded: exact (no packed-module mapping on the draft), substring, then fnmatch."""
    if not patterns:
        return None
    if prefix in patterns:
        return prefix
    bare = prefix.removeprefix("language_model.")
    for p in patterns:
        if p != prefix and (p in prefix or (prefix.startswith("language_model.") and p in bare)):
            return p
    return next((p for p in patterns if fnmatch.fnmatch(prefix, p)), None)


_UNROOTED_LAYER = re.compile(r"(?<![A-Za-z0-9_.])layers\.(\d+)")


def aliased_patterns(patterns: tuple[str, ...], num_target_layers: int | None) -> list[str]:
    """The exclusions as the releases before map_draft_quant_config hold them (qwen3_dflash.py
    `_add_global_draft_layer_exclusions`): as written, plus a copy of each with its unrooted `layers.N` renumbered
    to the draft layer's runtime index (N below num_target_layers, as draft_patterns decides)."""
    out = list(patterns)
    if not num_target_layers:
        return out
    for p in tuple(out):
        moved = _UNROOTED_LAYER.sub(
            lambda m: (
                m.group(0)
                if int(m.group(1)) >= num_target_layers
                else f"layers.{num_target_layers + int(m.group(1))}"
            ),
            p,
        )
        if moved != p and moved not in out:
            out.append(moved)
    return out


def match_exclusion(
    module: str,
    patterns: tuple[str, ...],
    num_target_layers: int | None,
    profile: RuntimeProfile | None = None,
) -> Exclusion:
    """Whether vLLM (the release `profile`, its newest when None) treats `module` (a canonical name) as excluded
    from quantization."""
    fused = fused_name(module)
    name = fused[0] if fused else module
    prefix = _module_name(name, num_target_layers)
    mapping = (profile or RELEASES[-1]).draft_exclusion_mapping
    # the lm_head takes a fresh quant config (qwen3_dflash.py get_draft_quant_config), its patterns unmapped
    if prefix == "lm_head":
        expanded = list(patterns)
    elif mapping == "aliased":
        expanded = aliased_patterns(patterns, num_target_layers)
    else:
        expanded = draft_patterns(patterns, num_target_layers)
    hit = _hit(prefix, expanded)
    return Exclusion(hit is not None, prefix, hit)
