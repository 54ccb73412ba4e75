"""One NVFP4 global scale per fused linear: convert re-quantizes the shards of q/k/v and gate/up that ModelOpt's
drafter export quantized alone, proven bit for bit against a float reference written here (brute-force nearest
values, no numerics code), with the worst-case error bound, and end to end through convert."""

from __future__ import annotations

import json

import numpy as np
import pytest
from convert_helpers import load_json, tensors_of

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import nvfp4_dequantize, nvfp4_quantize
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert.options import DEFAULT_RUNTIME
from lilicorr_ckpt.runtimes import fused_name

# ---------------------------------------------------------------- the float reference (independent of numerics)

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _e4m3_values() -> np.ndarray:
    """The 127 finite non-negative float8_e4m3fn values, by code (0x00..0x7E), from the format's definition."""
    out = []
    for code in range(127):
        exp, man = code >> 3, code & 7
        out.append(man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))
    return np.array(out, np.float32)


E4M3 = _e4m3_values()


def _nearest(value: float, table: np.ndarray) -> int:
    """Index of the entry of `table` nearest to `value`, ties to the even index (brute force)."""
    d = np.abs(table.astype(np.float64) - float(value))
    best = np.flatnonzero(d == d.min())
    even = [i for i in best if i % 2 == 0]
    return int(even[0] if even else best[0])


def reference_dequantize(packed: np.ndarray, codes: np.ndarray, scale_2: float, group: int) -> np.ndarray:
    """W = fp32(fp32(e4m3(block scale) * weight_scale_2) * E2M1(code)), element by element."""
    o, half = packed.shape
    out = np.empty((o, half * 2), np.float32)
    s2 = np.float32(scale_2)
    for r in range(o):
        for c in range(half * 2):
            nibble = (int(packed[r, c // 2]) >> (4 * (c % 2))) & 0xF
            magnitude = E2M1[nibble & 7]
            code = int(codes[r, c // group])
            block = np.float32(E4M3[code & 0x7F] * (-1 if code & 0x80 else 1)) * s2
            out[r, c] = np.float32(block * magnitude) * (-1 if nibble & 8 and magnitude else 1)
    return out


def reference_quantize(weight: np.ndarray, scale_2: float, group: int) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 with a given weight_scale_2, as ModelOpt defines it: per block of `group`, the block scale is the e4m3
    nearest to amax / (6 * weight_scale_2) (1.0 for an all-zero block, clamped to [2^-9, 448]); each weight is the
    E2M1 value nearest to w / (block scale * weight_scale_2), clipped at 6. (packed uint8, e4m3 codes)."""
    o, i = weight.shape
    s2 = np.float32(scale_2)
    codes = np.zeros((o, i // group), np.uint8)
    nibbles = np.zeros((o, i), np.uint8)
    for r in range(o):
        for b in range(i // group):
            block = weight[r, b * group : (b + 1) * group]
            target = np.float32(np.abs(block).max()) / (np.float32(6.0) * s2)
            if target == 0:
                target = np.float32(1.0)
            target = min(max(target, np.float32(2.0**-9)), np.float32(448.0))
            code = _nearest(target, E4M3)
            codes[r, b] = code
            effective = np.float32(E4M3[code]) * s2
            for k, w in enumerate(block):
                scaled = np.float32(w) / effective
                index = _nearest(min(abs(float(scaled)), 6.0), E2M1)
                nibbles[r, b * group + k] = index | (8 if scaled < 0 else 0)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8), codes


def _shards(seed: int, rows: int = 24, cols: int = 64, spreads=(1.0, 0.55, 0.3)) -> list[np.ndarray]:
    """Shards of one fused linear with different amax (so different weight_scale_2 when quantized alone)."""
    rng = np.random.default_rng(seed)
    out = []
    for spread in spreads:
        w = (rng.standard_normal((rows, cols)) * 0.02 * spread).astype(np.float32)
        w[rng.integers(rows), rng.integers(cols)] = 0.09 * spread  # an outlier sets each shard's amax
        w[3, :16] = 0.0  # an all-zero block
        out.append(w)
    return out


def _requantize(packed, codes, scale_2, shared, group=16, chunk=None, monkeypatch=None):
    """convert's streaming re-quantization of one stored shard: (packed, block scale codes, stats)."""
    import lilicorr_ckpt.convert.repair as repair

    if chunk is not None:
        monkeypatch.setattr(repair, "CHUNK_ELEMENTS", chunk)
    o, half = packed.shape
    blobs = {
        "w": packed.tobytes(),
        "s": codes.tobytes(),
        "s2": np.float32(scale_2).tobytes(),
    }
    infos = {
        "weight": TensorInfo("x.weight", "U8", (o, half), "w", 0, packed.nbytes),
        "weight_scale": TensorInfo("x.weight_scale", "F8_E4M3", codes.shape, "s", 0, codes.nbytes),
        "weight_scale_2": TensorInfo("x.weight_scale_2", "F32", (), "s2", 0, 4),
    }

    def read(info, offset, n):
        return blobs[info.file][offset : offset + n]

    parts = {}
    stats = []
    for part in ("weight", "weight_scale"):
        blocks = list(repair.requantize_blocks(infos, (o, half * 2), read, group, shared, part))
        parts[part] = b"".join(b for b, _ in blocks)
        stats += [s for _, s in blocks]
    new_packed = np.frombuffer(parts["weight"], np.uint8).reshape(packed.shape)
    new_codes = np.frombuffer(parts["weight_scale"], np.uint8).reshape(codes.shape)
    return new_packed, new_codes, stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_requantization_is_the_float_reference_bit_for_bit(seed, monkeypatch):
    stored = [nvfp4_quantize(w, 16) for w in _shards(seed)]  # each shard alone, as ModelOpt exports them
    scales = [float(s2) for _, _, s2 in stored]
    assert len(set(scales)) == 3
    shared = max(scales)
    for packed, codes, s2 in stored:
        if float(s2) == shared:
            continue
        original = reference_dequantize(packed, codes, float(s2), 16)
        # the codec decodes a stored shard exactly as the reference does
        assert np.array_equal(nvfp4_dequantize(packed, codes, s2, 16), original)
        ref_packed, ref_codes = reference_quantize(original, shared, 16)
        # several row blocks (5 rows a block) and one: the same bytes, the reference's
        for chunk in (5 * 64, None):
            new_packed, new_codes, _ = _requantize(
                packed, codes, s2, shared, chunk=chunk, monkeypatch=monkeypatch
            )
            assert np.array_equal(new_codes, ref_codes)
            assert np.array_equal(new_packed, ref_packed)
        # the numpy codec, given the shared weight_scale_2, is the same quantization
        ours = nvfp4_quantize(original, 16, weight_scale_2=shared)
        assert (
            np.array_equal(ours[0], ref_packed) and np.array_equal(ours[1], ref_codes) and ours[2] == shared
        )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_requantized_weight_is_the_nearest_nvfp4_value_and_within_the_bound(seed):
    """For every weight, given its block's new scale: the value written is the nearest of the 15 NVFP4 values
    (no other code is closer), so |new - old| <= half the E2M1 gap at |old| (0.25, 0.5 or 1 times the block
    scale), or the clipping above 6 block scales, itself < 6 * 2^-4 block scales (e4m3's rounding); and overall
    |new - old| <= (1 + 2^-4) / 6 of the block's amax (a normal block scale) or 2^-9 * shared (the smallest)."""
    stored = [nvfp4_quantize(w, 16) for w in _shards(seed, rows=32, cols=128, spreads=(1.0, 0.7, 0.05))]
    shared = max(float(s2) for _, _, s2 in stored)
    worst_ratio = 0.0
    for packed, codes, s2 in stored:
        old = nvfp4_dequantize(packed, codes, s2, 16)
        new_packed, new_codes, _ = nvfp4_quantize(old, 16, weight_scale_2=shared)
        new = nvfp4_dequantize(new_packed, new_codes, shared, 16)
        step = np.repeat(
            E4M3[new_codes] * np.float32(shared), 16, axis=1
        )  # the new block scales, times shared
        err = np.abs(new.astype(np.float64) - old.astype(np.float64))
        grid = (step[..., None] * E2M1[None, None, :]).astype(np.float64)  # every value this block can hold
        nearest = np.abs(np.abs(old.astype(np.float64))[..., None] - grid).min(axis=-1)
        assert np.array_equal(err, nearest)  # no NVFP4 value of the block is closer
        scaled = np.abs(old) / step
        half_gap = np.where(scaled <= 2, 0.25, np.where(scaled <= 4, 0.5, 1.0))
        bound = np.maximum(half_gap * step, np.abs(old) - 6 * step) * (1 + 1e-6)
        assert (err <= bound).all()
        amax = np.repeat(np.abs(old).reshape(old.shape[0], -1, 16).max(axis=-1), 16, axis=1)
        overall = np.maximum((1 + 2.0**-4) / 6 * amax, 2.0**-9 * shared) * (1 + 1e-6)
        assert (err <= overall).all()
        if float(s2) != shared:
            worst_ratio = max(worst_ratio, float((err / np.maximum(amax, 1e-30)).max()))
    assert 0 < worst_ratio <= (1 + 2.0**-4) / 6


@pytest.mark.parametrize("seed", [7, 8])
def test_a_shard_at_its_own_scale_keeps_its_values_but_not_its_bytes(seed):
    # every non-zero block ModelOpt writes reaches code 6 (amax / (6 * weight_scale_2) rounded to e4m3 keeps the
    # ratio within 6 * (1 +- 2^-4)), so re-quantizing a shard against its own weight_scale_2 gives its values and
    # block scales back; but a weight that rounded to -0 (code 0b1000) decodes to +0.0 and comes back as code 0:
    # the bytes differ. convert copies the shard already at the largest scale (bit-identical by construction)
    for w in _shards(seed):
        packed, codes, s2 = nvfp4_quantize(w, 16)
        nibbles = np.stack([packed & 15, packed >> 4], axis=-1).reshape(w.shape[0], -1, 16)
        assert set(np.unique((nibbles & 7).max(axis=-1))) <= {
            0,
            7,
        }  # each block's largest code: 6, or all zero
        again = nvfp4_quantize(nvfp4_dequantize(packed, codes, s2, 16), 16, weight_scale_2=float(s2))
        assert np.array_equal(again[1], codes)
        assert np.array_equal(
            nvfp4_dequantize(again[0], again[1], s2, 16), nvfp4_dequantize(packed, codes, s2, 16)
        )
        if (nibbles == 8).any():
            assert not np.array_equal(again[0], packed)


def test_a_corrupt_stored_shard_is_refused_not_requantized(monkeypatch):
    from lilicorr_ckpt.convert.repair import BadScales

    packed, codes, s2 = nvfp4_quantize(_shards(0)[1], 16)
    with pytest.raises(BadScales, match="weight_scale_2 is nan"):
        _requantize(packed, codes, float("nan"), 1e-3)
    bad = codes.copy()
    bad[0, 0] = 0x7F  # the e4m3 NaN code
    with pytest.raises(BadScales, match="NaN or infinite weight_scale"):
        _requantize(packed, bad, s2, float(s2) * 2)


# ---------------------------------------------------------------- through convert


def _scale(out, name: str) -> float:
    dtype, _, raw = out[name]
    assert dtype == "F32"
    return float(np.frombuffer(raw, np.float32)[0])


def _groups(out) -> dict[str, tuple[str, ...]]:
    groups = {}
    for name, (dtype, _, _) in out.items():
        if name.endswith(".weight") and dtype == "U8":
            fused = fused_name(name.removesuffix(".weight"))
            if fused:
                groups[fused[0]] = fused[1]
    return groups


def test_convert_gives_each_fused_linear_one_global_scale(cli, export, tmp_path):
    src = export(quant="NVFP4")  # ModelOpt style: every shard quantized alone
    before = tensors_of(src)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 0, run
    out = tensors_of(dst)
    record = load_json(dst / "conversion.json")
    groups = _groups(out)
    assert len(groups) == 4  # q/k/v and gate/up of both layers
    recorded = {g["module"]: g for g in record["fused_scales"]}
    for fused, shards in groups.items():
        stored = {s: _scale(before, f"{s}.weight_scale_2") for s in shards}
        shared = max(stored.values())
        assert {_scale(out, f"{s}.weight_scale_2") for s in shards} == {shared}
        entry = recorded[fused]
        assert entry["weight_scale_2"] == {"before": stored, "after": shared}
        for shard in shards:
            names = [f"{shard}.{p}" for p in ("weight", "weight_scale")]
            if stored[shard] == shared:  # at the largest already: copied byte for byte
                assert shard in entry["kept"]
                assert all(out[n] == before[n] for n in names + [f"{shard}.weight_scale_2"])
                continue
            packed = np.frombuffer(before[names[0]][2], np.uint8).reshape(before[names[0]][1])
            codes = np.frombuffer(before[names[1]][2], np.uint8).reshape(before[names[1]][1])
            original = reference_dequantize(packed, codes, stored[shard], 16)
            ref_packed, ref_codes = reference_quantize(original, shared, 16)
            assert out[names[0]][2] == ref_packed.tobytes() and out[names[1]][2] == ref_codes.tobytes()
            (info,) = [r for r in entry["requantized"] if r["module"] == shard]
            new = reference_dequantize(ref_packed, ref_codes, shared, 16)
            assert info["max_abs_error"] == float(np.abs(new - original).max()) > 0
            assert info["max_abs_weight"] == float(np.abs(original).max())
            assert info["ratio"] == shared / stored[shard] > 1
            assert info["max_abs_error_if_kept"] == pytest.approx(
                info["max_abs_weight"] * (info["ratio"] - 1)
            )
        # input_scale: the group's largest everywhere
        inputs = {_scale(out, f"{s}.input_scale") for s in shards}
        assert inputs == {max(_scale(before, f"{s}.input_scale") for s in shards)}
    report = validate(str(dst), runtime=DEFAULT_RUNTIME)  # reads each shard's weight_scale_2 (LC327)
    assert report.summary.errors == 0, report.findings
    assert "unified   weight_scale_2 of 4 fused linears" in run.out and "re-quantized" in run.out


def test_the_json_output_and_the_dry_run_report_the_unification(cli, export, tmp_path):
    src = export(quant="NVFP4")
    doc = json.loads(cli("convert", src, tmp_path / "out", "-f", "json").out)
    assert doc["status"] == "converted" and len(doc["fused_scales"]) == 4
    assert all(s["max_abs_error"] is not None for g in doc["fused_scales"] for s in g["requantized"])
    dry = json.loads(cli("convert", src, tmp_path / "dry", "--dry-run", "-f", "json").out)
    assert [g["module"] for g in dry["fused_scales"]] == [g["module"] for g in doc["fused_scales"]]
    assert not (tmp_path / "dry").exists()


def test_no_repair_refuses_to_requantize(cli, export, tmp_path):
    src = export(config=fixtures.draft_config(head=False), quant="NVFP4")  # vLLM repairs nothing of a DFlash
    run = cli("convert", src, tmp_path / "out", "--no-repair", "--runtime", "vllm")
    assert run.code == 1
    assert (
        "--no-repair" in run.err and "layers.0.mlp.gate_up_proj: the shards' weight_scale_2 differ" in run.err
    )
    assert not (tmp_path / "out").exists()


def test_shards_that_already_share_a_scale_are_copied(cli, export, tmp_path):
    src = export(quant="NVFP4", style="serving")  # one weight_scale_2 per fused linear
    dst = tmp_path / "out"
    assert cli("convert", src, dst).code == 0
    assert load_json(dst / "conversion.json")["fused_scales"] == []
    before, out = tensors_of(src), tensors_of(dst)
    assert all(out[n] == before[n] for n in out if n.startswith("layers.") and n in before)


def test_a_fused_linear_is_dequantized_whole(cli, export, tmp_path):
    # one shard asked in float: the runtimes build q/k/v as one linear, so k and v follow
    src = export(quant="NVFP4")
    dst = tmp_path / "out"
    run = cli("convert", src, dst, "--dequantize", "layers.*.self_attn.q_proj")
    assert run.code == 0, run
    out = tensors_of(dst)
    assert {out[f"layers.{i}.self_attn.{x}_proj.weight"][0] for x in "qkv" for i in (0, 1)} == {"BF16"}
    assert out["layers.1.mlp.up_proj.weight"][0] == "U8"
    reasons = {r["module"]: r["reason"] for r in load_json(dst / "conversion.json")["repairs"]}
    assert reasons["layers.0.self_attn.k_proj"].startswith("fused with q_proj")
    assert "*qkv_proj" in load_json(dst / "config.json")["quantization_config"]["ignore"]
    assert validate(str(dst), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_one_layer_in_float_is_refused_where_a_runtime_cannot_tell_layers_apart(cli, export, tmp_path):
    # SGLang builds a DFlash draft's decoder layers without their index, and vLLM matches q/k/v only as the fused
    # qkv_proj: no exclusion list makes layers.0's q/k/v float and layers.1's quantized for every release
    src = export(quant="NVFP4")
    run = cli("convert", src, tmp_path / "out", "--dequantize", "layers.0.self_attn.q_proj")
    assert run.code == 1
    assert "would build layers.0.self_attn.q_proj quantized" in run.err
    assert "--dequantize 'layers.*.self_attn.q_proj'" in run.err
    assert not (tmp_path / "out").exists()


def test_a_corrupt_global_scale_in_a_fused_linear_is_refused(cli, export, tmp_path):
    def corrupt(t):
        t["layers.0.self_attn.k_proj.weight_scale_2"] = ("F32", (), np.float32(np.nan).tobytes())

    run = cli("convert", export(quant="NVFP4", mutate=corrupt), tmp_path / "out")
    assert run.code == 1 and "layers.0.self_attn.k_proj.weight_scale_2 is nan" in run.err
    assert not (tmp_path / "out").exists()

    def zero(t):  # an all-zero scale below the others: its re-quantization refuses it (numerics' policy)
        t["layers.0.self_attn.k_proj.weight_scale_2"] = ("F32", (), np.float32(0).tobytes())

    run = cli("convert", export("zero", quant="NVFP4", mutate=zero), tmp_path / "out")
    assert run.code == 1 and "cannot re-quantize layers.0.self_attn.k_proj" in run.err, run
    assert not (tmp_path / "out").exists()


def test_the_pre_validation_does_not_read_an_earlier_output(cli, export, tmp_path):
    # the output is validated before a byte is written; a DST replaced with --force holds other bytes at the
    # planned offsets, which must not be read as the new output's scales
    src = export(quant="NVFP4")
    dst = tmp_path / "out"
    assert cli("convert", src, dst, "--runtime", "trtllm", "--naming", "sequential").code == 0
    run = cli("convert", src, dst, "--force")
    assert run.code == 0, run


def test_verify_reproduces_the_requantized_shards_bit_for_bit(cli, export, tmp_path):
    pytest.importorskip("torch", reason="--verify needs torch")
    pytest.importorskip("lilicorr_runtime.model.probe", reason="--verify needs lilicorr_runtime")
    src = export(config=fixtures.draft_config(head=False), quant="NVFP4")
    run = cli("convert", src, tmp_path / "out", "--verify")
    assert run.code == 0, run
    verify = load_json(tmp_path / "out" / "conversion.json")["verify"]
    # DFlash: fc is repaired for SGLang (bf16), so within bf16 rounding; the shards are reproduced exactly
    assert verify["passed"] and verify["requantized"]
    assert all(v["max_abs_error"] > 0 for v in verify["requantized"].values())
    assert verify["against_shards_as_stored"]


def test_the_fast_e2m1_rounding_is_the_nearest_code_search():
    # e2m1_encode counts midpoints (fast enough to re-quantize a large drafter) instead of searching the table: the
    # same index everywhere, at every midpoint and one float32 ulp either side, NaN included
    from lilicorr_ckpt.checkpoint import numerics

    rng = np.random.default_rng(0)
    mids = numerics._E2M1_MIDPOINTS
    values = np.concatenate(
        [
            rng.random(200_000).astype(np.float32) * 7,
            mids,
            np.nextafter(mids, np.float32(0)),
            np.nextafter(mids, np.float32(10)),
            E2M1,
            np.array([np.nan, 0.0, 6.0, 7.0, np.inf], np.float32),
        ]
    )
    magnitude = np.minimum(np.abs(values), np.float32(6.0))
    assert np.array_equal(numerics._e2m1_index(magnitude), numerics._nearest_code(magnitude, E2M1))
    assert np.array_equal(
        numerics.e2m1_encode(-values) & 8, np.where(-values < 0, 8, 0).astype(np.uint8)
    )  # the sign bit
