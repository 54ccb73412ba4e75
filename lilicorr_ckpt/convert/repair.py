"""Dequantize a module that must stay floating point, a block of rows at a time (numpy, no torch).

NVFP4: W = lut[code] * fp32(weight_scale) * weight_scale_2   (ModelOpt's NVFP4QTensor)
FP8:   W = fp32(weight) * weight_scale   (scalar, per output channel, or per 128x128 block)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, ExpectedTensor, Manifest, QuantScheme
from lilicorr_ckpt.checkpoint.numerics import bf16_bits, decode, e2m1_decode, e4m3_decode, scale_defects
from lilicorr_ckpt.checkpoint.tensors import TensorInfo

CHUNK_ELEMENTS = 4 << 20  # rows per block are chosen so one block holds about this many weights

Reader = Callable[[TensorInfo, int, int], bytes]  # (tensor, byte offset inside it, length) -> bytes

# packed byte -> its two E2M1 values (low nibble first), numerics' decoding (code 0b1000 is +0.0, as in ModelOpt)
_BYTES = np.arange(256, dtype=np.uint8)
PAIRS = e2m1_decode(np.stack([_BYTES & 0x0F, _BYTES >> 4], axis=1))  # [256, 2]


def nvfp4_rows(packed: np.ndarray, scale_codes: np.ndarray, scale_2: float, group_size: int) -> np.ndarray:
    """W = lut[code] * fp32(weight_scale) * weight_scale_2 for a block of rows, as float32 [n, i]."""
    n = packed.shape[0]
    values = PAIRS[packed].reshape(n, scale_codes.shape[1], group_size)  # one gather: byte -> 2 values
    values *= (e4m3_decode(scale_codes) * np.float32(scale_2))[..., None]
    return values.reshape(n, -1)


class BadScales(ValueError):
    """A quantized module's scales break numerics' scale policy, or decode to weights that are not finite."""


def _check_decoded(values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        bad = int(values.size - np.isfinite(values).sum())
        raise BadScales(f"{what}: {bad} dequantized weights are NaN or infinite (their scales overflow); "
                        "the source checkpoint is corrupt")
    return values


def encode_with_error(values: np.ndarray, dtype: str) -> tuple[bytes, float]:
    """(encoded bytes, largest |rounding error|) for float32 values written as `dtype`."""
    if dtype == "F32":
        return values.astype("<f4").tobytes(), 0.0
    if dtype == "BF16":
        bits = bf16_bits(values)
        back = bits.astype(np.uint32)
        back <<= 16
        diff = back.view(np.float32)
    else:
        bits = values.astype("<f2")
        diff = bits.astype(np.float32)
    diff -= values
    worst = float(np.nanmax(np.abs(diff))) if diff.size else 0.0
    return bits.tobytes(), worst if np.isfinite(worst) else 0.0


def dequantize_blocks(kind: str, inputs: dict[str, TensorInfo], out_shape: tuple[int, int], out_dtype: str,
                      read: Reader, group_size: int) -> Iterator[tuple[bytes, float]]:
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
            raise BadScales(f"{name}: weight_scale_2 is {scale_2:g} ({defects.describe()}; it is amax / (6 * 448)); "
                            "the source checkpoint is corrupt")
        packed_row, scale_row = cols // 2, cols // group_size
        defects = scale_defects(decode(read(scale, r0 * scale_row, min(block_rows, rows - r0) * scale_row), "F8_E4M3")
                                for r0 in range(0, rows, block_rows))
        if defects:
            raise BadScales(f"{name}: {defects.describe()} weight_scale block scales (they are clamped to "
                            "[2^-9, 448]); the source checkpoint is corrupt")
        for r0 in range(0, rows, block_rows):
            n = min(block_rows, rows - r0)
            packed = np.frombuffer(read(weight, r0 * packed_row, n * packed_row), dtype=np.uint8).reshape(n, packed_row)
            codes = np.frombuffer(read(scale, r0 * scale_row, n * scale_row), dtype=np.uint8).reshape(n, scale_row)
            yield encode_with_error(_check_decoded(nvfp4_rows(packed, codes, scale_2, group_size), name), out_dtype)
        return
    # fp8
    scale_values = decode(read(scale, 0, scale.nbytes), scale.dtype)
    defects = scale_defects([scale_values])
    if defects:
        raise BadScales(f"{name}: weight_scale holds {defects.describe()} values; the source checkpoint is corrupt")
    if len(scale.shape) == 4:  # [rows/128, 1, cols/128, 1]
        block = scale_values.reshape(scale.shape[0], scale.shape[2])
        block_rows = max(128, block_rows - block_rows % 128)
    for r0 in range(0, rows, block_rows):
        n = min(block_rows, rows - r0)
        codes = np.frombuffer(read(weight, r0 * cols, n * cols), dtype=np.uint8).reshape(n, cols)
        values = e4m3_decode(codes)
        if scale_values.size == 1:
            values = values * scale_values.reshape(())
        elif len(scale.shape) == 4:
            row_block = np.arange(r0, r0 + n) // 128
            values = values * np.repeat(block[row_block], 128, axis=1)[:, :cols]
        else:
            values = values * scale_values[r0:r0 + n, None]
        yield encode_with_error(_check_decoded(values.astype(np.float32), name), out_dtype)


REPAIR_INPUTS = ("weight", "weight_scale", "weight_scale_2")  # input_scale is dropped, never read


def expected_inputs(manifest: Manifest, module: str, scheme: QuantScheme) -> dict[str, ExpectedTensor]:
    """suffix -> the tensor a repair of `module` reads, as the manifest lays out `scheme`."""
    form = manifest.quantized_form(module, scheme)
    return {suffix: form[f"{module}.{suffix}"] for suffix in REPAIR_INPUTS if f"{module}.{suffix}" in form}


def input_fits(expected: ExpectedTensor, info: TensorInfo) -> bool:
    """The manifest's shape, and its dtype; a float scale may be stored in any float dtype (it is decoded)."""
    dtype_ok = info.dtype in expected.dtypes or (expected.dtypes <= FLOAT_DTYPES and info.dtype in FLOAT_DTYPES)
    return dtype_ok and expected.shape_ok(info.shape)
