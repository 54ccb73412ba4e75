"""DFlash2's grouped convolutions (LC116)."""

from __future__ import annotations

import math
from typing import Any

from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context, names
from lilicorr_ckpt.checks.findings import rule
from lilicorr_ckpt.runtimes import RuntimeProfile
from lilicorr_ckpt.runtimes.reads import present

# ---------------------------------------------------------------- catalogue
rule(
    "LC116",
    "conv-geometry",
    "error",
    CFG,
    "conv_kernel_size / conv_group_size are inconsistent (set alone, negative, kernel > block, width not divisible).",
    "Write both keys as trained, or neither for a convolution-free drafter.",
    doc="Checks dflash_config's `conv_kernel_size` / `conv_group_size` and fires when either is negative; "
    "when only one of them is > 0 (for SGLang and vLLM, which need both or neither; for TensorRT-LLM when "
    "the kernel size is set without a group size); when conv_kernel_size exceeds the block size "
    "(TensorRT-LLM); and when hidden_size is not divisible by conv_group_size. It fires only for the runtimes that "
    "read the keys for the head kind: vLLM reads them for LiLiCorr and DFlash2 only, SGLang for every head. vLLM's "
    "LiLiCorr tests the values as they are (`< 0`, then as truth values) before int() builds the convolution: a "
    "NaN, an infinity or a fraction is set there (beside the other key's 0: both or neither), false is 0, and where "
    "both are set int() of a NaN or an infinity fails and a fraction is truncated (2.5 builds the 2-tap "
    "convolution, which the tensor checks judge; 0.5 builds none: LC116).",
    why='Each runtime refuses these at load: SGLang "needs conv_kernel_size and conv_group_size together" '
    'and its grouped convolution says the group size "must divide hidden_size"; vLLM "must enable '
    'both" (a NaN included: it is neither negative nor 0); TensorRT-LLM wants a group > 0 when taps > 0 and a '
    'kernel size "between 0 and block_size".',
    example='    "dflash_config": {"block_size": 16, "conv_kernel_size": 4}\n\n(no conv_group_size).',
)


# ---------------------------------------------------------------- checks


def _read_values(ctx: Context, profile: RuntimeProfile) -> tuple[Any, Any]:
    """(conv_kernel_size, conv_group_size) as `profile` compares them: the typed config's (for a release that casts
    them, the cast value: checks/casts.py), or, for a release that tests the key as it is before it casts it
    (RuntimeProfile.config_reads `number>int()`: vLLM's lilicorr.py LiLiCorr.__init__ `draft_config.get(key, 0)`),
    the JSON number that is no whole number (NaN, an infinity, 2.5: its int() may be 0, its truth value is not)."""
    values = present(ctx.parsed.raw)
    out: list[Any] = []
    for key in ("conv_kernel_size", "conv_group_size"):
        typed = getattr(ctx.config.dflash, key)
        path = f"$.dflash_config.{key}"
        raw = values.get(path)
        loose = isinstance(raw, float) and not (math.isfinite(raw) and raw.is_integer())
        if loose and config_read(profile, ctx.geometry.family, path) == "number>int()":
            out.append(raw)
        else:
            out.append(typed)
    return out[0], out[1]


def _set(value: Any) -> bool:
    """Whether a size enables a convolution: > 0, or NaN, which `< 0` passes and a truth test counts as set (vLLM
    lilicorr.py LiLiCorr.__init__ `bool(taps) != bool(groups)`)."""
    return value is not None and (value > 0 or (isinstance(value, float) and math.isnan(value)))


def _shown(value: Any) -> str:
    if value is None:
        return "absent"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return str(value)


def conv_geometry(ctx: Context) -> None:
    # a release that does not read the convolution keys for this head kind builds no convolution from them
    # (RuntimeProfile.config_reads: vLLM reads them for LiLiCorr and DFlash2 only)
    readers = [
        p
        for p in ctx.profiles
        if all(
            config_read(p, ctx.geometry.family, f"$.dflash_config.{key}") != "unread"
            for key in ("conv_kernel_size", "conv_group_size")
        )
    ]
    # the releases grouped by the values they read (a NaN read as it is by vLLM, absent in the typed config)
    groups: dict[tuple[str, str], tuple[tuple[Any, Any], list[RuntimeProfile]]] = {}
    for p in readers:
        pair = _read_values(ctx, p)
        groups.setdefault((repr(pair[0]), repr(pair[1])), (pair, []))[1].append(p)
    for (taps, group), members in groups.values():
        _judge(ctx, members, taps, group)


def _judge(ctx: Context, readers: list[RuntimeProfile], taps: Any, group: Any) -> None:
    for key, value in (("conv_kernel_size", taps), ("conv_group_size", group)):
        if value is not None and value < 0:
            ctx.emit_for(
                "LC116",
                readers,
                f"dflash_config.{key} is {_shown(value)}",
                file="config.json",
                pointer=f"$.dflash_config.{key}",
                expected=">= 0",
                actual=_shown(value),
            )
    loose = [
        (key, v)
        for key, v in (("conv_kernel_size", taps), ("conv_group_size", group))
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()) and not v < 0
    ]
    if _set(taps) != _set(group):
        strict = [p for p in readers if p.conv_keys_both_or_neither or _set(taps)]
        shown = [_shown(v) for v in (taps, group)]
        why = "".join(
            f"; {names(strict, 'tests|test')} {key} as it is (`< 0`, then as a truth value): {_shown(v)} is "
            "neither negative nor 0, so it enables a convolution"
            for key, v in loose
        )
        ctx.emit_for(
            "LC116",
            strict,
            f"conv_kernel_size is {shown[0]} and conv_group_size is {shown[1]}: both or neither{why}",
            fix=(
                f"Write 0 for dflash_config.{loose[0][0]}, or remove it, for a head without convolutions; else "
                "both sizes as trained."
                if loose
                else None
            ),
            file="config.json",
            pointer=f"$.dflash_config.{loose[0][0] if loose else 'conv_kernel_size'}",
            expected="both > 0 or both 0",
            actual=f"{shown[0]}/{shown[1]}",
        )
    elif _set(taps) and loose:
        # both set, one of them no whole number: vLLM builds the convolution with int() of each (qwen3_dflash2.py
        # DFlash2Qwen3DecoderLayer), which fails on NaN and an infinity and truncates 2.5 to 2: a size the
        # tensor checks judge on the cast config (checks/casts.py; the trained 2 loads, LC004 names the read), and
        # 0.5 to 0, a convolution of no taps or a group size that divides nothing
        bad = [(key, v) for key, v in loose if not math.isfinite(v) or int(v) < 1]
        if bad:
            key, v = bad[0]
            ctx.emit_for(
                "LC116",
                readers,
                f"dflash_config.{key} is {_shown(v)}, not a convolution size: "
                + names(readers, "builds|build")
                + " the convolution from int() of it, "
                + ("which fails" if not math.isfinite(v) else f"{int(v)}, no convolution size"),
                fix=f"Write dflash_config.{key} as trained, a whole number.",
                file="config.json",
                pointer=f"$.dflash_config.{key}",
                expected="a whole number > 0",
                actual=_shown(v),
            )
            return
        taps, group = (int(v) if isinstance(v, float) else v for v in (taps, group))
        loose = []
    if loose:
        return
    t, gsz = taps or 0, group or 0
    if t > 0:
        b = ctx.geometry.block_size
        if b is not None and t > b:
            ctx.emit_for(
                "LC116",
                [p for p in readers if p.conv_kernel_within_block],
                f"conv_kernel_size {t} exceeds block_size {b}",
                file="config.json",
                pointer="$.dflash_config.conv_kernel_size",
                expected=f"<= {b}",
                actual=t,
            )
    m = ctx.geometry.hidden_size
    if gsz > 0 and m is not None and m % gsz:
        ctx.emit_for(
            "LC116",
            readers,
            f"hidden_size {m} is not divisible by conv_group_size {gsz}",
            file="config.json",
            pointer="$.dflash_config.conv_group_size",
            expected=f"a divisor of {m}",
            actual=gsz,
        )
