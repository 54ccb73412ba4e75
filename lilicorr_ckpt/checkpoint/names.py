"""Tensor names as the loaders see them: wrapper prefixes stripped, legacy head names and aliases renamed.

ModelOpt's DFlashExporter strips `dflash_module.`; older or hand-made exports keep it, EAGLE-style
wrappers use `eagle_module.`, and some writers add `model.`. The head may use the training module's
nn.Sequential names (`feature_mlp.1`) instead of the named MLPs (`feature_mlp.up_proj`). Some exports name
backbone modules by an alias: EAGLE-style `midlayer.` for the single draft layer, a native exporter's
`encoder.fc` / `encoder.output_norm_enc` for fc and hidden_norm (which runtimes rename which alias is
RuntimeProfile.tensor_aliases).
"""

from __future__ import annotations

import re

import msgspec

from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, canonical_name
from lilicorr_ckpt.checkpoint.tensors import TensorInfo, TensorTable

TRAINING_PREFIXES = ("dflash_module.", "eagle_module.")
MODEL_PREFIX = "model."
STRIPPED_PREFIXES = (*TRAINING_PREFIXES, MODEL_PREFIX)


def strip_prefixes(name: str, prefixes: tuple[str, ...] = STRIPPED_PREFIXES) -> tuple[str, tuple[str, ...]]:
    """(name without any of `prefixes`, however nested, the prefixes stripped outermost first)."""
    stripped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                stripped.append(prefix)
                changed = True
    return name, tuple(stripped)


# alias family -> (pattern over the prefix-stripped name, its canonical replacement)
ALIASES: dict[str, tuple[tuple[re.Pattern[str], str], ...]] = {
    "midlayer": ((re.compile(r"^midlayer\."), "layers.0."),),
    "encoder": (
        (re.compile(r"^encoder\.fc\."), "fc."),
        (re.compile(r"^encoder\.output_norm_enc\."), "hidden_norm."),
    ),
}


class Mapped(msgspec.Struct, frozen=True):
    source: str
    canonical: str
    prefixes: tuple[str, ...]  # prefixes stripped, outermost first
    legacy: bool  # the head name was a Sequential (legacy) name
    alias: str | None = None  # the alias family the name used (ALIASES)


def map_name(source: str) -> Mapped:
    bare, prefixes = strip_prefixes(source)
    for family, rules in ALIASES.items():
        for pattern, canonical in rules:
            if pattern.match(bare):
                return Mapped(source, pattern.sub(canonical, bare, count=1), prefixes, False, family)
    canonical = canonical_name(bare)
    return Mapped(source, canonical, prefixes, canonical != bare)


class NameView(msgspec.Struct, frozen=True):
    """The checkpoint's tensors under their canonical names."""

    by_canonical: dict[str, TensorInfo]
    actual: dict[str, str]  # canonical -> name in the file
    legacy: list[str]
    model_prefixed: list[str]
    training_prefixed: list[str]
    collisions: dict[str, list[str]]
    aliased: dict[str, list[str]] = {}  # alias family -> names in the file that use it


def name_view(table: TensorTable) -> NameView:
    by: dict[str, TensorInfo] = {}
    actual: dict[str, str] = {}
    legacy: list[str] = []
    model_prefixed: list[str] = []
    training: list[str] = []
    collisions: dict[str, list[str]] = {}
    aliased: dict[str, list[str]] = {}
    for name, info in table.tensors.items():
        m = map_name(name)
        if m.alias:
            aliased.setdefault(m.alias, []).append(name)
        if MODEL_PREFIX in m.prefixes:
            model_prefixed.append(name)
        if any(p in TRAINING_PREFIXES for p in m.prefixes):
            training.append(name)
        if m.legacy:
            legacy.append(name)
        if m.canonical in by:
            collisions.setdefault(m.canonical, [actual[m.canonical]]).append(name)
            continue
        by[m.canonical] = info
        actual[m.canonical] = name
    return NameView(by, actual, legacy, model_prefixed, training, collisions, aliased)


def observed_scheme(view: NameView, module: str) -> str:
    """float | nvfp4 | fp8 | missing | other, from the weight tensor's dtype."""
    info = view.by_canonical.get(f"{module}.weight")
    if info is None:
        return "missing"
    if info.dtype in FLOAT_DTYPES:
        return "float"
    return {"U8": "nvfp4", "F8_E4M3": "fp8"}.get(info.dtype, "other")
