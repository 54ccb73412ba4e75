"""Dequantize a module that must stay floating point, a block of rows at a time (numpy, no torch).

NVFP4: W = lut[code] * fp32(weight_scale) * weight_scale_2   (ModelOpt's NVFP4QTensor)
FP8:   W = fp32(weight) * weight_scale   (scalar, per output channel, or per 128x128 block)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from lilicorr_ckpt.checkpoint.numerics import E2M1_VALUES, bf16_bits, e4m3_decode, from_bf16_bits
from lilicorr_ckpt.checkpoint.tensors import TensorInfo

CHUNK_ELEMENTS = 4 << 20  # rows per block are chosen so one block holds about this many weights

Reader = Callable[[TensorInfo, int, int], bytes]  # (tensor, byte offset inside it, length) -> bytes


def decode_float(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        return from_bf16_bits(np.frombuffer(raw, dtype="<u2"))
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8").astype(np.float32)
    raise ValueError(f"not a float dtype: {dtype}")


def _pair_table() -> np.ndarray:
    """packed byte -> its two E2M1 values (low nibble first); code 0b1000 decodes to +0.0 as in ModelOpt."""
    values = np.where(np.arange(16) & 8, -1.0, 1.0).astype(np.float32) * E2M1_VALUES[np.arange(16) & 7]
    values[8] = 0.0
    byte = np.arange(256)
    return np.stack([values[byte & 0x0F], values[byte >> 4]], axis=1).astype(np.float32)


PAIRS = _pair_table()  # [256, 2]


def nvfp4_rows(packed: np.ndarray, scale_codes: np.ndarray, scale_2: float, group_size: int) -> np.ndarray:
    """W = lut[code] * fp32(weight_scale) * weight_scale_2 for a block of rows, as float32 [n, i]."""
    n = packed.shape[0]
    values = PAIRS[packed].reshape(n, scale_codes.shape[1], group_size)  # one gather: byte -> 2 values
    values *= (e4m3_decode(scale_codes) * np.float32(scale_2))[..., None]
    return values.reshape(n, -1)


class BadScales(ValueError):
    """A quantized module's scales decode to weights that are not finite, or carry a sign they never have."""


def _check_decoded(values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        bad = int(values.size - np.isfinite(values).sum())
        raise BadScales(f"{what}: {bad} dequantized weights are NaN or infinite (a NaN or infinite scale); "
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


def _read_all(read: Reader, info: TensorInfo) -> bytes:
    return read(info, 0, info.nbytes)


def dequantize_blocks(kind: str, inputs: dict[str, TensorInfo], out_shape: tuple[int, int], out_dtype: str,
                      read: Reader, group_size: int) -> Iterator[tuple[bytes, float]]:
    """Yield (encoded rows, largest rounding error in them) for the float weight of one module."""
    rows, cols = out_shape
    weight = inputs["weight"]
    scale = inputs["weight_scale"]
    block_rows = max(1, CHUNK_ELEMENTS // max(cols, 1))
    name = weight.name.removesuffix(".weight")
    if kind == "nvfp4":
        scale_2 = float(decode_float(_read_all(read, inputs["weight_scale_2"]), inputs["weight_scale_2"].dtype)[0])
        # as ModelOpt quantizes: weight_scale_2 = amax(W) / (6 * 448), block scales clamped to [2^-9, 448]
        if not np.isfinite(scale_2) or scale_2 < 0:
            raise BadScales(f"{name}: weight_scale_2 is {scale_2:g} (it is amax / (6 * 448): finite and >= 0); "
                            "the source checkpoint is corrupt")
        packed_row, scale_row = cols // 2, cols // group_size
        for r0 in range(0, rows, block_rows):
            n = min(block_rows, rows - r0)
            packed = np.frombuffer(read(weight, r0 * packed_row, n * packed_row), dtype=np.uint8).reshape(n, packed_row)
            codes = np.frombuffer(read(scale, r0 * scale_row, n * scale_row), dtype=np.uint8).reshape(n, scale_row)
            if (codes & 0x80).any():
                raise BadScales(f"{name}: negative weight_scale block scales (they are clamped to [2^-9, 448]); "
                                "the source checkpoint is corrupt")
            yield encode_with_error(_check_decoded(nvfp4_rows(packed, codes, scale_2, group_size), name), out_dtype)
        return
    # fp8
    scale_values = decode_float(_read_all(read, scale), scale.dtype)
    if not np.isfinite(scale_values).all() or (scale_values < 0).any():
        raise BadScales(f"{name}: weight_scale holds NaN, infinite or negative values; the source checkpoint is "
                        "corrupt")
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


def expected_inputs(kind: str, out_shape: tuple[int, int], group_size: int) -> dict[str, tuple[set[str], list[tuple]]]:
    """suffix -> (allowed dtypes, allowed shapes) of the tensors a repair reads."""
    o, i = out_shape
    if kind == "nvfp4":
        return {"weight": ({"U8"}, [(o, i // 2)]),
                "weight_scale": ({"F8_E4M3"}, [(o, i // group_size)]),
                "weight_scale_2": ({"F32", "BF16", "F16"}, [(), (1,)])}
    return {"weight": ({"F8_E4M3"}, [(o, i)]),
            "weight_scale": ({"F32", "BF16", "F16"}, [(), (1,), (o,), (o, 1), (-(-o // 128), 1, -(-i // 128), 1)])}
