"""The config as each release reads it, where a release casts a value of the wrong JSON type with int() or float():
a numeric string or a bool in an integer or number key is that release's number (RuntimeProfile.config_reads
`int()` / `float()` readers), so the geometry and value rules judge the cast value for it, and the schema's absent
value for the releases that do not cast.

run_checks groups the releases by the values they cast and runs the checks once per group (one run, as before,
when no release casts anything), merging the findings: one finding per distinct message, naming the releases
whose run gave it."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import recast
from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
from lilicorr_ckpt.checkpoint.load import Checkpoint
from lilicorr_ckpt.checkpoint.manifest import build_manifest
from lilicorr_ckpt.results import Finding
from lilicorr_ckpt.runtimes import RuntimeProfile
from lilicorr_ckpt.runtimes.reads import CASTS, config_read, present, reader_refuses, resolve_read

_TYPED = {int: "integer", float: "a number"}


def release_casts(ckpt: Checkpoint, profile: RuntimeProfile) -> dict[str, int | float]:
    """JSON path -> the number `profile` casts a value of the wrong type to (an integer key with int(), a number
    key with float())."""
    parsed = ckpt.parsed
    values = present(parsed.raw)
    family = ckpt.geometry.family
    out: dict[str, int | float] = {}
    for issue in parsed.issues:
        path = issue.path
        value: Any = values.get(path)
        if path not in values or value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            continue  # an integer out of range, not a cast
        if isinstance(value, float) and not math.isfinite(value):
            continue
        # an "else:READER" entry (a top-level key read only where dflash_config has none) is READER or unread
        reader = resolve_read(config_read(profile, family, path), path, parsed.raw)
        cast = CASTS.get(reader or "")
        if cast is None or _TYPED[cast] not in issue.expected or reader_refuses(reader or "", value):
            continue
        try:
            out[path] = cast(value)
        except (TypeError, ValueError, OverflowError):
            continue
    return out


def cast_views(
    ckpt: Checkpoint, profiles: list[RuntimeProfile]
) -> list[tuple[list[RuntimeProfile], Checkpoint]]:
    """The releases grouped by the values they cast, each group with the checkpoint as it reads it."""
    groups: dict[tuple[tuple[str, int | float], ...], list[RuntimeProfile]] = {}
    for p in profiles:
        groups.setdefault(tuple(sorted(release_casts(ckpt, p).items())), []).append(p)
    if list(groups) == [()]:
        return [(profiles, ckpt)]
    views = []
    for casts, members in groups.items():
        if not casts:
            views.append((members, ckpt))
            continue
        parsed = recast(ckpt.parsed, dict(casts))
        geometry = resolve_geometry(parsed.config)
        view = msgspec.structs.replace(
            ckpt,
            parsed=parsed,
            geometry=geometry,
            manifest=build_manifest(geometry, len(ckpt.table.tensors)),
        )
        views.append((members, view))
    return views


def merge(runs: list[tuple[list[str], list[Finding]]], every: list[str]) -> list[Finding]:
    """One finding per distinct content over the runs (each run: its releases, its findings), naming the releases
    whose run gave it; a finding for no runtime in particular stays so only where every run gave it so."""
    merged: dict[bytes, tuple[Finding, set[str], set[str], bool]] = {}
    for names, findings in runs:
        for f in findings:
            bare = msgspec.structs.replace(f, runtimes=[], silent_for=[])
            key = msgspec.json.encode(bare)
            _, who, silent, general = merged.get(key, (bare, set(), set(), True))
            merged[key] = (
                bare,
                who | set(f.runtimes or names),
                silent | set(f.silent_for),
                general and not f.runtimes,
            )
    out = []
    for bare, who, silent, general in merged.values():
        runtimes = [] if general and who >= set(every) else sorted(who)
        out.append(msgspec.structs.replace(bare, runtimes=runtimes, silent_for=sorted(silent)))
    return out
