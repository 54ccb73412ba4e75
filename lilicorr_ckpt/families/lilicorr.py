"""LiLiCorr: the DFlash backbone with a candidate-correlation head over the backbone's top-K candidates per slot.

The head is carried by LiLiCorrDraftModel, or by DFlashDraftModel when dflash_config routes it (projector_type
"lilicorr" or lilicorr_enabled, which TensorRT-LLM honours); `Geometry.lilicorr_enabled` decides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lilicorr_ckpt.families.base import HeadBuilder, HeadGeometry, QuantLinears, Routes

NAME = "lilicorr"
TITLE = "LiLiCorr"
ARCHITECTURES = ("LiLiCorrDraftModel",)
PROJECTOR_TYPE: str | None = "lilicorr"
CONFIG_KEYS = (
    "lilicorr_candidate_topk",
    "lilicorr_hidden_size",
    "lilicorr_num_layers",
    "lilicorr_num_heads",
    "lilicorr_mlp_ratio",
    "lilicorr_factor_dim",
    "lilicorr_vector_eps",
    "lilicorr_logit_scale",
)
HEAD_PREFIXES = ("lilicorr.",)
HEAD_NAMES: tuple[str, ...] = ()
HUB_TAGS = ("lilicorr",)
ROUTES: Routes = {}  # routed by the runtime profiles' LiLiCorr fields (it is the head every profile models)
QUANT_LINEARS: QuantLinears = {}  # its head's linears are manifest modules (LC306-LC309 judge them)
FIXTURES: Mapping[str, Mapping[str, Any]] = {}  # fixtures.draft_config builds a LiLiCorr drafter by default
DESCRIBED_KEYS = (
    "candidate_topk",
    "head_hidden_size_raw",
    "head_hidden_size",
    "head_num_layers",
    "head_num_heads",
    "head_mlp_ratio",
    "head_factor_dim",
    "head_vector_eps",
    "head_logit_scale",
    "head_mlp_width",
)


def carried(g: HeadGeometry) -> bool:
    return g.lilicorr_enabled


def head_tensors(b: HeadBuilder, g: HeadGeometry) -> str | None:
    """Every LiLiCorr head tensor, named as the loaders name them (the named-MLP form, under `lilicorr.`)."""
    dims = g.lilicorr_dims()
    if dims is None:
        return "LiLiCorr geometry is incomplete"
    M, h, K, B = dims.hidden_size, dims.head_hidden_size, dims.candidate_topk, dims.block_size
    L, N, F, R, S = dims.num_layers, dims.num_heads, dims.factor_dim, dims.mlp_width, dims.slots
    p = "lilicorr."
    if h != M:
        b.linear(p + "token_proj", h, M, "head", True)
    b.linear(p + "pass_hidden_proj", h, M, "head", True)
    b.param(p + "feature_norm.weight", (5,), "head")
    b.param(p + "feature_norm.bias", (5,), "head")
    b.linear(p + "feature_mlp.up_proj", h, 5, "head", True)
    b.linear(p + "feature_mlp.down_proj", h, h, "head", True)
    b.param(p + "slot_embedding", (1, 1, S, 1, h), "head")
    b.param(p + "rank_embedding", (1, 1, 1, K, h), "head")
    b.param(p + "relative_slot_bias", (N, 2 * B - 1), "head")
    b.param(p + "same_slot_bias", (N,), "head")
    b.linear(p + "context_proj", h, M, "head", True)
    for layer in range(L):
        q = f"{p}layers.{layer}."
        b.param(q + "attn_norm.weight", (h,), "head")
        b.param(q + "attn.in_proj_weight", (3 * h, h), "head")
        b.param(q + "attn.in_proj_bias", (3 * h,), "head")
        b.linear(q + "attn.out_proj", h, h, "head", True)
        b.param(q + "mlp_norm.weight", (h,), "head")
        b.linear(q + "mlp.up_proj", R, h, "head", True)
        b.linear(q + "mlp.down_proj", h, R, "head", True)
    b.param(p + "output_norm.weight", (h,), "head")
    b.param(p + "anchor_norm.weight", (h,), "head")
    b.linear(p + "factor_input_proj", h, 3 * h, "head", True)
    b.linear(p + "out_head", F, h, "head", True)
    b.linear(p + "in_head", F, h, "head", True)
    b.linear(p + "anchor_out_head", F, h, "head", True)
    return None


def describe(shown: Mapping[str, Any], g: Mapping[str, Any]) -> list[str]:
    d = shown
    return [
        f"  head       h {d['head_hidden_size']} (raw {d['head_hidden_size_raw']}), K {d['candidate_topk']}, "
        f"L {d['head_num_layers']}, N {d['head_num_heads']}, mlp {d['head_mlp_width']}, "
        f"F {d['head_factor_dim']}, eps {d['head_vector_eps']}, scale {d['head_logit_scale']}"
    ]
