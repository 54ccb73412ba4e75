"""Domino: the DFlash backbone with a prefix GRU and an embedding projection over the drafted prefix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lilicorr_ckpt.families.base import HeadBuilder, HeadGeometry, QuantLinears, Routes

NAME = "domino"
TITLE = "Domino"
ARCHITECTURES = ("DominoDraftModel",)
PROJECTOR_TYPE: str | None = "domino"
CONFIG_KEYS = ("gru_hidden_dim", "emb_dim", "shift_label", "pure_draft_prefix_len")
HEAD_PREFIXES = ("prefix_gru.", "embed_proj.")
HEAD_NAMES: tuple[str, ...] = ()
HUB_TAGS = ("domino",)
ROUTES: Routes = {
    "sglang": (
        ("DFlashDraftModel", "loads", "SGLang loads Domino as DFlashDraftModel with projector_type domino"),
        (
            "DominoDraftModel",
            "refuses",
            'SGLang loads Domino only as DFlashDraftModel with dflash_config.projector_type "domino"',
        ),
    ),
    "vllm": (
        (
            "*",
            "refuses",
            "the release has no Domino model: a DFlashDraftModel has no parameter for prefix_gru / "
            "embed_proj, and no registry key names a Domino class",
        ),
    ),
    "trtllm": (("*", "unconfirmed", "TensorRT-LLM's Domino support was not read"),),
}
# SGLang's dflash.py builds embed_proj as nn.Linear and prefix_gru as nn.GRU; vLLM has no Domino model
QUANT_LINEARS: QuantLinears = {}
FIXTURES: Mapping[str, Mapping[str, Any]] = {
    # DFlashDraftModel + projector_type "domino", prefix GRU and embed_proj (Gh 16, E 8)
    "domino": {
        "head": False,
        "emb_dim": 8,
        "dflash": {
            "projector_type": "domino",
            "gru_hidden_dim": 16,
            "emb_dim": 8,
            "shift_label": True,
            "pure_draft_prefix_len": 1,
        },
    },
}
DESCRIBED_KEYS = ("gru_hidden_dim", "emb_dim")


def carried(g: HeadGeometry) -> bool:
    return g.family == NAME


def head_tensors(b: HeadBuilder, g: HeadGeometry) -> str | None:
    """The GRU's input and hidden weights and the two-layer embedding projection, float in every loader read."""
    M, V, gh, e = g.hidden_size, g.vocab_size, g.gru_hidden_dim, g.emb_dim
    if M is None or V is None:
        return "needs hidden_size and vocab_size"
    if gh is None or e is None:
        return "Domino needs gru_hidden_dim and emb_dim"
    b.param("prefix_gru.weight_ih_l0", (3 * gh, M), "head")
    b.param("prefix_gru.weight_hh_l0", (3 * gh, gh), "head")
    b.param("embed_proj.0.weight", (e, M + gh), "head")
    b.param("embed_proj.2.weight", (V, e), "head")
    return None


def describe(shown: Mapping[str, Any], g: Mapping[str, Any]) -> list[str]:
    return [f"  domino     GRU hidden {shown['gru_hidden_dim']}, emb_dim {shown['emb_dim']}"]
