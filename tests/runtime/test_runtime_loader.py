"""Loading through the manifest: every tensor lands where the checkpoint name says, quantized weights
are dequantized, and whatever validate refuses is refused with validate's own error lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import e4m3_decode, nvfp4_dequantize
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.report.validate import render_text
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import CheckpointRefused
from lilicorr_runtime.model.codecs import nvfp4_dequantize as torch_nvfp4_dequantize


def file_tensors(path):
    """name -> numpy array of the raw stored values (bf16 widened exactly, fp8 as its code bytes)."""
    out = {}
    for name, t in load_file(str(path / "model.safetensors")).items():
        if t.dtype == torch.bfloat16:
            t = t.float()
        elif t.dtype == torch.float8_e4m3fn:
            t = t.view(torch.uint8)
        out[name] = t.numpy()
    return out


def test_every_tensor_is_loaded_under_its_name(drafter_dir):
    path = drafter_dir(fixtures.draft_config(conv=(4, 16), own_lm_head=True))
    d = load_drafter(path, runtime="vllm")  # SGLang drops an owned lm_head (LC404)
    stored = file_tensors(path)
    state = d.state_dict()
    assert set(state) == set(stored)
    for name, raw in stored.items():
        assert torch.equal(state[name], torch.from_numpy(raw)), name
    assert d.lm_head is not None and d.lilicorr is not None and d.layers[0].attention_conv is not None


@pytest.mark.parametrize("naming,prefix", [("sequential", ""), ("named", "model.")])
def test_legacy_names_and_model_prefix_load_the_same_weights(drafter_dir, naming, prefix):
    plain = load_drafter(drafter_dir())
    other = load_drafter(
        drafter_dir(fixtures.draft_config(), naming=naming, key_prefix=prefix),
        runtime="trtllm" if naming == "sequential" else "all",
    )  # SGLang and vLLM refuse Sequential names
    for name, value in plain.state_dict().items():
        assert torch.equal(value, other.state_dict()[name]), name


def test_sharded_checkpoint_loads(drafter_dir):
    plain = load_drafter(drafter_dir())
    sharded = load_drafter(drafter_dir(fixtures.draft_config(), shards=3))
    assert all(torch.equal(v, sharded.state_dict()[k]) for k, v in plain.state_dict().items())


@pytest.mark.parametrize("quant", ["NVFP4", "W4A16_NVFP4"])
def test_nvfp4_weights_are_dequantized(drafter_dir, quant):
    path = drafter_dir(fixtures.draft_config(), quant=quant)
    d = load_drafter(path)
    stored = file_tensors(path)
    quantized = [n[: -len(".weight_scale_2")] for n in stored if n.endswith(".weight_scale_2")]
    assert "lilicorr.pass_hidden_proj" in quantized and "layers.0.mlp.down_proj" in quantized
    for module in quantized:
        expected = nvfp4_dequantize(
            stored[module + ".weight"],
            stored[module + ".weight_scale"],
            float(stored[module + ".weight_scale_2"]),
        )
        assert torch.equal(d.state_dict()[module + ".weight"], torch.from_numpy(expected)), module
    # the float reference weights are close to their NVFP4 round trip
    ref = load_drafter(drafter_dir()).state_dict()["layers.0.mlp.down_proj.weight"]
    err = (d.state_dict()["layers.0.mlp.down_proj.weight"] - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.25


def test_torch_nvfp4_decoder_agrees_with_the_numpy_codec():
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (6, 16), dtype=np.uint8)
    scales = rng.integers(0, 0x7E, (6, 2), dtype=np.uint8)
    expected = nvfp4_dequantize(packed, scales, 0.37)
    got = torch_nvfp4_dequantize(
        torch.from_numpy(packed), torch.from_numpy(scales).view(torch.float8_e4m3fn), torch.tensor(0.37)
    )
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=1e-6, atol=0)


def test_fp8_weights_are_dequantized(drafter_dir):
    path = drafter_dir(fixtures.draft_config(), quant="FP8")
    d = load_drafter(path)
    stored = file_tensors(path)
    name = "lilicorr.context_proj"
    expected = e4m3_decode(stored[name + ".weight"]) * stored[name + ".weight_scale"]
    assert torch.equal(d.state_dict()[name + ".weight"], torch.from_numpy(expected.astype(np.float32)))


def refusal_lines(path, runtime):
    text = render_text(validate(str(path), runtime=runtime))
    return [line for line in text.splitlines() if line.startswith("ERROR")]


def test_refuses_what_validate_refuses_with_the_same_lines(drafter_dir):
    path = drafter_dir(fixtures.draft_config(dflash={"lilicorr_candidate_topk": 3}))
    lines = refusal_lines(path, "all")
    assert lines and "LC104" in lines[0]
    with pytest.raises(CheckpointRefused) as info:
        load_drafter(path)
    for line in lines:
        assert line in str(info.value)
    # TensorRT-LLM accepts any K, and so does the runtime under its profile
    d = load_drafter(path, runtime="trtllm")
    assert d.lilicorr is not None and d.lilicorr.candidate_topk == 3


def test_refuses_a_missing_head_tensor(drafter_dir):
    def drop(tensors):
        del tensors["lilicorr.in_head.weight"]

    path = drafter_dir(fixtures.draft_config(), mutate=drop)
    lines = refusal_lines(path, "sglang")
    assert any("LC201" in line for line in lines)
    with pytest.raises(CheckpointRefused) as info:
        load_drafter(path, runtime="sglang")
    assert all(line in str(info.value) for line in lines)


def test_refuses_conv_tensors_without_conv_keys(drafter_dir):
    def add_conv(tensors):
        tensors.update(
            {
                n: v
                for n, v in fixtures.checkpoint_tensors(fixtures.draft_config(conv=(4, 16))).items()
                if "_conv." in n
            }
        )

    path = drafter_dir(fixtures.draft_config(), mutate=add_conv)
    with pytest.raises(CheckpointRefused, match="LC205"):
        load_drafter(path)


def test_head_width_zero_follows_the_profile(drafter_dir):
    path = drafter_dir(fixtures.draft_config(dflash={"lilicorr_hidden_size": 0}))
    with pytest.raises(CheckpointRefused, match="LC105"):
        load_drafter(path)  # TensorRT-LLM refuses 0
    d = load_drafter(path, runtime="sglang")
    assert isinstance(d.lilicorr.token_proj, torch.nn.Identity)


def test_dtype_and_rotary_precision(drafter_dir):
    d = load_drafter(drafter_dir(), dtype=torch.bfloat16)
    assert d.fc.weight.dtype == torch.bfloat16 and d.inv_freq.dtype == torch.float32


def test_head_free_drafter_loads_without_head(drafter_dir):
    d = load_drafter(drafter_dir(fixtures.draft_config(head=False)))
    assert d.lilicorr is None


def test_refuses_a_sibling_family_head(drafter_dir):
    path = drafter_dir(fixtures.sibling_config("dflash2"))
    assert not refusal_lines(path, "all")  # validate accepts a complete DFlash2 checkpoint ...
    with pytest.raises(CheckpointRefused, match="dflash2 head"):
        load_drafter(path)  # ... but running the backbone alone would be a different drafter
