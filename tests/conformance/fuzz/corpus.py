"""Every disagreement the fuzzer found, as the case that reproduces it: the conformance suite runs each against every
supported release and asserts validate agrees with the executed loader (run.py prints new ones in this form).

PENDING: (case, release) -> why validate and that release still disagree (a known gap, not yet fixed); the suite
skips those pairs in the corpus and the fixed-seed budget, and fails on any other disagreement."""

from __future__ import annotations

from .cases import Case
from .corpus_siblings import SIBLING_PENDING, SIBLING_ROWS
from .corpus_values import VALUE_PENDING, VALUE_ROWS

CORPUS: tuple[Case, ...] = (
    # another head kind's key, wrongly typed: not read (vLLM: lilicorr.py reads lilicorr_* for LiLiCorr only)
    Case("dflash2", "dflash", "lilicorr_factor_dim", "object"),
    # read as a truth value (vLLM qwen3_dflash.py _dflash_layer_causal): LC004 for vLLM, LC001 for SGLang
    Case("lilicorr", "dflash", "causal", "negative"),
    Case("dflash2", "dflash", "sample_from_anchor", "empty_string"),
    # vLLM qwen3_dflash.py: `make_attention_sink(...) if add_swa_attention_sink_bias`: "" builds none
    Case("dflash", "dflash", "attention_sink_bias", "empty_string"),
    # the norms' eps, stored and used only when the draft runs: loads, serves NaN (harness served.py; LC181)
    Case("lilicorr-conv", "top", "rms_norm_eps", "negative"),
    Case("dflash", "top", "rms_norm_eps", "nan"),
    # transformers' strict Qwen3Config (LC005)
    Case("lilicorr-nvfp4", "top", "attention_bias", "null"),
    Case("lilicorr", "top", "rms_norm_eps", "zero"),
    Case("lilicorr", "top", "torch_dtype", "int_string"),
    Case("lilicorr-conv", "top", "mtp_layer_types", "true"),
    # AutoConfig's model_type (LC006)
    Case("dspark", "top", "model_type", "absent"),
    Case("dflash2", "top", "model_type", "int_string"),
    # get_text_config returns a top-level text_config (LC007)
    Case("dflash2", "top", "text_config", "nan"),
    # vLLM qwen3_dflash.py DFlashQwen3Model.__init__: eagle_config.update (LC008)
    Case("lilicorr", "top", "eagle_config", "zero"),
    # allocation at boot (LC009)
    Case("dflash", "dflash", "block_size", "huge"),
    Case("dflash", "top", "vocab_size", "huge"),
    # the harness: linear.py weight_loader leaves a missing shard's slice at init, narrows an oversize tensor
    Case("dflash2", "tensor", "layers.0.self_attn.v_proj.weight", "drop"),
    Case("lilicorr", "tensor", "layers.0.mlp.up_proj.weight", "rename"),
    Case("lilicorr", "tensor", "layers.1.self_attn.k_proj.weight", "reshape"),
    Case("lilicorr-nvfp4", "tensor", "layers.1.mlp.down_proj.weight_scale_2", "retype"),
    # vLLM config/speculative.py: dspark_draft_topk between 1 and the vocabulary
    Case("dspark", "top", "dspark_draft_topk", "negative"),
    # SGLang dflash_utils.py parse_dflash_draft_config: mask_token a non-empty string, attention_value_scale a
    # number, float(output_multiplier)
    Case("lilicorr-conv", "top", "mask_token", "zero"),
    Case("lilicorr-conv", "dflash", "attention_value_scale", "list"),
    Case("dflash2", "dflash", "output_multiplier", "null"),
    # vLLM qwen3_dflash.py _resolve_layer_attention: `is_sliding = use_swa`, any truthy value (LC119 without a window)
    Case("dflash", "dflash", "use_swa", "list"),
    Case("dflash", "dflash", "use_swa", "int_string"),
    # vLLM DFlashQwen3Model.__init__: a present falsy use_aux_hidden_state builds no fc (LC175)
    Case("dflash", "dflash", "use_aux_hidden_state", "null"),
    Case("dflash", "top", "use_aux_hidden_state", "empty_string"),
    Case("dflash", "top", "use_aux_hidden_state", "zero"),
    # vLLM DFlashQwen3DecoderLayer: a truthy top-level add_swa_attention_sink_bias builds sinks (LC180)
    Case("dflash", "top", "add_swa_attention_sink_bias", "int_string"),
    Case("lilicorr", "top", "add_swa_attention_sink_bias", "list"),
    Case("dflash", "dflash", "attention_sink_bias", "true"),
    Case("dflash", "top", "add_swa_attention_sink_bias", "zero"),
    # dflash_config.block_size: SGLang int()-casts it (parse_dflash_draft_config), vLLM reads it for LiLiCorr only
    Case("dflash", "dflash", "block_size", "int_string"),
    Case("dflash2", "dflash", "block_size", "int_string"),
    Case("lilicorr", "dflash", "block_size", "int_string"),
    Case("dspark", "dflash", "block_size", "null"),  # SGLang: null is absent
    Case("lilicorr", "dflash", "block_size", "true"),  # SGLang: int(true) == 1 sizes the LiLiCorr head
    Case(
        "lilicorr-conv", "dflash", "block_size", "null"
    ),  # LiLiCorr: null is no size (not the top-level one)
    Case("dflash2", "dflash", "block_size", "whole_float"),  # vLLM: not read for DFlash2, so no LC139
    # dspark_bonus_anchor: read only by vLLM's Qwen3-Omni DSpark check, by no SGLang module
    Case("dspark", "top", "dspark_bonus_anchor", "int_string"),
    # head_dim absent: Qwen3Config's default (128), not hidden_size / num_attention_heads (LC208)
    Case("dflash", "top", "head_dim", "absent"),
    Case("dflash2", "top", "head_dim", "absent"),
    # SGLang parse_dflash_draft_config checks the selector pair for every head kind (LC150)
    Case("dflash", "dflash", "selector_rank", "negative"),
    Case("dspark", "dflash", "selector_top_k", "negative"),
    Case("dflash", "dflash", "selector_top_k", "huge"),
    # a non-string torch_dtype: SGLang passes it to torch.set_default_dtype (LC001); transformers'
    # dict_dtype_to_str fails on one with no dot in its text (LC005)
    Case("lilicorr", "top", "torch_dtype", "zero"),
    Case("lilicorr", "top", "torch_dtype", "list"),
    # vLLM reads sample_from_anchor (the DFlash speculator) and lilicorr_enabled (lilicorr.py) as truth values
    Case("lilicorr", "dflash", "sample_from_anchor", "whole_float"),
    Case("lilicorr-nvfp4", "dflash", "lilicorr_enabled", "zero"),
    Case("lilicorr", "dflash", "lilicorr_enabled", "null"),
    # vLLM does not read dflash_config.block_size for plain DFlash or DSpark (no LC112 there); SGLang does
    Case("dflash", "dflash", "block_size", "negative"),
    Case("dspark", "dflash", "block_size", "negative"),
    # SGLang parse_dflash_draft_config: attention_sink_bias must be a bool, null included
    Case("domino", "dflash", "attention_sink_bias", "null"),
    # SGLang's loaders narrow an oversize tensor to its parameter (now seen by its harness; LC208)
    Case("lilicorr-conv", "tensor", "layers.0.mlp.up_proj.weight", "reshape"),
    Case("dflash", "tensor", "layers.1.self_attn.q_proj.weight", "reshape"),
    # numbers that size nothing, read off the built modules (conformance/served.py): lilicorr_vector_eps <= 0
    # (vLLM loads it: F.normalize with no floor, SW; SGLang refuses it) or NaN (both load it, SW); a NaN logit
    # scale (SW); a null one fails vLLM's first draft step (C)
    Case("lilicorr", "dflash", "lilicorr_vector_eps", "negative"),
    Case("lilicorr", "dflash", "lilicorr_logit_scale", "null"),
    Case("lilicorr", "dflash", "lilicorr_vector_eps", "nan"),
    Case("lilicorr", "dflash", "lilicorr_logit_scale", "nan"),
    # a build of 2**40 LiLiCorr layers: the boot's out-of-memory failure (LC103)
    Case("lilicorr-conv", "dflash", "lilicorr_num_layers", "huge"),
    # SGLang's looser reads: `projector_type == "domino"`, `bool(lilicorr_enabled)`, _parse_optional_int for
    # Domino's emb_dim; dflash_config.causal never read (a truthy value: LC133, as true)
    Case("dflash2", "dflash", "projector_type", "list"),
    Case("lilicorr-nvfp4", "dflash", "lilicorr_enabled", "list"),
    Case("domino", "dflash", "emb_dim", "int_string"),
    Case("dflash", "dflash", "causal", "zero"),
    Case("dflash", "dflash", "causal", "int_string"),
    # config values each release reads (corpus_values.py) and the sibling heads' keys and tensors, quantized
    # tensors included (corpus_siblings.py)
    *VALUE_ROWS,
    *SIBLING_ROWS,
)

PENDING: dict[tuple[Case, str], str] = {
    **VALUE_PENDING,
    **SIBLING_PENDING,
}
