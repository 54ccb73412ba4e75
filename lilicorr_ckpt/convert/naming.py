"""What convert adds to checkpoint/names: derived buffers it drops, the output naming, pattern matching."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from lilicorr_ckpt.checkpoint.manifest import legacy_name
from lilicorr_ckpt.errors import ConversionRefused
from lilicorr_ckpt.runtimes import RuntimeProfile

# buffers every loader recomputes; ModelOpt's exporter drops them too
DERIVED_BUFFERS = (
    re.compile(r"(^|\.)rotary_emb\.inv_freq$"),
    re.compile(r"(^|\.)rotary_emb\.(cos|sin)_cached$"),
)


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


def reads_naming(profile: RuntimeProfile, naming: str) -> bool:
    """The release loads a LiLiCorr head whose MLPs are named this way (named: feature_mlp.up_proj; sequential:
    the nn.Sequential indices feature_mlp.1, which some releases build and others rename on load)."""
    if naming == "named":
        return profile.head_mlp_naming == "named"
    return profile.head_mlp_naming == "sequential" or profile.legacy_mlp_names == "renamed"


def resolve_naming(requested: str, profiles: list[RuntimeProfile], canonical: Iterable[str]) -> str:
    """`auto` (the default): the head naming every selected release loads (named when both are), and named when the
    checkpoint has no head MLP to name. Refused when its head MLPs have no naming all of them load, with the
    selections to convert for separately. An explicit naming is kept (validate judges it)."""
    if requested != "auto":
        return requested
    named = [p for p in profiles if reads_naming(p, "named")]
    sequential = [p for p in profiles if reads_naming(p, "sequential")]
    if len(named) == len(profiles):
        return "named"
    if len(sequential) == len(profiles):
        return "sequential"
    mlps = sorted(c for c in canonical if legacy_name(c) != c)
    if not mlps:
        return "named"
    only_named = [p for p in profiles if p not in sequential]
    only_sequential = [p for p in profiles if p not in named]
    raise ConversionRefused(
        "no naming of the LiLiCorr head's MLPs is loaded by every selected release",
        [
            "named (feature_mlp.up_proj, layers.N.mlp.up_proj): "
            + ", ".join(p.display for p in only_named)
            + (" loads" if len(only_named) == 1 else " load")
            + " only these",
            "sequential (feature_mlp.1, layers.N.mlp.0): "
            + ", ".join(p.display for p in only_sequential)
            + (" loads" if len(only_sequential) == 1 else " load")
            + " only these",
            "fix: convert once for each: --runtime '"
            + ",".join(p.release_id for p in named)
            + "' and --runtime '"
            + ",".join(p.release_id for p in sequential)
            + "' --naming sequential",
        ],
    )
