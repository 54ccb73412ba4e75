"""DFlash2's grouped convolutions (LC116)."""

from __future__ import annotations

from lilicorr_ckpt.checks.config.common import CFG
from lilicorr_ckpt.checks.config.types import config_read
from lilicorr_ckpt.checks.context import Context
from lilicorr_ckpt.checks.findings import rule

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
    "read the keys for the head kind: vLLM reads them for LiLiCorr and DFlash2 only, SGLang for every head.",
    why='Each runtime refuses these at load: SGLang "needs conv_kernel_size and conv_group_size together" '
    'and its grouped convolution says the group size "must divide hidden_size"; vLLM "must enable '
    'both"; TensorRT-LLM wants a group > 0 when taps > 0 and a kernel size "between 0 and block_size".',
    example='    "dflash_config": {"block_size": 16, "conv_kernel_size": 4}\n\n(no conv_group_size).',
)


# ---------------------------------------------------------------- checks


def conv_geometry(ctx: Context) -> None:
    d = ctx.config.dflash
    taps, group = d.conv_kernel_size, d.conv_group_size
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
    for key, value in (("conv_kernel_size", taps), ("conv_group_size", group)):
        if value is not None and value < 0:
            ctx.emit_for(
                "LC116",
                readers,
                f"dflash_config.{key} is {value}",
                file="config.json",
                pointer=f"$.dflash_config.{key}",
                expected=">= 0",
                actual=value,
            )
    t, gsz = taps or 0, group or 0
    if (t > 0) != (gsz > 0):
        strict = [p for p in readers if p.conv_keys_both_or_neither or t > 0]
        shown = [("absent" if v is None else v) for v in (taps, group)]
        ctx.emit_for(
            "LC116",
            strict,
            f"conv_kernel_size is {shown[0]} and conv_group_size is {shown[1]}: both or neither",
            file="config.json",
            pointer="$.dflash_config.conv_kernel_size",
            expected="both > 0 or both 0",
            actual=f"{shown[0]}/{shown[1]}",
        )
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
