"""Dequantize a module that must stay floating point, a block of rows at a time (numpy, no torch).

NVFP4: W = lut[code] * fp32(weight_scale) * weight_scale_2   (shared/docs/modelopt_nvfp4.md §2.3)
FP8:   W = fp32(weight) * weight_scale   (scalar, per output channel, or per 128x128 block)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..numerics import bf16_bits, e4m3_decode, from_bf16_bits, nvfp4_dequantize
from ..tensors import TensorInfo

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


def encode_float(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return bf16_bits(values).tobytes()
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    raise ValueError(f"cannot write repaired weights as {dtype}")


def rounding_error(values: np.ndarray, dtype: str) -> float:
    if dtype == "BF16":
        back = from_bf16_bits(bf16_bits(values))
    elif dtype == "F16":
        back = values.astype(np.float16).astype(np.float32)
    else:
        return 0.0
    finite = np.isfinite(values)
    return float(np.abs(back[finite] - values[finite]).max()) if finite.any() else 0.0


def _read_all(read: Reader, info: TensorInfo) -> bytes:
    return read(info, 0, info.nbytes)


def dequantize_blocks(kind: str, inputs: dict[str, TensorInfo], out_shape: tuple[int, int], out_dtype: str,
                      read: Reader, group_size: int) -> Iterator[tuple[bytes, float]]:
    """Yield (encoded rows, largest rounding error in them) for the float weight of one module."""
    rows, cols = out_shape
    weight = inputs["weight"]
    scale = inputs["weight_scale"]
    block_rows = max(1, CHUNK_ELEMENTS // max(cols, 1))
    if kind == "nvfp4":
        scale_2 = float(decode_float(_read_all(read, inputs["weight_scale_2"]), inputs["weight_scale_2"].dtype)[0])
        packed_row, scale_row = cols // 2, cols // group_size
        for r0 in range(0, rows, block_rows):
            n = min(block_rows, rows - r0)
            packed = np.frombuffer(read(weight, r0 * packed_row, n * packed_row), dtype=np.uint8).reshape(n, packed_row)
            codes = np.frombuffer(read(scale, r0 * scale_row, n * scale_row), dtype=np.uint8).reshape(n, scale_row)
            # + 0.0 turns the -0.0 of code 0b1000 into +0.0, as ModelOpt's E2M1 table does
            values = nvfp4_dequantize(packed, codes, scale_2, group_size) + np.float32(0.0)
            yield encode_float(values, out_dtype), rounding_error(values, out_dtype)
        return
    # fp8
    scale_values = decode_float(_read_all(read, scale), scale.dtype)
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
        values = values.astype(np.float32)
        yield encode_float(values, out_dtype), rounding_error(values, out_dtype)


def expected_inputs(kind: str, out_shape: tuple[int, int], group_size: int) -> dict[str, tuple[set[str], list[tuple]]]:
    """suffix -> (allowed dtypes, allowed shapes) of the tensors a repair reads."""
    o, i = out_shape
    if kind == "nvfp4":
        return {"weight": ({"U8"}, [(o, i // 2)]),
                "weight_scale": ({"F8_E4M3"}, [(o, i // group_size)]),
                "weight_scale_2": ({"F32", "BF16", "F16"}, [(), (1,)])}
    return {"weight": ({"F8_E4M3"}, [(o, i)]),
            "weight_scale": ({"F32", "BF16", "F16"}, [(), (1,), (o,), (o, 1), (-(-o // 128), 1, -(-i // 128), 1)])}
