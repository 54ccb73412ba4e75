"""Dequantize a module that must stay floating point, a block of rows at a time (numpy, no torch): the source's
bytes read a block at a time, checked by the scale policy and decoded by checkpoint/numerics' codecs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec
import numpy as np

from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, ExpectedTensor, Manifest, QuantScheme
from lilicorr_ckpt.checkpoint.numerics import (
    decode,
    encode_with_error,
    fp8_dequantize,
    nvfp4_block_scale_codes,
    nvfp4_dequantize,
    nvfp4_quantize,
    scale_defects,
)
from lilicorr_ckpt.checkpoint.tensors import TensorInfo

CHUNK_ELEMENTS = 4 << 20  # rows per block are chosen so one block holds about this many weights

Reader = Callable[[TensorInfo, int, int], bytes]  # (tensor, byte offset inside it, length) -> bytes


class BadScales(ValueError):
    """A quantized module's scales break numerics' scale policy, or decode to weights that are not finite."""


def _check_decoded(values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        bad = int(values.size - np.isfinite(values).sum())
        raise BadScales(
            f"{what}: {bad} dequantized weights are NaN or infinite (their scales overflow); "
            "the source checkpoint is corrupt"
        )
    return values


def dequantize_blocks(
    kind: str,
    inputs: dict[str, TensorInfo],
    out_shape: tuple[int, int],
    out_dtype: str,
    read: Reader,
    group_size: int,
) -> Iterator[tuple[bytes, float]]:
    """Yield (encoded rows, largest rounding error in them) for the float weight of one module."""
    rows, cols = out_shape
    weight = inputs["weight"]
    scale = inputs["weight_scale"]
    block_rows = max(1, CHUNK_ELEMENTS // max(cols, 1))
    name = weight.name.removesuffix(".weight")
    if kind == "nvfp4":
        scale_2 = nvfp4_scale_2(inputs, read, name)
        for _, _, packed, codes in _nvfp4_rows(inputs, out_shape, read, group_size, block_rows, name):
            yield encode_with_error(
                _check_decoded(nvfp4_dequantize(packed, codes, scale_2, group_size), name), out_dtype
            )
        return
    # fp8
    scale_values = decode(read(scale, 0, scale.nbytes), scale.dtype)
    defects = scale_defects([scale_values])
    if defects:
        raise BadScales(
            f"{name}: weight_scale holds {defects.describe()} values; the source checkpoint is corrupt"
        )
    if len(scale.shape) == 4:  # [rows/128, 1, cols/128, 1]: blocks of whole 128-row bands
        block_rows = max(128, block_rows - block_rows % 128)
    scale_values = scale_values.reshape(scale.shape)
    for r0 in range(0, rows, block_rows):
        n = min(block_rows, rows - r0)
        codes = np.frombuffer(read(weight, r0 * cols, n * cols), dtype=np.uint8).reshape(n, cols)
        yield encode_with_error(
            _check_decoded(fp8_dequantize(codes, scale_values, first_row=r0), name), out_dtype
        )


def nvfp4_scale_2(inputs: dict[str, TensorInfo], read: Reader, name: str) -> float:
    """The module's weight_scale_2, checked by the scale policy."""
    info = inputs["weight_scale_2"]
    scale_2 = float(decode(read(info, 0, info.nbytes), info.dtype)[0])
    # as ModelOpt quantizes: weight_scale_2 = amax(W) / (6 * 448), block scales clamped to [2^-9, 448]
    defects = scale_defects([np.float32(scale_2)])
    if defects:
        raise BadScales(
            f"{name}: weight_scale_2 is {scale_2:g} ({defects.describe()}; it is amax / (6 * 448)); "
            "the source checkpoint is corrupt"
        )
    return scale_2


def _nvfp4_rows(
    inputs: dict[str, TensorInfo],
    out_shape: tuple[int, int],
    read: Reader,
    group_size: int,
    block_rows: int,
    name: str,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(first row, rows, packed codes, block scale codes) a block of rows at a time, after the block scales have
    been checked by the scale policy (all of them, before the first block is yielded)."""
    rows, cols = out_shape
    weight, scale = inputs["weight"], inputs["weight_scale"]
    packed_row, scale_row = cols // 2, cols // group_size
    defects = scale_defects(
        decode(read(scale, r0 * scale_row, min(block_rows, rows - r0) * scale_row), "F8_E4M3")
        for r0 in range(0, rows, block_rows)
    )
    if defects:
        raise BadScales(
            f"{name}: {defects.describe()} weight_scale block scales (they are clamped to "
            "[2^-9, 448]); the source checkpoint is corrupt"
        )
    for r0 in range(0, rows, block_rows):
        n = min(block_rows, rows - r0)
        packed = np.frombuffer(read(weight, r0 * packed_row, n * packed_row), dtype=np.uint8).reshape(
            n, packed_row
        )
        codes = np.frombuffer(read(scale, r0 * scale_row, n * scale_row), dtype=np.uint8).reshape(
            n, scale_row
        )
        yield r0, n, packed, codes


class Requantized(msgspec.Struct, kw_only=True):
    """What re-quantizing one block of rows did: the largest |new - old| of the dequantized weights, and the
    largest |old| (the scale it is measured against)."""

    max_abs_error: float
    max_abs_weight: float


REQUANTIZED_PARTS = ("weight", "weight_scale")


def requantize_blocks(
    inputs: dict[str, TensorInfo],
    out_shape: tuple[int, int],
    read: Reader,
    group_size: int,
    shared_scale_2: float,
    part: str,
) -> Iterator[tuple[bytes, Requantized]]:
    """Re-quantize one NVFP4 shard against its fused group's shared weight_scale_2, a block of rows at a time:
    its weights are dequantized exactly as stored (numerics.nvfp4_dequantize: what a runtime serving the shard
    alone computes), then quantized again as ModelOpt quantizes (nvfp4_quantize with that weight_scale_2), so each
    block scale is the nearest e4m3 to amax_block / (6 * shared) and each weight the nearest E2M1 multiple of it.
    Yields `part` (the packed weight, or the e4m3 block scale codes) of each block, with the block's error."""
    if part not in REQUANTIZED_PARTS:
        raise ValueError(f"part must be one of {REQUANTIZED_PARTS}, got {part!r}")
    rows, cols = out_shape
    block_rows = max(1, CHUNK_ELEMENTS // max(cols, 1))
    name = inputs["weight"].name.removesuffix(".weight")
    scale_2 = nvfp4_scale_2(inputs, read, name)
    for _, _, packed, codes in _nvfp4_rows(inputs, out_shape, read, group_size, block_rows, name):
        old = _check_decoded(nvfp4_dequantize(packed, codes, scale_2, group_size), name)
        amax = float(np.abs(old).max()) if old.size else 0.0
        if part == "weight_scale":  # the block scales alone (the weight's pass measures the error)
            new_codes = nvfp4_block_scale_codes(old, shared_scale_2, group_size)
            yield new_codes.tobytes(), Requantized(max_abs_error=0.0, max_abs_weight=amax)
            continue
        new_packed, new_codes, _ = nvfp4_quantize(old, group_size, weight_scale_2=shared_scale_2)
        new = nvfp4_dequantize(new_packed, new_codes, shared_scale_2, group_size)
        error = float(np.abs(new - old).max()) if old.size else 0.0
        yield new_packed.tobytes(), Requantized(max_abs_error=error, max_abs_weight=amax)


REPAIR_INPUTS = ("weight", "weight_scale", "weight_scale_2")  # input_scale is dropped, never read


def expected_inputs(manifest: Manifest, module: str, scheme: QuantScheme) -> dict[str, ExpectedTensor]:
    """suffix -> the tensor a repair of `module` reads, as the manifest lays out `scheme`."""
    form = manifest.quantized_form(module, scheme)
    return {suffix: form[f"{module}.{suffix}"] for suffix in REPAIR_INPUTS if f"{module}.{suffix}" in form}


def input_fits(expected: ExpectedTensor, info: TensorInfo) -> bool:
    """The manifest's shape, and its dtype; a float scale may be stored in any float dtype (it is decoded)."""
    dtype_ok = info.dtype in expected.dtypes or (
        expected.dtypes <= FLOAT_DTYPES and info.dtype in FLOAT_DTYPES
    )
    return dtype_ok and expected.shape_ok(info.shape)
