"""What every head-kind module provides, as a Protocol each module satisfies (mypy checks them in
`lilicorr_ckpt.families.FAMILIES`), and the two narrow views of the reader the modules work on.

The families sit below the reader: they import nothing from `lilicorr_ckpt.checkpoint`, which imports them (the
architecture names, the head tensors), so the views are Protocols the reader's `Geometry` and manifest builder
satisfy rather than imports of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

# runtime name -> (architecture or "*", verdict "loads" | "refuses" | "unconfirmed", why), first match wins
Routes = Mapping[str, tuple[tuple[str, str, str], ...]]
# runtime name -> the head's linears its loader builds through the draft's quantization config, each
# (canonical module, the config layout that selects the class building it that way or None for every config, the
# loader's statement): the others are plain float layers. The exclusions must name these as that loader does
# (checks/sibling_quant.py)
QuantLinears = Mapping[str, tuple[tuple[str, Callable[[Mapping[str, Any]], bool] | None, str], ...]]


class LiLiCorrDims(msgspec.Struct, frozen=True):
    """The LiLiCorr head's geometry with every dimension known: what its tensors (the manifest) and its modules (the
    runtime) are built from. `Geometry.lilicorr_dims()` yields one only when the config determines them all."""

    hidden_size: int  # M, the draft width
    head_hidden_size: int  # h
    candidate_topk: int  # K
    block_size: int  # B
    num_layers: int  # L
    num_heads: int  # N
    factor_dim: int  # F
    mlp_width: int  # R = int(h * mlp_ratio)

    @property
    def slots(self) -> int:  # S = B - 1
        return self.block_size - 1


class HeadBuilder(Protocol):
    """The manifest's builder: float parameters and linear modules (a weight, and a bias when asked)."""

    def param(self, name: str, shape: tuple[int, ...], component: str) -> None: ...

    def linear(self, name: str, out_features: int, in_features: int, component: str, bias: bool) -> None: ...


class HeadGeometry(Protocol):
    """The resolved geometry a head's tensors follow (checkpoint.geometry.Geometry)."""

    @property
    def family(self) -> str | None: ...
    @property
    def lilicorr_enabled(self) -> bool: ...
    def lilicorr_dims(self) -> LiLiCorrDims | None: ...
    @property
    def hidden_size(self) -> int | None: ...
    @property
    def vocab_size(self) -> int | None: ...
    @property
    def draft_vocab_size(self) -> int | None: ...
    @property
    def selector_rank(self) -> int | None: ...
    @property
    def markov_rank(self) -> int | None: ...
    @property
    def markov_head_type(self) -> str | None: ...
    @property
    def confidence_head(self) -> bool: ...
    @property
    def confidence_with_markov(self) -> bool: ...
    @property
    def dspark_layout(self) -> str | None: ...
    @property
    def gru_hidden_dim(self) -> int | None: ...
    @property
    def emb_dim(self) -> int | None: ...


class Family(Protocol):
    """A head-kind module: lilicorr, dflash, dflash2, dspark, domino."""

    NAME: str  # the family id: Geometry.family, the sibling-route key, the Hub tag
    TITLE: str  # how prose names it
    ARCHITECTURES: tuple[str, ...]  # the `architectures[0]` values that declare it
    PROJECTOR_TYPE: str | None  # the dflash_config.projector_type that declares it under DFlashDraftModel
    CONFIG_KEYS: tuple[str, ...]  # the config keys its head reads (top level or dflash_config)
    HEAD_PREFIXES: tuple[str, ...]  # name prefixes of its head's tensors (no `model.`)
    HEAD_NAMES: tuple[str, ...]  # exact names of its head's tensors that no prefix covers
    HUB_TAGS: tuple[str, ...]  # the tags `card` writes for a drafter with this head
    ROUTES: Routes  # per runtime, how its loader routes this head (sibling heads only)
    QUANT_LINEARS: QuantLinears  # per runtime, the head's linears built through the quant config
    FIXTURES: Mapping[str, Mapping[str, Any]]  # published layouts: name -> fixtures.draft_config arguments
    DESCRIBED_KEYS: tuple[str, ...]  # the geometry keys `describe` prints (inspect flags them when unknown)

    def carried(self, g: HeadGeometry) -> bool:
        """Whether a checkpoint of geometry `g` carries this head (its tensors are expected)."""
        ...

    def head_tensors(self, b: HeadBuilder, g: HeadGeometry) -> str | None:
        """Register the head's tensors on `b`; a reason instead when the geometry does not determine them."""
        ...

    def describe(self, shown: Mapping[str, Any], g: Mapping[str, Any]) -> list[str]:
        """`inspect`'s lines for the head (`shown`: the geometry as printed, "?" for unknown; `g`: as resolved)."""
        ...
