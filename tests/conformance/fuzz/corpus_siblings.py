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
