import importlib.util
import json
import sys

import numpy as np
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import bf16_bits
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.errors import InputError

from ._support import hits, one, refused_by, run
from helpers import REPO


def make_target(
    path, *, hidden=64, layers=4, vocab=512, eos=2, bos=1, pad=None, embed_rows=None, theta=10000.0
):
    path.mkdir(parents=True)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "eos_token_id": eos,
        "bos_token_id": bos,
        "rope_theta": theta,
    }
    if pad is not None:
        cfg["pad_token_id"] = pad
    (path / "config.json").write_text(json.dumps(cfg))
    rows = embed_rows or vocab
    fixtures.save(
        path, cfg, {"model.embed_tokens.weight": ("BF16", (rows, hidden), bytes(rows * hidden * 2))}
    )
    return path


def rules(report):
    return {f.rule for f in report.findings}


@pytest.fixture
def drafter(make_ckpt):
    return make_ckpt()


def test_matching_target_passes(drafter, tmp_path):
    target = make_target(tmp_path / "target")
    report = validate(str(drafter), target=str(target))
    assert report.summary.errors == 0 and report.summary.warnings == 0


def test_hidden_size_and_vocab_mismatch(drafter, tmp_path):
    report = validate(str(drafter), target=str(make_target(tmp_path / "t", hidden=128, vocab=1000)))
    assert {"LC501", "LC503"} <= rules(report)
    msg = next(f.message for f in report.findings if f.rule == "LC501")
    assert "64" in msg and "128" in msg


def test_layer_ids_beyond_the_target_explain_the_convention(make_ckpt, tmp_path):
    # ids [1, 4] on a 4-layer target: 4 looks like a +1-shifted "before layer" id
    ckpt = make_ckpt(
        config=fixtures.draft_config(dflash={"target_layer_ids": [1, 4]}, num_target_layers=None)
    )
    report = validate(str(ckpt), target=str(make_target(tmp_path / "t", layers=4)))
    [f] = [f for f in report.findings if f.rule == "LC502"]
    assert "id i reads the output of target layer i" in f.message and "hidden_states[i+1]" in f.message
    assert "[4]" in f.message and "0..3" in f.message


def test_num_target_layers_disagreement_is_a_warning(drafter, tmp_path):
    report = validate(str(drafter), target=str(make_target(tmp_path / "t", layers=6)))
    assert "LC505" in rules(report) and report.summary.errors == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(embed_rows=500), "outside"),  # mask 511 beyond 500 embedding rows
        (dict(eos=511), "eos"),
        (dict(pad=511), "pad"),
    ],
)
def test_mask_token_must_be_a_real_dedicated_row(drafter, tmp_path, kwargs, needle):
    report = validate(str(drafter), target=str(make_target(tmp_path / "t", **kwargs)))
    assert any(f.rule == "LC504" and needle in f.message for f in report.findings)


def test_rope_theta_mismatch_warns(drafter, tmp_path):
    report = validate(str(drafter), target=str(make_target(tmp_path / "t", theta=1e6)))
    assert "LC506" in rules(report)


@pytest.mark.parametrize(
    "edit, found, skipped",
    [
        ({"hidden_size": "64"}, 'hidden_size "64" (not an integer)', "hidden size"),
        ({"num_hidden_layers": 4.5}, "num_hidden_layers 4.5 (not an integer)", "layer ids and count"),
        ({"vocab_size": None}, "vocab_size missing", "vocabulary"),
    ],
)
def test_a_target_geometry_that_cannot_be_read_is_reported_not_skipped(
    drafter, tmp_path, edit, found, skipped
):
    target = make_target(tmp_path / "t")
    cfg = json.loads((target / "config.json").read_text())
    for key, value in edit.items():
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
    (target / "config.json").write_text(json.dumps(cfg))
    report = validate(str(drafter), target=str(target))
    [f] = [f for f in report.findings if f.rule == "LC507"]
    assert found in f.message and f"not checked against the drafter: {skipped}" in f.message
    assert report.summary.errors == 0 and report.summary.warnings == 1


def test_a_target_with_no_vocabulary_at_all_skips_the_mask_range_check_visibly(drafter, tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 4}))
    [f] = [f for f in validate(str(drafter), target=str(target)).findings if f.rule == "LC507"]
    assert "vocabulary, mask token range" in f.message


def _gguf_bytes():
    spec = importlib.util.spec_from_file_location(
        "gguf_bytes", REPO / "tests" / "checkpoint" / "gguf_bytes.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf_bytes"] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def test_gguf_target_metadata(tmp_path, drafter):
    # a small Llama GGUF as llama.cpp writes one: geometry, tokenizer and weights (one with no weights is refused)
    model = _gguf_bytes().tiny_model(layers=4, hidden=64, heads=4, kv_heads=2, ffn=64, vocab=512)
    gguf = model.write(tmp_path / "m.gguf")
    info = read_target(str(gguf))
    eos = 256 + 5 + 2  # the byte alphabet, five merges, then <|endoftext|> <|im_start|> <|im_end|>
    assert (info.hidden_size, info.num_layers, info.vocab_size) == (64, 4, 512)
    assert info.special_ids["eos"] == eos
    assert validate(str(drafter), target=str(gguf)).summary.errors == 0
    weightless = _gguf_bytes().tiny_model(
        layers=4, hidden=64, heads=4, kv_heads=2, ffn=64, vocab=512, weights=False
    )
    with pytest.raises(InputError, match="holds no weights"):
        read_target(str(weightless.write(tmp_path / "vocab-only.gguf")))


def test_deep_finds_nan_and_all_zero_weights(make_ckpt):
    def mutate(t):
        dtype, shape, _ = t["lilicorr.out_head.weight"]
        values = np.zeros(shape, dtype=np.float32)
        values[3, 2] = np.nan
        t["lilicorr.out_head.weight"] = (dtype, shape, bf16_bits(values).tobytes())
        dtype, shape, raw = t["lilicorr.in_head.weight"]
        t["lilicorr.in_head.weight"] = (dtype, shape, bytes(len(raw)))
        t["lilicorr.in_head.bias"] = (
            dtype,
            t["lilicorr.in_head.bias"][1],
            bytes(len(t["lilicorr.in_head.bias"][2])),
        )

    ckpt = make_ckpt(mutate=mutate)
    assert not {"LC701", "LC702"} & rules(validate(str(ckpt)))  # header-only by default
    report = validate(str(ckpt), deep=True)
    assert [f.subjects for f in report.findings if f.rule == "LC701"] == [["lilicorr.out_head.weight"]]
    # zero biases are normal; a zero weight is not
    assert [f.subjects for f in report.findings if f.rule == "LC702"] == [["lilicorr.in_head.weight"]]


def test_deep_is_clean_on_a_healthy_quantized_checkpoint(make_ckpt):
    report = validate(str(make_ckpt(quant="NVFP4")), deep=True)
    assert report.summary.errors == 0 and report.summary.warnings == 0


def test_deep_finds_all_zero_nvfp4_scales(make_ckpt):
    # an all-zero weight_scale / weight_scale_2 zeroes the dequantized weight: the module outputs only its bias
    def mutate(t):
        dtype, shape, raw = t["lilicorr.context_proj.weight_scale"]
        t["lilicorr.context_proj.weight_scale"] = (dtype, shape, bytes(len(raw)))
        t["lilicorr.pass_hidden_proj.weight_scale_2"] = ("F32", (), np.float32(0).tobytes())

    ckpt = make_ckpt(quant="NVFP4", mutate=mutate)
    assert "LC703" not in rules(validate(str(ckpt)))  # header-only by default
    report = validate(str(ckpt), deep=True)
    found = [f for f in report.findings if f.rule == "LC703"]
    assert sorted(s for f in found for s in f.subjects) == [
        "lilicorr.context_proj.weight_scale",
        "lilicorr.pass_hidden_proj.weight_scale_2",
    ]
    assert all(f.severity == "error" for f in found) and "only its bias" in found[0].message
    assert not any(v.accepted for v in report.runtimes)


def test_deep_finds_negative_scales(make_ckpt):
    # a negative weight_scale_2, or E4M3 block scales with the sign bit, flip the module's weights
    def mutate(t):
        dtype, shape, raw = t["lilicorr.context_proj.weight_scale"]
        t["lilicorr.context_proj.weight_scale"] = (dtype, shape, bytes([0xB8]) + raw[1:])  # one block at -1.0
        t["lilicorr.pass_hidden_proj.weight_scale_2"] = ("F32", (), np.float32(-1e-3).tobytes())
        t["lilicorr.token_proj.weight_scale_2"] = (
            "F32",
            (),
            np.float32(-0.0).tobytes(),
        )  # -0.0: zero, not negative

    report = validate(str(make_ckpt(quant="NVFP4", mutate=mutate)), deep=True)
    found = [f for f in report.findings if f.rule == "LC704"]
    assert sorted(s for f in found for s in f.subjects) == [
        "lilicorr.context_proj.weight_scale",
        "lilicorr.pass_hidden_proj.weight_scale_2",
    ]
    assert all(f.severity == "error" for f in found) and "flip" in found[0].message


def test_target_embedding_rows_must_equal_vocab_for_trtllm(drafter, tmp_path):
    # TensorRT-LLM also needs the target embedding to have exactly V rows; the config vocab_size agrees here
    target = make_target(tmp_path / "t", vocab=512, embed_rows=520)
    report = validate(str(drafter), target=str(target))
    found = [f for f in report.findings if f.rule == "LC503"]
    assert [(f.runtimes, f.severity) for f in found] == [(["trtllm"], "error")]
    assert "520" in found[0].message and "512" in found[0].message
    assert {v.runtime: v.accepted for v in report.runtimes} == {"sglang": True, "vllm": True, "trtllm": False}


def _unequal_gate_up(t: fixtures.Tensors) -> None:
    t["layers.0.mlp.up_proj.weight_scale_2"] = ("F32", (), np.float32(0.25).tobytes())


def test_fused_shards_with_different_global_scales_are_refused_by_sglang_and_vllm(make_ckpt):
    # SGLang and vLLM serve a fused gate_up_proj with weight_scale_2.max(): up_proj's 0.25 rescales gate_proj's
    # weights. The scalar scales are read by default (4 bytes a shard), not only with --deep
    path = make_ckpt(quant="NVFP4", mutate=_unequal_gate_up)
    report = run(path)
    f = one(report, "LC327", "error")
    assert (
        f.runtimes == ["sglang", "vllm"] and "layers.0.mlp.gate_up_proj" in f.message and "0.25" in f.message
    )
    assert refused_by(report) == ["sglang", "vllm"]


def test_fixture_shards_share_one_global_scale_as_modelopt_exports_them(make_ckpt):
    report = run(make_ckpt(quant="NVFP4"), deep=True)
    assert hits(report, "LC327") == [] and refused_by(report) == []
