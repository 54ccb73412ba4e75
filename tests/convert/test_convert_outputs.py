"""What convert writes: names, config, quantization metadata, repairs, shards, the conversion record."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from convert_helpers import EXAMPLE, bf16_to_f32, load_json, metadata_of, tensors_of, tree_digest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import bf16_bits, e4m3_decode, nvfp4_dequantize
from lilicorr_ckpt.checkpoint.quant import pattern_problems
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert.options import DEFAULT_RUNTIME
from lilicorr_ckpt.runtimes import excluded_by

MUST_FLOAT = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "lilicorr.factor_input_proj",
    "lilicorr.out_head",
    "lilicorr.in_head",
    "lilicorr.feature_mlp.down_proj",
)


def _module(name: str) -> str:
    return name.rsplit(".", 1)[0]


def test_modelopt_example_converts_and_every_runtime_accepts_it(cli, tmp_path):
    assert validate(str(EXAMPLE)).exit_code == 1  # the export as ModelOpt writes it is refused
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--runtime", "all")
    assert run.code == 0, run
    report = validate(str(dst))
    assert report.summary.errors == 0 and report.summary.warnings == 0, report.findings
    assert all(v.accepted for v in report.runtimes)
    assert "repaired  layers.*.self_attn.q_proj (2 modules): NVFP4 -> BF16" in run.out
    assert sorted(p.name for p in dst.iterdir()) == [
        "config.json",
        "conversion.json",
        "hf_quant_config.json",
        "model.safetensors",
    ]


def test_the_default_keeps_qkv_quantized_for_the_released_engines(cli, tmp_path):
    # q/k/v are dequantized only for the unreleased TensorRT-LLM: by default they stay NVFP4, one global scale per
    # fused linear, and both released engines accept the output
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst)
    assert run.code == 0, run
    out = tensors_of(dst)
    assert out["layers.0.self_attn.q_proj.weight"][0] == "U8"
    report = validate(str(dst), runtime=DEFAULT_RUNTIME)
    assert report.summary.errors == 0 and [v.runtime for v in report.runtimes] == ["sglang", "vllm"]
    for layer in (0, 1):
        for shards in (("q", "k", "v"), ("gate", "up")):
            where = "self_attn" if len(shards) == 3 else "mlp"
            values = {out[f"layers.{layer}.{where}.{s}_proj.weight_scale_2"][2] for s in shards}
            assert len(values) == 1, (layer, shards)
    assert "q_proj" not in " ".join(line for line in run.out.splitlines() if line.startswith("  repaired"))
    assert "TensorRT-LLM" in run.out and "--runtime all" in run.out  # the selection is said
    record = load_json(dst / "conversion.json")
    assert record["options"]["runtime"] == DEFAULT_RUNTIME == "sglang,vllm"
    assert record["validation"]["verdicts"] == {"sglang": "accepts", "vllm": "accepts"}


def _requantized_names(record: dict) -> set[str]:
    return {
        f"{shard['module']}.{suffix}"
        for group in record["fused_scales"]
        for shard in group["requantized"]
        for suffix in ("weight", "weight_scale", "weight_scale_2")
    }


def test_repaired_modules_hold_the_dequantized_values_in_the_model_dtype(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--runtime", "all").code == 0
    src, out = tensors_of(EXAMPLE), tensors_of(dst)
    repaired = [n for n in out if n.endswith(".weight") and any(m in n for m in MUST_FLOAT)]
    assert len(repaired) == 10
    for name in repaired:
        module = _module(name)
        dtype, shape, raw = out[name]
        assert dtype == "BF16"
        packed = np.frombuffer(src[name][2], np.uint8).reshape(src[name][1])
        scales = np.frombuffer(src[module + ".weight_scale"][2], np.uint8).reshape(
            src[module + ".weight_scale"][1]
        )
        scale_2 = np.frombuffer(src[module + ".weight_scale_2"][2], np.float32)[0]
        expected = nvfp4_dequantize(packed, scales, scale_2) + np.float32(0.0)  # ModelOpt's E2M1 zero is +0.0
        assert shape == expected.shape
        assert raw == bf16_bits(expected).tobytes()
        assert not any(f"{module}.{s}" in out for s in ("weight_scale", "weight_scale_2", "input_scale"))
    # everything else is copied byte for byte, but the fused shards re-quantized to their group's scale
    requantized = _requantized_names(load_json(dst / "conversion.json"))
    assert requantized and all("mlp.gate_proj" in n or "mlp.up_proj" in n for n in requantized)
    for name, value in out.items():
        if name not in repaired and name not in requantized:
            assert src[name] == value, name


def test_quant_metadata_is_rewritten_for_the_runtimes(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--runtime", "all").code == 0
    config, nested = load_json(dst / "config.json"), load_json(dst / "hf_quant_config.json")
    flat = config["quantization_config"]
    assert (
        flat["quant_method"] == "modelopt_fp4" and flat["quant_algo"] == "NVFP4" and flat["group_size"] == 16
    )
    assert nested["quantization"]["exclude_modules"] == flat["ignore"]
    assert nested["quantization"]["quant_algo"] == "NVFP4"
    assert {"group_size", "kv_cache_quant_algo", "exclude_modules"} <= set(nested["quantization"])
    ignore = flat["ignore"]
    assert "*qkv_proj" in ignore  # every q/k/v part is float: the fused alias is listed
    assert "*embed_tokens*" in ignore  # format spec: always excluded, as ModelOpt's drafter export does
    for pattern in ignore:
        assert pattern_problems(pattern) == [], pattern  # no training prefix, base-model name or layer index
        assert not pattern.startswith(("dflash_module", "model.", "lm_head"))
    # every runtime's matcher excludes exactly the float modules
    out = tensors_of(dst)
    modules = {
        _module(n)
        for n, (dtype, shape, _) in out.items()
        if n.endswith(".weight") and len(shape) == 2 and not n.endswith("in_proj_weight")
    }
    for module in modules:
        is_float = out[module + ".weight"][0] == "BF16"
        for matcher in ("vllm", "sglang", "trtllm"):
            assert excluded_by(matcher, module, tuple(ignore), 4).excluded == is_float, (matcher, module)


def test_conversion_record_lists_every_change(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--runtime", "all").code == 0
    record = load_json(dst / "conversion.json")
    assert record["tool"] == "lilicorr-ckpt" and record["version"]
    assert set(record["source"]["files"]) == {"config.json", "hf_quant_config.json", "model.safetensors"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in record["source"]["files"].values())
    assert record["source"]["files"] == {k: v for k, v in tree_digest(EXAMPLE).items()}
    repaired = {r["module"] for r in record["repairs"]}
    assert "lilicorr.out_head" in repaired and "layers.1.self_attn.v_proj" in repaired
    assert all(r["to"] == "BF16" and r["max_rounding_error"] >= 0 for r in record["repairs"])
    dropped = {d["tensor"] for d in record["drops"]}
    assert "lilicorr.out_head.weight_scale_2" in dropped
    assert record["exclusions"]["stripped"] == {
        "dflash_module.lilicorr.feature_mlp.up_proj": "lilicorr.feature_mlp.up_proj"
    }
    assert set(record["exclusions"]["dropped"]) == {"lm_head", "model.embed_tokens", "model.layers.*"}
    assert any(c["key"] == "quantization_config" for c in record["config"])
    assert record["validation"]["verdicts"] == {"sglang": "accepts", "vllm": "accepts", "trtllm": "accepts"}
    meta = metadata_of(dst / "model.safetensors")
    assert json.loads(meta["lilicorr_ckpt.source_sha256"]) == record["source"]["files"]
    assert meta["lilicorr_ckpt.tool"].startswith("lilicorr-ckpt ") and meta["format"] == "pt"


def test_same_input_gives_byte_identical_output(cli, tmp_path):
    assert cli("convert", EXAMPLE, tmp_path / "a", "--max-shard-size", "40KB").code == 0
    assert cli("convert", EXAMPLE, tmp_path / "b", "--max-shard-size", "40KB").code == 0
    a, b = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert len(a) > 4 and a == b


@pytest.mark.parametrize("prefix", ["dflash_module.", "eagle_module.", "model.", "model.dflash_module."])
def test_prefixes_are_stripped_and_bytes_copied(cli, export, tmp_path, prefix):
    src = export(key_prefix=prefix)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 0, run
    before, after = tensors_of(src), tensors_of(dst)
    assert {prefix + n for n in after} == set(before)
    assert all(after[n] == before[prefix + n] for n in after)
    renames = load_json(dst / "conversion.json")["renames"]
    assert len(renames) == len(after) and renames[0]["why"].startswith("strip ")
    assert validate(str(dst)).summary.errors == 0


def test_legacy_head_names_become_named_and_back(cli, export, tmp_path):
    src = export(naming="sequential")
    assert "lilicorr.feature_mlp.1.weight" in tensors_of(src)
    assert cli("convert", src, tmp_path / "named").code == 0
    named = tensors_of(tmp_path / "named")
    assert "lilicorr.feature_mlp.up_proj.weight" in named and "lilicorr.feature_norm.bias" in named
    assert not any(re.search(r"mlp\.\d", n) for n in named)
    report = validate(str(tmp_path / "named"))
    assert report.summary.errors == 0 and report.summary.warnings == 0

    # SGLang 0.5.23 and vLLM refuse the Sequential names (LC217): write them for the runtime that renames them
    run = cli(
        "convert", tmp_path / "named", tmp_path / "seq", "--naming", "sequential", "--runtime", "trtllm"
    )
    assert run.code == 0, run
    seq = tensors_of(tmp_path / "seq")
    assert set(seq) == set(tensors_of(src))
    assert validate(str(tmp_path / "seq"), runtime="trtllm").summary.errors == 0


def test_sequential_output_of_a_quantized_export_excludes_the_legacy_names(cli, tmp_path):
    # TensorRT-LLM, the runtime that renames the Sequential names, follows the config for feature_mlp: its float
    # up_proj (in_features 5) is excluded under the legacy name the output carries
    run = cli("convert", EXAMPLE, tmp_path / "seq", "--naming", "sequential", "--runtime", "trtllm")
    assert run.code == 0, run
    out = tensors_of(tmp_path / "seq")
    assert (
        out["lilicorr.feature_mlp.1.weight"][0] == "BF16" and out["lilicorr.feature_mlp.3.weight"][0] == "U8"
    )
    ignore = load_json(tmp_path / "seq" / "config.json")["quantization_config"]["ignore"]
    assert "lilicorr.feature_mlp.1" in ignore


def test_sharded_input_and_sharded_output(cli, export, tmp_path):
    src = export(shards=3, quant="NVFP4")
    assert (src / "model.safetensors.index.json").exists()
    run = cli("convert", src, tmp_path / "one")
    assert run.code == 0, run
    assert [p.name for p in (tmp_path / "one").glob("*.safetensors")] == ["model.safetensors"]

    run = cli("convert", src, tmp_path / "many", "--max-shard-size", "30KB")
    assert run.code == 0, run
    files = sorted(p.name for p in (tmp_path / "many").glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = load_json(tmp_path / "many" / "model.safetensors.index.json")
    assert sorted(set(index["weight_map"].values())) == files
    sizes = {}
    for f in files:
        for name, (_, _, raw) in tensors_of(tmp_path / "many" / f).items():
            sizes[name] = len(raw)
    assert index["metadata"]["total_size"] == sum(sizes.values())
    assert tensors_of(tmp_path / "many") == tensors_of(tmp_path / "one")
    assert validate(str(tmp_path / "many"), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_a_misplaced_index_entry_is_fixed_and_said(cli, export, tmp_path):
    """An index that places a tensor in the wrong shard (validate's LC603) is rebuilt from where the tensors are,
    and convert says so instead of fixing it silently."""
    src = export(shards=3, quant="NVFP4")
    index = load_json(src / "model.safetensors.index.json")
    name = sorted(index["weight_map"])[0]
    real = index["weight_map"][name]
    wrong = next(f for f in sorted(set(index["weight_map"].values())) if f != real)
    index["weight_map"][name] = wrong
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    assert "placed 1 tensor(s) in a shard that does not hold them" in run.out and wrong in run.out, run.out
    record = load_json(tmp_path / "out" / "conversion.json")
    assert list(record["index_fixed"].values()) == [{"listed": wrong, "found": real}]
    assert validate(str(tmp_path / "out"), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_config_is_normalized_from_the_tensors(cli, export, tmp_path):
    cfg = fixtures.draft_config(conv=(4, 16), architecture="Qwen3ForCausalLM")
    d = cfg["dflash_config"]
    cfg["lilicorr_logit_scale"] = d.pop("lilicorr_logit_scale")  # an older export: geometry at the top level
    for key in (
        "lilicorr_hidden_size",
        "lilicorr_factor_dim",
        "lilicorr_candidate_topk",
        "conv_kernel_size",
        "conv_group_size",
        "block_size",
        "projector_type",
        "lilicorr_enabled",
    ):
        d.pop(key)
    del cfg["block_size"]
    src = fixtures.save(
        tmp_path / "src", cfg, fixtures.checkpoint_tensors(fixtures.draft_config(conv=(4, 16)))
    )
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 0, run
    out = load_json(dst / "config.json")
    assert out["architectures"] == ["LiLiCorrDraftModel"]
    assert out["block_size"] == out["dflash_config"]["block_size"] == 8
    nested = out["dflash_config"]
    assert nested["lilicorr_logit_scale"] == 10.0 and "lilicorr_logit_scale" not in out
    assert (
        nested["lilicorr_hidden_size"],
        nested["lilicorr_factor_dim"],
        nested["lilicorr_candidate_topk"],
    ) == (32, 16, 4)
    assert (nested["conv_kernel_size"], nested["conv_group_size"]) == (4, 16)
    assert nested["projector_type"] == "lilicorr" and nested["lilicorr_enabled"] is True
    changes = {c["key"]: c for c in load_json(dst / "conversion.json")["config"]}
    assert changes["dflash_config.block_size"]["reason"].startswith(
        "determined by lilicorr.relative_slot_bias"
    )
    assert changes["lilicorr_logit_scale"]["action"] == "removed"
    assert validate(str(dst)).summary.errors == 0


def test_block_size_conflict_keeps_the_nested_value_at_both_levels(cli, export, tmp_path):
    cfg = fixtures.draft_config(head=False, block_size=16)
    src = export(config=cfg)
    assert cli("convert", src, tmp_path / "out").code == 0
    out = load_json(tmp_path / "out" / "config.json")
    assert out["block_size"] == out["dflash_config"]["block_size"] == 8
    assert out["architectures"] == ["DFlashDraftModel"]


def test_only_the_chosen_runtimes_decide_what_is_repaired(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "trt", "--runtime", "trtllm")
    assert run.code == 0, run
    out = tensors_of(tmp_path / "trt")
    # TRT-LLM loads the quantized factor heads (SGLang and vLLM build them in float) ...
    assert out["lilicorr.out_head.weight"][0] == "U8"
    assert out["lilicorr.feature_mlp.down_proj.weight"][0] == "U8"
    # ... but slices the raw q/k/v weight into its fused context-KV buffer, so those are repaired
    assert out["layers.0.self_attn.q_proj.weight"][0] == "BF16"
    report = validate(str(tmp_path / "trt"), runtime="trtllm")
    assert report.summary.errors == 0


def test_dequantize_option_and_fused_gate_up_alias(cli, tmp_path):
    run = cli(
        "convert",
        EXAMPLE,
        tmp_path / "out",
        "--dequantize",
        "layers.*.mlp.gate_proj",
        "--dequantize",
        "layers.*.mlp.up_proj",
    )
    assert run.code == 0, run
    ignore = load_json(tmp_path / "out" / "config.json")["quantization_config"]["ignore"]
    assert "*gate_up_proj" in ignore
    assert tensors_of(tmp_path / "out")["layers.1.mlp.up_proj.weight"][0] == "BF16"
    assert validate(str(tmp_path / "out"), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_fp8_export_is_repaired_with_weight_times_scale(cli, export, tmp_path):
    src = export(quant="FP8")
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    config = load_json(tmp_path / "out" / "config.json")
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["quant_algo"] == "FP8"
    before, after = tensors_of(src), tensors_of(tmp_path / "out")
    codes = np.frombuffer(before["lilicorr.out_head.weight"][2], np.uint8)
    scale = np.frombuffer(before["lilicorr.out_head.weight_scale"][2], np.float32)
    expected = bf16_bits(e4m3_decode(codes) * scale[0]).tobytes()
    assert after["lilicorr.out_head.weight"][2] == expected
    assert after["layers.0.mlp.down_proj.weight"][0] == "F8_E4M3"
    assert validate(str(tmp_path / "out"), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_a_float_module_with_stray_scales_loses_them(cli, export, tmp_path):
    def add_stray(tensors):
        tensors["lilicorr.in_head.input_scale"] = ("F32", (), np.float32(0.5).tobytes())

    src = export(quant="NVFP4", style="serving", mutate=add_stray)
    assert validate(str(src)).summary.errors >= 1
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    assert "lilicorr.in_head.input_scale" not in tensors_of(tmp_path / "out")
    assert "dropped its stray input_scale" in run.out
    assert validate(str(tmp_path / "out")).summary.errors == 0


def test_a_plain_bf16_export_keeps_no_quant_metadata(cli, export, tmp_path):
    src = export()
    cfg = load_json(src / "config.json")
    cfg["quantization_config"] = {
        "producer": {"name": "modelopt"},
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "kv_cache_quant_algo": None,
            "exclude_modules": [],
        },
    }
    (src / "config.json").write_text(json.dumps(cfg))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    assert "quantization_config" not in load_json(tmp_path / "out" / "config.json")
    assert not (tmp_path / "out" / "hf_quant_config.json").exists()
    assert "quantization_config removed" in run.out


def test_quant_metadata_is_inferred_when_the_source_has_none(cli, export, tmp_path):
    src = export(quant="W4A16_NVFP4", style="serving")
    cfg = load_json(src / "config.json")
    del cfg["quantization_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "hf_quant_config.json").unlink()
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    flat = load_json(tmp_path / "out" / "config.json")["quantization_config"]
    assert flat["quant_algo"] == "W4A16_NVFP4" and flat["quant_method"] == "modelopt_fp4"


def test_converting_twice_changes_nothing_but_provenance(cli, tmp_path):
    assert cli("convert", EXAMPLE, tmp_path / "once").code == 0
    run = cli("convert", tmp_path / "once", tmp_path / "twice")
    assert run.code == 0, run
    assert tensors_of(tmp_path / "once") == tensors_of(tmp_path / "twice")
    assert load_json(tmp_path / "once" / "config.json") == load_json(tmp_path / "twice" / "config.json")
    record = load_json(tmp_path / "twice" / "conversion.json")
    assert record["renames"] == record["repairs"] == record["drops"] == record["config"] == []


def test_dry_run_writes_nothing_and_prints_the_plan(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--dry-run")
    assert run.code == 0, run
    assert run.out.startswith("would convert") and "repaired" in run.out
    assert "shards to re-quantize to their group's largest" in run.out
    assert not dst.exists() and list(tmp_path.iterdir()) == []
    record = json.loads(cli("convert", EXAMPLE, dst, "--dry-run", "--format", "json", "-r", "all").out)
    assert record["validation"]["errors"] == 0 and len(record["repairs"]) == 10
    # the errors of the re-quantized shards are measured when they are written
    assert all(s["max_abs_error"] is None for g in record["fused_scales"] for s in g["requantized"])


def test_repaired_bf16_weights_round_to_nearest(cli, tmp_path):
    assert cli("convert", EXAMPLE, tmp_path / "out").code == 0
    raw = tensors_of(tmp_path / "out")["lilicorr.out_head.weight"][2]
    values = bf16_to_f32(raw)
    assert np.isfinite(values).all() and np.abs(values).max() > 0


@pytest.mark.parametrize("layout", ["scalar", "per_channel", "block128"])
def test_fp8_repairs_apply_every_scale_layout(layout, monkeypatch):
    import lilicorr_ckpt.convert.repair as repair
    from lilicorr_ckpt.checkpoint.numerics import e4m3_encode
    from lilicorr_ckpt.checkpoint.tensors import TensorInfo

    monkeypatch.setattr(repair, "CHUNK_ELEMENTS", 100 * 256)  # several row blocks
    rng = np.random.default_rng(5)
    o, i = 256, 256
    codes = e4m3_encode(rng.standard_normal((o, i)).astype(np.float32) * 50)
    shape = {"scalar": (), "per_channel": (o,), "block128": (2, 1, 2, 1)}[layout]
    scale = (np.asarray(rng.random(shape)) + 0.5).astype(np.float32)
    if layout == "scalar":
        full = np.full((o, i), scale, np.float32)
    elif layout == "per_channel":
        full = np.repeat(scale[:, None], i, 1)
    else:
        full = np.kron(scale.reshape(2, 2), np.ones((128, 128), np.float32))
    expected = bf16_bits(e4m3_decode(codes) * full).tobytes()
    blobs = {"w": codes.tobytes(), "s": np.ascontiguousarray(scale).tobytes()}
    infos = {
        "weight": TensorInfo("x.weight", "F8_E4M3", (o, i), "w", 0, o * i),
        "weight_scale": TensorInfo("x.weight_scale", "F32", scale.shape, "s", 0, scale.nbytes),
    }
    out = b"".join(
        b
        for b, _ in repair.dequantize_blocks(
            "fp8", infos, (o, i), "BF16", lambda t, off, n: blobs[t.file][off : off + n], 16
        )
    )
    assert out == expected


# ---------------------------------------------------------------- other files of SRC: copied or left out

KEPT = {
    "README.md": "# drafter\n",
    "LICENSE": "Apache-2.0\n",
    "generation_config.json": '{"do_sample": false}\n',
    "tokenizer.json": '{"version": "1.0"}\n',
    "tokenizer_config.json": "{}\n",
    "chat_template.jinja": "{{ x }}\n",
    ".gitattributes": "*.safetensors filter=lfs\n",
    "notes.txt": "trained 3 epochs\n",
    "special_tokens_map.json": "{}\n",
}
LEFT_OUT = {
    "pytorch_model.bin": "pickle format",
    "training_args.bin": "pickle format",
    "optimizer.pt": "pickle format",
    "model.gguf": "(gguf)",
    "pytorch_model.bin.index.json": "weight index that is not part of the source checkpoint",
    "conversion.json": "the record of an earlier conversion",
    "runs/": "subdirectory",
}


def _with_other_files(src, files=KEPT):
    for name, text in files.items():
        (src / name).write_text(text)
    (src / "pytorch_model.bin").write_bytes(b"not really a pickle")
    (src / "training_args.bin").write_bytes(b"\x80\x04")
    (src / "optimizer.pt").write_bytes(b"\x80\x04")
    (src / "model.gguf").write_bytes(b"GGUF")
    (src / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    (src / "conversion.json").write_text('{"tool": "lilicorr-ckpt", "output": {}}')
    (src / "runs").mkdir()
    (src / "runs" / "events.out").write_text("x")
    return src


def test_other_files_are_copied_unchanged_or_left_out_and_every_one_is_recorded(cli, export, tmp_path):
    src = _with_other_files(export(quant="NVFP4"))
    before = tree_digest(src)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 0, run
    assert tree_digest(src) == before
    for name, text in KEPT.items():
        assert (dst / name).read_text() == text, name
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [*KEPT, "config.json", "conversion.json", "hf_quant_config.json", "model.safetensors"]
    )
    assert load_json(dst / "conversion.json")["tool"] == "lilicorr-ckpt"  # its own record, not the source's
    other = load_json(dst / "conversion.json")["other_files"]
    assert other["copied"] == sorted(KEPT)
    reasons = {d["file"]: d["reason"] for d in other["dropped"]}
    assert set(reasons) == set(LEFT_OUT)
    for name, why in LEFT_OUT.items():
        assert why in reasons[name], (name, reasons[name])
    assert "(never opened)" in reasons["pytorch_model.bin"]
    # the summary: the files are many, so a count and the first names, and a line per reason left out
    assert "  copied    9 other files unchanged: .gitattributes, LICENSE, README.md," in run.out
    assert (
        "  left out  3 files (optimizer.pt, pytorch_model.bin, training_args.bin): weights in a pickle format"
        in run.out
    )
    assert "  left out  runs/: subdirectory" in run.out
    assert validate(str(dst), runtime=DEFAULT_RUNTIME).summary.errors == 0


def test_a_few_other_files_get_a_line_each_and_the_json_output_lists_them(cli, export, tmp_path):
    src = export()
    (src / "README.md").write_text("card")
    (src / "pytorch_model.bin").write_bytes(b"x")
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    assert "  copied    README.md (unchanged)\n" in run.out
    assert "  left out  pytorch_model.bin: weights in a pickle format (never opened)" in run.out
    doc = json.loads(cli("convert", src, tmp_path / "again", "-f", "json").out)
    assert doc["status"] == "converted"
    assert doc["other_files"]["copied"] == ["README.md"]
    assert [d["file"] for d in doc["other_files"]["dropped"]] == ["pytorch_model.bin"]
    assert (tmp_path / "again" / "README.md").read_text() == "card"


def test_dry_run_lists_the_other_files_and_writes_nothing(cli, export, tmp_path):
    src = export()
    (src / "README.md").write_text("card")
    (src / "model.npz").write_bytes(b"PK")
    dst = tmp_path / "out"
    run = cli("convert", src, dst, "--dry-run")
    assert run.code == 0, run
    assert (
        "  copied    README.md (unchanged)" in run.out
        and "  left out  model.npz: weights in another format (npz)" in run.out
    )
    doc = json.loads(cli("convert", src, dst, "--dry-run", "-f", "json").out)
    assert doc["status"] == "dry-run" and doc["other_files"]["copied"] == ["README.md"]
    assert not dst.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_plain_export_records_no_other_files(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst)
    assert run.code == 0, run
    assert load_json(dst / "conversion.json")["other_files"] == {"copied": [], "dropped": []}
    assert "copied" not in run.out and "left out" not in run.out


def test_a_disk_full_while_copying_other_files_leaves_nothing(cli, export, tmp_path, monkeypatch):
    import errno
    import os

    import lilicorr_ckpt.convert.writer as writer

    src = export()
    (src / "README.md").write_text("card" * 1000)
    real = writer.copy_file

    def copy_file(a, b):
        real(a, b)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "copy_file", copy_file)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 2 and "cannot write the output: No space left on device" in run.err, run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_repairs_apply_numerics_scale_policy_with_negative_zero_as_zero():
    import lilicorr_ckpt.convert.repair as repair
    from lilicorr_ckpt.checkpoint import numerics
    from lilicorr_ckpt.checkpoint.numerics import ScaleDefects, e2m1_decode, scale_defects
    from lilicorr_ckpt.checkpoint.tensors import TensorInfo

    assert scale_defects([np.array([0.5, -0.0, 0.0], np.float32)]) == ScaleDefects()
    assert scale_defects([np.zeros(2, np.float32), np.array([-0.0], np.float32)]).all_zero
    assert scale_defects([np.array([np.nan], np.float32)]) == ScaleDefects(non_finite=True)
    assert scale_defects([np.array([1.0], np.float32), np.array([-1e-3], np.float32)]).negative
    assert not np.signbit(
        numerics.NVFP4_PAIRS[[0x08, 0x80], [0, 1]]
    ).any()  # E2M1 code 0b1000 is +0.0, as in ModelOpt
    assert (
        numerics.NVFP4_PAIRS.reshape(-1)
        == e2m1_decode(np.array([b >> (4 * h) & 15 for b in range(256) for h in (0, 1)], np.uint8))
    ).all()
    o, i = 2, 32
    packed = np.full((o, i // 2), 0x22, np.uint8)  # every element 1.0
    blobs = {"w": packed.tobytes(), "s2": np.float32(0.5).tobytes()}
    infos = {
        "weight": TensorInfo("x.weight", "U8", (o, i // 2), "w", 0, packed.nbytes),
        "weight_scale": TensorInfo("x.weight_scale", "F8_E4M3", (o, 2), "s", 0, 4),
        "weight_scale_2": TensorInfo("x.weight_scale_2", "F32", (), "s2", 0, 4),
    }

    def run(scale_codes: bytes) -> np.ndarray:
        blobs["s"] = scale_codes
        out = b"".join(
            b
            for b, _ in repair.dequantize_blocks(
                "nvfp4", infos, (o, i), "F32", lambda t, off, n: blobs[t.file][off : off + n], 16
            )
        )
        return np.frombuffer(out, np.float32).reshape(o, i)

    # one block scale -0.0 (0x80) beside 1.0 (0x38): zero, not negative (as validate --deep reads it)
    got = run(bytes([0x80, 0x38, 0x38, 0x38]))
    assert (got[0, :16] == 0).all() and (got[0, 16:] == 0.5).all() and (got[1] == 0.5).all()
    with pytest.raises(repair.BadScales, match="all zero weight_scale"):
        run(bytes([0x80, 0x00, 0x00, 0x80]))
