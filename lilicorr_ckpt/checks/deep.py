"""Deep rules (LC7xx, `validate --deep`): read tensor data memory-mapped, in bounded chunks, for NaN/Inf,
all-zero weights and bad scales."""

from __future__ import annotations

import mmap

import numpy as np

from lilicorr_ckpt.checkpoint.numerics import DECODABLE, ScaleDefects, decode, e4m3_is_nan, scale_defects
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
DEEP = "deep"
rule(
    "LC701",
    "non-finite",
    "error",
    DEEP,
    "A tensor contains NaN or Inf.",
    "Re-export from a healthy training checkpoint.",
    doc="With `--deep`, scans every floating-point tensor's data (memory-mapped, in 16 MiB chunks) and fires "
    "for each one that holds a NaN or an infinity; for F8_E4M3 tensors the NaN code (0x7F / 0xFF).",
    why="A non-finite weight spreads to every activation it touches: the draft proposes nothing useful and "
    "acceptance collapses, while every loader loads it without complaint.",
    example="    `lilicorr.out_head.weight` contains NaN or Inf",
)
rule(
    "LC702",
    "all-zero",
    "warning",
    DEEP,
    "A weight tensor is all zeros (untrained or lost in export).",
    "Check the export; an all-zero kernel_projection is the untrained initialisation.",
    doc="With `--deep`, fires for a weight-like tensor (a `.weight`, `in_proj_weight`, `base_kernel`, "
    "`slot_embedding` or `rank_embedding`, not a norm) whose bytes are all zero (-0.0 counts as zero).",
    why="It loads everywhere, and the module outputs nothing (or only its bias): usually an untrained module "
    "or one lost in export. An all-zero convolution kernel_projection is the convolution's untrained "
    "initialisation.",
    example="    `lilicorr.in_head.weight` is all zeros",
)
rule(
    "LC703",
    "all-zero-scale",
    "error",
    DEEP,
    "A quantization scale tensor is all zeros: the module dequantizes to zero and outputs only its bias.",
    "Re-export the module; ModelOpt clamps NVFP4 weight_scale to [2^-9, 448] and derives the other scales from "
    "non-zero amax values.",
    doc="With `--deep`, fires for a quantization scale tensor (`weight_scale`, `weight_scale_2`, "
    "`input_scale`) whose values are all zero.",
    why="A zero weight scale dequantizes the whole weight to zero, so the module outputs only its bias; a "
    "zero input_scale quantizes its activations with a zero scale. The checkpoint loads everywhere and "
    "serves a broken module.",
    example="    lilicorr.pass_hidden_proj.weight_scale_2   F32 []   0.0",
)
rule(
    "LC704",
    "negative-scale",
    "error",
    DEEP,
    "A quantization scale holds negative values: the weights (or activations) it scales change sign.",
    "Re-export the module; every ModelOpt scale is an amax ratio (>= 0), and NVFP4 block scales are clamped to "
    "[2^-9, 448].",
    doc="With `--deep`, fires for a quantization scale tensor (`weight_scale`, `weight_scale_2`, "
    "`input_scale`) that holds a negative non-zero value (for F8_E4M3 scales: a set sign bit on a "
    "non-zero code).",
    why="Every ModelOpt scale is an amax ratio and cannot be negative; a negative scale flips the sign of the "
    "weights (or activations) it applies to, silently, on every runtime.",
    example="    lilicorr.token_proj.weight_scale_2   F32 []   -0.001",
)


SCALES = ("weight_scale", "weight_scale_2", "input_scale")  # quantization scales
CHUNK = 16 << 20  # bytes per step; memory stays bounded whatever the tensor size
# (dtype, bit mask, all-ones exponent): a value is NaN/Inf when (bits & mask) == mask
_NON_FINITE = {
    "BF16": (np.uint16, 0x7F80),
    "F16": (np.uint16, 0x7C00),
    "F32": (np.uint32, 0x7F800000),
    "F64": (np.uint64, 0x7FF0000000000000),
}


def _scan(view: memoryview, dtype: str) -> tuple[bool, bool]:
    """(has non-finite, all zero) over one tensor's bytes."""
    non_finite = False
    all_zero = True
    spec = _NON_FINITE.get(dtype)
    for begin in range(0, len(view), CHUNK):
        chunk = view[begin : begin + CHUNK]
        if spec is not None:
            item = np.dtype(spec[0]).itemsize
            bits = np.frombuffer(chunk[: len(chunk) // item * item], dtype=spec[0])
            mask = spec[0](spec[1])
            if not non_finite and bool(((bits & mask) == mask).any()):
                non_finite = True
            magnitude = bits << np.uint8(1)  # the sign bit shifted out: -0.0 is zero
            if all_zero and bool(magnitude.any()):
                all_zero = False
        else:
            if dtype == "F8_E4M3":
                codes = np.frombuffer(chunk, dtype=np.uint8)
                if not non_finite and bool(e4m3_is_nan(codes).any()):
                    non_finite = True
            if all_zero and any(chunk.tobytes().strip(b"\x00")):
                all_zero = False
        if non_finite and not all_zero:
            break
    return non_finite, all_zero


def _scale_defects(view: memoryview, dtype: str) -> ScaleDefects:
    """numerics' scale policy over a scale tensor's values, decoded a chunk at a time."""
    # decode reads its input through np.frombuffer, which takes any buffer: the slice is not copied
    chunks = (view[begin : begin + CHUNK] for begin in range(0, len(view), CHUNK))
    return scale_defects(decode(chunk, dtype) for chunk in chunks)  # type: ignore[arg-type]


@check
def deep_checks(ctx: Context) -> None:
    if not ctx.deep:
        return
    by_file: dict[str, list[tuple[str, str]]] = {}
    for canonical, info in ctx.names.by_canonical.items():
        by_file.setdefault(info.file, []).append((canonical, info.name))
    for rel, names in sorted(by_file.items()):
        path = ctx.source.root / rel
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size == 0:
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    for canonical, actual in sorted(names):
                        info = ctx.table.tensors[actual]
                        if info.nbytes == 0:
                            continue
                        leaf = canonical.rsplit(".", 1)[-1]
                        if leaf in SCALES and info.dtype in DECODABLE:
                            defects = _scale_defects(view[info.start : info.end], info.dtype)
                            non_finite, all_zero, negative = (
                                defects.non_finite,
                                defects.all_zero,
                                defects.negative,
                            )
                        else:
                            (non_finite, all_zero), negative = (
                                _scan(view[info.start : info.end], info.dtype),
                                False,
                            )
                        if non_finite:
                            ctx.emit(
                                "LC701",
                                f"`{actual}` contains NaN or Inf",
                                file=rel,
                                pointer=actual,
                                subjects=[actual],
                            )
                        if negative:
                            ctx.emit(
                                "LC704",
                                f"`{actual}` holds negative values: the signs of "
                                f"`{canonical.rsplit('.', 1)[0]}`'s {'activations' if leaf == 'input_scale' else 'weights'} "
                                "flip where it applies",
                                file=rel,
                                pointer=actual,
                                subjects=[actual],
                            )
                        weightish = (
                            leaf
                            in ("weight", "in_proj_weight", "base_kernel", "slot_embedding", "rank_embedding")
                            and "norm" not in canonical
                        )
                        if all_zero and leaf in SCALES:
                            module = canonical.rsplit(".", 1)[0]
                            effect = (
                                "its activations are quantized with a zero scale"
                                if leaf == "input_scale"
                                else "its weight dequantizes to zero, so it outputs only its bias"
                            )
                            ctx.emit(
                                "LC703",
                                f"`{actual}` is all zeros: {effect} (`{module}`)",
                                file=rel,
                                pointer=actual,
                                subjects=[actual],
                            )
                        elif all_zero and weightish:
                            ctx.emit(
                                "LC702",
                                f"`{actual}` is all zeros",
                                file=rel,
                                pointer=actual,
                                subjects=[actual],
                            )
                finally:
                    view.release()
