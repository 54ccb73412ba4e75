"""What each serving stack accepts, as data (the loader audit in docs/validate.md says which loader code each
field comes from).

Rules consult these records; nothing else in the code branches on a runtime's name.
Patterns are fnmatch patterns over canonical module names (checkpoint names without `model.`).
"""

from __future__ import annotations

import fnmatch

import msgspec

QKV = ("layers.*.self_attn.q_proj", "layers.*.self_attn.k_proj", "layers.*.self_attn.v_proj")
HEAD_RAW_LINEARS = ("lilicorr.factor_input_proj", "lilicorr.out_head", "lilicorr.in_head")
FEATURE_MLP = ("lilicorr.feature_mlp.*",)


class RuntimeProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    display: str
    # lilicorr_candidate_topk: power of two and <= this, or None for "any K >= 1"
    topk_power_of_two_max: int | None
    hidden_size_zero_ok: bool  # lilicorr_hidden_size 0 means "use the draft width"
    vector_eps_below_half: bool  # vector_eps must lie in (0, 0.5)
    block_size_default: int | None  # used when block_size is absent everywhere; None = refused
    conv_keys_both_or_neither: bool
    conv_kernel_within_block: bool  # refuses conv_kernel_size > block_size
    legacy_mlp_names: str  # "renamed" | "refused" (no parameter for the Sequential names)
    owned_lm_head: str  # "supported" | "dropped" (no lm_head parameter: the target's head is used)
    # linear modules this runtime builds unquantized whatever the quant config says
    float_forced: tuple[str, ...]
    # linear modules that must be float and excluded, because the runtime follows the config for them
    float_required: tuple[str, ...]
    # linear modules whose quantized loading is not confirmed for this runtime
    quant_unconfirmed: tuple[str, ...]
    exclusion_matcher: str  # vllm | sglang | trtllm (see quant.py)
    nested_quant_method_algos: tuple[str, ...] | None  # algos it derives quant_method for in the nested form
    mask_token_fallback: str  # what it does when mask_token_id is missing
    target_layer_ids_fallback: str
    # flat quantization_config: the exclusion list it reads (None: unconfirmed, `exclude_modules` taken as a fallback)
    flat_exclusions_key: str | None = None
    # flat quantization_config: the group size it uses when there is no top-level group_size
    # (None: unconfirmed, config_groups.group_0.weights.group_size taken as a fallback)
    flat_group_size_default: int | None = None
    # the nested NVFP4 form must carry group_size, kv_cache_quant_algo and exclude_modules (null allowed)
    nested_form_keys_required: bool = False
    # flat form: refuses NVFP4 when neither the top level nor config_groups' weights give a group size
    flat_group_size_required: bool = False
    # with no quantization_config in config.json, derives a quant_method from hf_quant_config.json (and refuses
    # what it cannot derive one for: LC302); which copy a runtime reads at all is quant_config_read
    reads_hf_quant_config: bool = False
    # is_causal / dflash_config.causal true: "refuses" ("requires non-causal"), "honours" (drafts causally as
    # declared) or "ignores" (runs full layers bidirectionally whatever the config says: a silent mis-load)
    causal: str = "refuses"
    # reads output_multiplier from dflash_config only and requires it > 0 (None: does not read it)
    output_multiplier_nested_positive: bool = False
    embedding_rows_equal_vocab: bool = False  # the target's input embedding must have exactly V rows
    accepts_fused_qkv: bool = True  # accepts (and splits) a float fused self_attn.qkv_proj.weight
    # DFlashDraftModel (and the backbones in projector_routed_architectures) with dflash_config.projector_type
    # "lilicorr" / lilicorr_enabled true selects LiLiCorr
    projector_type_routes: bool = False
    projector_routed_architectures: tuple[str, ...] = ()
    # with num_target_layers absent, checks target_layer_ids against the draft's own num_hidden_layers
    taps_checked_against_draft_layers: bool = False
    num_target_layers_positive: bool = False  # refuses num_target_layers < 1
    hidden_act: str = "silu-only"  # "silu-only" (refuses others) | "unconfirmed"
    # a sliding_attention layer takes its window from dflash_config.swa_window_size when sliding_window is absent
    swa_window_size_read: bool = False
    # dflash_config.use_swa (outside layer_types): "applied" (every layer sliding) | "ignored" (full attention)
    use_swa: str = "applied"
    # dflash_config.swa_window_size < 1 with use_swa: "refuses" | "literal" (a window of 0) | "ignored"
    swa_window_zero: str = "refuses"
    # whole-number floats (4.0) where an integer is needed: "casts" (int()), "crashes" (used raw: TypeError),
    # "refuses" (an explicit integer check) or "unconfirmed"
    integral_float_lilicorr: str = "casts"  # lilicorr_* integer geometry
    integral_float_backbone: str = "casts"  # hidden_size, num_hidden_layers, block_size, ...
    integral_float_mask_token: str = "casts"  # mask_token_id
    embed_tokens_copy: str = "dropped"  # a draft embed_tokens.weight: "dropped" | "used" | "replaced"
    # which quantization config it acts on when both exist: "config.json" (the inline quantization_config;
    # hf_quant_config.json only when config.json has none) or "hf_quant_config.json" (the file is authoritative,
    # the inline copy is read only when the file sets no global quant_algo, and a differing inline copy only warns)
    quant_config_read: str = "config.json"
    # lilicorr.slot_embedding / rank_embedding stored 4-D ([1, S, 1, h] / [1, 1, K, h], without the leading
    # singleton): False = refused (the 5-D parameter's loader checks the shape), True = loaded (its own layout)
    embeddings_4d: bool = False
    # what a sliding_attention layer of window w computes (None: not established)
    sliding_semantics: str | None = None
    # the rope_theta it uses when config.json has none (None: not established)
    rope_theta_default: str | None = None
    # what it does with lilicorr_enabled false on LiLiCorrDraftModel (None: not established)
    lilicorr_disabled: str | None = None
    # older revisions read the top-level block_size only (the newest prefers dflash_config's)
    block_size_top_level_in_older: bool = False
    # DFlash2: reads conv_kernel_size / conv_group_size with a plain index (a KeyError without them)
    dflash2_conv_indexed: bool = False
    # a tensor name it has no parameter for: "dropped" (unresolved names ignored) | "refused" | None (not established)
    unknown_tensors: str | None = None
    # a legacy and a named-MLP name for one head tensor: "overwrites" (the second wins) | "refuses"
    legacy_duplicate: str = "refuses"
    # lm_head tensors without has_own_lm_head: "dropped" (no parameter) | "owned" (any lm_head tensor makes the
    # head the draft's own) | "ignored" (the target's head is swapped in)
    undeclared_lm_head: str = "dropped"
    # Sibling heads: (family, architectures[0] or "*", "loads" | "refuses" | "unconfirmed", why). A family and
    # architecture with no row is not loaded as that head.
    sibling_routes: tuple[tuple[str, str, str, str], ...] = ()
    # DFlash2 selector keys: "pair" (rank and top_k both or neither, >= 0), "range" (rank >= 1, 2 <= top_k <= V)
    selector_check: str = ""
    markov_rank_top_level: bool = False  # DSpark: reads markov_rank from the top level and requires it > 0
    markov_head_types: tuple[str, ...] = ()  # DSpark markov_head_type values it builds; others refused
    markov_head_types_unconfirmed: tuple[str, ...] = ()
    domino_checks: bool = False  # shift_label bool, pure_draft_prefix_len 1, emb_dim agreement, block_size > 1
    domino_dims_required: bool = False  # gru_hidden_dim and emb_dim >= 1

    def sibling_route(self, family: str, architecture: str | None) -> tuple[str, str]:
        """(verdict, why) for a sibling head declared under `architecture`."""
        for fam, arch, verdict, why in self.sibling_routes:
            if fam == family and arch in ("*", architecture):
                return verdict, why
        return "refuses", f"{self.display} does not load a {family} head declared as {architecture}"

    def must_stay_float(self, module: str) -> bool:
        """The linear `module` (canonical name) must be stored in float for this runtime."""
        return matches_any(module, self.float_forced + self.float_required)

    def may_quantize(self, module: str) -> bool:
        """The runtime is known to load `module` quantized (when its config quantizes it)."""
        return not self.must_stay_float(module) and not matches_any(module, self.quant_unconfirmed)


def matches_any(module: str, patterns: tuple[str, ...]) -> bool:
    """`module` (a canonical name) matches one of these fnmatch patterns."""
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


SGLANG = RuntimeProfile(
    name="sglang",
    display="SGLang",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=16,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="renamed",
    owned_lm_head="dropped",  # dflash.py DFlashDraftModel has no lm_head parameter; load_weights drops it
    float_forced=QKV + HEAD_RAW_LINEARS + FEATURE_MLP,
    float_required=(),
    quant_unconfirmed=("layers.*.attention_conv.kernel_projection", "layers.*.mlp_conv.kernel_projection",
                       "lm_head"),
    exclusion_matcher="sglang",
    nested_quant_method_algos=None,
    output_multiplier_nested_positive=True,  # parse_dflash_draft_config reads dflash_config only
    # ModelOptFp4Config.from_config, flat form: exclusions from `ignore` only (default none); group_size from the
    # top level or the first config group's weights, else "NVFP4 quantization requires group_size"
    flat_exclusions_key="ignore",
    flat_group_size_required=True,
    causal="ignores",  # full layers run ENCODER_ONLY; dflash_config.causal is never read
    taps_checked_against_draft_layers=True,  # DFlashDraftModel.__init__ falls back to num_hidden_layers
    num_target_layers_positive=True,
    use_swa="ignored",  # read only for the Nemotron-3.5 layout
    swa_window_zero="ignored",
    integral_float_mask_token="refuses",  # parse_dflash_draft_config: "mask_token_id must be an integer"
    # weight_utils.get_quant_config: hf_config.quantization_config first, the config files only without it
    quant_config_read="config.json",
    sliding_semantics="causally, over the last w tokens",  # dflash.py: sliding layers DECODER, window_left w-1
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    lilicorr_disabled="parses the config as plain DFlash and then raises (\"requires the lilicorr_* geometry fields\")",
    unknown_tensors="dropped",  # DFlashDraftModel.load_weights: "Ignore unexpected weights"
    legacy_duplicate="overwrites",  # the renaming maps both to one parameter; the second loaded wins
    undeclared_lm_head="dropped",  # no lm_head parameter
    sibling_routes=(
        ("dflash2", "DFlash2DraftModel", "unconfirmed", "SGLang main dispatches on DFlash2DraftModel, but no tagged "
         "release is known to register it, and whether its loader refuses missing selector or conv tensors is "
         "UNCONFIRMED"),
        ("dflash2", "DFlashDraftModel", "unconfirmed", "SGLang switches the convolution and selector on from the "
         "dflash_config keys; Model-Optimizer warns a DFlash2 head declared as DFlashDraftModel loads as plain "
         "DFlash, which loader it means is UNCONFIRMED"),
        ("dspark", "Qwen3DSparkModel", "loads", "the entry class of SGLang's dspark model"),
        ("dspark", "DSparkDraftModel", "unconfirmed", "SGLang's DSpark entry class is Qwen3DSparkModel (SpecForge "
         "rewrites DSparkDraftModel to it before SGLang loads it); loading DSparkDraftModel directly is UNCONFIRMED"),
        ("dspark", "DFlashDraftModel", "refuses", "SGLang routes DFlashDraftModel as plain DFlash and drops the flat "
         "Model-Optimizer Markov names, leaving the Markov head at its initialisation"),
        ("domino", "DFlashDraftModel", "loads", "SGLang loads Domino as DFlashDraftModel with projector_type domino"),
        ("domino", "DominoDraftModel", "refuses", "SGLang loads Domino only as DFlashDraftModel with "
         "dflash_config.projector_type \"domino\""),
    ),
    selector_check="pair",  # parse_dflash_draft_config: "selector needs rank and top_k together"
    markov_rank_top_level=True,  # build_markov_head: "DSpark requires markov_rank > 0"
    markov_head_types=("vanilla", "gated", "rnn"),
    domino_checks=True,  # parse_dflash_draft_config and the Domino model tests
    domino_dims_required=True,
    mask_token_fallback="resolves the `<|MASK|>` token through the tokenizer",
    target_layer_ids_fallback="guesses them with build_target_layer_ids (wrong for 14 of 20 published "
    "checkpoints, sglang#37475)",
)

VLLM = RuntimeProfile(
    name="vllm",
    display="vLLM",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=None,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="refused",  # lilicorr.py named-MLP revision: no renaming, no Sequential parameters
    owned_lm_head="supported",
    float_forced=HEAD_RAW_LINEARS,
    # qkv_proj follows the quant config, but the fused-KV context path runs F.linear on raw slices of it.
    # feature_mlp follows the draft quant config in the newest revision; up_proj's
    # in_features 5 cannot be NVFP4, which LC305 reports.
    float_required=QKV,
    quant_unconfirmed=(),
    exclusion_matcher="vllm",
    nested_quant_method_algos=("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4"),
    mask_token_fallback="has no fallback",
    target_layer_ids_fallback="has no fallback",
    flat_exclusions_key="ignore",  # its flat-form parser reads `ignore` only
    flat_group_size_default=16,  # the flat form's top-level group_size, default 16
    reads_hf_quant_config=True,  # derives quant_method for the nested form
    nested_form_keys_required=True,
    causal="honours",  # qwen3_dflash.py _dflash_layer_causal: is_causal, then dflash_config.causal
    swa_window_size_read=True,  # qwen3_dflash.py _resolve_layer_attention reads swa_window_size first
    swa_window_zero="literal",
    integral_float_lilicorr="crashes",  # candidate_topk & (candidate_topk - 1), range(num_layers)
    integral_float_backbone="crashes",  # range(config.num_hidden_layers)
    embed_tokens_copy="used",  # includes_embed_tokens: the draft's own input table
    quant_config_read="config.json",  # get_quant_config: hf_config.quantization_config, else hf_quant_config.json
    # qwen3_dflash.py _resolve_layer_attention: sliding layers causal unless causal / is_causal says otherwise
    sliding_semantics="causally, over the last w tokens",
    rope_theta_default="1e6 (set_default_rope_theta)",
    lilicorr_disabled="refuses it (\"requires lilicorr_enabled=True\")",
    dflash2_conv_indexed=True,  # qwen3_dflash2 reads both conv keys with a plain index
    unknown_tensors="refused",  # AutoWeightsLoader raises on a name with no parameter
    legacy_duplicate="refuses",  # no parameter for the legacy name
    undeclared_lm_head="owned",  # includes_lm_head: any lm_head tensor
    sibling_routes=(
        ("dflash2", "DFlash2DraftModel", "unconfirmed", "vLLM's DFlash2DraftModel registry key is asserted only by "
         "registry-verification scripts (its registry file was not read)"),
        ("dspark", "Qwen3DSparkModel", "loads", "vLLM's registry maps Qwen3DSparkModel to qwen3_dspark"),
        ("dspark", "DSparkDraftModel", "refuses", "vLLM's registry routes DSparkDraftModel to its DeepSeek-V4 DSpark "
         "class, not the Qwen3 one"),
        ("dspark", "DFlashDraftModel", "refuses", "no vLLM loader reads the flat Model-Optimizer DSpark layout"),
        ("domino", "*", "unconfirmed", "vLLM's Domino model asserts projector_type domino; which registry key maps "
         "to it is UNCONFIRMED"),
    ),
    selector_check="range",  # qwen3_dflash2: selector_rank >= 1, 2 <= selector_top_k <= V
    markov_rank_top_level=True,  # qwen3_dspark reads config.markov_rank
    markov_head_types=("vanilla",),
    markov_head_types_unconfirmed=("gated", "rnn"),
    domino_dims_required=True,  # gru_hidden_dim / emb_dim from the merged config (KeyError when absent)
)

TRTLLM = RuntimeProfile(
    name="trtllm",
    display="TensorRT-LLM",
    topk_power_of_two_max=None,
    hidden_size_zero_ok=False,
    vector_eps_below_half=True,
    block_size_default=None,
    conv_keys_both_or_neither=False,
    conv_kernel_within_block=True,
    legacy_mlp_names="renamed",
    owned_lm_head="supported",
    # modeling_dflash.py _build_fused_kv_buffers slices the raw qkv_proj weight into its context-KV buffer
    float_forced=QKV,
    float_required=(),
    quant_unconfirmed=(),
    exclusion_matcher="trtllm",
    nested_quant_method_algos=None,
    mask_token_fallback="falls back to vocab_size, an id outside the embedding",
    target_layer_ids_fallback="takes fc's input width from the checkpoint",
    causal="refuses",  # "LiLiCorr requires non-causal draft attention"
    embedding_rows_equal_vocab=True,  # num_embeddings must equal V
    projector_type_routes=True,
    # its LiLiCorr test routes Qwen3ForCausalLM + projector_type / lilicorr_enabled to LiLiCorr (a Laguna backbone
    # is refused: "generic GQA DFlash backbone")
    projector_routed_architectures=("Qwen3ForCausalLM",),
    hidden_act="unconfirmed",  # GatedMLP activation from the HF backbone: not traced
    integral_float_lilicorr="crashes",  # LiLiCorrHead uses the raw values (torch.zeros, range)
    integral_float_backbone="unconfirmed",  # range(num_draft_layers) would crash; not traced
    embed_tokens_copy="replaced",  # load_weights_from_target_model swaps in the target's
    # _torch/model_config.py ModelConfig.from_pretrained: hf_quant_config.json first ("the file is authoritative"),
    # warn_if_inline_diverges only logs; config.json's copy is used when the file sets no global quant_algo
    quant_config_read="hf_quant_config.json",
    embeddings_4d=True,  # modeling_lilicorr.py: the parameters are 4-D; _normalize_lilicorr_weights squeezes 5-D
    # its LiLiCorr test: sliding layers non-causal with a symmetric window (w-1, w-1)
    sliding_semantics="non-causally, over w-1 tokens on each side (a symmetric window)",
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    block_size_top_level_in_older=True,  # modeling_dflash.py 009d8fa4 reads the top-level block_size only
    legacy_duplicate="refuses",  # _normalize_lilicorr_weights: "Duplicate LiLiCorr parameter"
    undeclared_lm_head="ignored",  # load_weights_from_target_model uses the target's head unless has_own_lm_head
    sibling_routes=(
        ("dflash2", "*", "unconfirmed", "TensorRT-LLM has a DFlash2 path on DFlashForCausalLM; its config keys and "
         "tensors were not read"),
        ("dspark", "*", "unconfirmed", "TensorRT-LLM's Qwen3 DSpark drafter follows the DeepSpec layout; its "
         "routing and checks were not read"),
        ("domino", "*", "unconfirmed", "TensorRT-LLM's Domino support was not read"),
    ),
)

PROFILES = {p.name: p for p in (SGLANG, VLLM, TRTLLM)}
RUNTIME_CHOICES = (*PROFILES, "all")


def select_profiles(choice: str) -> list[RuntimeProfile]:
    return list(PROFILES.values()) if choice == "all" else [PROFILES[choice]]
