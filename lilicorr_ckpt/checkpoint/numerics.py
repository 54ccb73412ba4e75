"""The numpy codecs for the dtypes drafter checkpoints carry (bf16, float8_e4m3fn, NVFP4's E2M1 pairs), and the
one scale policy. Every numpy decoding of tensor bytes is here: validate --deep, convert's repairs and the
fixtures call these, and lilicorr_runtime/model/codecs.py holds torch twins of the dequantizers (same names, same
signatures) that the tests compare with them.

NVFP4 follows ModelOpt's NVFP4QTensor: element 2j in the low
nibble, 2j+1 in the high nibble; code = sign<<3 | index into {0, .5, 1, 1.5, 2, 3, 4, 6};
weight_scale_2 = amax(W) / (6*448); block scale = amax_block / (6*weight_scale_2) stored as e4m3;
W = lut[code] * fp32(weight_scale) * weight_scale_2.
FP8: W = fp32(weight) * weight_scale (a scalar, one per output channel, or one per 128x128 block).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import numpy as np

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E4M3_MAX = 448.0
E4M3_MIN_SCALE = 2.0**-9


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def decode(raw: bytes, dtype: str) -> np.ndarray:
    """Little-endian safetensors bytes of a float dtype (F32, F16, BF16, F64, F8_E4M3) -> float32 values."""
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        return from_bf16_bits(np.frombuffer(raw, dtype="<u2"))
    if dtype == "F64":
        return np.frombuffer(raw, dtype="<f8").astype(np.float32)
    if dtype == "F8_E4M3":
        return e4m3_decode(np.frombuffer(raw, dtype=np.uint8))
    raise ValueError(f"not a float dtype: {dtype}")


DECODABLE = frozenset({"F32", "F16", "BF16", "F64", "F8_E4M3"})


def encode_with_error(values: np.ndarray, dtype: str) -> tuple[bytes, float]:
    """float32 values -> (little-endian bytes of `dtype`: F32, BF16 or F16; the largest |rounding error|)."""
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


class ScaleDefects(msgspec.Struct, frozen=True):
    """What makes a tensor of quantization scales unusable: the one policy, applied by validate --deep, convert's
    repairs and the runtime's loader. A scale is an amax ratio: finite and >= 0 (-0.0 is zero, not negative); a
    tensor whose scales are all zero dequantizes its module to zero (it outputs only its bias)."""

    non_finite: bool = False
    negative: bool = False
    all_zero: bool = False

    def __bool__(self) -> bool:
        return self.non_finite or self.negative or self.all_zero

    def describe(self) -> str:
        return ", ".join(
            what
            for flag, what in (
                (self.non_finite, "NaN or infinite"),
                (self.negative, "negative"),
                (self.all_zero, "all zero"),
            )
            if flag
        )


def scale_defects(chunks: Iterable[np.ndarray]) -> ScaleDefects:
    """The policy over one scale tensor's decoded values, given whole or in chunks."""
    non_finite = negative = False
    all_zero = True
    for values in chunks:
        values = np.asarray(values)
        non_finite = non_finite or not bool(np.isfinite(values).all())
        negative = negative or bool((values < 0).any())  # NaN compares false; -0.0 is not < 0
        all_zero = all_zero and not bool((values != 0).any())  # NaN != 0
    return ScaleDefects(non_finite=non_finite, negative=negative, all_zero=all_zero)


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(exp == 15) & (man == 7)] = np.nan
    return value.astype(np.float32)


E4M3_TABLE = _e4m3_table()
_E4M3_POSITIVE = E4M3_TABLE[:127]  # codes 0x00..0x7E, increasing


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def e4m3_is_nan(codes: np.ndarray) -> np.ndarray:
    """float8_e4m3fn has no infinity; its NaN codes are 0x7F and 0xFF."""
    return (np.asarray(codes, dtype=np.uint8) & 0x7F) == 0x7F


def _nearest_code(mag: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of an increasing table of magnitudes, ties to the even index."""
    hi = np.clip(np.searchsorted(table, mag, side="left"), 0, len(table) - 1)
    lo = np.maximum(hi - 1, 0)
    d_hi = table[hi] - mag
    d_lo = mag - table[lo]
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.where(pick_hi, hi, lo).astype(np.uint8)


def e4m3_encode(values: np.ndarray) -> np.ndarray:
    """float32 -> float8_e4m3fn codes, round to nearest even, saturating at +-448; NaN -> 0x7F."""
    values = np.asarray(values, dtype=np.float32)
    code = _nearest_code(np.minimum(np.abs(values), E4M3_MAX), _E4M3_POSITIVE)
    code = code | np.where(np.signbit(values) & (code != 0), 0x80, 0).astype(np.uint8)
    code[np.isnan(values)] = 0x7F
    return code


# the midpoints between adjacent E2M1 magnitudes; at the k-th, ties go to the even index (k when k is even)
_E2M1_MIDPOINTS = (E2M1_VALUES[:-1] + E2M1_VALUES[1:]) / 2


def _e2m1_index(mag: np.ndarray) -> np.ndarray:
    """_nearest_code(mag, E2M1_VALUES) for magnitudes in [0, 6] (NaN included: index 6, as it gives), by counting
    the midpoints below each value: seven comparisons instead of a search, several times faster."""
    index = np.zeros(mag.shape, dtype=np.uint8)
    for k, mid in enumerate(_E2M1_MIDPOINTS):
        index += (
            mag > mid if k % 2 == 0 else mag >= mid
        )  # a tie at an odd midpoint goes up, to the even index
    index[np.isnan(mag)] = 6
    return index


def e2m1_encode(values: np.ndarray) -> np.ndarray:
    """Already-scaled float32 -> 4-bit codes (uint8 0..15), ties to the even code as ModelOpt does."""
    values = np.asarray(values, dtype=np.float32)
    code = _e2m1_index(np.minimum(np.abs(values), np.float32(6.0)))
    return code | np.where(values < 0, 8, 0).astype(np.uint8)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """4-bit codes -> float32; code 8 (negative zero) decodes to +0.0, as ModelOpt's table does."""
    codes = np.asarray(codes, dtype=np.uint8)
    return np.where(codes & 8, -E2M1_VALUES[codes & 7], E2M1_VALUES[codes & 7]) + np.float32(0.0)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[..., 2n] codes -> [..., n] bytes, element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def nvfp4_quantize(
    weight: np.ndarray,
    group_size: int = 16,
    global_amax: float | None = None,
    *,
    weight_scale_2: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """float32 [o, i] -> (packed uint8 [o, i/2], e4m3 codes [o, i/group], fp32 weight_scale_2). `global_amax` sets
    weight_scale_2 from a shared amax (ModelOpt unifies it across linears a runtime fuses); default: this weight's.
    `weight_scale_2` gives the global scale itself (as NVFP4QTensor.quantize's weights_scaling_factor_2 does): a
    shard re-quantized against its fused group's shared scale. Rows are quantized independently, so any run of
    rows quantizes as it would inside the whole weight."""
    weight = np.asarray(weight, dtype=np.float32)
    o, i = weight.shape
    if i % group_size or i % 2:
        raise ValueError(f"NVFP4 needs in_features divisible by {group_size}, got {i}")
    if weight_scale_2 is not None:
        scale_2 = np.float32(weight_scale_2)
        if not (np.isfinite(scale_2) and scale_2 > 0):
            raise ValueError(f"weight_scale_2 must be finite and positive, got {weight_scale_2!r}")
    else:
        amax = global_amax if global_amax is not None else float(np.abs(weight).max()) if weight.size else 0.0
        scale_2 = np.float32(amax / (6.0 * E4M3_MAX)) if amax > 0 else np.float32(1.0)
    blocks = weight.reshape(o, i // group_size, group_size)
    scale_codes = nvfp4_block_scale_codes(weight, scale_2, group_size)
    effective = e4m3_decode(scale_codes) * scale_2
    scaled = blocks / effective[..., None]
    codes = e2m1_encode(scaled.reshape(o, i))
    return pack_nibbles(codes), scale_codes, scale_2


def nvfp4_block_scale_codes(weight: np.ndarray, scale_2: float, group_size: int = 16) -> np.ndarray:
    """The e4m3 codes [o, i/group] of NVFP4's block scales of float32 `weight` [o, i] for the global scale `scale_2`,
    as nvfp4_quantize (and ModelOpt) sets them: amax_block / (6 * weight_scale_2) rounded to nearest even, 1.0 for
    an all-zero block, clamped to [2^-9, 448]. Cheaper than the whole quantization (no weight is encoded)."""
    weight = np.asarray(weight, dtype=np.float32)
    o, i = weight.shape
    block_amax = np.abs(weight.reshape(o, i // group_size, group_size)).max(axis=-1)
    block_scale = block_amax / (6.0 * np.float32(scale_2))
    block_scale[block_scale == 0] = 1.0  # an all-zero block: ModelOpt stores scale 1.0 (its codes are 0)
    block_scale = np.clip(block_scale, E4M3_MIN_SCALE, E4M3_MAX).astype(np.float32)
    return e4m3_encode(block_scale)


# packed byte -> its two E2M1 values (low nibble first): e2m1_decode's values, code 0b1000 +0.0 as in ModelOpt
_BYTES = np.arange(256, dtype=np.uint8)
NVFP4_PAIRS = e2m1_decode(np.stack([_BYTES & 0x0F, _BYTES >> 4], axis=1))  # [256, 2]


def nvfp4_dequantize(
    packed: np.ndarray, scale_codes: np.ndarray, scale_2: float, group_size: int = 16
) -> np.ndarray:
    """W = lut[code] * fp32(weight_scale) * weight_scale_2, as float32 [o, i], for packed uint8 [o, i/2] and e4m3
    block scale codes [o, i/group]; any run of rows with their scale rows decodes as the whole would."""
    packed = np.asarray(packed, dtype=np.uint8)
    scale_codes = np.asarray(scale_codes, dtype=np.uint8)
    o = packed.shape[0]
    values = NVFP4_PAIRS[packed].reshape(o, scale_codes.shape[1], group_size)  # one gather: byte -> 2 values
    values *= (e4m3_decode(scale_codes) * np.float32(scale_2))[..., None]
    return values.reshape(o, -1)


def fp8_dequantize(codes: np.ndarray, scale: np.ndarray, first_row: int = 0) -> np.ndarray:
    """float8_e4m3fn codes [n, i] -> float32, times `scale` (decoded values, shaped as stored): a scalar, per output
    channel [o] / [o, 1], or per 128x128 block [o/128, 1, i/128, 1]. `first_row`: the codes are rows first_row ..
    first_row + n of the weight (a block of a larger one); `scale` is always the whole weight's."""
    codes = np.asarray(codes, dtype=np.uint8)
    n, cols = codes.shape
    values = e4m3_decode(codes)
    scale = np.asarray(scale, dtype=np.float32)
    if scale.size == 1:
        return (values * scale.reshape(())).astype(np.float32)
    if scale.ndim == 4:
        blocks = scale.reshape(scale.shape[0], scale.shape[2])
        row_block = np.arange(first_row, first_row + n) // 128
        return (values * np.repeat(blocks[row_block], 128, axis=1)[:, :cols]).astype(np.float32)
    return (values * scale.reshape(-1)[first_row : first_row + n, None]).astype(np.float32)
