"""checkpoint/numerics.py, the one numpy codec module: NVFP4 and FP8 dequantization as repairs call it (a block of
rows at a time) equals the whole-tensor decoding, the definition, and the runtime's torch twins."""

from __future__ import annotations

import numpy as np
import pytest

from lilicorr_ckpt.checkpoint.numerics import (
    E4M3_TABLE,
    bf16_bits,
    e2m1_decode,
    e4m3_decode,
    e4m3_encode,
    e4m3_is_nan,
    encode_with_error,
    fp8_dequantize,
    from_bf16_bits,
    nvfp4_dequantize,
    nvfp4_quantize,
    unpack_nibbles,
)

RNG = np.random.default_rng(7)


def test_nvfp4_dequantize_is_the_definition_whole_and_by_rows():
    weight = RNG.normal(size=(40, 64)).astype(np.float32)
    packed, codes, scale_2 = nvfp4_quantize(weight, 16)
    definition = (
        e2m1_decode(unpack_nibbles(packed)).reshape(40, 4, 16)
        * (e4m3_decode(codes) * np.float32(scale_2))[..., None]
    ).reshape(40, 64)
    whole = nvfp4_dequantize(packed, codes, scale_2, 16)
    assert whole.dtype == np.float32 and np.array_equal(whole, definition)
    by_rows = np.concatenate(
        [nvfp4_dequantize(packed[r : r + 7], codes[r : r + 7], scale_2, 16) for r in range(0, 40, 7)]
    )
    assert np.array_equal(by_rows, whole)
    assert not np.signbit(
        nvfp4_dequantize(np.array([[0x88]], np.uint8), np.array([[0x38]], np.uint8), 1.0, 2)
    ).any()


SCALES = {
    "scalar": lambda o, i: RNG.uniform(0.01, 1, size=()).astype(np.float32),
    "per-channel": lambda o, i: RNG.uniform(0.01, 1, size=(o,)).astype(np.float32),
    "per-channel [o, 1]": lambda o, i: RNG.uniform(0.01, 1, size=(o, 1)).astype(np.float32),
    "128x128 blocks": lambda o, i: RNG.uniform(0.01, 1, size=(-(-o // 128), 1, -(-i // 128), 1)).astype(
        np.float32
    ),
}


def _fp8_definition(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    o, i = codes.shape
    out = np.empty((o, i), np.float32)
    for r in range(o):
        for c in range(i):
            if scale.size == 1:
                s = scale.reshape(())
            elif scale.ndim == 4:
                s = scale[r // 128, 0, c // 128, 0]
            else:
                s = scale.reshape(-1)[r]
            out[r, c] = E4M3_TABLE[codes[r, c]] * s
    return out


@pytest.mark.parametrize("layout", list(SCALES))
def test_fp8_dequantize_is_the_definition_whole_and_by_row_blocks(layout):
    o, i = 300, 140  # neither a multiple of 128
    codes = e4m3_encode(RNG.normal(size=(o, i)).astype(np.float32) * 50)
    scale = SCALES[layout](o, i)
    whole = fp8_dequantize(codes, scale)
    assert whole.dtype == np.float32 and np.array_equal(whole, _fp8_definition(codes, scale))
    step = 128 if layout == "128x128 blocks" else 37  # repairs cut block scales at whole 128-row bands
    by_rows = np.concatenate(
        [fp8_dequantize(codes[r : r + step], scale, first_row=r) for r in range(0, o, step)]
    )
    assert np.array_equal(by_rows, whole)


@pytest.mark.parametrize("layout", list(SCALES))
def test_the_runtime_torch_twins_decode_the_same(layout):
    torch = pytest.importorskip("torch")
    from lilicorr_runtime.model import codecs

    o, i = 260, 130
    codes = e4m3_encode(RNG.normal(size=(o, i)).astype(np.float32) * 20)
    scale = SCALES[layout](o, i)
    theirs = codecs.fp8_dequantize(torch.from_numpy(codes).view(torch.float8_e4m3fn), torch.from_numpy(scale))
    assert np.array_equal(theirs.numpy(), fp8_dequantize(codes, scale))
    packed, block_codes, scale_2 = nvfp4_quantize(RNG.normal(size=(8, 32)).astype(np.float32), 16)
    theirs = codecs.nvfp4_dequantize(
        torch.from_numpy(packed), torch.from_numpy(block_codes).view(torch.float8_e4m3fn), float(scale_2), 16
    )
    assert np.array_equal(theirs.numpy(), nvfp4_dequantize(packed, block_codes, scale_2, 16))


def test_e4m3_nan_codes_are_0x7f_and_0xff():
    codes = np.arange(256, dtype=np.uint8)
    assert list(codes[e4m3_is_nan(codes)]) == [0x7F, 0xFF]
    assert np.array_equal(e4m3_is_nan(codes), np.isnan(e4m3_decode(codes)))


def test_encode_with_error_rounds_and_reports_the_largest_error():
    values = np.array([1.0, 1.00390625, 3.14159, -2.5e-3, np.nan], np.float32)
    data, worst = encode_with_error(values, "BF16")
    assert data == bf16_bits(values).tobytes()
    back = from_bf16_bits(np.frombuffer(data, "<u2"))
    assert worst == pytest.approx(float(np.nanmax(np.abs(back - values))))
    assert encode_with_error(values[:4], "F32") == (values[:4].astype("<f4").tobytes(), 0.0)
    data, worst = encode_with_error(values[:4], "F16")
    assert data == values[:4].astype("<f2").tobytes() and 0 < worst < 1e-3
