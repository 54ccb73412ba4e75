"""The held-out decode walk (lilicorr_train.heldout): acceptance measured teacher-forced at every answer position
and walked block by block is the acceptance greedy decoding measures, block for block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lilicorr_runtime.decode.speculative import SpeculativeDecoder
from lilicorr_runtime.target.load import load_target
from lilicorr_train.export import DrafterShape, build_drafter, drafter_config
from lilicorr_train.heldout import decode_walk, walk_rows, walk_tau
from lilicorr_train.loop import init_from_target, target_pass
from lilicorr_train.mixes import Shard
from lilicorr_train.objective import (
    LossWeights,
    TrainBatch,
    draft_teacher_forced,
    log_probs_at,
    training_step,
)

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")
NEW_TOKENS = 40


def test_decode_walk_anchors_each_block_after_the_last_ones_tokens():
    # answer position 0 comes from the prefill; the block at 0 accepts 2 (3 tokens: 1..3), the one at 3 accepts 1
    assert decode_walk([2, 0, 0, 1, 5, 0], 6) == [3, 2]
    assert decode_walk([0] * 5, 5) == [1, 1, 1, 1]
    assert decode_walk([6, 0, 0], 3) == [7]  # the last block counts whole, as the decoder records it
    assert decode_walk([], 1) == []


def _shard(seqs: list[list[int]], prompt_lengths: list[int], categories: list[int]) -> Shard:
    return Shard(
        tokens=np.concatenate(seqs).astype(np.uint16),
        offsets=np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        prompt_lengths=np.array(prompt_lengths, dtype=np.int32),
        category=np.array(categories, dtype=np.uint8),
        source=np.zeros(len(seqs), dtype=np.uint8),
    )


def test_walk_rows_takes_the_first_answered_sequences_of_each_category():
    seqs = [[5, 6, 7, 8]] * 6
    # row 1 has a one-token answer (nothing to draft after the prefill's token): skipped
    shard = _shard(seqs, [1, 3, 2, 1, 1, 2], [0, 0, 0, 0, 2, 2])
    assert walk_rows(shard, per_category=2).tolist() == [0, 2, 4, 5]


@pytest.fixture(scope="module")
def trained():
    """The tiny target's greedy answers to six prompts, and a drafter without convolution trained on them for
    18 steps: far from perfect, so blocks accept anything from none to all of their drafts."""
    torch.manual_seed(0)
    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    shape = DrafterShape(target_layer_ids=(1, 2), mask_token_id=511, head_hidden_size=32, head_num_heads=2)
    drafter = build_drafter(drafter_config(target.config, shape))
    init_from_target(drafter, target, 3)
    slots = drafter.block_size - 1
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 14, 20, 7, 11)]
    answers = target.generate_batch(prompts, NEW_TOKENS + slots, eos_token_ids=(), batch_size=8)
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    tokens = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for r, s in enumerate(seqs):
        tokens[r, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    anchors = torch.stack([torch.arange(len(p), len(p) + NEW_TOKENS) for p in prompts])
    batch = TrainBatch(tokens, lengths, anchors, anchors <= lengths[:, None] - 2)
    hidden, features = target_pass(target, tokens, drafter.target_layer_ids)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=6e-3)
    embed, head = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    for _ in range(18):
        loss = training_step(drafter, embed, head, features, hidden, batch, LossWeights()).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        drafter.lilicorr.invalidate_derived()
    drafter.eval()
    shard = _shard(seqs, [len(p) for p in prompts], [0, 1, 2, 0, 1, 2])
    return target, drafter, prompts, answers, shard


def test_the_walk_is_what_greedy_decoding_measures(trained):
    target, drafter, prompts, answers, shard = trained
    walked = walk_tau(drafter, target, shard, per_category=10, new_tokens=NEW_TOKENS, batch=4)
    assert walked["val_walk_sequences"] == len(prompts)
    for arm in ("control", "head"):
        decoder = SpeculativeDecoder(target, drafter, mode=arm)
        committed = []
        for prompt, answer in zip(prompts, answers, strict=True):
            result = decoder.generate(prompt, NEW_TOKENS, eos_token_ids=())
            assert result.tokens == answer[:NEW_TOKENS]  # lossless: the walk's truth is what decoding writes
            committed += [b.committed for b in result.blocks]
        accepted = [c - 1 for c in committed]
        # a drafter that accepts some blocks whole and others not at all: the comparison is not trivial
        assert 0 in accepted and drafter.block_size - 1 in accepted
        assert walked[f"val_walk_blocks_{arm}"] == len(committed)
        assert walked[f"val_walk_tau_{arm}"] == pytest.approx(sum(committed) / len(committed), abs=1e-4)
        # every block has true tokens for all its drafts here (the answers run a block past NEW_TOKENS), so the
        # walk's conditional rates are the decoder's, per position
        reached = [sum(a >= s for a in accepted) for s in range(drafter.block_size)]
        expected = [
            round(reached[s] / reached[s - 1], 4) if reached[s - 1] else None for s in range(1, len(reached))
        ]
        assert walked[f"val_walk_cond_{arm}"] == expected
    # the head reorders candidates: its walk differs from the control's
    assert walked["val_walk_blocks_head"] != walked["val_walk_blocks_control"]
    conditional = walked["val_walk_cond_head"]
    assert len(conditional) == drafter.block_size - 1
    assert all(c is None or 0.0 <= c <= 1.0 for c in conditional)


def test_the_walk_does_not_depend_on_its_batch(trained):
    """Answers of different lengths side by side (padded rows, anchors past a short answer's end) walk as each
    does alone."""
    target, drafter, prompts, answers, _ = trained
    cut = [3, NEW_TOKENS + 7, 12, 1, 25, 9]  # answer tokens kept; the 1-token answer has nothing to walk
    seqs = [p + a[:n] for p, a, n in zip(prompts, answers, cut, strict=True)]
    shard = _shard(seqs, [len(p) for p in prompts], [0, 1, 2, 0, 1, 2])
    together = walk_tau(drafter, target, shard, per_category=10, new_tokens=NEW_TOKENS, batch=4)
    alone = walk_tau(drafter, target, shard, per_category=10, new_tokens=NEW_TOKENS, batch=1)
    assert together == alone and together["val_walk_sequences"] == 5
    nothing = _shard([prompts[0] + answers[0][:1]], [len(prompts[0])], [0])
    assert walk_tau(drafter, target, nothing) == {"val_walk_sequences": 0}  # no tau rather than a made-up one


def test_the_training_steps_log_probabilities_are_the_exact_ones(trained):
    """draft_teacher_forced: the candidates and the control's argmax are decoding's (topk_lse); the training
    step's log-probabilities, read at the truth and the K candidates, are the exact path's (what the walk and
    decoding read) and the textbook form's (the logits minus their logsumexp) to fp32 round-off, and so is their
    gradient with respect to the drafter's slot hidden states."""
    target, drafter, prompts, answers, _ = trained
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    tokens = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for r, s in enumerate(seqs):
        tokens[r, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    anchors = torch.stack([torch.arange(len(p), len(p) + 12) for p in prompts])
    batch = TrainBatch(tokens, lengths, anchors, anchors <= lengths[:, None] - 2)
    _, features = target_pass(target, tokens, drafter.target_layer_ids)
    embed, head = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    with torch.no_grad():
        exact = draft_teacher_forced(drafter, embed, head, features, batch, exact=True)
    fast = draft_teacher_forced(drafter, embed, head, features, batch)
    assert torch.equal(exact.ids, fast.ids) and torch.equal(exact.argmax, fast.argmax)
    logits = torch.nn.functional.linear(fast.pass_hidden, head)
    assert torch.equal(exact.argmax, logits.argmax(-1))  # ties aside, the first candidate is the argmax
    assert torch.equal(exact.ids, logits.topk(exact.ids.shape[-1], dim=-1).indices)
    assert exact.candidate_log_probs.dtype == fast.candidate_log_probs.dtype == torch.float32
    torch.testing.assert_close(fast.candidate_log_probs, exact.candidate_log_probs, rtol=0, atol=2e-5)
    torch.testing.assert_close(fast.truth_log_prob, exact.truth_log_prob, rtol=0, atol=2e-5)
    # a drafter that is not sure of everything: the values mean something
    assert exact.truth_log_prob.min() < -1.0
    textbook = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    torch.testing.assert_close(fast.candidate_log_probs, textbook.gather(-1, fast.ids), rtol=0, atol=2e-5)
    torch.testing.assert_close(
        fast.truth_log_prob, textbook.gather(-1, fast.truth[..., None])[..., 0], rtol=0, atol=2e-5
    )
    # the gradient: the same loss through log_probs_at and through the textbook form, on the same hidden states
    weights = torch.linspace(0.5, 1.5, fast.candidate_log_probs.shape[-1])
    losses = {
        "fused": (fast.candidate_log_probs * weights).sum() - 2 * fast.truth_log_prob.sum(),
        "textbook": (textbook.gather(-1, fast.ids) * weights).sum()
        - 2 * textbook.gather(-1, fast.truth[..., None]).sum(),
    }
    grads = {
        name: torch.autograd.grad(loss, fast.pass_hidden, retain_graph=True)[0]
        for name, loss in losses.items()
    }
    assert float(grads["textbook"].norm()) > 0
    torch.testing.assert_close(grads["fused"], grads["textbook"], rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu_the_candidates_are_the_kernels_and_the_gradient_the_textbooks():
    """The fit's own setting: CUDA, bf16 autocast, so the candidates and the log-partition come from topk_lse's
    Triton kernel and the gradient from log_probs_at's softmax of bf16 logits: the candidates are the top values
    (ties in any order), the values are the textbook ones and so is the gradient at the slot hidden states."""
    torch.manual_seed(1)
    target = load_target(TARGET, dtype="float32", device="cuda", fast=True)
    shape = DrafterShape(target_layer_ids=(1, 2), mask_token_id=511, head_hidden_size=32, head_num_heads=2)
    drafter = build_drafter(drafter_config(target.config, shape)).cuda()
    init_from_target(drafter, target, 3)
    tokens = torch.randint(3, 500, (4, 40), device="cuda")
    lengths = torch.full((4,), 40, device="cuda")
    anchors = torch.arange(8, 32, device="cuda").repeat(4, 1)
    batch = TrainBatch(tokens, lengths, anchors, torch.ones_like(anchors, dtype=torch.bool))
    _, features = target_pass(target, tokens, drafter.target_layer_ids)
    embed, head = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fast = draft_teacher_forced(drafter, embed, head, features, batch)
        logits = torch.nn.functional.linear(fast.pass_hidden, head)
    assert logits.dtype == torch.bfloat16 and fast.candidate_log_probs.dtype == torch.float32
    k = fast.ids.shape[-1]
    top = logits.float().topk(k, dim=-1).values
    assert torch.equal(
        logits.float().gather(-1, fast.ids), top
    )  # the top values, whichever tied id was taken
    assert torch.equal(logits.float().gather(-1, fast.argmax[..., None])[..., 0], top[..., 0])
    textbook = logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    torch.testing.assert_close(fast.candidate_log_probs, textbook.gather(-1, fast.ids), rtol=0, atol=1e-4)
    torch.testing.assert_close(
        fast.truth_log_prob, textbook.gather(-1, fast.truth[..., None])[..., 0], rtol=0, atol=1e-4
    )
    # the walk drafts without gradients, so the drafter's own ops (norms, attention) run as decoding's Triton kernels
    # where the training step ran their differentiable references: its hidden states differ by rounding, and its
    # candidates are the training step's except where two logits lie within that rounding (the first GPU run of
    # this test asked for equal ids and failed)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        exact = draft_teacher_forced(drafter, embed, head, features, batch, exact=True)
    assert (exact.ids == fast.ids).float().mean() > 0.97
    torch.testing.assert_close(exact.candidate_log_probs, fast.candidate_log_probs, rtol=0, atol=5e-2)
    losses = {
        "fused": fast.candidate_log_probs.sum() - 2 * fast.truth_log_prob.sum(),
        "textbook": textbook.gather(-1, fast.ids).sum()
        - 2 * textbook.gather(-1, fast.truth[..., None]).sum(),
    }
    grads = {
        n: torch.autograd.grad(v, fast.pass_hidden, retain_graph=True)[0].float() for n, v in losses.items()
    }
    assert float(grads["textbook"].norm()) > 0
    # both gradients reach pass_hidden in bf16, so single elements differ by a bf16 step of the gradient's scale
    # (the first GPU run: 39 of 43,008 elements up to 3.9e-3 apart under atol 1e-3); a wrong gradient is off
    # by its own size, which the norm of the difference shows
    gap = (grads["fused"] - grads["textbook"]).norm() / grads["textbook"].norm()
    assert float(gap) < 1e-2
    step = float(grads["textbook"].abs().max()) * 2**-6
    torch.testing.assert_close(grads["fused"], grads["textbook"], rtol=2e-2, atol=max(step, 1e-3))


def test_log_probs_at_has_the_softmaxs_gradient_an_index_named_twice_included():
    """log_probs_at: logits[index] - lse in the forward, and in the backward scatter(g) - softmax * sum(g),
    checked against finite differences in float64 (gradcheck), with the truth among the candidates (an index
    named twice in a row, as the fit's [truth, candidates] often is)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 11, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[[4, 4, 0], [1, 2, 3], [10, 9, 10]], [[0, 1, 2], [7, 7, 7], [5, 6, 4]]])

    def picked(x: torch.Tensor) -> torch.Tensor:
        return log_probs_at(x, index, torch.logsumexp(x, dim=-1)).double()

    assert torch.autograd.gradcheck(picked, (logits,))
    textbook = torch.log_softmax(logits, dim=-1).gather(-1, index)
    torch.testing.assert_close(picked(logits), textbook.detach(), rtol=0, atol=1e-6)
