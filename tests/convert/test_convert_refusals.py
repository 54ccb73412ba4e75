"""Bad input: a clear reason, the right exit code, no traceback, and nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from convert_helpers import EXAMPLE, load_json, tensors_of, tree_digest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.runtimes import PROFILES

SG, VL, TR = (PROFILES[n].display for n in ("sglang", "vllm", "trtllm"))


def _nothing_written(run, dst):
    assert "Traceback" not in run.err + run.out
    assert not dst.exists()
    assert not list(dst.parent.glob(f".{dst.name}.convert-*"))


def test_unknown_layout_names_what_was_expected(cli, tmp_path):
    src = tmp_path / "llama"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    (src / "model.safetensors").write_bytes((EXAMPLE / "model.safetensors").read_bytes())
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 2
    assert "not a DFlash-family drafter export" in run.err and "dflash_config" in run.err
    assert "LiLiCorrDraftModel" in run.err
    _nothing_written(run, tmp_path / "out")


def test_tensors_with_no_dflash_names_are_an_unknown_layout(cli, export, tmp_path):
    src = export()
    fixtures.save(src, load_json(src / "config.json"), {"encoder.block.0.weight": ("BF16", (4,), b"\0" * 8)})
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 2 and "no tensor of" in run.err and "layers.0.self_attn.q_proj.weight" in run.err
    _nothing_written(run, tmp_path / "out")


def test_pickle_only_source_is_refused_without_unpickling(cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(fixtures.draft_config()))
    (src / "pytorch_model.bin").write_bytes(b"not really a pickle")
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 2 and "never unpickled" in run.err and "pytorch_model.bin" in run.err


@pytest.mark.parametrize("case", ["no-config", "not-a-dir", "corrupt", "truncated", "bad-json"])
def test_unreadable_input_exits_2_without_traceback(cli, export, tmp_path, case):
    src = export()
    if case == "no-config":
        (src / "config.json").unlink()
    elif case == "not-a-dir":
        src = src / "model.safetensors"
    elif case == "corrupt":
        (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    elif case == "truncated":
        data = (src / "model.safetensors").read_bytes()
        (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    else:
        (src / "config.json").write_text("{")
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 2, run
    assert run.err.startswith("lilicorr-ckpt: error:")
    _nothing_written(run, tmp_path / "out")


def test_a_key_that_maps_to_nothing_is_refused_until_dropped_explicitly(cli, export, tmp_path):
    def add(tensors):
        tensors["dflash_module.embed_tokens.weight"] = ("BF16", (512, 64), b"\0" * 512 * 64 * 2)
        tensors["dflash_module.mystery_gate"] = ("F32", (3,), b"\0" * 12)

    src = export(key_prefix="dflash_module.", mutate=add)
    dst = tmp_path / "out"
    run = cli("convert", src, dst)
    assert run.code == 1
    assert "map to nothing" in run.err and "dflash_module.mystery_gate (as mystery_gate)" in run.err
    assert "--drop" in run.err
    _nothing_written(run, dst)

    run = cli(
        "convert",
        src,
        dst,
        "--drop",
        "embed_tokens.*",
        "--drop",
        "dflash_module.mystery_*",
        "--drop",
        "mystery_gate",
    )  # two patterns for one tensor: both count as used
    assert run.code == 0, run
    drops = {d["tensor"]: d["reason"] for d in load_json(dst / "conversion.json")["drops"]}
    assert drops == {
        "dflash_module.embed_tokens.weight": "--drop embed_tokens.*",
        "dflash_module.mystery_gate": "--drop dflash_module.mystery_*",
    }
    assert "dropped   dflash_module.mystery_gate" in run.out


def test_a_drop_pattern_that_matches_nothing_is_a_usage_error(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out", "--drop", "embed_tokenz.*")
    assert run.code == 4 and "matches no tensor" in run.err


def test_rotary_buffers_are_dropped_and_reported(cli, export, tmp_path):
    def add(tensors):
        tensors["rotary_emb.inv_freq"] = ("F32", (8,), b"\0" * 32)

    src = export(mutate=add)
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    drops = load_json(tmp_path / "out" / "conversion.json")["drops"]
    assert drops == [
        {
            "tensor": "rotary_emb.inv_freq",
            "reason": "derived buffer every loader recomputes (ModelOpt's exporter drops it too)",
        }
    ]


def test_names_that_collide_after_renaming_are_refused(cli, export, tmp_path):
    def dup(tensors):
        tensors["dflash_module.fc.weight"] = tensors["fc.weight"]
        tensors["lilicorr.feature_mlp.1.bias"] = tensors["lilicorr.feature_mlp.up_proj.bias"]

    src = export(mutate=dup)
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1
    assert "dflash_module.fc.weight, fc.weight all become fc.weight" in run.err
    assert "lilicorr.feature_mlp.1.bias, lilicorr.feature_mlp.up_proj.bias all become" in run.err
    _nothing_written(run, tmp_path / "out")


def test_no_repair_refuses_instead_of_dequantizing(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--no-repair")
    assert run.code == 1
    assert "--no-repair" in run.err and "lilicorr.out_head is stored NVFP4" in run.err
    _nothing_written(run, dst)


def test_missing_untrained_constants_are_never_guessed(cli, export, tmp_path):
    cfg = fixtures.draft_config()
    src = fixtures.save(tmp_path / "src", cfg, fixtures.checkpoint_tensors(cfg))
    del cfg["dflash_config"]["lilicorr_logit_scale"]
    (src / "config.json").write_text(json.dumps(cfg))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1
    assert "lilicorr_logit_scale" in run.err and "--set dflash_config.lilicorr_logit_scale=VALUE" in run.err
    _nothing_written(run, tmp_path / "out")
    run = cli("convert", src, tmp_path / "out", "--set", "dflash_config.lilicorr_logit_scale=10")
    assert run.code == 0, run
    assert load_json(tmp_path / "out" / "config.json")["dflash_config"]["lilicorr_logit_scale"] == 10
    change = load_json(tmp_path / "out" / "conversion.json")["config"][0]
    assert change == {
        "key": "dflash_config.lilicorr_logit_scale",
        "action": "set",
        "after": 10,
        "reason": "--set on the command line",
    }


def test_missing_tensors_are_refused_before_writing(cli, export, tmp_path):
    src = export(mutate=lambda t: t.pop("lilicorr.in_head.bias"))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1 and "lacks tensors" in run.err and "lilicorr.in_head.bias" in run.err


def test_conflicting_quant_metadata_is_refused(cli, export, tmp_path):
    src = export(quant="NVFP4")
    doc = load_json(src / "hf_quant_config.json")
    doc["quantization"]["quant_algo"] = "FP8"
    (src / "hf_quant_config.json").write_text(json.dumps(doc))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1 and "different quantization algorithms" in run.err


def test_metadata_that_contradicts_the_weights_is_refused(cli, export, tmp_path):
    src = export(quant="NVFP4")
    for name in ("hf_quant_config.json", "config.json"):
        doc = load_json(src / name)
        node = doc["quantization_config"] if name == "config.json" else doc
        node["quantization"]["quant_algo"] = "FP8"
        (src / name).write_text(json.dumps(doc))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1 and "says FP8 but the weights are nvfp4" in run.err


def test_a_repair_input_with_the_wrong_shape_is_refused(cli, export, tmp_path):
    def bad(tensors):
        dtype, (o, g), raw = tensors["lilicorr.out_head.weight_scale"]
        tensors["lilicorr.out_head.weight_scale"] = (dtype, (o, g - 1), raw[: o * (g - 1)])

    src = export(quant="NVFP4", mutate=bad)
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1
    assert "cannot repair lilicorr.out_head: lilicorr.out_head.weight_scale is F8_E4M3 [16, 1]" in run.err


def test_existing_destination_needs_force_and_force_replaces_an_earlier_output(cli, tmp_path):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst, "--naming", "sequential", "--runtime", "trtllm").code == 0
    (dst / "old.txt").write_text("old")
    run = cli("convert", EXAMPLE, dst)
    assert run.code == 4 and "already exists" in run.err and "--force" in run.err
    assert (dst / "old.txt").exists()
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 0, run
    assert (dst / "old.txt").read_text() == "old" and (
        dst / "model.safetensors"
    ).exists()  # the user's file stays
    assert "lilicorr.feature_mlp.up_proj.weight" in tensors_of(dst)  # the new output, not the old one
    assert not list(tmp_path.glob(".out.convert-*"))


def test_force_replaces_an_empty_directory(cli, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 0, run
    assert (dst / "conversion.json").exists() and not list(tmp_path.glob(".out.convert-*"))


@pytest.mark.parametrize("record", [None, '{"tool": "something-else", "output": {}}', "not json"])
def test_force_never_deletes_a_directory_that_is_not_a_convert_output(cli, tmp_path, record):
    dst = tmp_path / "victim"
    (dst / "sub").mkdir(parents=True)
    (dst / "notes.txt").write_text("important")
    (dst / "sub" / "data.csv").write_text("1,2")
    for i in range(5):
        (dst / f"z{i}.txt").write_text("x")
    if record is not None:
        (dst / "conversion.json").write_text(record)
    before = tree_digest(dst)
    run = cli("convert", EXAMPLE, dst, "--force")
    assert run.code == 4, run
    assert run.err.count("\n") == 1 and "Traceback" not in run.err
    assert "is not empty and is not an earlier convert output" in run.err
    assert "notes.txt, sub/" in run.err and "more" in run.err  # a few names, then a count
    assert "choose another DST, or move its contents away" in run.err
    assert tree_digest(dst) == before
    assert not list(tmp_path.glob(".victim.convert-*"))


def test_force_help_says_what_it_replaces(cli):
    out = " ".join(cli("convert", "--help").out.split())
    assert "Replace DST if it is an empty directory or the output of an earlier convert" in out


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_the_source_is_never_a_destination(cli, export, tmp_path, where):
    src = export()
    before = tree_digest(src)
    dst = {"same": src, "inside": src / "converted", "contains": tmp_path}[where]
    run = cli("convert", src, dst, "--force")
    assert run.code == 4, run
    assert tree_digest(src) == before


def test_the_source_is_only_read(cli, export, tmp_path):
    src = export(quant="NVFP4", key_prefix="dflash_module.", naming="sequential", shards=2)
    before = tree_digest(src)
    stats = {p.name: p.stat().st_mtime_ns for p in src.iterdir()}
    assert cli("convert", src, tmp_path / "out").code == 0
    assert tree_digest(src) == before
    assert {p.name: p.stat().st_mtime_ns for p in src.iterdir()} == stats


def test_bad_options_are_usage_errors(cli, tmp_path):
    assert cli("convert", EXAMPLE, tmp_path / "o", "--max-shard-size", "lots").code == 4
    assert cli("convert", EXAMPLE, tmp_path / "o", "--set", "novalue").code == 4
    assert cli("convert", EXAMPLE, tmp_path / "o", "--dequantize", "no.such.module").code == 4
    assert cli("convert", EXAMPLE, tmp_path / "o", "--naming", "odd").code == 4


def test_strict_refuses_warnings(cli, tmp_path):
    # one layer_types entry too many: a warning for TensorRT-LLM (LC143), refused under --strict (SGLang and vLLM
    # refuse it outright: their transformers config class checks the length, LC119)
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["layer_types"] = ["full_attention"] * (cfg["num_hidden_layers"] + 1)
    (src / "config.json").write_text(json.dumps(cfg))
    assert cli("convert", src, tmp_path / "a", "--runtime", "trtllm").code == 0
    run = cli("convert", src, tmp_path / "b", "--runtime", "trtllm", "--strict")
    assert run.code == 1 and "LC143" in run.err
    run = cli("convert", src, tmp_path / "c", "--runtime", "sglang")
    assert run.code == 1 and "LC119" in run.err


def test_sequential_names_are_refused_for_sglang_and_vllm(cli, tmp_path):
    # SGLang 0.5.23 and vLLM have no parameter for the Sequential names (LC217); TensorRT-LLM renames them
    for runtime in ("all", "sglang", "vllm"):
        run = cli("convert", EXAMPLE, tmp_path / runtime, "--naming", "sequential", "--runtime", runtime)
        assert run.code == 1 and "LC217" in run.err, (runtime, run)
    assert cli("convert", EXAMPLE, tmp_path / "b", "--naming", "sequential", "--runtime", "trtllm").code == 0


def test_help_teaches_with_examples(cli):
    run = cli("convert", "--help")
    assert run.code == 0
    assert "Examples (from the repository root):" in run.out
    assert "lilicorr-ckpt convert examples/tiny-modelopt-nvfp4 ./drafter --dry-run" in run.out
    assert "--to speculators" in run.out
    assert "--max-shard-size" in run.out and "Exit codes" in run.out


def test_values_survive_a_float32_source(cli, export, tmp_path):
    src = export(dtype="F32", quant="NVFP4")
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 0, run
    out = tensors_of(tmp_path / "out")
    assert out["lilicorr.out_head.weight"][0] == "F32"
    assert np.isfinite(np.frombuffer(out["lilicorr.out_head.weight"][2], np.float32)).all()


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda c: c.__setitem__("hidden_size", "64"), '$.hidden_size: expected an integer, found "64"'),
        (lambda c: c.__setitem__("dflash_config", [1, 2]), "$.dflash_config: expected an object"),
        (lambda c: c.__setitem__("num_hidden_layers", 0), "LC118 num_hidden_layers is 0"),
        (lambda c: c["dflash_config"].__setitem__("block_size", -3), "LC112 block_size is -3"),
        (
            lambda c: c["dflash_config"].__setitem__("lilicorr_logit_scale", float("nan")),
            "--set dflash_config.lilicorr_logit_scale=VALUE",
        ),
    ],
)
def test_a_bad_config_is_refused_with_the_key_to_fix(cli, export, tmp_path, edit, expected):
    src = export(quant="NVFP4")
    cfg = load_json(src / "config.json")
    edit(cfg)
    (src / "config.json").write_text(json.dumps(cfg))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1, run
    assert expected in run.err and "Traceback" not in run.err
    _nothing_written(run, tmp_path / "out")


def test_a_group_size_the_scales_contradict_is_refused(cli, export, tmp_path):
    src = export(quant="NVFP4")
    for name in ("config.json", "hf_quant_config.json"):
        doc = load_json(src / name)
        (doc.get("quantization_config") or doc)["quantization"]["group_size"] = 32
        (src / name).write_text(json.dumps(doc))
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1 and "says group_size 32 but the NVFP4 weight scales imply 16" in run.err


# ---------------------------------------------------------------- -f json: one JSON document on stdout, always


def test_a_refusal_in_json_format_still_prints_one_json_document(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--no-repair", "-f", "json")
    assert run.code == 1
    doc = json.loads(run.out)
    assert doc["status"] == "refused" and doc["exit_code"] == 1 and doc["written"] is False
    assert doc["summary"].startswith("the source needs repairs and --no-repair was given")
    assert (
        f"lilicorr.out_head is stored NVFP4 but must stay floating point for {SG} and {VL}" in doc["reasons"]
    )
    assert "refused:" in run.err  # the message for people stays on stderr
    _nothing_written(run, dst)


@pytest.mark.parametrize(
    "args,code,text",
    [
        (["--set", "dflash_config.lilicorr_logit_scale=abc"], 4, "VALUE must be JSON"),
        (["--drop", "nothing.matches.*"], 4, "matches no tensor"),
    ],
)
def test_usage_errors_in_json_format_print_a_json_document(cli, tmp_path, args, code, text):
    run = cli("convert", EXAMPLE, tmp_path / "out", *args, "-f", "json")
    assert run.code == code, run
    doc = json.loads(run.out)
    assert doc["status"] == "error" and doc["exit_code"] == code and text in doc["error"]
    assert text in run.err


def test_unreadable_input_in_json_format_prints_a_json_document(cli, tmp_path):
    run = cli("convert", tmp_path / "missing", tmp_path / "out", "-f", "json")
    assert run.code == 2, run
    doc = json.loads(run.out)
    assert doc["status"] == "error" and doc["exit_code"] == 2 and "does not exist" in doc["error"]


def test_a_conversion_in_json_format_carries_its_status(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out", "-f", "json")
    assert run.code == 0, run
    doc = json.loads(run.out)
    assert doc.pop("status") == "converted" and doc.pop("kept") == []  # kept: what --force kept of DST
    # the paths as given (conversion.json itself records none), then exactly the record
    assert (doc.pop("src"), doc.pop("dst")) == (str(EXAMPLE), str(tmp_path / "out"))
    assert doc == load_json(tmp_path / "out" / "conversion.json")


def test_a_dry_run_in_json_format_names_its_paths(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out", "-f", "json", "--dry-run")
    assert run.code == 0, run
    doc = json.loads(run.out)
    assert doc["status"] == "dry-run" and doc["src"] == str(EXAMPLE) and doc["dst"] == str(tmp_path / "out")
    assert doc["layout"] == {"source": "z-lab", "output": "z-lab"}


# ---------------------------------------------------------------- --set: JSON values, objects only


def test_a_set_value_that_is_not_json_is_a_usage_error_showing_the_quoted_form(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--set", "dflash_config.lilicorr_logit_scale=abc")
    assert run.code == 4, run
    assert "VALUE must be JSON" in run.err
    assert "strings must be quoted: dflash_config.lilicorr_logit_scale='\"abc\"'" in run.err
    assert run.err.count("\n") == 1
    _nothing_written(run, dst)
    assert cli("convert", EXAMPLE, dst, "--set", "dflash_config.note=").code == 4


def test_setting_a_key_under_a_value_that_is_not_an_object_is_a_usage_error(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--set", "dflash_config.block_size.x=1")
    assert run.code == 4, run
    assert "dflash_config.block_size is 8 (a number), not an object" in run.err
    assert "--set dflash_config.block_size=VALUE" in run.err
    _nothing_written(run, dst)
    run = cli(
        "convert", EXAMPLE, dst, "--set", "extra=1", "--set", "extra.inner=2"
    )  # the earlier --set counts
    assert run.code == 4 and "extra is 1 (a number), not an object" in run.err, run


def test_set_accepts_quoted_strings_and_creates_missing_objects(cli, tmp_path):
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst, "--set", 'dflash_config.note="x"', "--set", "provenance.run.id=7")
    assert run.code == 0, run
    config = load_json(dst / "config.json")
    assert config["dflash_config"]["note"] == "x" and config["provenance"] == {"run": {"id": 7}}


# ---------------------------------------------------------------- corrupt scales on a module that needs a repair


def _patch_tensor(src, name, data: bytes):
    """Overwrite the bytes of one tensor of src/model.safetensors in place."""
    path = src / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    assert len(data) == end - begin
    raw[8 + n + begin : 8 + n + end] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "tensor, data, needle",
    [
        ("weight_scale_2", np.float32(np.nan).tobytes(), "weight_scale_2 is nan"),
        ("weight_scale_2", np.float32(np.inf).tobytes(), "weight_scale_2 is inf"),
        ("weight_scale_2", np.float32(-1e-3).tobytes(), "weight_scale_2 is -0.001"),
        ("weight_scale", bytes([0x7F]) * 256, "NaN or infinite"),  # the E4M3 NaN code in every block
        ("weight_scale", bytes([0xB8]) * 256, "negative weight_scale"),  # -1.0 in E4M3
        # numerics' scale policy, as validate --deep applies it (LC703): an all-zero scale zeroes the module
        ("weight_scale_2", np.float32(0).tobytes(), "weight_scale_2 is 0 (all zero"),
        ("weight_scale", bytes(256), "all zero weight_scale"),
    ],
)
def test_a_repair_whose_scales_are_corrupt_is_refused(cli, tmp_path, tensor, data, needle):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    _patch_tensor(src, f"layers.0.self_attn.q_proj.{tensor}", data)  # q_proj is repaired for TensorRT-LLM
    dst = tmp_path / "out"
    run = cli("convert", src, dst, "--runtime", "all")
    assert run.code == 1, run
    assert "cannot repair layers.0.self_attn.q_proj: its scales are corrupt" in run.err and needle in run.err
    _nothing_written(run, dst)


def test_nvfp4_in_features_off_the_group_size_is_refused_not_crashed(cli, export, tmp_path):
    def mutate(
        t: fixtures.Tensors,
    ) -> None:  # down_proj 136 -> 64 stored NVFP4 with floor(136 / 16) block scales
        t["layers.0.mlp.down_proj.weight"] = ("U8", (64, 68), bytes(64 * 68))
        t["layers.0.mlp.down_proj.weight_scale"] = ("F8_E4M3", (64, 8), bytes([0x38]) * (64 * 8))
        t["layers.0.mlp.down_proj.weight_scale_2"] = ("F32", (), np.float32(1e-3).tobytes())

    src = export(config=fixtures.draft_config(intermediate_size=136), quant="NVFP4", mutate=mutate)
    run = cli("convert", src, tmp_path / "out")
    assert run.code == 1, run  # it crashed with an internal error (a reshape) before
    assert "in_features 136 is not a multiple of the group size 16" in run.err
    _nothing_written(run, tmp_path / "out")
