"""Corpus rows for the sibling heads (DFlash2, DSpark, Domino) and quantized tensors: the fuzzer's cases that once
disagreed, each fixed at its root. corpus.py joins them."""

from __future__ import annotations

from .cases import Case

SIBLING_ROWS: tuple[Case, ...] = (
    # DSpark's confidence head (RuntimeProfile dspark_confidence_head): SGLang builds none unless ragged
    # verification is on (models/dspark.py build_confidence_head) and skips its tensors; vLLM builds it for a truthy
    # enable_confidence_head, as wide as hidden_size (+ markov_rank for a truthy confidence_head_with_markov), and
    # reads it only under adaptive verification. A defect only the opt-in meets is LC229 (a warning)
    Case("dspark", "tensor", "confidence_head.proj.bias", "reshape"),
    Case("dspark", "tensor", "confidence_head.proj.bias", "drop"),
    Case("dspark", "tensor", "confidence_head.proj.weight", "extra"),
    Case("dspark", "tensor", "confidence_head.proj.weight", "rename"),
    Case("dspark", "tensor", "confidence_head.proj.weight", "reshape"),
    Case("dspark", "tensor", "confidence_head.proj.weight", "quantize"),
    Case("dspark", "top", "confidence_head_with_markov", "absent"),
    Case("dspark", "top", "confidence_head_with_markov", "null"),
    Case("dspark", "top", "confidence_head_with_markov", "int_string"),
    Case("dspark", "top", "confidence_head_with_markov", "zero"),
    Case("dspark", "top", "confidence_head_with_markov", "nan"),
    Case("dspark", "top", "enable_confidence_head", "absent"),
    Case("dspark", "top", "enable_confidence_head", "zero"),
    Case("dspark", "top", "enable_confidence_head", "list"),
    Case("dspark", "top", "enable_confidence_head", "empty_string"),
    Case("dspark", "top", "enable_confidence_head", "negative"),
    # SGLang speculative/dspark_components/dspark_config.py parse_dspark_draft_config (then models/dspark.py
    # build_markov_head), as each release reads the config (RuntimeProfile dspark_reads; siblings.py
    # _dspark_parsed): the prefixed dspark_* keys first (int(), markov_head_type through str().lower()), then
    # dspark_config (0.5.23: dflash_config merged under it), then the top level
    Case("dspark", "top", "dspark_noise_token_id", "true"),  # int(true): mask token 1 in every slot (LC163)
    Case("dspark", "top", "dspark_noise_token_id", "object"),  # int() of a dict (LC001)
    Case("dspark", "top", "dspark_noise_token_id", "negative"),  # "must be non-negative" (LC163)
    Case("dspark", "top", "mask_token_id", "null"),  # 0.5.21/0.5.22: no mask token (LC163); 0.5.23 unread
    Case("dspark", "top", "mask_token_id", "int_string"),  # 0.5.21/0.5.22 embed token 2 (LC163)
    Case("dspark", "top", "dspark_markov_head_type", "true"),  # 'true' is no type (LC153)
    Case("dspark", "top", "dspark_markov_head_type", "int_string"),
    Case("dspark", "top", "dspark_markov_rank", "object"),  # int() of a dict (LC001)
    Case("dspark", "top", "dspark_markov_rank", "zero"),  # "requires markov_rank > 0" (LC152)
    Case("dspark", "top", "dspark_block_size", "nan"),  # int(nan) (LC001)
    Case("dspark", "top", "dspark_block_size", "object"),
    Case("dspark", "top", "dspark_target_layer_ids", "int_string"),  # "a non-empty list of ints" (LC001)
    Case("dspark", "top", "markov_rank", "int_string"),  # int("8") loads (LC004 only)
    Case("dspark", "top", "markov_rank", "true"),  # int(true) == 1 builds a rank-1 head (LC001)
    # vLLM qwen3_dspark.py Qwen3DSparkModel.__init__ sizes the Markov head by config.markov_rank uncast:
    # nn.Embedding(vocab, 8.0) is a TypeError at build (LC139 for vLLM; SGLang's build_markov_head int()s it)
    Case("dspark", "top", "markov_rank", "whole_float"),
    Case(
        "dspark", "dflash", "markov_rank", "zero"
    ),  # 0.5.23 reads it first (LC152); 0.5.21/0.5.22, vLLM: unread
    Case("dspark", "dflash", "markov_rank", "int_string"),  # 0.5.23: int() loads
    Case("dspark", "dflash", "markov_rank", "nan"),
    Case("dspark", "dflash", "markov_head_type", "true"),  # 0.5.23: str() gives 'true' (LC153); others unread
    Case("dspark", "dflash", "markov_head_type", "null"),  # 0.5.23: null is no type (LC162)
    # an empty markov_head_type: SGLang refuses '' (str().lower()); vLLM never reads it and serves vanilla, not what
    # the config declares (LC153)
    Case("dspark", "top", "markov_head_type", "empty_string"),
    # vLLM config/speculative.py checks `1 <= dspark_draft_topk <= draft vocabulary`; true and 2.0 pass it and
    # fail the first draft step's topk() (spec_decode/dspark/speculator.py _sample_sequential_topk: the vLLM
    # harness now runs that read): LC001
    Case("dspark", "top", "dspark_draft_topk", "true"),
    Case("dspark", "top", "dspark_draft_topk", "whole_float"),
    Case("dspark", "top", "dspark_draft_topk", "huge"),
    # SGLang speculative/dflash_utils.py parse_dflash_draft_config: Domino's gru_hidden_dim and
    # pure_draft_prefix_len through _parse_optional_int, dflash_config's value else the top-level one; emb_dim from
    # both through int(), compared (LC156-LC158 judge the cast values)
    Case("domino", "top", "emb_dim", "true"),  # int(true) == 1 != 8: "emb_dim differs" (LC158)
    Case("domino", "top", "gru_hidden_dim", "empty_string"),  # not read beside dflash_config's
    Case("domino", "dflash", "gru_hidden_dim", "int_string"),
    Case("domino", "dflash", "pure_draft_prefix_len", "int_string"),
    Case("domino", "dflash", "pure_draft_prefix_len", "true"),  # int(true) == 1
    Case(
        "domino", "dflash", "block_size", "true"
    ),  # int(true) == 1: "Domino requires block_size > 1" (LC159)
    # an NVFP4 weight_scale stored in a float dtype: both engines cast it into the F8_E4M3 parameter (RuntimeProfile
    # scale_dtype_cast), exact for values E4M3 holds (LC329), rounded otherwise (LC304; the harnesses now compare
    # the cast). A fused shard's missing input_scale: vLLM's modelopt.py register_params leaves its slot torch.empty
    # memory, folded in by KNvfp4Dynamic.process's max() (the harness poisons the slot: SW; LC304)
    Case("lilicorr-nvfp4", "tensor", "fc.weight_scale", "retype"),
    Case("lilicorr-nvfp4", "tensor", "lilicorr.layers.0.mlp.up_proj.weight_scale", "retype"),
    Case("lilicorr-nvfp4", "tensor", "layers.0.mlp.gate_proj.input_scale", "drop"),
    Case("lilicorr-nvfp4", "tensor", "layers.0.mlp.up_proj.input_scale", "rename"),
)

# (case, release) -> why validate and that release still disagree (corpus.PENDING)
SIBLING_PENDING: dict[tuple[Case, str], str] = {}
