"""What convert adds to checkpoint/names: derived buffers it drops, the output naming, pattern matching."""

from __future__ import annotations

import fnmatch
import re

from lilicorr_ckpt.checkpoint.manifest import legacy_name

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
