"""convert on real ModelOpt 0.48.0rc1 drafter exports (tests/data/producers/modelopt-0.48.0rc1, written by ModelOpt's
own export code; its README describes each): every one converts, or is refused with the flag that fixes it, and
the output passes validate for the releases asked, with one NVFP4 global scale per fused linear and every float
module excluded under a pattern each release matches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from convert_helpers import REPO, load_json, tensors_of

from lilicorr_ckpt.checkpoint.load import load_checkpoint
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert.options import DEFAULT_RUNTIME
from lilicorr_ckpt.runtimes import EVERY_RELEASE, PROFILES, excluded_by, fused_name, select_profiles

MODELOPT = REPO / "tests" / "data" / "producers" / "modelopt-0.48.0rc1"

# fixture -> (the refusal's fix, as the message names it; the flags that fix it). None: converts as it is
FIXES: dict[str, tuple[str, tuple[str, ...]] | None] = {
    "dflash-bf16": None,
    "dflash-nvfp4": None,
    "dflash2-bf16": None,
    "dflash2-nvfp4": (
        "--dequantize candidate_selector.hidden_projection",
        ("--dequantize", "candidate_selector.hidden_projection"),
    ),
    "dspark-bf16": None,
    "dspark-nvfp4": (
        "--dequantize confidence_proj --dequantize markov_w2",
        ("--dequantize", "confidence_proj", "--dequantize", "markov_w2"),
    ),
    "dspark-nvfp4-markovfloat": ("--dequantize confidence_proj", ("--dequantize", "confidence_proj")),
    "lilicorr-bf16": None,
    "lilicorr-bf16-conv": None,
    "lilicorr-nvfp4": None,
    "lilicorr-nvfp4-conv": None,
    "lilicorr-nvfp4-evalcalib": ("--relabel-w4a16", ("--relabel-w4a16",)),
}
NVFP4 = sorted(f for f in FIXES if "nvfp4" in f)


def test_every_fixture_is_listed():
    assert sorted(p.name for p in MODELOPT.iterdir() if p.is_dir()) == sorted(FIXES)


def _scales(out: dict, suffix: str) -> dict[str, float]:
    return {
        n.removesuffix("." + suffix): float(np.frombuffer(raw, np.float32)[0])
        for n, (dtype, _, raw) in out.items()
        if n.endswith("." + suffix) and dtype == "F32"
    }


def _check_output(dst: Path, runtime: str) -> None:
    """validate accepts it for `runtime` (reading every fused shard's weight_scale_2: LC327), no fused linear keeps
    unequal scales, and every module stored in float is excluded under every release's matcher."""
    report = validate(str(dst), runtime=runtime)
    assert report.summary.errors == 0, [
        f"{f.rule} {f.message}" for f in report.findings if f.severity == "error"
    ]
    assert all(v.accepted for v in report.runtimes)
    out = tensors_of(dst)
    for suffix in ("weight_scale_2", "input_scale"):
        values = _scales(out, suffix)
        groups: dict[str, set[float]] = {}
        for module, value in values.items():
            fused = fused_name(module)
            if fused:
                groups.setdefault(fused[0], set()).add(value)
        assert all(len(v) == 1 for v in groups.values()), (suffix, groups)
    config = load_json(dst / "config.json")
    if "quantization_config" not in config:
        return
    ignore = tuple(config["quantization_config"]["ignore"])
    assert ignore == tuple(load_json(dst / "hf_quant_config.json")["quantization"]["exclude_modules"])
    ckpt = load_checkpoint(str(dst))
    n_target = ckpt.geometry.num_target_layers
    weights = {n.removesuffix(".weight"): dtype for n, (dtype, shape, _) in out.items() if len(shape) == 2}
    float_linears = {
        m for m, dtype in weights.items() if dtype in ("BF16", "F16", "F32") and m + ".weight" in out
    }
    float_linears = {
        m for m in float_linears if m in ckpt.manifest.modules or "." in m and not m.endswith("_proj_weight")
    }
    quantized = {m for m, dtype in weights.items() if dtype == "U8"}
    for release in EVERY_RELEASE:
        for module in quantized:
            assert not excluded_by(release, module, ignore, n_target).excluded, (release.release_id, module)
        for module in float_linears & (set(ckpt.manifest.modules) | _sibling_linears(ckpt)):
            assert excluded_by(release, module, ignore, n_target).excluded, (release.release_id, module)


def _sibling_linears(ckpt) -> set[str]:
    return {
        n.removesuffix(".weight")
        for n, t in ckpt.manifest.tensors.items()
        if t.module is None and t.component == "head" and n.endswith(".weight") and len(t.shape) == 2
    }


@pytest.mark.parametrize("fixture", sorted(FIXES))
def test_each_export_converts_or_is_refused_naming_the_fix(cli, tmp_path, fixture):
    src = MODELOPT / fixture
    fix = FIXES[fixture]
    dst = tmp_path / "out"
    if fix is not None:
        needle, flags = fix
        run = cli("convert", src, dst)
        assert run.code == 1, run
        assert needle in run.err and "Traceback" not in run.err
        assert "--drop" not in run.err  # the old advice, which led to a second refusal
        assert not dst.exists()
    else:
        flags = ()
    run = cli("convert", src, dst, *flags)
    assert run.code == 0, run
    _check_output(dst, DEFAULT_RUNTIME)
    assert run.out.count("validate  sglang: accepts, vllm: accepts") == 1


@pytest.mark.parametrize("fixture", NVFP4)
@pytest.mark.parametrize("runtime", ["all", "vllm>=0.31", "sglang,vllm==0.32.0"])
def test_each_nvfp4_export_converts_for_several_releases(cli, tmp_path, fixture, runtime):
    flags = FIXES[fixture][1] if FIXES[fixture] else ()
    dst = tmp_path / "out"
    run = cli("convert", MODELOPT / fixture, dst, "--runtime", runtime, *flags)
    assert run.code == 0, run
    _check_output(dst, runtime)
    verdicts = load_json(dst / "conversion.json")["validation"]["verdicts"]
    assert len(verdicts) == len(select_profiles(runtime)) and set(verdicts.values()) == {"accepts"}


def test_the_fused_shards_are_unified_and_the_record_says_by_how_much(cli, tmp_path):
    src = MODELOPT / "lilicorr-nvfp4"
    before = tensors_of(src)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 0, run
    record = load_json(dst / "conversion.json")
    groups = {g["module"]: g for g in record["fused_scales"]}
    # the README: q/k/v and gate/up all differ, in both layers
    assert sorted(groups) == [
        "layers.0.mlp.gate_up_proj",
        "layers.0.self_attn.qkv_proj",
        "layers.1.mlp.gate_up_proj",
        "layers.1.self_attn.qkv_proj",
    ]
    stored = _scales(before, "weight_scale_2")
    out = tensors_of(dst)
    for group in groups.values():
        assert group["weight_scale_2"]["after"] == max(stored[s] for s in group["shards"])
        for shard in group["requantized"]:
            # |dw| of the re-quantization is at most the error of serving the shard as stored (LC327's: equal where
            # the ratio is so close to 1 that the block holding the amax keeps its scale and codes), and within
            # NVFP4's bound: a sixth of the largest weight, plus e4m3's rounding
            assert (
                0 < shard["max_abs_error"] <= shard["max_abs_error_if_kept"] * (1 + 1e-5)
            )  # float32 rounding
            assert shard["max_abs_error"] <= (1 + 2.0**-4) / 6 * shard["max_abs_weight"]
        for kept in group["kept"]:
            for suffix in ("weight", "weight_scale", "weight_scale_2"):
                assert out[f"{kept}.{suffix}"] == before[f"{kept}.{suffix}"]
    # q's input_scale differed from k's and v's (README): all three carry the largest now
    assert {g["input_scale"] is not None for n, g in groups.items() if n.endswith("qkv_proj")} == {True}
    assert "unified   weight_scale_2 of 4 fused linears" in run.out


def test_the_dspark_markov_head_kept_float_is_excluded_for_every_release(cli, tmp_path):
    # the export lists it as dflash_module.markov_w2; convert wrote no exclusion for it before, so vLLM built the
    # Markov head's ParallelLMHead quantized and refused the float weight
    dst = tmp_path / "out"
    run = cli("convert", MODELOPT / "dspark-nvfp4-markovfloat", dst, "--dequantize", "confidence_proj")
    assert run.code == 0, run
    out = tensors_of(dst)
    assert out["markov_head.markov_w2.weight"][0] == "BF16"
    ignore = tuple(load_json(dst / "config.json")["quantization_config"]["ignore"])
    for release in EVERY_RELEASE:
        for module in ("markov_head.markov_w2", "markov_head.markov_w1", "confidence_head.proj"):
            assert excluded_by(release, module, ignore, 8).excluded, (release.release_id, module)
    stripped = load_json(dst / "conversion.json")["exclusions"]["stripped"]
    assert stripped == {"dflash_module.markov_w1": "markov_w1", "dflash_module.markov_w2": "markov_w2"}


def test_the_sibling_dequantization_writes_modelopts_values(cli, tmp_path):
    from lilicorr_ckpt.checkpoint.numerics import bf16_bits, nvfp4_dequantize

    src = MODELOPT / "dflash2-nvfp4"
    dst = tmp_path / "out"
    flag = ("--dequantize", "candidate_selector.hidden_projection")
    assert cli("convert", src, dst, *flag).code == 0
    before, out = tensors_of(src), tensors_of(dst)
    name = "candidate_selector.hidden_projection"
    packed = np.frombuffer(before[f"{name}.weight"][2], np.uint8).reshape(before[f"{name}.weight"][1])
    codes = np.frombuffer(before[f"{name}.weight_scale"][2], np.uint8).reshape(
        before[f"{name}.weight_scale"][1]
    )
    scale_2 = np.frombuffer(before[f"{name}.weight_scale_2"][2], np.float32)[0]
    assert out[f"{name}.weight"] == (
        "BF16",
        (16, 64),
        bf16_bits(nvfp4_dequantize(packed, codes, scale_2)).tobytes(),
    )
    assert not any(f"{name}.{s}" in out for s in ("weight_scale", "weight_scale_2", "input_scale"))
    assert "*hidden_projection" in load_json(dst / "config.json")["quantization_config"]["ignore"]


def test_an_unknown_dequantize_pattern_lists_the_sibling_names(cli, tmp_path):
    run = cli("convert", MODELOPT / "dspark-nvfp4", tmp_path / "out", "--dequantize", "markov_w3")
    assert run.code == 4 and "matches no module" in run.err and "markov_w2" in run.err


def test_relabel_writes_w4a16_in_both_configs(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", MODELOPT / "lilicorr-nvfp4-evalcalib", dst, "--relabel-w4a16")
    assert run.code == 0, run
    flat = load_json(dst / "config.json")["quantization_config"]
    nested = load_json(dst / "hf_quant_config.json")["quantization"]
    assert (
        flat["quant_algo"] == nested["quant_algo"] == "W4A16_NVFP4" and flat["quant_method"] == "modelopt_fp4"
    )
    record = load_json(dst / "conversion.json")
    assert record["relabel"]["from"] == "NVFP4" and record["relabel"]["input_scales_dropped"] == 0
    assert record["options"]["relabel_w4a16"] is True and record["output"]["quant_algo"] == "W4A16_NVFP4"
    assert "relabel   quant_algo NVFP4 -> W4A16_NVFP4" in run.out
    # the weights are the export's (the fused shards aside, re-quantized to one global scale)
    before, out = tensors_of(MODELOPT / "lilicorr-nvfp4-evalcalib"), tensors_of(dst)
    requantized = {s["module"] for g in record["fused_scales"] for s in g["requantized"]}
    assert out["layers.0.mlp.down_proj.weight"] == before["layers.0.mlp.down_proj.weight"]
    assert requantized and not any("down_proj" in m for m in requantized)


def test_relabel_drops_the_activation_scales_of_a_calibrated_export(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", MODELOPT / "dflash-nvfp4", dst, "--relabel-w4a16")
    assert run.code == 0, run
    out = tensors_of(dst)
    assert not any(n.endswith("input_scale") for n in out)
    record = load_json(dst / "conversion.json")
    assert record["relabel"]["input_scales_dropped"] > 0
    assert all(g["input_scale"] is None for g in record["fused_scales"])
    _check_output(dst, DEFAULT_RUNTIME)


def test_relabel_is_refused_where_a_release_does_not_load_w4a16(cli, tmp_path, monkeypatch):
    import msgspec

    import lilicorr_ckpt.convert.plan as plan

    real = plan.select_profiles

    def without_w4a16(spec):
        return [msgspec.structs.replace(p, quant_algos=("NVFP4",)) for p in real(spec)]

    monkeypatch.setattr(plan, "select_profiles", without_w4a16)
    run = cli("convert", MODELOPT / "lilicorr-nvfp4-evalcalib", tmp_path / "out")
    assert run.code == 1 and "--relabel-w4a16 cannot serve them" in run.err and "re-export" in run.err
    run = cli("convert", MODELOPT / "lilicorr-nvfp4-evalcalib", tmp_path / "out", "--relabel-w4a16")
    assert run.code == 1 and "do not load W4A16_NVFP4" in run.err
    assert not (tmp_path / "out").exists()


def test_relabel_needs_an_nvfp4_export(cli, tmp_path):
    run = cli("convert", MODELOPT / "lilicorr-bf16", tmp_path / "out", "--relabel-w4a16")
    assert run.code == 4 and "relabels an NVFP4 (W4A4) export" in run.err


def test_no_naming_serves_every_release_of_a_lilicorr_head(cli, tmp_path):
    # the oldest SGLang release builds the Sequential names, the others the named ones: `every` is refused with the
    # two selections to convert for; one release alone gets the naming it loads
    run = cli("convert", MODELOPT / "lilicorr-bf16", tmp_path / "out", "--runtime", "every")
    assert run.code == 1 and "--naming sequential" in run.err and "convert once for each" in run.err
    oldest = (
        select_profiles("sglang")[0].engine_id
        + "=="
        + [p for p in EVERY_RELEASE if p.engine_id == "sglang"][0].version
    )
    run = cli("convert", MODELOPT / "lilicorr-bf16", tmp_path / "old", "--runtime", oldest)
    assert run.code == 0, run
    assert load_json(tmp_path / "old" / "conversion.json")["options"]["naming"] == "sequential"
    assert "lilicorr.feature_mlp.1.weight" in tensors_of(tmp_path / "old")
    # a DFlash has no head MLP to name: every release at once
    run = cli("convert", MODELOPT / "dflash-nvfp4", tmp_path / "every", "--runtime", "every")
    assert run.code == 0, run
    _check_output(tmp_path / "every", "every")


def test_the_unreleased_engine_changes_the_output_only_when_named(cli, tmp_path):
    src = MODELOPT / "lilicorr-nvfp4"
    assert cli("convert", src, tmp_path / "default").code == 0
    assert cli("convert", src, tmp_path / "all", "--runtime", "all").code == 0
    default, every = tensors_of(tmp_path / "default"), tensors_of(tmp_path / "all")
    assert default["layers.0.self_attn.q_proj.weight"][0] == "U8"  # both released engines load it NVFP4
    # the unreleased TensorRT-LLM needs it float
    assert every["layers.0.self_attn.q_proj.weight"][0] == "BF16"
    assert not PROFILES["trtllm"].released
