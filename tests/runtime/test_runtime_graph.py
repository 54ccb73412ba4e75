"""The static-shape draft step (the body of the CUDA graph) against the eager draft path, and on CUDA the
replayed graph against the same step run eagerly and the whole decoder against the CPU reference."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import small_config, tiny_target

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import SpeculativeDecoder
from lilicorr_runtime.decode.draft_step import DraftStep
from lilicorr_runtime.decode.speculative import draft_block
from lilicorr_runtime.ops import greedy_walk

CUDA = torch.cuda.is_available()


def _setup(tmp_path, device="cpu", conv=None, sliding=False):
    cfg = small_config(conv=conv) if conv else small_config()
    if sliding:
        cfg["layer_types"] = ["sliding_attention", "full_attention"]
        cfg["sliding_window"] = 6
        cfg["use_sliding_window"] = True  # without it the qwen3 config drops the window (LC119)
    path = fixtures.write_checkpoint(tmp_path / "d", cfg, dtype="F32")
    drafter = load_drafter(path, device=device)
    target = tiny_target("qwen3")
    target.model.to(device)
    return drafter, target


@torch.inference_mode()
def _context(drafter, target, prompt_len=11, capacity=64):
    target.reset()
    step = target.forward(torch.arange(prompt_len) % 13, drafter.target_layer_ids)
    cache = drafter.new_cache(capacity=capacity)
    context = drafter.project_context(step.features[None])
    drafter.append_context(cache, context)
    return cache, context[:, -1]


@pytest.mark.parametrize("conv, sliding", [(None, False), ((4, 16), False), (None, True)])
def test_static_step_equals_the_eager_draft(tmp_path, conv, sliding):
    drafter, target = _setup(tmp_path, conv=conv, sliding=sliding)
    cache, anchor_hidden = _context(drafter, target)
    anchor = torch.tensor([7])
    n = drafter.block_size - 1
    with torch.inference_mode():
        ref = draft_block(drafter, cache, anchor, anchor_hidden, n, target.embed, target.logits, score=True)
        ref_tokens = greedy_walk(ref.start, ref.pairs, ref.candidate_ids)
        step = DraftStep(
            drafter, cache, target.embed, target.logits, num_tokens=n, walk="greedy", use_graph=False
        )
        out = step.run(anchor, anchor_hidden, cache.length)
    torch.testing.assert_close(out["logits"], ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["start"], ref.start, rtol=1e-4, atol=1e-5)
    assert torch.equal(out["candidate_ids"], ref.candidate_ids)
    assert torch.equal(out["tokens"], ref_tokens)


def test_static_step_ignores_stale_rows_beyond_the_length(tmp_path):
    drafter, target = _setup(tmp_path)
    cache, anchor_hidden = _context(drafter, target)
    step = DraftStep(
        drafter, cache, target.embed, target.logits, num_tokens=3, walk="control", use_graph=False
    )
    with torch.inference_mode():
        before = step.run(torch.tensor([3]), anchor_hidden, cache.length)["logits"].clone()
        for i in range(len(cache.keys)):  # garbage where no context row is
            cache.keys[i][:, :, cache.length :] = 1e4
            cache.values[i][:, :, cache.length :] = -1e4
        after = step.run(torch.tensor([3]), anchor_hidden, cache.length)["logits"]
    assert torch.equal(before, after)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("walk", ["greedy", "sample", "control"])
def test_gpu_graph_replay_equals_the_eager_step(tmp_path, walk):
    drafter, target = _setup(tmp_path, device="cuda", conv=(4, 16))
    cache, anchor_hidden = _context(drafter, target)
    n = drafter.block_size - 1
    uniforms = torch.rand(1, n, generator=torch.Generator().manual_seed(0)).cuda()
    with torch.inference_mode():
        graphed = DraftStep(drafter, cache, target.embed, target.logits, num_tokens=n, walk=walk)
        eager = DraftStep(
            drafter, cache, target.embed, target.logits, num_tokens=n, walk=walk, use_graph=False
        )
        assert graphed.graph is not None
        for anchor in (1, 5, 9):  # replays with new inputs each time
            a = graphed.run(torch.tensor([anchor], device="cuda"), anchor_hidden, cache.length, uniforms, 0.7)
            b = eager.run(torch.tensor([anchor], device="cuda"), anchor_hidden, cache.length, uniforms, 0.7)
            for name in a:
                assert torch.equal(a[name], b[name]), name


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_decoder_commits_the_cpu_reference_tokens(tmp_path):
    cfg = small_config(conv=(4, 16))
    path = fixtures.write_checkpoint(tmp_path / "d", cfg, dtype="F32")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    results = {}
    for device, graph in (("cpu", False), ("cuda", True), ("cuda", False)):
        target = tiny_target("qwen3")
        target.model.to(device)
        decoder = SpeculativeDecoder(target, load_drafter(path, device=device), cuda_graph=graph)
        results[device, graph] = decoder.generate(prompt, 40)
    ar = SpeculativeDecoder(tiny_target("qwen3"), mode="ar").generate(prompt, 40).tokens
    for key, result in results.items():
        assert result.tokens == ar, key
    assert results["cuda", True].blocks == results["cuda", False].blocks
