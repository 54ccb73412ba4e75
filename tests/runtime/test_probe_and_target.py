"""The probe the converter's --verify compares, and the target adapter's loading paths."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import small_config, tiny_target

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import SpeculativeDecoder, load_target
from lilicorr_runtime.model.probe import reference_outputs


def test_reference_outputs_are_deterministic_and_shaped(drafter):
    d = drafter()
    a, b = reference_outputs(d, seed=0), reference_outputs(d, seed=0)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    g = d.geometry
    S, K = g.block_size - 1, g.candidate_topk
    assert a["draft_logits"].shape == (S, g.vocab_size) and a["start"].shape == (K,)
    assert a["pairs"].shape == (S - 1, K, K) and a["candidate_ids"].shape == (S, K)
    assert not torch.equal(a["start"], reference_outputs(d, seed=1)["start"])


def test_reference_outputs_tell_checkpoints_apart(drafter_dir):
    base = reference_outputs(load_drafter(drafter_dir()))
    legacy = reference_outputs(
        load_drafter(drafter_dir(fixtures.draft_config(), naming="sequential"), runtime="trtllm")
    )  # SGLang and vLLM refuse Sequential names
    assert all(torch.equal(base[k], legacy[k]) for k in base)  # a rename changes no function
    quantized = reference_outputs(load_drafter(drafter_dir(fixtures.draft_config(), quant="NVFP4")))
    assert not torch.allclose(base["pairs"], quantized["pairs"], atol=1e-6)
    reseeded = reference_outputs(load_drafter(drafter_dir(fixtures.draft_config(), seed=3)))
    assert not torch.allclose(base["draft_logits"], reseeded["draft_logits"])


def test_head_free_probe_has_no_scores(drafter):
    out = reference_outputs(drafter(fixtures.draft_config(head=False)))
    assert "start" not in out and out["draft_logits"].shape == (7, 512)


def test_load_target_from_a_directory(tmp_path, drafter):
    target = tiny_target("qwen3")
    target.model.save_pretrained(tmp_path / "target")
    loaded = load_target(tmp_path / "target")
    assert loaded.tokenizer is None and loaded.num_layers == 4 and loaded.vocab_size == 16
    prompt = [3, 1, 4, 1, 5]
    d = drafter(small_config())
    expected = SpeculativeDecoder(target, mode="ar").generate(prompt, 16).tokens
    assert SpeculativeDecoder(loaded, d).generate(prompt, 16).tokens == expected


def test_load_target_refuses_a_non_gguf_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_target(tmp_path / "weights.bin")
