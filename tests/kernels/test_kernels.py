"""Triton kernels against their torch references: under TRITON_INTERPRET=1 on the CPU (small shapes, run
in CI) and natively on CUDA (full shapes, marked gpu)."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # without a GPU the kernels run in Triton's interpreter; it is chosen when a kernel is decorated
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
if not CUDA and hasattr(triton, "knobs"):
    triton.knobs.runtime.interpret = True  # triton was imported before the variable was set

from lilicorr_runtime import ops  # noqa: E402
from lilicorr_runtime.kernels import triton_ops  # noqa: E402

if not CUDA:
    triton_ops = importlib.reload(triton_ops)  # re-decorate in case it was imported in compiled mode

DEVICE = "cuda" if CUDA else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_topk_identical(logits: torch.Tensor, k: int) -> None:
    values, ids, lse = triton_ops.topk_lse_triton(logits.to(DEVICE), k)
    ref_values, ref_ids, ref_lse = ops.topk_lse_reference(logits.cpu(), k)
    assert torch.equal(ids.cpu(), ref_ids), (ids, ref_ids)
    assert torch.equal(values.cpu(), ref_values)
    torch.testing.assert_close(lse.cpu(), ref_lse, rtol=1e-5, atol=1e-4, equal_nan=True)


# ---------------------------------------------------------------- CPU (interpreter) and GPU, small shapes


@pytest.mark.parametrize("vocab", [256, 257, 1000, 1025])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_topk_lse_matches_the_reference(vocab, k):
    logits = torch.randn(3, vocab, generator=_gen(vocab + k)) * 4
    assert_topk_identical(logits, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_lse_ties_return_the_lowest_columns(dtype):
    # 64 distinct values over 2000 columns: every top-k boundary is a tie
    logits = torch.randint(0, 64, (4, 2000), generator=_gen(7)).to(dtype)
    assert_topk_identical(logits, 8)
    values, ids, _ = triton_ops.topk_lse_triton(logits.to(DEVICE), 8)
    assert torch.equal(logits.gather(1, ids.cpu()).float(), values.cpu())  # every id holds its value


def test_topk_lse_nan_rows():
    logits = torch.randn(3, 700, generator=_gen(3))
    logits[0, 5] = float("nan")  # one NaN: never a candidate, but the row's lse is NaN
    logits[1] = float("nan")  # all NaN: -inf values, columns 0..k-1
    assert_topk_identical(logits, 4)
    values, ids, lse = triton_ops.topk_lse_triton(logits.to(DEVICE), 4)
    assert torch.isnan(lse[:2].cpu()).all() and torch.isfinite(lse[2].cpu())
    assert ids[1].cpu().tolist() == [0, 1, 2, 3] and torch.isneginf(values[1].cpu()).all()
    assert 5 not in ids[0].cpu().tolist()


def test_topk_lse_non_contiguous_rows():
    logits = torch.randn(6, 900, generator=_gen(5))[::2]
    assert not logits.is_contiguous()
    assert_topk_identical(logits, 8)


def test_topk_lse_values_minus_lse_are_full_vocabulary_log_probs():
    logits = torch.randn(2, 1500, generator=_gen(11)) * 5
    values, ids, lse = triton_ops.topk_lse_triton(logits.to(DEVICE), 8)
    ref = torch.log_softmax(logits.double(), dim=-1).gather(1, ids.cpu())
    torch.testing.assert_close((values - lse[:, None]).cpu().double(), ref, rtol=1e-5, atol=1e-5)


def test_topk_lse_refuses_k_above_16():
    with pytest.raises(ValueError, match="1 <= k <= min"):
        triton_ops.topk_lse_triton(torch.randn(1, 100, device=DEVICE), 32)


def _lattice(batch: int, slots: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    start = torch.randn(batch, k, generator=g)
    pairs = torch.randn(batch, slots - 1, k, k, generator=g)
    ids = torch.randint(0, 50000, (batch, slots, k), generator=g)
    return start, pairs, ids


@pytest.mark.parametrize("k", [1, 2, 3, 8, 16])
def test_greedy_walk_matches_the_reference(k):
    start, pairs, ids = _lattice(5, 7, k, seed=k)
    start[0] = 0.0
    pairs[0] = 0.0  # all ties: lowest index everywhere
    start[1, 0] = float("nan")
    pairs[2, 1] = float("nan")
    got = triton_ops.greedy_walk_triton(start.to(DEVICE), pairs.to(DEVICE), ids.to(DEVICE)).cpu()
    assert torch.equal(got, ops.greedy_walk_reference(start, pairs, ids))
    assert got[0].tolist() == ids[0, :, 0].tolist()


def test_greedy_walk_non_contiguous_pairs():
    start, pairs, ids = _lattice(4, 6, 8, seed=2)
    transposed = pairs.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last dim strided
    assert not transposed.is_contiguous()
    got = triton_ops.greedy_walk_triton(start.to(DEVICE), transposed.to(DEVICE), ids.to(DEVICE)).cpu()
    assert torch.equal(got, ops.greedy_walk_reference(start, pairs, ids))


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_sample_walk_matches_the_reference(k):
    start, pairs, ids = _lattice(6, 5, k, seed=100 + k)
    uniforms = torch.rand(6, 5, generator=_gen(k))
    temperatures = torch.tensor([0.5, 1.0, 2.0, 0.0, 1.0, 1.0])
    greedy = torch.tensor([False, False, True, False, True, False])
    start[5] = float("nan")  # no finite score: argmax and a one-hot proposal
    tokens, q = triton_ops.sample_walk_triton(*(t.to(DEVICE) for t in (start, pairs, ids, uniforms, temperatures,
                                                                       greedy)))
    ref_tokens, ref_q = ops.sample_walk_reference(start, pairs, ids, uniforms, temperatures, greedy)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(q.cpu(), ref_q, rtol=1e-6, atol=1e-6)
    # greedy rows are bit-identical to the greedy walk
    assert torch.equal(tokens.cpu()[greedy], ops.greedy_walk_reference(start, pairs, ids)[greedy])


def test_sample_walk_stays_in_support_at_round_off():
    # u just below 1 with a tail of zero-probability candidates: the pick must stay in the support
    start = torch.tensor([[5.0, 4.0, float("-inf"), float("-inf")]])
    pairs = torch.zeros(1, 1, 4, 4)
    ids = torch.arange(8).view(1, 2, 4)
    uniforms = torch.tensor([[0.9999999, 0.5]])
    tokens, q = triton_ops.sample_walk_triton(*(t.to(DEVICE) for t in (start, pairs, ids, uniforms, torch.ones(1),
                                                                       torch.zeros(1, dtype=torch.bool))))
    assert tokens[0, 0].item() in (0, 1)
    assert torch.equal(tokens.cpu(), ops.sample_walk_reference(start, pairs, ids, uniforms, torch.ones(1),
                                                               torch.zeros(1, dtype=torch.bool))[0])


# ---------------------------------------------------------------- GPU, full shapes


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [1024, 1025, 2047, 3072, 49152, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_gpu_topk_lse_full_vocabularies(vocab, dtype, k):
    logits = (torch.randn(40, vocab, generator=_gen(vocab)) * 3).to(dtype)
    assert_topk_identical(logits, k)


@gpu
@needs_cuda
def test_gpu_topk_lse_bf16_ties_at_full_vocabulary():
    logits = torch.randint(0, 64, (16, 151936), generator=_gen(1)).to(torch.bfloat16)
    assert_topk_identical(logits, 8)


@gpu
@needs_cuda
def test_gpu_dispatch_uses_triton_and_falls_back_for_non_power_of_two_k():
    assert ops.kernel_backend("cuda") == "triton"
    logits = torch.randn(8, 5000, generator=_gen(2)).cuda()
    for k in (3, 8):  # 3 goes through the reference on the GPU
        values, ids, lse = ops.topk_lse(logits, k)
        ref = ops.topk_lse_reference(logits.cpu(), k)
        assert torch.equal(ids.cpu(), ref[1])


@gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 32, 257])
def test_gpu_walks_full_shapes(batch):
    start, pairs, ids = _lattice(batch, 15, 8, seed=batch)
    got = triton_ops.greedy_walk_triton(start.cuda(), pairs.cuda(), ids.cuda()).cpu()
    assert torch.equal(got, ops.greedy_walk_reference(start, pairs, ids))
    uniforms = torch.rand(batch, 15, generator=_gen(batch))
    temps = torch.rand(batch, generator=_gen(batch + 1)) * 2
    greedy = torch.rand(batch, generator=_gen(batch + 2)) < 0.3
    tokens, q = triton_ops.sample_walk_triton(start.cuda(), pairs.cuda(), ids.cuda(), uniforms.cuda(), temps.cuda(),
                                              greedy.cuda())
    ref_tokens, ref_q = ops.sample_walk_reference(start, pairs, ids, uniforms, temps, greedy)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(q.cpu(), ref_q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [16, 100, 128])
def test_rms_norm_matches_the_reference(dtype, width):
    x = (torch.randn(3, 5, width, generator=_gen(width)) * 3).to(dtype)
    weight = (1 + 0.1 * torch.randn(width, generator=_gen(1))).to(dtype)
    got = triton_ops.rms_norm_triton(x.to(DEVICE), weight.to(DEVICE), 1e-6).cpu()
    ref = ops.rms_norm_reference(x, weight, 1e-6)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:  # two bf16 roundings, and Triton's interpreter rounds fp32 -> bf16 its own way: within 2 ulps
        ulp = torch.finfo(torch.bfloat16).eps * ref.float().abs().clamp_min(1e-3)
        assert ((got.float() - ref.float()).abs() <= 2.01 * ulp).all()


@pytest.mark.parametrize("k, slots, width", [(1, 2, 16), (4, 5, 48), (8, 3, 300), (16, 4, 64)])
def test_lattice_scores_match_the_reference(k, slots, width):
    g = _gen(k * 100 + slots)
    out_vec = torch.randn(2, slots, k, width, generator=g)
    in_vec = torch.randn(2, slots, k, width, generator=g)
    anchor = torch.randn(2, width, generator=g)
    anchor[1] = 0.0  # an invalid anchor: its vector is the zero vector, normalised with eps
    start, pairs = triton_ops.lattice_scores_triton(out_vec.to(DEVICE), in_vec.to(DEVICE), anchor.to(DEVICE), 1e-6,
                                                    10.0)
    ref_start, ref_pairs = ops.lattice_scores_reference(out_vec, in_vec, anchor, 1e-6, 10.0)
    torch.testing.assert_close(start.cpu(), ref_start, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pairs.cpu(), ref_pairs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 4, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidate_features_match_the_reference(k, dtype):
    log_probs = -torch.rand(2, 5, k, generator=_gen(k)).sort(dim=-1).values * 6  # descending log-probs
    weight = (1 + 0.1 * torch.randn(5, generator=_gen(2))).to(dtype)
    bias = (0.1 * torch.randn(5, generator=_gen(3))).to(dtype)
    got = triton_ops.candidate_features_triton(log_probs.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), 1e-5,
                                               dtype).cpu()
    ref = ops.candidate_features_reference(log_probs, weight, bias, 1e-5, dtype)
    assert got.shape == (2, 5, k, 5) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
