"""The torch reference ops against brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from runtime_helpers import chi_square_p_value

from lilicorr_runtime.decode.block import categorical, verify_greedy, verify_sampled
from lilicorr_runtime.ops import control_walk, greedy_walk, sample_walk, topk_lse


@pytest.mark.parametrize("vocab,k", [(1000, 8), (1025, 4), (37, 1), (8, 8)])
def test_topk_lse_matches_float64_log_softmax(vocab, k):
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    values, ids, lse = topk_lse(logits, k)
    assert values.dtype == torch.float32 and lse.dtype == torch.float32 and ids.dtype == torch.int64
    ref = torch.log_softmax(logits.double(), dim=-1)
    ref_values, _ = ref.topk(k, dim=-1)
    torch.testing.assert_close((values - lse[:, None]).double(), ref_values, rtol=1e-5, atol=1e-5)
    assert torch.all(values[:, :-1] >= values[:, 1:])  # descending
    assert torch.equal(logits.gather(1, ids), values)  # every id holds its value


def test_topk_lse_bf16_input_is_scored_in_fp32():
    logits = (torch.randn(3, 4096, generator=torch.Generator().manual_seed(1)) * 8).bfloat16()
    values, ids, lse = topk_lse(logits, 8)
    ref = torch.log_softmax(logits.double(), dim=-1).gather(1, ids)
    torch.testing.assert_close((values - lse[:, None]).double(), ref, rtol=1e-5, atol=1e-4)


def brute_greedy(start, pairs, ids):
    # one row at a time with python max (first maximum wins)
    b, slots, k = ids.shape
    out = torch.empty(b, slots, dtype=torch.long)
    for r in range(b):
        row = start[r].tolist()
        for s in range(slots):
            pick = max(range(k), key=lambda j: (row[j], -j))
            out[r, s] = ids[r, s, pick]
            if s + 1 < slots:
                row = pairs[r, s, pick].tolist()
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 8, 16])
def test_greedy_walk_matches_brute_force(k):
    g = torch.Generator().manual_seed(k)
    b, slots = 5, 7
    start, pairs = torch.randn(b, k, generator=g), torch.randn(b, slots - 1, k, k, generator=g)
    ids = torch.randint(0, 10_000, (b, slots, k), generator=g)
    assert torch.equal(greedy_walk(start, pairs, ids), brute_greedy(start, pairs, ids))


def test_greedy_walk_ties_go_to_the_lower_index():
    k, slots = 4, 3
    ids = torch.arange(slots * k).view(1, slots, k)
    start = torch.tensor([[0.0, 2.0, 2.0, 1.0]])
    pairs = torch.zeros(1, slots - 1, k, k)
    pairs[0, 0, 1] = torch.tensor([5.0, 1.0, 5.0, 5.0])
    assert greedy_walk(start, pairs, ids).tolist() == [[1, 4, 8]]
    # the walk follows the pick, not the row with the best total: slot 1 conditions on candidate 1
    pairs[0, 0, 2] = torch.tensor([0.0, 0.0, 0.0, 9.0])
    assert greedy_walk(start, pairs, ids).tolist() == [[1, 4, 8]]


def test_greedy_walk_is_not_viterbi():
    # path 0->0 scores 1 + 0; path 1->1 scores 0.9 + 5: greedy commits slot 0 first and keeps candidate 0
    start = torch.tensor([[1.0, 0.9]])
    pairs = torch.tensor([[[[0.0, -1.0], [-1.0, 5.0]]]])
    ids = torch.tensor([[[10, 11], [20, 21]]])
    assert greedy_walk(start, pairs, ids).tolist() == [[10, 20]]


def test_control_walk_is_per_slot_argmax_with_low_index_ties():
    logits = torch.tensor([[[0.0, 3.0, 3.0], [7.0, 1.0, 7.0]]])
    assert control_walk(logits).tolist() == [[1, 0]]


def test_sample_walk_follows_the_inverse_cdf_rule():
    g = torch.Generator().manual_seed(3)
    b, slots, k = 6, 5, 8
    start, pairs = torch.randn(b, k, generator=g) * 3, torch.randn(b, slots - 1, k, k, generator=g) * 3
    ids = torch.randint(0, 1000, (b, slots, k), generator=g)
    u = torch.rand(b, slots, generator=g)
    temps = torch.tensor([1.0, 0.5, 2.0, 0.0, 1e-9, 1.3])
    greedy = torch.tensor([False, False, False, False, False, True])
    tokens, q = sample_walk(start, pairs, ids, u, temps, greedy)
    for r in range(b):
        row = start[r].double()
        for s in range(slots):
            t = max(float(temps[r]), 1e-5)
            probs = torch.softmax(row / t, dim=-1)
            if greedy[r]:
                pick = int(row.argmax())
                expect_q = torch.nn.functional.one_hot(torch.tensor(pick), k).double()
            else:
                pick = min(int((probs.cumsum(0) <= u[r, s]).sum()), k - 1)
                expect_q = probs
            assert tokens[r, s] == ids[r, s, pick]
            torch.testing.assert_close(q[r, s].double(), expect_q, atol=1e-6, rtol=1e-5)
            if s + 1 < slots:
                row = pairs[r, s, pick].double()


def test_sample_walk_greedy_rows_are_bit_identical_to_greedy_walk():
    g = torch.Generator().manual_seed(4)
    b, slots, k = 8, 15, 16
    start, pairs = torch.randn(b, k, generator=g), torch.randn(b, slots - 1, k, k, generator=g)
    ids = torch.randint(0, 1000, (b, slots, k), generator=g)
    greedy = torch.arange(b) % 2 == 0
    tokens, q = sample_walk(start, pairs, ids, torch.rand(b, slots, generator=g), torch.ones(b), greedy)
    expected = greedy_walk(start, pairs, ids)
    assert torch.equal(tokens[greedy], expected[greedy])
    assert torch.equal(q[greedy].sum(-1), torch.ones(int(greedy.sum()), slots))
    assert torch.equal(q[greedy].max(-1).values, torch.ones(int(greedy.sum()), slots))


def test_sample_walk_draws_each_slot_from_its_softmax():
    # one slot, K = 4, many rows: the empirical pick frequencies match softmax(row / T)
    n, k = 40_000, 4
    row = torch.tensor([1.0, 0.2, -0.5, 0.7])
    start = row.expand(n, k)
    ids = torch.arange(k).expand(n, 1, k)
    u = torch.rand(n, 1, generator=torch.Generator().manual_seed(5))
    tokens, q = sample_walk(
        start, torch.zeros(n, 0, k, k), ids, u, torch.full((n,), 0.7), torch.zeros(n, dtype=torch.bool)
    )
    counts = torch.bincount(tokens[:, 0], minlength=k)
    assert chi_square_p_value(counts, torch.softmax(row / 0.7, -1)) > 1e-4
    torch.testing.assert_close(q[0, 0], torch.softmax(row / 0.7, -1))


def test_categorical_never_draws_a_zero_probability_entry():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).expand(5, 5)
    u = torch.tensor([0.0, 0.25, 0.5, 0.75, 0.9999999])
    assert categorical(probs, u).tolist() == [1, 1, 3, 3, 3]


def test_verify_greedy_accepts_the_longest_matching_prefix():
    vocab, n = 10, 4
    target_choice = torch.tensor([[3, 1, 4, 1, 5], [3, 1, 4, 1, 5], [3, 1, 4, 1, 5]])
    logits = torch.nn.functional.one_hot(target_choice, vocab).float()
    drafts = torch.tensor([[3, 1, 4, 1], [3, 9, 4, 1], [0, 1, 4, 1]])
    accepted, nxt = verify_greedy(logits, drafts)
    assert accepted.tolist() == [4, 1, 0]
    assert nxt.tolist() == [5, 1, 3]
    assert drafts.shape[1] == n


def test_verify_sampled_emits_the_target_distribution():
    # brute-force check of exactness: p and q over a 5-token vocabulary, two drafted positions;
    # the first emitted token and the (first, second) pair must follow the target's distribution
    vocab, n, rows = 5, 2, 60_000
    g = torch.Generator().manual_seed(6)
    p1 = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    p2 = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])  # target given the first token (same for every token here)
    p3 = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])
    q1 = torch.tensor([0.1, 0.6, 0.0, 0.3, 0.0])  # a realized proposal with holes in its support
    q2 = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])  # a greedy point mass
    d1 = categorical(q1.expand(rows, vocab), torch.rand(rows, generator=g))
    d2 = torch.full((rows,), 2)
    target = torch.stack([p1, p2, p3]).expand(rows, 3, vocab)
    q = torch.stack([q1, q2]).expand(rows, n, vocab)
    accepted, nxt = verify_sampled(
        target, torch.stack([d1, d2], 1), q, torch.rand(rows, n, generator=g), torch.rand(rows, generator=g)
    )
    first = torch.where(accepted >= 1, d1, nxt)
    assert chi_square_p_value(torch.bincount(first, minlength=vocab), p1) > 1e-4
    second = torch.where(accepted >= 2, d2, nxt)[accepted >= 1]
    assert chi_square_p_value(torch.bincount(second, minlength=vocab), p2) > 1e-4
    # acceptance of position 1 happens with probability Σ min(p, q)
    torch.testing.assert_close((accepted >= 1).float().mean(), torch.minimum(p1, q1).sum(), atol=0.01, rtol=0)


def test_verify_sampled_rejects_a_token_the_target_cannot_emit():
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]])
    q = torch.tensor([[[1.0, 0.0, 0.0]]])
    accepted, nxt = verify_sampled(p, torch.tensor([[0]]), q, torch.zeros(1, 1), torch.tensor([0.3]))
    assert accepted.tolist() == [0] and nxt.tolist() == [1]


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_walk_exhaustive_small_lattice(k):
    # every 0/1 score pattern on a 3-slot lattice: the walk equals the brute-force greedy
    slots = 3
    ids = torch.arange(slots * k).view(1, slots, k)
    for bits in itertools.islice(itertools.product([0.0, 1.0], repeat=k + (slots - 1) * k * k), 0, 4096, 7):
        values = torch.tensor(bits)
        start = values[:k].view(1, k)
        pairs = values[k:].view(1, slots - 1, k, k)
        assert torch.equal(greedy_walk(start, pairs, ids), brute_greedy(start, pairs, ids))


def _gqa_inputs(device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(5)
    b, heads, kv_heads, n, rows, hd = 2, 6, 2, 5, 24, 16
    q, keys, values = (
        torch.randn(*s, generator=g).to(device, dtype)
        for s in [(b, n, heads, hd), (b, kv_heads, rows, hd), (b, kv_heads, rows, hd)]
    )
    last = torch.tensor([[9, 10, 11, 12, 13], [2, 3, 4, 20, 23]], device=device)
    first = torch.tensor([0, 3], device=device)
    return q, keys, values, last, first


def test_the_expanded_gqa_attention_reads_each_query_heads_own_kv_head():
    """_attend_heads_expanded (CUDA's prefill attention with GQA) against SDPA's own GQA, in float64 on the CPU:
    query head h reads KV head h // groups, not h % KV (a repeat in the wrong order fails here)."""
    from lilicorr_runtime.ops.core import _attend_heads_expanded

    q, keys, values, last, first = _gqa_inputs("cpu", torch.float64)
    rows = torch.arange(keys.shape[2])
    mask = ((rows >= first[:, None, None]) & (rows <= last[:, :, None]))[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
    )
    got = _attend_heads_expanded(q.transpose(1, 2), keys, values, mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    swapped = _attend_heads_expanded(q.transpose(1, 2), keys.flip(1), values.flip(1), mask)
    assert not torch.allclose(swapped, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_gqa_prefill_attention_runs_a_fused_kernel():
    """The CUDA reference attention with GQA and a mask takes one of SDPA's fused kernels (the math backend, which
    SDPA picks for a mask with enable_gqa, is switched off here: the call would fail), and agrees with the math
    backend's enable_gqa result to bf16 round-off. Which fused kernel is torch's choice: the fit's profile on an
    H100 (torch 2.11) shows cuDNN's; the first run of this test, which allowed only the memory-efficient one,
    failed there. The reference clamps a left-padding query (last < first: batch 1's first query here) to row
    first[b] as the function documents; the second run compared it with an empty softmax row, which SDPA's math
    backend writes as zeros, and failed on exactly that row's 96 values."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lilicorr_runtime.ops import step_attention_reference

    q, keys, values, last, first = _gqa_inputs("cuda", torch.bfloat16)
    fused = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]
    with sdpa_kernel(fused):
        got = step_attention_reference(q, keys, values, last, first)
    rows = torch.arange(keys.shape[2], device="cuda")
    clamped = torch.maximum(last, first[:, None])
    assert bool((clamped > last).any()), "the inputs must hold a left-padding query"
    mask = ((rows >= first[:, None, None]) & (rows <= clamped[:, :, None]))[:, None]
    with sdpa_kernel([SDPBackend.MATH]):
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
        )
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(got.shape), rtol=2e-2, atol=2e-2)
