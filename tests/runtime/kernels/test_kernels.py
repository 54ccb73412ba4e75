"""Triton kernels against their torch references: under TRITON_INTERPRET=1 on the CPU (small shapes, run
in CI) and natively on CUDA (full shapes, marked gpu)."""

from __future__ import annotations

import pytest
import torch
from interpreted_triton import CUDA, DEVICE, fresh, triton  # noqa: F401 (before any kernel module)

from lilicorr_runtime import ops
from lilicorr_runtime.ops import draft_triton

triton_ops = fresh(draft_triton)
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


# float32 rows take the select's two-reduction path; bfloat16 and float16 rows its packed 16-bit keys
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [256, 257, 1000, 1025])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_topk_lse_matches_the_reference(vocab, k, dtype):
    logits = (torch.randn(3, vocab, generator=_gen(vocab + k)) * 4).to(dtype)
    assert_topk_identical(logits, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_ties_return_the_lowest_columns(dtype):
    # 64 distinct values over 2000 columns: every top-k boundary is a tie
    logits = torch.randint(0, 64, (4, 2000), generator=_gen(7)).to(dtype)
    assert_topk_identical(logits, 8)
    values, ids, _ = triton_ops.topk_lse_triton(logits.to(DEVICE), 8)
    assert torch.equal(logits.gather(1, ids.cpu()).float(), values.cpu())  # every id holds its value


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_nan_rows(dtype):
    logits = torch.randn(3, 700, generator=_gen(3)).to(dtype)
    logits[0, 5] = float("nan")  # one NaN: never a candidate, but the row's lse is NaN
    logits[1] = float("nan")  # all NaN: -inf values, columns 0..k-1
    assert_topk_identical(logits, 4)
    values, ids, lse = triton_ops.topk_lse_triton(logits.to(DEVICE), 4)
    assert torch.isnan(lse[:2].cpu()).all() and torch.isfinite(lse[2].cpu())
    assert ids[1].cpu().tolist() == [0, 1, 2, 3] and torch.isneginf(values[1].cpu()).all()
    assert 5 not in ids[0].cpu().tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [4, 8, 16])
def test_topk_lse_rows_with_fewer_finite_values_than_k(k, dtype):
    # -inf fills the rest of the top-k in column order; a selected entry must not be selected twice
    logits = torch.full((3, 1300), float("-inf"), dtype=dtype)
    logits[0, [900, 3, 640]] = torch.tensor([1.0, 2.0, 1.0], dtype=dtype)
    logits[1, 700] = 0.5
    logits[1, 0:2] = float("nan")
    logits[2] = torch.randn(1300, generator=_gen(k)).to(dtype)
    logits[2, 256:1300] = float("-inf")
    assert_topk_identical(logits, k)
    _, ids, _ = triton_ops.topk_lse_triton(logits.to(DEVICE), k)
    assert ids.cpu()[0, :3].tolist() == [3, 640, 900]
    assert all(len(set(row)) == k for row in ids.cpu().tolist())


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_infinite_logits(dtype):
    # +inf: lse +inf (the reference's reference point is 0, not inf - inf); a row of -inf: lse -inf
    logits = torch.randn(3, 900, generator=_gen(9)).to(dtype)
    logits[0, 17] = float("inf")
    logits[1] = float("-inf")
    assert_topk_identical(logits, 8)
    _, ids, lse = triton_ops.topk_lse_triton(logits.to(DEVICE), 8)
    assert lse[0].item() == float("inf") and lse[1].item() == float("-inf") and ids[0, 0].item() == 17


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_non_contiguous_rows(dtype):
    logits = torch.randn(6, 900, generator=_gen(5)).to(dtype)[::2]
    assert not logits.is_contiguous()
    assert_topk_identical(logits, 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_equal_values_in_tiles_chosen_out_of_column_order(dtype):
    # tiles are chosen by maximum (tile 6 before tile 1 here), but equal values must come out in column order
    logits = torch.full((1, 2048), -3.0, dtype=dtype)
    logits[0, 1700] = 9.0  # tile 6's maximum
    logits[0, 1600] = 5.0  # tile 6 again
    logits[0, 300] = 5.0  # tile 1's maximum
    logits[0, 301] = 5.0
    assert_topk_identical(logits, 4)
    _, ids, _ = triton_ops.topk_lse_triton(logits.to(DEVICE), 4)
    assert ids.cpu()[0].tolist() == [1700, 300, 301, 1600]


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_lse_signed_zeros_tie_in_column_order(dtype):
    # -0.0 == +0.0: the integer keys must not order them by sign
    logits = torch.full((2, 600), -1.0, dtype=dtype)
    logits[0, [10, 20, 30]] = torch.tensor([0.0, -0.0, 0.0], dtype=dtype)
    logits[1, [5, 400]] = torch.tensor([-0.0, 0.0], dtype=dtype)
    assert_topk_identical(logits, 4)
    _, ids, _ = triton_ops.topk_lse_triton(logits.to(DEVICE), 4)
    assert ids.cpu()[0, :3].tolist() == [10, 20, 30] and ids.cpu()[1, :2].tolist() == [5, 400]


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


def test_walks_strided_start_temperatures_and_mask():
    start, pairs, ids = _lattice(4, 6, 8, seed=4)
    wide = torch.randn(4, 16, generator=_gen(5))
    wide[:, ::2] = start
    strided_start = wide[:, ::2]
    temps = torch.tensor([0.5, 9.0, 1.0, 9.0, 2.0, 9.0, 0.7, 9.0])[::2]
    mask = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0], dtype=torch.int8)[::2]
    uniforms = torch.rand(4, 6, generator=_gen(6))
    assert not (strided_start.is_contiguous() or temps.is_contiguous() or mask.is_contiguous())
    got = triton_ops.greedy_walk_triton(strided_start.to(DEVICE), pairs.to(DEVICE), ids.to(DEVICE)).cpu()
    assert torch.equal(got, ops.greedy_walk_reference(start, pairs, ids))
    tokens, q = triton_ops.sample_walk_triton(
        *(t.to(DEVICE) for t in (strided_start, pairs, ids, uniforms, temps, mask))
    )
    ref_tokens, ref_q = ops.sample_walk_reference(
        start, pairs, ids, uniforms, temps.contiguous(), mask.bool()
    )
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(q.cpu(), ref_q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_sample_walk_matches_the_reference(k):
    start, pairs, ids = _lattice(6, 5, k, seed=100 + k)
    uniforms = torch.rand(6, 5, generator=_gen(k))
    temperatures = torch.tensor([0.5, 1.0, 2.0, 0.0, 1.0, 1.0])
    greedy = torch.tensor([False, False, True, False, True, False])
    start[5] = float("nan")  # no finite score: argmax and a one-hot proposal
    tokens, q = triton_ops.sample_walk_triton(
        *(t.to(DEVICE) for t in (start, pairs, ids, uniforms, temperatures, greedy))
    )
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
    tokens, q = triton_ops.sample_walk_triton(
        *(
            t.to(DEVICE)
            for t in (start, pairs, ids, uniforms, torch.ones(1), torch.zeros(1, dtype=torch.bool))
        )
    )
    assert tokens[0, 0].item() in (0, 1)
    assert torch.equal(
        tokens.cpu(),
        ops.sample_walk_reference(
            start, pairs, ids, uniforms, torch.ones(1), torch.zeros(1, dtype=torch.bool)
        )[0],
    )


# ---------------------------------------------------------------- GPU, full shapes


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [1024, 1025, 2047, 3072, 49152, 151936])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_gpu_topk_lse_full_vocabularies(vocab, dtype, k):
    logits = (torch.randn(40, vocab, generator=_gen(vocab)) * 3).to(dtype)
    assert_topk_identical(logits, k)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_topk_lse_16_bit_ties_at_full_vocabulary(dtype):
    logits = torch.randint(0, 64, (16, 151936), generator=_gen(1)).to(dtype)
    assert_topk_identical(logits, 8)
    logits[:, ::7] = -0.0  # signed zeros among the maxima
    logits[:, 1::7] = 0.0
    logits = logits.clamp(max=0.0)
    assert_topk_identical(logits, 16)


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
    tokens, q = triton_ops.sample_walk_triton(
        start.cuda(), pairs.cuda(), ids.cuda(), uniforms.cuda(), temps.cuda(), greedy.cuda()
    )
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


def test_rms_norm_casts_back_to_the_input_dtype_before_an_fp32_weight():
    x = (torch.randn(4, 64, generator=_gen(8)) * 3).to(torch.bfloat16)
    weight = torch.full((64,), 2.0)  # fp32 weight, bf16 activations; a power of two keeps the check exact
    got = triton_ops.rms_norm_triton(x.to(DEVICE), weight.to(DEVICE), 1e-6).cpu()
    ref = ops.rms_norm_reference(x, weight, 1e-6)
    assert got.dtype == ref.dtype == torch.float32
    normalised = got / 2
    assert torch.equal(normalised.to(torch.bfloat16).float(), normalised)  # rounded to bf16 before the weight
    _within_bf16_ulps(got, ref, 1.01, floor=1e-3)


@pytest.mark.parametrize("k, slots, width", [(1, 2, 16), (4, 5, 48), (8, 3, 300), (16, 4, 64)])
def test_lattice_scores_match_the_reference(k, slots, width):
    g = _gen(k * 100 + slots)
    out_vec = torch.randn(2, slots, k, width, generator=g)
    in_vec = torch.randn(2, slots, k, width, generator=g)
    anchor = torch.randn(2, width, generator=g)
    anchor[1] = 0.0  # an invalid anchor: its vector is the zero vector, normalised with eps
    start, pairs = triton_ops.lattice_scores_triton(
        out_vec.to(DEVICE), in_vec.to(DEVICE), anchor.to(DEVICE), 1e-6, 10.0
    )
    ref_start, ref_pairs = ops.lattice_scores_reference(out_vec, in_vec, anchor, 1e-6, 10.0)
    torch.testing.assert_close(start.cpu(), ref_start, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pairs.cpu(), ref_pairs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slots", [1, 2, 17, 33])
@pytest.mark.parametrize("k", [3, 8])
def test_walks_any_lattice_length(slots, k):
    # more slots than one 16-wide block, a lattice without pairs, and infinite scores in rows the walk
    # does not take (the register-resident row select must stay exact around them)
    start, pairs, ids = _lattice(3, slots, k, seed=slots * 10 + k)
    if slots > 2:
        pairs[0, 1, :, 0] = float("inf")
        pairs[1, 0, 2 % k] = float("-inf")
    uniforms = torch.rand(3, slots, generator=_gen(slots))
    temperatures = torch.tensor([1.0, 0.7, 1.0])
    greedy = torch.tensor([False, False, True])
    got = triton_ops.greedy_walk_triton(start.to(DEVICE), pairs.to(DEVICE), ids.to(DEVICE)).cpu()
    assert torch.equal(got, ops.greedy_walk_reference(start, pairs, ids))
    pairs = torch.where(
        pairs == float("inf"), 1e4, pairs
    )  # a softmax over +inf has no distribution: sampled walks take it finite
    tokens, q = triton_ops.sample_walk_triton(
        *(t.to(DEVICE) for t in (start, pairs, ids, uniforms, temperatures, greedy))
    )
    ref_tokens, ref_q = ops.sample_walk_reference(start, pairs, ids, uniforms, temperatures, greedy)
    assert torch.equal(tokens.cpu(), ref_tokens)
    torch.testing.assert_close(q.cpu(), ref_q, rtol=1e-6, atol=1e-6)


def _within_bf16_ulps(got: torch.Tensor, ref: torch.Tensor, ulps: float, floor: float = 1e-2) -> None:
    scale = ref.float().abs().clamp_min(floor)
    err = ((got.float() - ref.float()).abs() / scale).max().item()
    assert err <= ulps * torch.finfo(torch.bfloat16).eps, f"max relative error {err:.3g}"


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [24, 100])
def test_feature_hidden_matches_the_reference(k, dtype, width):
    g = _gen(k + width)
    log_probs = -torch.rand(2, 3, k, generator=g).sort(dim=-1).values * 6
    norm_w = (1 + 0.1 * torch.randn(5, generator=g)).to(dtype)
    norm_b = (0.1 * torch.randn(5, generator=g)).to(dtype)
    up_w = torch.randn(width, 5, generator=g).to(dtype)
    up_b = (0.1 * torch.randn(width, generator=g)).to(dtype)
    got = triton_ops.feature_hidden_triton(
        *(t.to(DEVICE) for t in (log_probs, norm_w, norm_b)), 1e-5, up_w.to(DEVICE), up_b.to(DEVICE)
    ).cpu()
    ref = ops.feature_hidden_reference(log_probs, norm_w, norm_b, 1e-5, up_w, up_b)
    assert got.shape == (2, 3, k, width) and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:  # bf16 features feed a LayerNorm over five values, which magnifies an ulp of rounding
        torch.testing.assert_close(got.float(), ref.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["delta+bias", "delta", "norm only", "factor input"])
@pytest.mark.parametrize("width", [32, 100])
def test_residual_norm_matches_the_reference(dtype, mode, width):
    g = _gen(width)
    x = (torch.randn(2, 7, width, generator=g) * 2).to(dtype)
    delta = torch.randn(2, 7, width, generator=g).to(dtype) if mode != "norm only" else None
    bias = (
        (0.3 * torch.randn(width, generator=g)).to(dtype) if mode in ("delta+bias", "factor input") else None
    )
    weight = (1 + 0.1 * torch.randn(width, generator=g)).to(dtype)
    anchor = torch.randn(2, width, generator=g).to(dtype) if mode == "factor input" else None
    got_x, got_y = triton_ops.residual_norm_triton(
        x.to(DEVICE),
        None if delta is None else delta.to(DEVICE),
        None if bias is None else bias.to(DEVICE),
        weight.to(DEVICE),
        1e-6,
        None if anchor is None else anchor.to(DEVICE),
    )
    ref_x, ref_y = ops.residual_norm_reference(x, delta, bias, weight, 1e-6, anchor)
    assert got_y.shape == ref_y.shape == (2, 7, 3 * width if anchor is not None else width)
    assert got_x.dtype == ref_x.dtype and got_y.dtype == ref_y.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got_x.cpu(), ref_x, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_y.cpu(), ref_y, rtol=1e-5, atol=1e-5)
    else:
        if CUDA or delta is None:
            assert torch.equal(got_x.cpu(), ref_x)  # the same two roundings
        else:  # Triton's interpreter rounds fp32 -> bf16 its own way: an ulp per rounding
            terms = x.float().abs() + delta.float().abs() + (0 if bias is None else bias.float().abs())
            bound = 2.01 * torch.finfo(torch.bfloat16).eps * (terms + ref_x.float().abs())
            assert ((got_x.cpu().float() - ref_x.float()).abs() <= bound).all()
        # the norm (and factor input) of the kernel's own residual sum
        _, ref_y = ops.residual_norm_reference(got_x.cpu(), None, None, weight, 1e-6, anchor)
        _within_bf16_ulps(got_y.cpu(), ref_y, 3.01, floor=1e-3)
    if anchor is not None:  # [y, a, y ⊙ a]: the anchor block is the row's own anchor, copied
        assert torch.equal(got_y.cpu()[1, :, width : 2 * width], anchor[1].expand(7, width))


def test_residual_norm_one_anchor_for_every_row():
    x, delta = torch.randn(3, 5, 32, generator=_gen(1)), torch.randn(3, 5, 32, generator=_gen(2))
    weight, anchor = torch.randn(32, generator=_gen(3)), torch.randn(1, 32, generator=_gen(4))
    got_x, got_y = triton_ops.residual_norm_triton(
        x.to(DEVICE), delta.to(DEVICE), None, weight.to(DEVICE), 1e-6, anchor.to(DEVICE)
    )
    ref_x, ref_y = ops.residual_norm_reference(x, delta, None, weight, 1e-6, anchor)
    torch.testing.assert_close(got_y.cpu(), ref_y, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_y.cpu()[2, :, 32:64], anchor.expand(5, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, hidden, heads", [(6, 32, 4), (40, 48, 2), (130, 32, 2)])
def test_lattice_attention_matches_the_reference(dtype, n, hidden, heads):
    # head widths 8 and 24 are padded to 16 and 32; n = 130 takes two key blocks (the online softmax)
    g = _gen(n + hidden)
    qkv = torch.randn(2, n, 3 * hidden, generator=g).to(dtype)
    bias = (torch.randn(heads, n, n, generator=g) * 2).to(dtype)
    got = triton_ops.lattice_attention_triton(qkv.to(DEVICE), bias.to(DEVICE), heads).cpu()
    ref = ops.lattice_attention_reference(qkv.float(), bias.float(), heads)
    assert got.shape == (2, n, hidden) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref, rtol=tol, atol=tol)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_head_kernels_at_qwen3_8b_geometry(dtype, batch):
    # h 1024, 8 heads, K 8, S 15: n = 120 nodes
    g = _gen(batch)
    n, h, k, s = 120, 1024, 8, 15
    qkv = torch.randn(batch, n, 3 * h, generator=g).to(dtype)
    bias = torch.randn(8, n, n, generator=g).to(dtype)
    got = triton_ops.lattice_attention_triton(qkv.cuda(), bias.cuda(), 8).cpu()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        got.float(), ops.lattice_attention_reference(qkv.float(), bias.float(), 8), rtol=tol, atol=tol
    )
    x, delta = (
        torch.randn(batch, n, h, generator=g).to(dtype),
        torch.randn(batch, n, h, generator=g).to(dtype),
    )
    bvec, w, a = (torch.randn(h, generator=g).to(dtype) for _ in range(3))
    a = a.expand(batch, h).contiguous()
    got_x, got_y = triton_ops.residual_norm_triton(
        x.cuda(), delta.cuda(), bvec.cuda(), w.cuda(), 1e-6, a.cuda()
    )
    ref_x, ref_y = ops.residual_norm_reference(x, delta, bvec, w, 1e-6, a)
    assert torch.equal(got_x.cpu(), ref_x)
    torch.testing.assert_close(got_y.cpu().float(), ref_y.float(), rtol=tol, atol=tol)
    log_probs = -torch.rand(batch, s, k, generator=g).sort(dim=-1).values * 6
    nw, nb, up_b = torch.randn(5, generator=g), torch.randn(5, generator=g), torch.randn(h, generator=g)
    up_w = torch.randn(h, 5, generator=g)
    got = triton_ops.feature_hidden_triton(
        log_probs.cuda(),
        nw.to(dtype).cuda(),
        nb.to(dtype).cuda(),
        1e-5,
        up_w.to(dtype).cuda(),
        up_b.to(dtype).cuda(),
    ).cpu()
    ref = ops.feature_hidden_reference(
        log_probs, nw.to(dtype), nb.to(dtype), 1e-5, up_w.to(dtype), up_b.to(dtype)
    )
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
