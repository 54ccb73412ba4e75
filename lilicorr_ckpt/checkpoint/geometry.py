"""Resolved drafter geometry: every dimension the manifest and the runtime need, read once.

A value is None when the config does not determine it (missing or invalid key); the rules
report why, and the manifest leaves the components that need it unchecked.
"""

from __future__ import annotations

import math

import msgspec

from lilicorr_ckpt import families
from lilicorr_ckpt.checkpoint.config import LILICORR_KEYS, DraftConfig
from lilicorr_ckpt.families import LiLiCorrDims

DEFAULT_BLOCK_SIZE = (
    16  # SGLang's resolve_block_size(default=16); the other stacks refuse a missing block_size
)


class BackboneDims(msgspec.Struct, kw_only=True, frozen=True):
    """The DFlash backbone's geometry with every dimension known: what the manifest builds its tensors from."""

    hidden_size: int  # M
    num_layers: int  # Ld
    num_heads: int  # nh
    num_kv_heads: int  # nkv
    head_dim: int  # hd
    intermediate_size: int  # I


class Geometry(msgspec.Struct, kw_only=True, frozen=True):
    family: str | None  # lilicorr | dflash | dflash2 | dspark | domino | None (the head, with projector_type)
    hidden_size: int | None  # M
    num_layers: int | None  # Ld
    num_heads: int | None  # nh
    num_kv_heads: int | None  # nkv
    head_dim: int | None  # hd
    intermediate_size: int | None  # I
    vocab_size: int | None  # V
    rms_norm_eps: float
    attention_bias: bool
    block_size: int | None  # B as the stacks that have a default resolve it
    block_size_declared: bool
    target_layer_ids: tuple[int, ...] | None
    num_target_layers: int | None
    mask_token_id: int | None
    conv_kernel_size: int  # taps, 0 = no convolution
    conv_group_size: int  # G
    has_own_lm_head: bool
    lilicorr_enabled: bool  # the head is declared (architecture or keys) and not disabled
    # LiLiCorr head; None when the key is missing/invalid
    candidate_topk: int | None  # K
    head_hidden_size_raw: int | None  # as written; 0 means "draft width" for SGLang/vLLM
    head_hidden_size: int | None  # h, resolved
    head_num_layers: int | None  # L
    head_num_heads: int | None  # N
    head_mlp_ratio: float | None
    head_factor_dim: int | None  # F
    head_vector_eps: float | None
    head_logit_scale: float | None
    # sibling heads: the DFlash2 selector, the DSpark Markov head, the Domino GRU
    selector_rank: int | None = None  # DFlash2 r; 0 / None = no selector
    selector_top_k: int | None = None
    markov_rank: int | None = None  # DSpark r, from the top level (where SGLang and vLLM read it)
    markov_head_type: str | None = None  # vanilla | gated | rnn (lower-cased)
    confidence_head: bool = False
    confidence_with_markov: bool = False
    dspark_layout: str | None = (
        None  # "served" (markov_head.*) | "modelopt" (flat names) for the DSpark family
    )
    gru_hidden_dim: int | None = None  # Domino Gh
    emb_dim: int | None = None  # Domino E
    # a reduced draft vocabulary (draft_vocab_size below vocab_size): the rows of an owned lm_head and of d2t (the
    # draft-to-target id offsets); None when the draft drafts over the whole vocabulary
    draft_vocab_size: int | None = None

    @property
    def slots(self) -> int | None:
        return None if self.block_size is None else self.block_size - 1

    @property
    def head_mlp_width(self) -> int | None:  # R = int(h * mlp_ratio)
        if self.head_hidden_size is None or self.head_mlp_ratio is None:
            return None
        return int(self.head_hidden_size * self.head_mlp_ratio)

    @property
    def has_conv(self) -> bool:
        return self.conv_kernel_size > 0 and self.conv_group_size > 0

    @property
    def num_taps(self) -> int | None:
        return None if self.target_layer_ids is None else len(self.target_layer_ids)

    def head_complete(self) -> bool:
        return self.lilicorr_dims() is not None

    def lilicorr_dims(self) -> LiLiCorrDims | None:
        """The LiLiCorr head's dimensions, every one known, or None when the config leaves one undetermined."""
        M, h, K, B = self.hidden_size, self.head_hidden_size, self.candidate_topk, self.block_size
        L, N, F, R = self.head_num_layers, self.head_num_heads, self.head_factor_dim, self.head_mlp_width
        if (
            M is None
            or h is None
            or K is None
            or B is None
            or L is None
            or N is None
            or F is None
            or R is None
        ):
            return None
        return LiLiCorrDims(
            hidden_size=M,
            head_hidden_size=h,
            candidate_topk=K,
            block_size=B,
            num_layers=L,
            num_heads=N,
            factor_dim=F,
            mlp_width=R,
        )

    def backbone_dims(self) -> BackboneDims | None:
        """The backbone's dimensions, every one known, or None when the config leaves one undetermined."""
        M, layers, heads, hd = self.hidden_size, self.num_layers, self.num_heads, self.head_dim
        kv, inter = self.num_kv_heads, self.intermediate_size
        if M is None or layers is None or heads is None or hd is None or kv is None or inter is None:
            return None
        return BackboneDims(
            hidden_size=M,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=hd,
            intermediate_size=inter,
        )


def _positive_int(value: int | None) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def resolve_block_size(config: DraftConfig) -> tuple[int | None, bool]:
    """dflash_config.block_size wins over the top-level key (SGLang, vLLM, TRT)."""
    declared = config.dflash.block_size if config.dflash.block_size is not None else config.block_size
    if declared is not None:
        return declared, True
    return DEFAULT_BLOCK_SIZE, False


def head_declared(config: DraftConfig) -> bool:
    d = config.dflash
    fields = msgspec.structs.asdict(d)
    return (
        config.family == "lilicorr"
        or d.projector_type == "lilicorr"
        or any(fields[key] is not None for key in LILICORR_KEYS)
    )


def routed_by_projector(config: DraftConfig) -> bool:
    """DFlashDraftModel whose dflash_config selects LiLiCorr: TensorRT-LLM routes it to LiLiCorr through
    projector_type "lilicorr" or lilicorr_enabled true (TensorRT-LLM routes on either); the others follow `architectures`."""
    d = config.dflash
    return config.family == "dflash" and (d.projector_type == "lilicorr" or d.lilicorr_enabled is True)


def head_family(config: DraftConfig) -> str | None:
    """The head a checkpoint carries (families.head_family: the architecture's, or the projector_type's)."""
    return families.head_family(config.family, config.dflash.projector_type)


# model types whose transformers config class declares a head_dim default (Qwen3Config:
# `head_dim: int = 128`); others derive it from hidden_size / num_attention_heads
CONFIG_CLASS_HEAD_DIM = {"qwen3": 128}


def resolve_geometry(config: DraftConfig) -> Geometry:
    d = config.dflash
    hidden = _positive_int(config.hidden_size)
    heads = _positive_int(config.num_attention_heads)
    head_dim = _positive_int(config.head_dim)
    if head_dim is None and config.head_dim is None:
        if config.model_type in CONFIG_CLASS_HEAD_DIM:
            # the loaders build the config with transformers' class, whose dataclass default fills an absent
            # head_dim (Qwen3Config: 128), not hidden_size // num_attention_heads
            head_dim = CONFIG_CLASS_HEAD_DIM[config.model_type]
        elif hidden and heads and hidden % heads == 0:
            head_dim = hidden // heads
    kv_heads = _positive_int(config.num_key_value_heads)
    if kv_heads is None and config.num_key_value_heads is None:
        kv_heads = heads
    block_size, declared = resolve_block_size(config)
    if block_size is not None and block_size < 2:
        block_size = None
    layer_ids = d.target_layer_ids if d.target_layer_ids is not None else config.target_layer_ids
    mask = d.mask_token_id if d.mask_token_id is not None else config.mask_token_id
    num_target = d.num_target_layers if d.num_target_layers is not None else config.num_target_layers
    h_raw = d.lilicorr_hidden_size
    if h_raw is None or h_raw < 0:
        h = None
    else:
        h = h_raw if h_raw > 0 else hidden
    taps = d.conv_kernel_size if isinstance(d.conv_kernel_size, int) and d.conv_kernel_size > 0 else 0
    group = d.conv_group_size if isinstance(d.conv_group_size, int) and d.conv_group_size > 0 else 0
    eps = _finite(config.rms_norm_eps)
    family = head_family(config)
    # an empty type is no type any release builds (vLLM, which never reads it, serves vanilla), not vanilla
    markov_type = config.markov_head_type if config.markov_head_type is not None else d.markov_head_type
    vocab, draft_vocab = _positive_int(config.vocab_size), _positive_int(config.draft_vocab_size)
    confidence = (
        config.enable_confidence_head if config.enable_confidence_head is not None else d.use_confidence_head
    )
    return Geometry(
        family=family,
        hidden_size=hidden,
        num_layers=_positive_int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_positive_int(config.intermediate_size),
        vocab_size=vocab,
        rms_norm_eps=eps if eps is not None and eps > 0 else 1e-6,
        attention_bias=bool(config.attention_bias),
        block_size=block_size,
        block_size_declared=declared,
        target_layer_ids=tuple(layer_ids) if layer_ids else None,
        num_target_layers=_positive_int(num_target),
        mask_token_id=mask if isinstance(mask, int) and mask >= 0 else None,
        conv_kernel_size=taps,
        conv_group_size=group,
        has_own_lm_head=bool(config.has_own_lm_head),
        lilicorr_enabled=head_declared(config)
        and d.lilicorr_enabled is not False
        and (config.family in ("lilicorr", None) or routed_by_projector(config)),
        candidate_topk=_positive_int(d.lilicorr_candidate_topk),
        head_hidden_size_raw=h_raw,
        head_hidden_size=h,
        head_num_layers=_positive_int(d.lilicorr_num_layers),
        head_num_heads=_positive_int(d.lilicorr_num_heads),
        head_mlp_ratio=_positive_or_none(d.lilicorr_mlp_ratio),
        head_factor_dim=_positive_int(d.lilicorr_factor_dim),
        head_vector_eps=_positive_or_none(d.lilicorr_vector_eps),
        head_logit_scale=_positive_or_none(d.lilicorr_logit_scale),
        selector_rank=_positive_int(d.selector_rank) if family == "dflash2" else None,
        selector_top_k=_positive_int(d.selector_top_k) if family == "dflash2" else None,
        markov_rank=_positive_int(config.markov_rank if config.markov_rank is not None else d.markov_rank)
        if family == "dspark"
        else None,
        markov_head_type=(markov_type if markov_type is not None else "vanilla").lower()
        if family == "dspark"
        else None,
        confidence_head=bool(confidence) and family == "dspark",
        confidence_with_markov=bool(config.confidence_head_with_markov) and family == "dspark",
        dspark_layout=("served" if config.family == "dspark" else "modelopt") if family == "dspark" else None,
        gru_hidden_dim=_positive_int(
            d.gru_hidden_dim if d.gru_hidden_dim is not None else config.gru_hidden_dim
        )
        if family == "domino"
        else None,
        emb_dim=_positive_int(d.emb_dim if d.emb_dim is not None else config.emb_dim)
        if family == "domino"
        else None,
        draft_vocab_size=draft_vocab if vocab and draft_vocab and draft_vocab < vocab else None,
    )


def _positive_or_none(value: float | None) -> float | None:
    value = _finite(value)
    return value if value is not None and value > 0 else None
