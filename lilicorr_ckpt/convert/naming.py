"""Source tensor names -> canonical checkpoint names (and back to the requested naming).

ModelOpt's DFlashExporter strips `dflash_module.`; older or hand-made exports keep it, EAGLE-style
wrappers use `eagle_module.`, and some writers add `model.`. The head may use the training module's
nn.Sequential names (`feature_mlp.1`) instead of the named MLPs (`feature_mlp.up_proj`).
"""

from __future__ import annotations

import fnmatch
import re

import msgspec

from ..manifest import canonical_name, legacy_name

STRIPPED_PREFIXES = ("dflash_module.", "eagle_module.", "model.")
# buffers every loader recomputes; ModelOpt's exporter drops them too
DERIVED_BUFFERS = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"), re.compile(r"(^|\.)rotary_emb\.(cos|sin)_cached$"))


class Mapped(msgspec.Struct, frozen=True):
    source: str
    canonical: str
    prefixes: tuple[str, ...]  # prefixes stripped, outermost first
    legacy: bool  # the head name was a Sequential (legacy) name


def strip_prefixes(name: str) -> tuple[str, tuple[str, ...]]:
    stripped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in STRIPPED_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                stripped.append(prefix)
                changed = True
    return name, tuple(stripped)


def map_name(source: str) -> Mapped:
    bare, prefixes = strip_prefixes(source)
    canonical = canonical_name(bare)
    return Mapped(source, canonical, prefixes, canonical != bare)


def is_derived_buffer(canonical: str) -> bool:
    return any(rx.search(canonical) for rx in DERIVED_BUFFERS)


def output_name(canonical: str, naming: str) -> str:
    return legacy_name(canonical) if naming == "sequential" else canonical


def matches(patterns: tuple[str, ...], *names: str) -> str | None:
    """The first pattern that matches any of `names` (fnmatch, case-sensitive)."""
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(n, pattern) for n in names):
            return pattern
    return None


def natural_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """Sort `layers.2` before `layers.10`."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split("."))
