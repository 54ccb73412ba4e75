"""The runtime's operators, each a torch reference (`*_reference`, what CPU runs and the oracle of its kernel)
beside a dispatcher that runs its Triton kernel on CUDA:

- draft.py: the draft step's ops (norms, `topk_lse`, the LiLiCorr head's kernels, the walks); draft_triton.py
  holds their kernels.
- step.py: the fast target's step (linear layers with their norm and epilogue, RoPE with the K/V write, attention
  over the visible cache rows); step_triton.py holds their kernels.
- rope.py: the one rotary embedding, for the drafter and the target.
- dispatch.py: how a dispatcher picks its implementation, and the shape error every one raises.

The verification ops (greedy and rejection sampling) are the decoder's: lilicorr_runtime/decode/verify.py.
"""

from .dispatch import kernel_backend
from .draft import (
    MIN_TEMPERATURE,
    candidate_features_reference,
    control_walk,
    feature_hidden,
    feature_hidden_reference,
    greedy_walk,
    greedy_walk_reference,
    lattice_attention,
    lattice_attention_reference,
    lattice_scores,
    lattice_scores_reference,
    residual_norm,
    residual_norm_reference,
    rms_norm,
    rms_norm_reference,
    sample_walk,
    sample_walk_reference,
    topk_lse,
    topk_lse_reference,
)
from .rope import apply_rope, rope_tables
from .step import (
    decoder_layer,
    rope_attention,
    rope_attention_reference,
    rope_kv,
    rope_kv_reference,
    step_attention,
    step_attention_reference,
    step_linear,
    step_linear_reference,
)

__all__ = [
    "MIN_TEMPERATURE",
    "apply_rope",
    "candidate_features_reference",
    "control_walk",
    "decoder_layer",
    "feature_hidden",
    "feature_hidden_reference",
    "greedy_walk",
    "greedy_walk_reference",
    "kernel_backend",
    "lattice_attention",
    "lattice_attention_reference",
    "lattice_scores",
    "lattice_scores_reference",
    "residual_norm",
    "residual_norm_reference",
    "rms_norm",
    "rms_norm_reference",
    "rope_attention",
    "rope_attention_reference",
    "rope_kv",
    "rope_kv_reference",
    "rope_tables",
    "sample_walk",
    "sample_walk_reference",
    "step_attention",
    "step_attention_reference",
    "step_linear",
    "step_linear_reference",
    "topk_lse",
    "topk_lse_reference",
]
