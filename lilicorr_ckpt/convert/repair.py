"""Dequantize a module that must stay floating point, a block of rows at a time (numpy, no torch): the source's
bytes read a block at a time, checked by the scale policy and decoded by checkpoint/numerics' codecs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, ExpectedTensor, Manifest, QuantScheme
from lilicorr_ckpt.checkpoint.numerics import (
    decode,
    encode_with_error,
    fp8_dequantize,
    nvfp4_dequantize,
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
        scale_2_info = inputs["weight_scale_2"]
        scale_2 = float(decode(read(scale_2_info, 0, scale_2_info.nbytes), scale_2_info.dtype)[0])
        # as ModelOpt quantizes: weight_scale_2 = amax(W) / (6 * 448), block scales clamped to [2^-9, 448]
        defects = scale_defects([np.float32(scale_2)])
        if defects:
            raise BadScales(
                f"{name}: weight_scale_2 is {scale_2:g} ({defects.describe()}; it is amax / (6 * 448)); "
                "the source checkpoint is corrupt"
            )
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
