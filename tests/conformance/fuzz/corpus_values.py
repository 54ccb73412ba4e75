"""Corpus rows for config values as each release reads them (the backbone, types, schema, geometry, taps
and block checks): the fuzzer's cases that once disagreed, each fixed at its root. corpus.py joins them."""

from __future__ import annotations

from .cases import Case

VALUE_ROWS: tuple[Case, ...] = (
    # a top-level text config: transformers' get_text_config passes over a null one (vLLM loads it), SGLang's
    # get_hf_text_config asserts on `text_config` whatever it holds; any other value has no num_attention_heads
    # (vLLM config/model.py ModelConfig.__post_init__ -> get_hf_text_config refuses it) (LC007)
    Case("dflash", "top", "text_config", "null"),
    Case("lilicorr-nvfp4", "top", "text_config", "null"),
    Case("dflash", "top", "decoder", "null"),
    Case("dspark", "top", "text_config", "huge"),
    Case("dflash", "top", "decoder", "zero"),
    # head_dim below 1: a negative q/k/v size; 0 is vLLM's `head_dim or hidden_size // num_heads`, SGLang's
    # zero-width rotary (LC118)
    Case("lilicorr-conv", "top", "head_dim", "negative"),
    Case("dflash", "top", "head_dim", "zero"),
    # target_hidden_size: vLLM _get_dflash_fc_input_size `target_hidden_size or hidden_size`, used uncast (a whole
    # float or a negative one fails the fc build: LC139, LC118; a falsy one is the draft's width); SGLang never reads it
    Case("dflash2", "top", "target_hidden_size", "whole_float"),
    Case("dflash2", "top", "target_hidden_size", "negative"),
    Case("dflash", "top", "target_hidden_size", "empty_string"),
    Case("dflash", "top", "target_hidden_size", "true"),
    # vLLM lilicorr.py LiLiCorrMLP: int(hidden_size * mlp_ratio): true is ratio 1, a string is repeated
    Case("lilicorr-nvfp4", "dflash", "lilicorr_mlp_ratio", "true"),
    Case("lilicorr", "dflash", "lilicorr_mlp_ratio", "int_string"),
    # vLLM: is_neox_style keys get_rope's cache and is compared between layers (_build_fused_kv_buffers)
    Case("lilicorr-nvfp4", "top", "is_neox_style", "nan"),
    Case("dflash", "top", "is_neox_style", "list"),
    Case("dflash", "top", "is_neox_style", "zero"),
    # vLLM: num_speculative_tokens (block_size - 1) above a top-level n_predict must be a multiple of it, for every
    # head but DSpark (LC182)
    Case("lilicorr-conv", "top", "n_predict", "zero"),
    Case("lilicorr-nvfp4", "top", "n_predict", "object"),
    Case("dflash", "top", "n_predict", "whole_float"),
    Case("dflash", "top", "n_predict", "true"),
    Case("dspark", "top", "n_predict", "zero"),
    # read as absent when falsy: transformers' `rope_parameters = rope_scaling or ...` (both engines), vLLM's
    # eagle3_utils.py `if not layer_ids:`; vLLM's has_own_lm_head a flag (SGLang never reads it)
    Case("lilicorr", "top", "rope_scaling", "empty_string"),
    Case("lilicorr-conv", "top", "rope_scaling", "zero"),
    Case("lilicorr-conv", "top", "rope_scaling", "true"),
    Case("lilicorr-nvfp4", "top", "eagle_aux_hidden_state_layer_ids", "empty_string"),
    Case("dflash", "top", "eagle_aux_hidden_state_layer_ids", "int_string"),
    Case("dflash", "top", "has_own_lm_head", "empty_string"),
    Case("lilicorr-conv", "top", "has_own_lm_head", "zero"),
    Case("lilicorr", "top", "has_own_lm_head", "int_string"),
    # vLLM get_parallel_drafting_token_id: int(dflash_config["mask_token_id"]); SGLang requires an integer
    Case("lilicorr", "dflash", "mask_token_id", "int_string"),
    Case("dspark", "dflash", "mask_token_id", "true"),
    # int() casts: vLLM qwen3_dflash2.py (DFlash2's convolution and selector sizes), SGLang _parse_optional_int
    Case("dflash2", "dflash", "conv_kernel_size", "whole_float"),
    Case("dflash2", "dflash", "conv_group_size", "whole_float"),
    Case("dflash2", "dflash", "selector_top_k", "int_string"),
    Case("dflash2", "dflash", "selector_top_k", "true"),
    Case("lilicorr-conv", "dflash", "conv_group_size", "int_string"),
    Case("dflash2", "dflash", "conv_kernel_size", "int_string"),
    # SGLang's pair checks run on the cast values (parse_dflash_draft_config): a cast size set alone is refused
    Case("dflash", "dflash", "selector_rank", "true"),
    Case("lilicorr", "dflash", "conv_kernel_size", "int_string"),
    Case("domino", "dflash", "conv_group_size", "int_string"),
    # config.json's draft_id_to_target_id: no vLLM module reads the key (qwen3_dflash.py
    # DFlashQwen3ForCausalLM.__init__ builds the map only from draft_vocab_size against the target's vocabulary,
    # lilicorr.py LiLiCorrForCausalLM.__init__ refuses that one): LC149, not LC120
    Case("lilicorr-nvfp4", "top", "draft_id_to_target_id", "negative"),
    Case("lilicorr-nvfp4", "top", "draft_id_to_target_id", "list"),
    Case("lilicorr-conv", "top", "draft_id_to_target_id", "whole_float"),
    Case("lilicorr-conv", "top", "draft_id_to_target_id", "nan"),
    # sizes no release reads (LC009 only where read): dflash_config's sizes but block_size (SGLang dflash_utils.py
    # parse_dflash_draft_config, vLLM lilicorr.py LiLiCorr.__init__ read no other), a top-level block_size
    # dflash_config's overrides (`dflash_cfg.get("block_size", top-level)` in both)
    Case("lilicorr-nvfp4", "dflash", "vocab_size", "huge"),
    Case("lilicorr-nvfp4", "top", "block_size", "huge"),
    Case("dspark", "dflash", "target_hidden_size", "huge"),
    Case("dspark", "dflash", "draft_vocab_size", "huge"),
    Case("dflash", "dflash", "draft_vocab_size", "huge"),
    Case("lilicorr-conv", "dflash", "intermediate_size", "huge"),
    Case("dflash", "dflash", "intermediate_size", "huge"),
    # read and allocated at boot (vLLM: LiLiCorr's lm_head, DFlash's block buffers in the speculator; SGLang: the
    # worker's block positions, the draft decode graph's logits buffer): out of memory, refused (LC009)
    Case("lilicorr-nvfp4", "top", "vocab_size", "huge"),
    Case("domino", "dflash", "block_size", "huge"),
    Case("dspark", "dflash", "block_size", "huge"),
    Case("dflash2", "dflash", "block_size", "huge"),
    # convolution keys on a head without convolutions: vLLM reads them only for LiLiCorr (lilicorr.py
    # LiLiCorr.__init__) and DFlash2 (qwen3_dflash2.py DFlash2Qwen3DecoderLayer); SGLang's
    # parse_dflash_draft_config checks them for every head (LC116 for SGLang only)
    Case("dspark", "dflash", "conv_kernel_size", "negative"),
    Case("dspark", "dflash", "conv_group_size", "whole_float"),
    Case("dflash", "dflash", "conv_kernel_size", "whole_float"),
    Case("dflash", "dflash", "conv_group_size", "negative"),
    # whole-number floats in keys a release never reads: a top-level mask_token_id or num_target_layers
    # dflash_config's value overrides (SGLang dflash_utils.py parse_dflash_draft_config:
    # `dflash_cfg.get(key, top-level)`); num_target_layers, which no vLLM DFlash-family module reads (LC139)
    Case("lilicorr-nvfp4", "top", "num_target_layers", "whole_float"),
    Case("lilicorr", "top", "mask_token_id", "whole_float"),
    Case("lilicorr-conv", "top", "mask_token_id", "whole_float"),
    Case("dspark", "top", "mask_token_id", "whole_float"),
    # a size cast with int() is judged at the cast value for the releases that cast it (checks/casts.py): SGLang
    # dflash_utils.py parse_dflash_draft_config _parse_optional_int (num_target_layers, dflash_config's else the
    # top-level one; the convolution and selector sizes), vLLM qwen3_dflash2.py (DFlash2's sizes)
    Case("dflash2", "top", "num_target_layers", "int_string"),
    Case("dspark", "top", "num_target_layers", "int_string"),
    Case("domino", "top", "num_target_layers", "int_string"),
    # vLLM qwen3_dflash2.py DFlash2Qwen3Model.__init__: float(dflash_config input_embedding_scale) (SGLang never
    # reads it); qwen3_dflash.py DFlashQwen3ForCausalLM.__init__: torch.zeros(draft_vocab_size) (LC001, LC118)
    Case("dflash2", "dflash", "input_embedding_scale", "object"),
    Case("dflash2", "dflash", "input_embedding_scale", "empty_string"),
    Case("dflash2", "dflash", "input_embedding_scale", "null"),
    Case("dflash2", "top", "draft_vocab_size", "negative"),
    # intermediate_size absent: Qwen3Config's default 22016; SGLang layers/linear.py weight loaders zero-pad the
    # narrower trained MLP tensors (pad_or_narrow_weight: the trained function, LC183), vLLM's narrow fails (LC118)
    Case("dflash2", "top", "intermediate_size", "absent"),
    Case("domino", "top", "intermediate_size", "absent"),
    Case("lilicorr-nvfp4", "top", "intermediate_size", "absent"),
    # SGLang parse_dflash_draft_config: `output_multiplier <= 0` lets NaN through, and only DFlash2DraftModel
    # (_transform_unary_logits) applies it; vLLM qwen3_dflash2.py: the LogitsProcessor scale and
    # input_embedding_scale (LC184 on DFlash2; any other head loads and serves the trained function)
    Case("lilicorr-conv", "dflash", "output_multiplier", "nan"),
    Case("dflash", "dflash", "output_multiplier", "nan"),
    Case("dflash2", "dflash", "output_multiplier", "nan"),
    Case("dflash2", "dflash", "input_embedding_scale", "nan"),
    # transformers configuration_utils.py remap_legacy_layer_types: `if mtp_layer_types is not None` (null loads)
    Case("dspark", "top", "mtp_layer_types", "null"),
    # SGLang lilicorr_utils.py _parse_lilicorr_config: float("0") is 0.0, then "must be positive" (LC103, cast)
    Case("lilicorr-conv", "dflash", "lilicorr_vector_eps", "int_string"),
    # vLLM qwen3_dflash.py / qwen3_dspark.py: LogitsProcessor(scale=getattr(config, "logit_scale", 1.0)) (LC184)
    Case("dspark", "top", "logit_scale", "nan"),
    Case("lilicorr", "top", "logit_scale", "nan"),
    # vLLM qwen3_dflash2.py: a rank-0 CandidateSelector cannot take the trained selector (linear.py weight_loader)
    Case("dflash2", "dflash", "selector_rank", "zero"),
    # an explicit is_causal (DFlash2's false) is read before dflash_config.causal: SGLang models/dflash.py
    # _get_dflash_attention_type, vLLM qwen3_dflash.py _dflash_layer_causal (no LC133 / LC134 for them)
    Case("dflash2", "dflash", "causal", "whole_float"),
    Case("dflash2", "dflash", "causal", "true"),
    # (LC185, a warning, says so); the other contradiction, is_causal true beside dflash_config.causal false: both
    # run causal layers as is_causal states (LC134)
    Case("dflash2", "top", "is_causal", "true"),
    # vLLM qwen3_dflash2.py: output_multiplier is the candidates' logits scale, which logits_processor.py
    # get_top_k_tokens refuses <= 0 at the first draft step (the harness runs compute_candidates): LC123 on DFlash2
    # for vLLM too; a plain DFlash head never applies it (SGLang's parser refuses it for every head)
    Case("dflash2", "dflash", "output_multiplier", "negative"),
    Case("dflash2", "dflash", "output_multiplier", "zero"),
    Case("dflash", "dflash", "output_multiplier", "negative"),
    # a quantization_config object with no quant_method: vLLM model_arch_config_convertor.py
    # _normalize_quantization_config `quant_cfg.get("quant_method", "")`, config/model.py _verify_quantization
    # (an empty method is no quantization: loads unquantized); SGLang "Unknown quantization method" (LC316)
    Case("dflash", "top", "quantization_config", "object"),
    Case("lilicorr-nvfp4", "top", "quantization_config", "object"),
    # vLLM qwen3_dflash.py DFlashQwen3ForCausalLM: a draft vocabulary (draft_vocab_size, else vocab_size: 0, or
    # Qwen3Config's 151936 when absent) other than the target's builds draft_id_to_target_id, through which
    # compute_logits scatters the (shared target) lm_head's logits at the first draft step: a shape mismatch, or
    # with 0 rows no finite logit, so every drafted token is token 0 (the vLLM harness runs that step: LC115,
    # LC122, LC118); DSpark sizes its head and id map by it alike
    Case("dflash", "top", "vocab_size", "zero"),
    Case("dflash", "top", "vocab_size", "absent"),
    Case("dflash", "top", "draft_vocab_size", "zero"),
    Case("dflash2", "top", "draft_vocab_size", "zero"),
    Case("dspark", "top", "draft_vocab_size", "zero"),
    # vLLM lilicorr.py LiLiCorr.__init__ compares dflash_config's conv_kernel_size / conv_group_size `< 0` as
    # they are (`.get(key, 0)`): a null one is a TypeError at build (the schema's null is absent elsewhere)
    Case("lilicorr", "dflash", "conv_kernel_size", "null"),
    Case("lilicorr-nvfp4", "dflash", "conv_kernel_size", "null"),
    Case("lilicorr", "dflash", "conv_group_size", "null"),
    # ... then as truth values (`bool(taps) != bool(groups)`): NaN is neither negative nor 0, so beside the other
    # key's 0 it is refused at build in every vLLM release ("must enable both taps and group size", LC116); where
    # both enable a convolution, qwen3_dflash2.py DFlash2Qwen3DecoderLayer int()s them: 16.0 is 16 (LC141, not
    # LC139); SGLang's _parse_optional_int refuses NaN (LC001) and casts 16.0
    Case("lilicorr", "dflash", "conv_kernel_size", "nan"),
    Case("lilicorr-nvfp4", "dflash", "conv_group_size", "nan"),
    Case("lilicorr-conv", "dflash", "conv_kernel_size", "whole_float"),
    Case("lilicorr-conv", "dflash", "conv_group_size", "whole_float"),
    # ... where both are set, a fraction passes both tests and int() truncates it (2.5 is 2, 16.5 is 16): the
    # trained convolution, which loads (the tensor checks judge the truncated size); false is 0 there (no
    # convolution: a head without one loads, one beside a set partner is refused). SGLang's _parse_optional_int
    # int()s both alike
    Case("lilicorr-conv", "dflash", "conv_kernel_size", "fraction"),
    Case("lilicorr-conv", "dflash", "conv_group_size", "fraction"),
    Case("lilicorr", "dflash", "conv_kernel_size", "false"),
    Case("lilicorr-nvfp4", "dflash", "conv_group_size", "false"),
    Case("lilicorr-conv", "dflash", "conv_kernel_size", "false"),
    # the fuzzer's fraction and false: SGLang int()s a LiLiCorr size, block_size and DSpark's top-level
    # markov_rank (_parse_lilicorr_config, build_markov_head): 8.5 is the trained 8 and loads (LC004); it
    # float()s output_multiplier (parse_dflash_draft_config), so false is 0.0, "must be positive" (LC123)
    Case("dspark", "top", "markov_rank", "fraction"),
    Case("lilicorr-nvfp4", "dflash", "block_size", "fraction"),
    Case("lilicorr-conv", "dflash", "output_multiplier", "false"),
)

# (case, release) -> why validate and that release still disagree (corpus.PENDING)
VALUE_PENDING: dict[tuple[Case, str], str] = {}
