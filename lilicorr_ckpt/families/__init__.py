"""One module per head kind, each with the same names (`base.Family`): its architectures, config markers and
keys, its head's tensors, its routing per runtime, its `inspect` lines, its Hub tags and its sample layouts.

A new head kind is one new module here, listed in `FAMILIES`; the reader, the checks, `inspect`, `card` and the
fixtures find it through this registry. The families import nothing from the rest of the package."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lilicorr_ckpt.families import dflash, dflash2, domino, dspark, lilicorr
from lilicorr_ckpt.families.base import Family, HeadBuilder, HeadGeometry, LiLiCorrDims

FAMILIES: dict[str, Family] = {f.NAME: f for f in (lilicorr, dflash, dflash2, dspark, domino)}
# architecture name -> family
ARCHITECTURES: dict[str, str] = {arch: f.NAME for f in FAMILIES.values() for arch in f.ARCHITECTURES}
# the heads beside LiLiCorr, which each runtime routes by its own table (the LC014 / LC015 / LC016 rules)
SIBLINGS: tuple[str, ...] = tuple(name for name, f in FAMILIES.items() if f.ROUTES)
SIBLING_HEAD_PREFIXES: tuple[str, ...] = tuple(p for n in SIBLINGS for p in FAMILIES[n].HEAD_PREFIXES)
SIBLING_HEAD_NAMES: tuple[str, ...] = tuple(x for n in SIBLINGS for x in FAMILIES[n].HEAD_NAMES)
HEAD_TAGS: tuple[str, ...] = tuple(t for f in FAMILIES.values() for t in f.HUB_TAGS)

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "HEAD_TAGS",
    "SIBLINGS",
    "SIBLING_HEAD_NAMES",
    "SIBLING_HEAD_PREFIXES",
    "Family",
    "HeadBuilder",
    "HeadGeometry",
    "LiLiCorrDims",
    "head_family",
    "is_drafter",
    "sibling_owner",
]


def head_family(architecture_family: str | None, projector_type: str | None) -> str | None:
    """The head a checkpoint carries: its architecture's family, or for DFlashDraftModel the sibling its
    dflash_config.projector_type names (Model-Optimizer's DSpark and Domino exporters keep DFlashDraftModel)."""
    if architecture_family == dflash.NAME:
        for name in SIBLINGS:
            if projector_type == FAMILIES[name].PROJECTOR_TYPE:
                return name
    return architecture_family


def sibling_owner(name: str) -> str | None:
    """The sibling family whose head a (canonical) tensor name belongs to, or None."""
    for family in SIBLINGS:
        f = FAMILIES[family]
        if name.startswith(f.HEAD_PREFIXES) or name in f.HEAD_NAMES:
            return family
    return None


_MARKERS = tuple(FAMILIES)  # an architecture naming a family ("Qwen3DFlashDraft") is a drafter's


def is_drafter(raw: Mapping[str, Any]) -> bool:
    """Whether a config.json is a drafter's: it has a dflash_config (of any type: the checks judge it), top-level
    lilicorr_* keys, a speculators config of a family's kind (speculators_model_type dflash, dflash2, dspark), or an
    architecture of a family (listed, or naming one: DFlash, LiLiCorr, DSpark, Domino). Every "is this a drafter?"
    asks this: the loader (a target model passed as the drafter), the target reader (the drafter passed as the
    target), inspect, card and the pre-commit hook (a target kept beside the drafter)."""
    if "dflash_config" in raw or any(k.startswith("lilicorr_") for k in raw):
        return True
    kind = raw.get("speculators_model_type")
    if raw.get("speculators_config") is not None and isinstance(kind, str) and kind in FAMILIES:
        return True  # the speculators layout of a DFlash-family drafter (checkpoint/speculators.py)
    archs = raw.get("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    return any(a in ARCHITECTURES or any(m in a.lower() for m in _MARKERS) for a in names)
