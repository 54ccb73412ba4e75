"""DFlash: the block-diffusion drafting backbone alone, no head of its own. DFlashDraftModel also declares a
sibling head through dflash_config.projector_type (Model-Optimizer's DSpark and Domino exporters keep it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lilicorr_ckpt.families.base import HeadBuilder, HeadGeometry, QuantLinears, Routes

NAME = "dflash"
TITLE = "DFlash"
ARCHITECTURES = ("DFlashDraftModel",)
PROJECTOR_TYPE: str | None = None
CONFIG_KEYS: tuple[str, ...] = ()
HEAD_PREFIXES: tuple[str, ...] = ()
HEAD_NAMES: tuple[str, ...] = ()
HUB_TAGS: tuple[str, ...] = ()  # every drafter's card carries "dflash" (modelcard.BASE_TAGS)
ROUTES: Routes = {}
QUANT_LINEARS: QuantLinears = {}
FIXTURES: Mapping[str, Mapping[str, Any]] = {}
DESCRIBED_KEYS: tuple[str, ...] = ()


def carried(g: HeadGeometry) -> bool:
    return False


def head_tensors(b: HeadBuilder, g: HeadGeometry) -> str | None:
    return None


def describe(shown: Mapping[str, Any], g: Mapping[str, Any]) -> list[str]:
    return []
