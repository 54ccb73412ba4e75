"""Quantization rules (LC3xx) and the quantized owned lm_head.

Which modules each runtime quantizes, how it reads the flat and nested ModelOpt forms and matches exclusions,
and the scale tensors NVFP4 / FP8 need. Every checkpoint here is a
serving-style fixture (flat `ignore` in config.json, nested hf_quant_config.json) with one defect added.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.manifest import quant_scheme
from lilicorr_ckpt.runtimes import PROFILES

from ._support import (
    ALL,
    assert_clean,
    describe,
    edit_config,
    edit_json,
    hits,
    one,
    problems,
    refused_by,
    run,
    set_exclusions,
)

Tensors = dict[str, tuple[str, tuple[int, ...], bytes]]
SCALAR = np.float32(0.01).tobytes()

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def servable(config: dict[str, Any] | None = None) -> set[str]:
    return fixtures.servable_quantized(fixtures.manifest_for(config or fixtures.draft_config()))


def of_rule(report, rule: str, severity: str | None = None, module: str | None = None):
    return [f for f in hits(report, rule, severity) if module is None or any(module in s for s in f.subjects)]


# ---------------------------------------------------------------- valid quantized checkpoints


OWNED = fixtures.draft_config(own_lm_head=True)
# SGLang drops an owned lm_head and scores with the target's (loader audit E11)
SGLANG_OWNED_HEAD = ("LC404", "error", ("sglang",))


@pytest.mark.parametrize(
    "kw, allowed",
    [
        pytest.param({"quant": "NVFP4"}, [], id="nvfp4"),
        pytest.param({"quant": "W4A16_NVFP4"}, [], id="w4a16-nvfp4"),
        pytest.param({"quant": "FP8"}, [], id="fp8"),
        pytest.param({"quant": "NVFP4", "config": fixtures.draft_config(conv=(4, 16))}, [], id="nvfp4-conv"),
        pytest.param(
            {"quant": "NVFP4", "naming": "sequential"},
            [("LC217", "error", ("sglang", "vllm"))],
            id="nvfp4-sequential",
        ),
        pytest.param({"quant": "NVFP4", "key_prefix": "model."}, [], id="nvfp4-model-prefix"),
        # a bf16 owned head listed in the exclusions, as every ModelOpt preset leaves it
        pytest.param({"quant": "NVFP4", "config": OWNED}, [SGLANG_OWNED_HEAD], id="nvfp4-owned-bf16-head"),
        # an owned NVFP4 head: weight, weight_scale, weight_scale_2, input_scale, not excluded
        pytest.param(
            {"quant": "NVFP4", "config": OWNED, "quantize": servable(OWNED) | {"lm_head"}},
            [SGLANG_OWNED_HEAD, ("LC314", "warning", ("sglang",))],
            id="nvfp4-owned-nvfp4-head",
        ),
        pytest.param(
            {"quant": "W4A16_NVFP4", "config": OWNED, "quantize": servable(OWNED) | {"lm_head"}},
            [SGLANG_OWNED_HEAD, ("LC314", "warning", ("sglang",))],
            id="w4a16-owned-nvfp4-head",
        ),
    ],
)
def test_valid_quantized_checkpoints_pass(ckpt, kw, allowed):
    # valid quantized layouts: nothing but the listed findings, and only their runtimes refuse
    report = run(ckpt(**kw))
    assert problems(report) == sorted(allowed), describe(report)
    assert refused_by(report) == sorted(
        {r for _, severity, rts in allowed if severity == "error" for r in rts}
    )


def test_w4a16_without_input_scale_is_accepted_by_every_runtime(ckpt):
    path = ckpt(quant="W4A16_NVFP4")
    header = (path / "model.safetensors").read_bytes()
    assert b"weight_scale_2" in header and b"input_scale" not in header
    report = run(path)
    assert_clean(report)
    assert hits(report, "LC304") == [] and hits(report, "LC315") == []


# ---------------------------------------------------------------- quant config documents


def test_hf_quant_config_disagreeing_with_config_json(ckpt):
    path = ckpt(quant="NVFP4")
    edit_json(
        path / "hf_quant_config.json",
        lambda d: d["quantization"].update(
            quant_algo="W4A16_NVFP4",
            group_size=32,
            exclude_modules=d["quantization"]["exclude_modules"] + ["*fc"],
        ),
    )
    report = run(path)
    f = one(report, "LC301", "warning")
    assert f.runtimes == []
    for fragment in (
        "quant_algo NVFP4 vs W4A16_NVFP4",
        "group_size 16 vs 32",
        "only in hf_quant_config.json: ['*fc']",
        f"{TR} acts on hf_quant_config.json",
        f"{SG} and {VL} act on config.json",
    ):
        assert fragment in f.message
    # TensorRT-LLM reads the file (authoritative): its group size 32 and `*fc` do not fit the tensors; SGLang and
    # vLLM read config.json's copy, which does
    assert refused_by(report) == ["trtllm"], describe(report)
    assert {f.rule for f in report.findings if f.severity == "error"} == {"LC304", "LC308"}
    assert all(f.runtimes == ["trtllm"] for f in report.findings if f.severity == "error")


def nested_in_config_json(path: Path) -> None:
    """config.json carries the nested ModelOpt form, as the spec exporter writes it (no quant_method)."""
    nested = json.loads((path / "hf_quant_config.json").read_text())
    edit_config(path, lambda c: c.__setitem__("quantization_config", nested))


# SGLang flattens a nested quantization_config found in config.json (its quant_algo copied to the top level) and
# then reads no exclusion: the float q/k/v it builds quantized refuse the load (LC326, LC307)
NESTED_INLINE_SGLANG = ["LC307", "LC309", "LC326"]


def test_nested_w4a16_without_quant_method_is_refused_by_vllm(ckpt):
    # vLLM derives quant_method for the nested form only for FP8* and NVFP4 ("Unknown ModelOpt quant algo")
    path = ckpt(quant="W4A16_NVFP4")
    nested_in_config_json(path)
    report = run(path)
    by_runtime = {tuple(f.runtimes): f for f in hits(report, "LC302") + hits(report, "LC322")}
    assert {k: f.severity for k, f in by_runtime.items()} == {
        ("vllm",): "error",
        ("sglang", "trtllm"): "warning",
    }, describe(report)
    assert "W4A16_NVFP4" in by_runtime[("vllm",)].message
    assert by_runtime[("vllm",)].pointer == "$.quantization_config.quant_method"
    assert refused_by(report) == ["sglang", "vllm"]
    assert problems(report, ignore={"LC302", "LC322", *NESTED_INLINE_SGLANG}) == []
    assert {tuple(f.runtimes) for r in NESTED_INLINE_SGLANG for f in hits(report, r)} == {("sglang",)}


def test_nested_nvfp4_without_quant_method_only_warns(ckpt):
    path = ckpt(quant="NVFP4")
    nested_in_config_json(path)
    report = run(path)
    assert hits(report, "LC302") == []
    f = one(report, "LC322")
    assert (f.severity, sorted(f.runtimes)) == ("warning", ALL)
    lost = one(report, "LC326")
    assert lost.runtimes == ["sglang"] and "flattens" in lost.message, describe(report)
    assert {s for f in hits(report, "LC307") for s in f.subjects} == set(QKV)
    assert refused_by(report) == ["sglang"]


def test_flat_form_without_quant_method_is_refused_by_vllm(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(path, lambda c: c["quantization_config"].pop("quant_method"))
    f = one(run(path), "LC302", "error")
    assert f.runtimes == ["vllm"] and "flat form" in f.message


def test_flat_form_without_quant_method_warning_does_not_call_it_nested(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(path, lambda c: c["quantization_config"].pop("quant_method"))
    warning = one(run(path), "LC322", "warning")
    assert sorted(warning.runtimes) == ["sglang", "trtllm"]
    assert "nested" not in warning.message and "quant_method" in warning.message


def test_w4a16_with_only_nested_hf_quant_config_is_refused_by_vllm(ckpt):
    # no quantization_config in config.json: vLLM reads hf_quant_config.json and derives quant_method only for
    # FP8* and NVFP4, so W4A16_NVFP4 raises "Unknown ModelOpt quant algo"
    path = ckpt(quant="W4A16_NVFP4")
    edit_config(path, lambda c: c.pop("quantization_config"))
    report = run(path)
    f = one(report, "LC302", "error")
    assert f.runtimes == ["vllm"] and f.file == "hf_quant_config.json"
    assert "W4A16_NVFP4" in f.message and "Unknown ModelOpt quant algo" in f.message
    assert refused_by(report) == ["vllm"]
    assert problems(report, ignore={"LC302"}) == []


def test_nvfp4_with_only_nested_hf_quant_config_is_derived_by_vllm(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(path, lambda c: c.pop("quantization_config"))
    assert hits(run(path), "LC302") == []


def test_flat_nvfp4_exclusions_under_exclude_modules_are_read_by_every_runtime(ckpt):
    # SGLang's ModelOptFp4Config.from_config falls back to modules_to_not_convert, then exclude_modules; vLLM
    # 0.33.0's to exclude_modules (modelopt.py from_config); TensorRT-LLM reads exclude_modules
    path = ckpt(quant="NVFP4")
    edit_config(
        path,
        lambda c: c["quantization_config"].__setitem__(
            "exclude_modules", c["quantization_config"].pop("ignore")
        ),
    )
    report = run(path)
    assert hits(report, "LC320") == [] and hits(report, "LC307") == [], describe(report)
    assert refused_by(report) == [], describe(report)


def test_flat_fp8_exclusions_under_exclude_modules_are_invisible_to_sglang(ckpt):
    # SGLang's ModelOptFp8Config.from_config reads `ignore` only (its FP4 config falls back to the other keys);
    # vLLM falls back to exclude_modules
    path = ckpt(quant="FP8")
    edit_config(
        path,
        lambda c: c["quantization_config"].__setitem__(
            "exclude_modules", c["quantization_config"].pop("ignore")
        ),
    )
    report = run(path)
    f = one(report, "LC320", "error")
    assert f.runtimes == ["sglang"] and "exclude_modules" in f.message and "ignore" in f.message, describe(
        report
    )
    assert refused_by(report) == ["sglang"]


def test_flat_nvfp4_empty_ignore_hides_exclude_modules_from_sglang(ckpt):
    # the first key present wins, even an empty list
    path = ckpt(quant="NVFP4")
    edit_config(
        path,
        lambda c: c["quantization_config"].update(
            exclude_modules=c["quantization_config"]["ignore"], ignore=[]
        ),
    )
    report = run(path)
    found = {tuple(f.runtimes): f for f in hits(report, "LC320", "error")}
    assert set(found) == {("sglang",), ("vllm",)}, describe(report)
    assert (
        "`ignore`, present and empty, the first of `ignore`, else `modules_to_not_convert`"
        in found[("sglang",)].message
    )


def test_flat_form_with_ignore_and_exclude_modules_is_read_through_ignore(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(
        path,
        lambda c: c["quantization_config"].__setitem__(
            "exclude_modules", list(c["quantization_config"]["ignore"])
        ),
    )
    assert_clean(run(path))


def flat_group_in_config_groups(path: Path) -> None:
    def move(c: dict[str, Any]) -> None:
        qc = c["quantization_config"]
        w = {"num_bits": 4, "type": "float", "group_size": qc.pop("group_size"), "dynamic": False}
        qc["config_groups"] = {"group_0": {"weights": w, "input_activations": dict(w), "targets": ["Linear"]}}

    edit_config(path, move)


def nvfp4_group_32(path: Path) -> Path:
    """A serving-style NVFP4 checkpoint quantized with group size 32 (ModelOpt's metadata says 32)."""
    cfg = fixtures.draft_config()
    manifest = fixtures.manifest_for(cfg)
    quantized = fixtures.servable_quantized(manifest, 32)
    flat, nested = fixtures.quant_metadata(manifest, "NVFP4", quantized, group_size=32)
    cfg["quantization_config"] = flat
    scheme = quant_scheme("NVFP4", 32)
    shared = fixtures.fused_global_amax(manifest, quantized)  # one weight_scale_2 per fused linear
    tensors: Tensors = {}
    for name, expected in manifest.tensors.items():
        values = fixtures._values(name, expected.shape, 0)
        if expected.module in quantized and name == f"{expected.module}.weight":
            tensors.update(
                fixtures._quantized(expected.module, values, scheme, 0, shared.get(expected.module))
            )
        else:
            tensors[name] = ("BF16", expected.shape, fixtures.encode(values, "BF16"))
    return fixtures.save(path, cfg, tensors, hf_quant_config=nested)


def test_nvfp4_group_32_with_top_level_group_size_is_refused_by_sglang_marlin(tmp_path):
    report = run(nvfp4_group_32(tmp_path / "g32"))
    f = one(report, "LC325", "error")
    assert f.runtimes == ["sglang"] and "group_size 32" in f.message and "Marlin" in f.message
    assert problems(report, ignore={"LC325"}) == [] and refused_by(report) == ["sglang"]


def test_flat_group_size_only_in_config_groups_is_refused_by_vllm(tmp_path):
    # vLLM reads the flat form's top-level group_size, default 16; SGLang reads config_groups too (and then
    # refuses 32 on Marlin: LC325)
    path = nvfp4_group_32(tmp_path / "g32")
    flat_group_in_config_groups(path)
    report = run(path)
    f = one(report, "LC321", "error")
    assert f.runtimes == ["vllm"] and "32" in f.message and "16" in f.message and "config_groups" in f.message
    assert one(report, "LC325", "error").runtimes == ["sglang"]
    assert refused_by(report) == ["sglang", "vllm"]
    assert problems(report, ignore={"LC321", "LC325"}) == []


def test_flat_group_size_16_only_in_config_groups_matches_vllm_default(ckpt):
    path = ckpt(quant="NVFP4")
    flat_group_in_config_groups(path)
    assert hits(run(path), "LC321") == []


def test_nested_nvfp4_missing_keys_vllm_requires(ckpt):
    path = ckpt(quant="NVFP4")
    edit_json(path / "hf_quant_config.json", lambda d: d["quantization"].pop("kv_cache_quant_algo"))
    report = run(path)
    f = one(report, "LC303", "error")
    assert f.runtimes == ["vllm"] and "kv_cache_quant_algo" in f.message and f.file == "hf_quant_config.json"
    assert refused_by(report) == ["vllm"]


def test_quantized_tensors_without_metadata(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(path, lambda c: c.pop("quantization_config"))
    (path / "hf_quant_config.json").unlink()
    report = run(path)
    f = one(report, "LC311", "error")
    assert "quantization metadata" in f.message and "fc" in f.subjects
    assert refused_by(report) == ALL


@pytest.mark.parametrize(
    "algo, fragment",
    [
        pytest.param("W8A16", "quant_algo W8A16", id="unsupported"),
        pytest.param(None, "names no quant_algo", id="absent"),
    ],
)
def test_quant_algo_unsupported_or_absent(ckpt, algo, fragment):
    path = ckpt(quant="NVFP4")

    def set_algo(d: dict[str, Any]) -> None:
        if algo is None:
            d.pop("quant_algo")
        else:
            d["quant_algo"] = algo

    edit_config(path, lambda c: set_algo(c["quantization_config"]))
    edit_json(path / "hf_quant_config.json", lambda d: set_algo(d["quantization"]))
    f = one(run(path), "LC312", "error")
    assert fragment in f.message and f.runtimes == []
    if algo:
        assert (f.expected, f.actual) == ("NVFP4 | W4A16_NVFP4 | FP8", algo)


@pytest.mark.parametrize(
    "doc, fragment",
    [
        pytest.param(
            {
                "producer": {"name": "modelopt"},
                "quantization": {
                    "quant_algo": "NVFP4",
                    "group_size": 16,
                    "kv_cache_quant_algo": None,
                    "exclude_modules": "lm_head",
                },
            },
            "exclude_modules must be a list of strings",
            id="exclusions-not-a-list",
        ),
        pytest.param({"algo": "NVFP4"}, "neither the nested", id="unknown-form"),
    ],
)
def test_unreadable_quant_config(ckpt, doc, fragment):
    path = ckpt(quant="NVFP4")
    (path / "hf_quant_config.json").write_text(json.dumps(doc))
    found = hits(run(path), "LC316", "error")
    assert [f.file for f in found] == ["hf_quant_config.json"]
    assert fragment in found[0].message


def test_metadata_without_quantized_tensors(ckpt):
    report = run(ckpt(quant="NVFP4", quantize=set()))
    f = one(report, "LC317", "warning")
    assert "NVFP4" in f.message
    assert problems(report) == [("LC317", "warning", ())]


# ---------------------------------------------------------------- scale tensors


def test_nvfp4_module_missing_weight_scale_2(ckpt):
    report = run(ckpt(quant="NVFP4", mutate=lambda t: t.pop("layers.0.self_attn.o_proj.weight_scale_2")))
    f = one(report, "LC304", "error")
    assert f.runtimes == [] and f.subjects == ["layers.0.self_attn.o_proj.weight_scale_2"]
    assert "layers.0.self_attn.o_proj" in f.message and "weight_scale_2" in f.message
    assert refused_by(report) == ALL


@pytest.mark.parametrize(
    "name, new, expected, actual",
    [
        pytest.param(
            "fc.weight_scale", ("F32", (64, 8)), "F8_E4M3 [64, 8]", "F32 [64, 8]", id="weight-scale-dtype"
        ),
        pytest.param(
            "fc.weight_scale",
            ("F8_E4M3", (64, 4)),
            "F8_E4M3 [64, 8]",
            "F8_E4M3 [64, 4]",
            id="weight-scale-group-32",
        ),
        pytest.param("fc.weight", ("U8", (64, 128)), "U8 [64, 64]", "U8 [64, 128]", id="weight-not-packed"),
        pytest.param(
            "fc.weight_scale_2", ("F32", (64,)), "F32 []", "F32 [64]", id="weight-scale-2-per-channel"
        ),
    ],
)
def test_nvfp4_scale_tensor_shape_and_dtype(ckpt, name, new, expected, actual):
    dtype, shape = new
    size = int(np.prod(shape)) * (4 if dtype == "F32" else 1)

    def mutate(t: Tensors) -> None:
        t[name] = (dtype, shape, bytes(size))

    report = run(ckpt(quant="NVFP4", mutate=mutate))
    f = next((f for f in hits(report, "LC304", "error") if f.pointer == name), None)
    assert f is not None, describe(report)
    assert (f.expected, f.actual) == (expected, actual)
    assert name in f.message


def test_nvfp4_w4a4_without_input_scale_is_refused(ckpt):
    report = run(ckpt(quant="NVFP4", mutate=lambda t: t.pop("lilicorr.context_proj.input_scale")))
    f = one(report, "LC304", "error")
    assert "lilicorr.context_proj" in f.message and "input_scale" in f.message
    assert f.runtimes == []  # every runtime


@pytest.mark.parametrize("quant, module", [("NVFP4", "lilicorr.context_proj"), ("FP8", "fc")])
def test_missing_input_scale_under_activation_quantization_is_refused_by_sglang_too(ckpt, quant, module):
    report = run(ckpt(quant=quant, mutate=lambda t: t.pop(f"{module}.input_scale")))
    assert [f.severity for f in hits(report, "LC304")] == ["error"], describe(report)
    assert refused_by(report) == ALL


def test_fp8_module_missing_weight_scale(ckpt):
    f = one(run(ckpt(quant="FP8", mutate=lambda t: t.pop("fc.weight_scale"))), "LC304", "error")
    assert "fc.weight_scale" in f.message and f.runtimes == []


def test_fp8_module_with_nvfp4_scale(ckpt):
    def mutate(t: Tensors) -> None:
        t["fc.weight_scale_2"] = ("F32", (), SCALAR)

    f = one(run(ckpt(quant="FP8", mutate=mutate)), "LC304", "error")
    assert "fc.weight_scale_2" in f.message and "fp8" in f.message


def test_fp8_kv_cache_scales_are_expected(ckpt):
    def mutate(t: Tensors) -> None:
        for i in (0, 1):
            t[f"layers.{i}.self_attn.k_proj.k_scale"] = ("F32", (), SCALAR)
            t[f"layers.{i}.self_attn.v_proj.v_scale"] = ("F32", (), SCALAR)

    path = ckpt(quant="FP8", mutate=mutate)
    edit_config(path, lambda c: c["quantization_config"].__setitem__("kv_cache_quant_algo", "FP8"))
    edit_json(
        path / "hf_quant_config.json", lambda d: d["quantization"].__setitem__("kv_cache_quant_algo", "FP8")
    )
    assert_clean(run(path))


def test_kv_cache_scales_without_kv_cache_quantization_warn(ckpt):
    def mutate(t: Tensors) -> None:
        t["layers.0.self_attn.k_proj.k_scale"] = ("F32", (), SCALAR)

    report = run(ckpt(quant="FP8", mutate=mutate))
    f = one(report, "LC318", "warning")
    assert f.subjects == ["layers.0.self_attn.k_proj.k_scale"] and "kv_cache_quant_algo" in f.message
    assert problems(report) == [("LC318", "warning", ())]


def test_quantized_config_without_hf_quant_config_warns(ckpt):
    path = ckpt(quant="NVFP4")
    (path / "hf_quant_config.json").unlink()
    report = run(path)
    assert problems(report) == [("LC319", "warning", ())]
    assert_clean(run(ckpt()))  # no quantization: nothing to pair


def test_an_unreadable_hf_quant_config_is_not_also_called_missing(ckpt):
    path = ckpt(quant="NVFP4")
    (path / "hf_quant_config.json").write_text("{}")
    rules_hit = {f.rule for f in run(path).findings}
    assert "LC316" in rules_hit and "LC319" not in rules_hit


def test_w4a16_module_shipping_input_scale(ckpt):
    def mutate(t: Tensors) -> None:
        t["fc.input_scale"] = ("F32", (), SCALAR)

    report = run(ckpt(quant="W4A16_NVFP4", mutate=mutate))
    f = one(report, "LC315", "warning")
    assert f.subjects == ["fc.input_scale"] and "weight-only" in f.message
    assert problems(report) == [("LC315", "warning", ())]


def test_stored_format_must_match_declared_algo(ckpt):
    path = ckpt(quant="NVFP4")
    edit_config(path, lambda c: c["quantization_config"].update(quant_algo="FP8", quant_method="modelopt"))
    edit_json(path / "hf_quant_config.json", lambda d: d["quantization"].update(quant_algo="FP8"))
    report = run(path)
    f = next((f for f in hits(report, "LC304", "error") if f.pointer == "fc.weight"), None)
    assert f is not None, describe(report)
    assert (f.expected, f.actual) == ("F8_E4M3 [64, 128]", "U8 [64, 64]")


def test_nvfp4_in_features_not_a_multiple_of_the_group(ckpt):
    # head width 40: attn.out_proj has in_features 40, which no 16-wide NVFP4 block tiles
    config = fixtures.draft_config(dflash={"lilicorr_hidden_size": 40})
    modules = ["lilicorr.layers.0.attn.out_proj", "lilicorr.layers.1.attn.out_proj"]

    def mutate(t: Tensors) -> None:
        for m in modules:
            t[f"{m}.weight"] = ("U8", (40, 20), bytes(800))
            t[f"{m}.weight_scale"] = ("F8_E4M3", (40, 2), bytes(80))
            t[f"{m}.weight_scale_2"] = ("F32", (), SCALAR)
            t[f"{m}.input_scale"] = ("F32", (), SCALAR)

    path = ckpt(config, quant="NVFP4", mutate=mutate)
    set_exclusions(path, lambda ex: [p for p in ex if p != "*out_proj"])
    report = run(path)
    f = one(report, "LC305", "error")
    assert f.runtimes == [] and sorted(f.subjects) == modules
    assert "in_features 40 % 16" in f.message
    assert refused_by(report) == ALL


# ---------------------------------------------------------------- must-be-float modules


QKV = {f"layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qkv"}


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param({"lilicorr.factor_input_proj"}, id="factor_input_proj"),
        pytest.param({"lilicorr.out_head"}, id="out_head"),
        pytest.param({"lilicorr.in_head"}, id="in_head"),
    ],
)
def test_quantized_raw_float_module_refused_by_sglang_and_vllm(ckpt, modules):
    report = run(ckpt(quant="NVFP4", quantize=servable() | modules))
    found = hits(report, "LC306", "error")
    assert found, describe(report)
    assert {s for f in found for s in f.subjects} == modules
    assert all(sorted(f.runtimes) == ["sglang", "vllm"] for f in found)
    assert refused_by(report) == ["sglang", "vllm"]  # TRT quantizes any head nn.Linear (_load_linear)
    assert problems(report, ignore={"LC306"}) == []


def test_quantized_feature_mlp_down_proj_refused_by_sglang_only(ckpt):
    # SGLang builds feature_mlp unquantized; vLLM (newest revision) and TRT follow the config.
    # Only up_proj (in_features 5) cannot be NVFP4, which LC305 reports.
    report = run(ckpt(quant="NVFP4", quantize=servable() | {"lilicorr.feature_mlp.down_proj"}))
    found = hits(report, "LC306", "error")
    assert [f.runtimes for f in found] == [["sglang"]], describe(report)
    assert "read as raw floats" not in found[0].message and "unquantized" in found[0].message
    assert refused_by(report) == ["sglang"]
    assert problems(report, ignore={"LC306"}) == []


def test_feature_mlp_not_excluded(ckpt):
    # SGLang forces it float (LC309: list it anyway); vLLM and TRT follow the config and would quantize it
    path = ckpt(quant="NVFP4")
    set_exclusions(path, lambda ex: [p for p in ex if "feature_mlp" not in p])
    report = run(path)
    unprotected = of_rule(report, "LC307", "error", "feature_mlp")
    assert unprotected and all(sorted(f.runtimes) == ["trtllm", "vllm"] for f in unprotected), describe(
        report
    )
    assert "model.lilicorr.feature_mlp" in " ".join(f.message for f in unprotected)  # vLLM's prefixed name
    assert all(f.runtimes == ["sglang"] for f in hits(report, "LC309", "warning"))
    assert refused_by(report) == ["trtllm", "vllm"]


def test_qkv_float_protected_for_vllm_by_v_proj_glob(ckpt):
    # vLLM matches the fused `qkv_proj` prefix; fnmatch('...self_attn.qkv_proj', '*v_proj') is true
    path = ckpt(quant="NVFP4")
    set_exclusions(path, lambda ex: [p for p in ex if p != "*qkv_proj"])
    assert_clean(run(path))


def test_qkv_float_without_a_matching_exclusion_refused_by_vllm(ckpt):
    path = ckpt(quant="NVFP4")
    set_exclusions(
        path, lambda ex: [p for p in ex if p not in ("*qkv_proj", "*v_proj")] + ["*self_attn.v_proj"]
    )
    report = run(path)
    unprotected = of_rule(report, "LC307", "error", "self_attn")
    # SGLang builds LiLiCorr's qkv_proj through the quant config too (`*self_attn.v_proj` matches no qkv_proj)
    assert unprotected and all(f.runtimes == ["sglang", "vllm"] for f in unprotected), describe(report)
    assert "qkv_proj" in " ".join(f.message for f in unprotected)
    assert refused_by(report) == ["sglang", "vllm"]


def test_owned_bf16_head_not_excluded(ckpt):
    path = ckpt(OWNED, quant="NVFP4")
    set_exclusions(path, lambda ex: [p for p in ex if "lm_head" not in p])
    f = one(run(path), "LC307", "error")
    assert f.subjects == ["lm_head"] and "a bf16 owned head must be listed in the exclusions" in f.message
    assert {"vllm", "trtllm"} <= set(f.runtimes)


def test_owned_nvfp4_head_missing_weight_scale_2(ckpt):
    report = run(
        ckpt(
            OWNED,
            quant="NVFP4",
            quantize=servable(OWNED) | {"lm_head"},
            mutate=lambda t: t.pop("lm_head.weight_scale_2"),
        )
    )
    f = one(report, "LC304", "error")
    assert f.subjects == ["lm_head.weight_scale_2"] and f.runtimes == []
    assert refused_by(report) == ALL


def test_owned_nvfp4_head_that_is_excluded(ckpt):
    # packed tensors while lm_head is still in `ignore`: the runtime builds a bf16 head
    path = ckpt(OWNED, quant="NVFP4", quantize=servable(OWNED) | {"lm_head"})
    set_exclusions(path, lambda ex: [*ex, "lm_head"])
    f = one(run(path), "LC308", "error")
    assert f.subjects == ["lm_head"] and sorted(f.runtimes) == ALL
    assert "`lm_head` matches it" in f.message


def test_lm_head_input_scale_trap(ckpt):
    # an excluded bf16 head that still ships input_scale: no runtime has a parameter for it
    def mutate(t: Tensors) -> None:
        t["lm_head.input_scale"] = ("F32", (), SCALAR)

    report = run(ckpt(OWNED, quant="NVFP4", mutate=mutate))
    f = one(report, "LC308", "error")
    assert f.runtimes == [] and f.subjects == ["lm_head.input_scale"]
    assert "lm_head" in f.message and "input_scale" in f.message
    assert refused_by(report) == ALL


def test_float_module_shipping_a_weight_scale(ckpt):
    def mutate(t: Tensors) -> None:
        t["lilicorr.out_head.weight_scale"] = ("F8_E4M3", (16, 2), bytes(32))

    f = one(run(ckpt(quant="NVFP4", mutate=mutate)), "LC308", "error")
    assert f.subjects == ["lilicorr.out_head.weight_scale"]


def test_quantized_module_that_is_excluded(ckpt):
    path = ckpt(quant="NVFP4")
    set_exclusions(path, lambda ex: [*ex, "*self_attn.o_proj"])
    report = run(path)
    f = one(report, "LC308", "error")
    assert sorted(f.runtimes) == ALL and sorted(f.subjects) == [
        "layers.0.self_attn.o_proj",
        "layers.1.self_attn.o_proj",
    ]
    assert "`*self_attn.o_proj` matches it" in f.message


# ---------------------------------------------------------------- exclusion patterns


def test_exclusion_with_training_prefix(ckpt):
    # ModelOpt writes `dflash_module.`-prefixed names; no runtime matches them
    path = ckpt(quant="NVFP4")
    set_exclusions(
        path, lambda ex: [p for p in ex if p != "*lilicorr.out_head"] + ["dflash_module.lilicorr.out_head"]
    )
    report = run(path)
    f = one(report, "LC310", "warning")
    assert f.subjects == ["dflash_module.lilicorr.out_head"] and "training prefix" in f.message
    # TRT follows the config for out_head and would build it quantized; SGLang and vLLM force it float
    assert [x.runtimes for x in of_rule(report, "LC307", "error")] == [["trtllm"]]
    assert refused_by(report) == ["trtllm"]


def test_exclusion_with_backbone_layer_index(ckpt):
    # vLLM 0.33.0 renumbers a draft layer index in the patterns as in the module names
    # (models/utils.py map_draft_quant_config): `layers.0...` matches model.layers.4 there
    o_proj = {"layers.0.self_attn.o_proj", "layers.1.self_attn.o_proj"}
    path = ckpt(quant="NVFP4", quantize=servable() - o_proj)
    set_exclusions(path, lambda ex: [p for p in ex if "o_proj" not in p] + sorted(o_proj))
    report = run(path)
    assert sorted(f.subjects[0] for f in hits(report, "LC310", "warning")) == sorted(o_proj)
    assert hits(report, "LC307") == [], describe(report)
    assert refused_by(report) == []


def test_exclusion_with_a_runtime_layer_index_is_left_as_written_by_vllm(ckpt):
    # `model.layers.4...` is already vLLM's name of draft layer 0 (4 target layers): left as written, it matches
    o_proj = "layers.0.self_attn.o_proj"
    path = ckpt(quant="NVFP4", quantize=servable() - {o_proj})
    set_exclusions(
        path, lambda ex: [p for p in ex if "o_proj" not in p] + ["model.layers.4.self_attn.o_proj"]
    )
    report = run(path)
    assert [f.runtimes for f in hits(report, "LC307")] == [["sglang", "trtllm"]], describe(report)
    assert refused_by(report) == ["sglang", "trtllm"]


def test_exclusion_with_base_model_name_is_informational(ckpt):
    path = ckpt(quant="NVFP4")
    set_exclusions(path, lambda ex: [*ex, "model.embed_tokens"])
    report = run(path)
    assert one(report, "LC323").severity == "info"
    assert_clean(report)


def test_exact_head_layer_exclusion_is_not_flagged(ckpt):
    config = fixtures.draft_config(dflash={"lilicorr_hidden_size": 40})
    report = run(ckpt(config, quant="NVFP4"))
    assert hits(report, "LC310") == [], describe(report)


def test_exclusions_naming_the_shards_do_not_exclude_vllms_fused_qkv_proj(ckpt):
    # vLLM 0.33.0's draft quant config has no packed-module mapping (models/utils.py get_draft_quant_config):
    # qkv_proj is matched by its own name, so exact shard names exclude nothing and the float q/k/v fail to load
    path = ckpt(quant="NVFP4")
    set_exclusions(
        path,
        lambda ex: (
            [p for p in ex if p not in ("*q_proj", "*k_proj", "*v_proj", "*qkv_proj")]
            + [f"layers.{i}.self_attn.{x}_proj" for i in (0, 1) for x in "qkv"]
        ),
    )
    report = run(path)
    found = hits(report, "LC307", "error")
    assert found and all(f.runtimes == ["vllm"] for f in found), describe(report)
    assert "model.layers.4.self_attn.qkv_proj" in " ".join(f.message for f in found)
    assert refused_by(report) == ["vllm"]


def test_a_v_proj_suffix_pattern_excludes_vllms_fused_qkv_proj(ckpt):
    # fnmatch("model.layers.4.self_attn.qkv_proj", "*v_proj") is true: vLLM keeps qkv_proj in float
    path = ckpt(quant="NVFP4")
    set_exclusions(path, lambda ex: [p for p in ex if p != "*qkv_proj"])
    assert hits(run(path), "LC307") == []


def test_quantized_conv_projection_refused_by_sglang(ckpt):
    # dflash.py DFlashGroupedConv.kernel_projection is a plain nn.Linear
    config = fixtures.draft_config(conv=(4, 16))
    conv = {f"layers.{i}.{c}.kernel_projection" for i in (0, 1) for c in ("attention_conv", "mlp_conv")}
    report = run(ckpt(config, quant="NVFP4", quantize=servable(config) | conv))
    found = hits(report, "LC306", "error")
    assert found and all(f.runtimes == ["sglang"] for f in found)
    assert {s for f in found for s in f.subjects} == conv
    assert refused_by(report) == ["sglang"]


def test_quantized_qkv_is_refused_by_trtllm_only(ckpt):
    # SGLang 0.5.23 builds LiLiCorr's q/k/v through the quant config and vLLM 0.33.0 runs a quantized qkv_proj
    # through its quant method (qwen3_dflash.py _build_context_kv_buffers); TensorRT-LLM slices the raw qkv_proj
    # weight into its fused context-KV buffer (loader audit E6)
    report = run(ckpt(quant="NVFP4", quantize=servable() | QKV))
    found = hits(report, "LC306", "error")
    assert {s for f in found for s in f.subjects} == QKV, describe(report)
    assert sorted({r for f in found for r in f.runtimes}) == ["trtllm"]
    assert problems(report, ignore={"LC306"}) == []
