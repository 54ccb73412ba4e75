"""Speculative decoding is lossless: greedy output equals target-only greedy decoding token for token,
and sampled output follows the target's distribution."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import chi_square_p_value, small_config, tiny_target

from lilicorr_runtime import BlockRecord, GenerationResult, SpeculativeDecoder, acceptance_stats, draft_block
from lilicorr_runtime.decode.block import verify_sampled
from lilicorr_runtime.ops import sample_walk

PROMPTS = [[5, 7, 3, 2, 9, 8, 12, 7, 13, 3, 11, 6], [4, 1, 2]]


def greedy_reference(target, prompt, n):
    ids = torch.tensor([prompt])
    out = target.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_ar_mode_is_hf_greedy_decoding(arch):
    target = tiny_target(arch)
    result = SpeculativeDecoder(target, mode="ar").generate(PROMPTS[0], 24)
    assert result.tokens == greedy_reference(target, PROMPTS[0], 24)
    assert [b.committed for b in result.blocks] == [1] * 23


GREEDY_CASES = {
    "llama-K4-B8": ("llama", small_config(), {}),
    "qwen3-K1": ("qwen3", small_config(dflash={"lilicorr_candidate_topk": 1}), {}),
    "qwen2-K8-B4": (
        "qwen2",
        small_config(block_size=4, dflash={"block_size": 4, "lilicorr_candidate_topk": 8}),
        {},
    ),
    "llama-K2-n3": (
        "llama",
        small_config(dflash={"lilicorr_candidate_topk": 2}),
        {"num_speculative_tokens": 3},
    ),
    "qwen3-n1": ("qwen3", small_config(), {"num_speculative_tokens": 1}),
    "llama-conv": ("llama", small_config(conv=(4, 16)), {}),
    "qwen3-conv-n5": ("qwen3", small_config(conv=(3, 8)), {"num_speculative_tokens": 5}),
    "llama-own-head": ("llama", small_config(own_lm_head=True), {"runtime": "vllm"}),
    "qwen2-h-equals-M": ("qwen2", small_config(dflash={"lilicorr_hidden_size": 64}), {}),
    "qwen3-bf16-drafter": ("qwen3", small_config(conv=(4, 16)), {"load_dtype": torch.bfloat16}),
    "llama-nvfp4-drafter": ("llama", small_config(), {"quant": "NVFP4"}),
    "llama-control": ("llama", small_config(head=False), {"mode": "control"}),
    "qwen3-control-with-head": ("qwen3", small_config(), {"mode": "control"}),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_speculative_decoding_is_lossless(case, drafter):
    arch, config, kwargs = GREEDY_CASES[case]
    kwargs = dict(kwargs)
    target = tiny_target(arch)
    d = drafter(
        config,
        load_dtype=kwargs.pop("load_dtype", None),
        runtime=kwargs.pop("runtime", "all"),
        **({"quant": kwargs.pop("quant")} if "quant" in kwargs else {}),
    )
    decoder = SpeculativeDecoder(target, d, **kwargs)
    reference = SpeculativeDecoder(target, mode="ar")
    results = []
    for prompt in PROMPTS:
        result = decoder.generate(prompt, 48)
        assert result.tokens == reference.generate(prompt, 48).tokens
        n = decoder.num_tokens
        assert all(
            b.drafted == n and 0 <= b.accepted <= n and b.committed == b.accepted + 1 for b in result.blocks
        )
        # every emitted token is accounted for: the prefill's one plus each block's commits (last block cut)
        assert (
            1 + sum(b.committed for b in result.blocks[:-1])
            < len(result.tokens)
            <= 1 + sum(b.committed for b in result.blocks)
        )
        results.append(result)
    assert greedy_reference(target, PROMPTS[1], 48) == results[1].tokens


def test_greedy_decoding_runs_partial_and_full_acceptance(drafter):
    # the losslessness cases above would pass vacuously if nothing were ever accepted
    target = tiny_target("llama", seed=0)
    seen = []
    for config, n in ((small_config(), None), (small_config(), 1)):
        result = SpeculativeDecoder(
            target, drafter(config), mode="control", num_speculative_tokens=n
        ).generate(PROMPTS[0], 64)
        seen += [(b.accepted, b.drafted) for b in result.blocks]
    assert any(0 < a < n for a, n in seen), "no partially accepted block"
    assert any(a == n for a, n in seen), "no fully accepted block"


def test_generation_stops_at_eos(drafter):
    target = tiny_target("qwen3")
    full = SpeculativeDecoder(target, mode="ar").generate(PROMPTS[0], 30).tokens
    eos = full[9]
    cut = full[: full.index(eos) + 1]
    for mode in ("ar", "head"):
        decoder = SpeculativeDecoder(target, drafter(small_config()), mode=mode)
        assert decoder.generate(PROMPTS[0], 30, eos_token_ids=[eos]).tokens == cut


def test_decoder_refuses_mismatched_or_impossible_settings(drafter):
    target = tiny_target("llama", hidden=32)
    with pytest.raises(ValueError, match="hidden_size 64 != target hidden_size 32"):
        SpeculativeDecoder(target, drafter(small_config()))
    target = tiny_target("llama")
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be in \[1, 7\]"):
        SpeculativeDecoder(target, drafter(small_config()), num_speculative_tokens=8)
    with pytest.raises(ValueError, match="needs a LiLiCorr head"):
        SpeculativeDecoder(target, drafter(small_config(head=False)), mode="head")
    with pytest.raises(ValueError, match="reach past"):
        SpeculativeDecoder(tiny_target("llama", layers=2), drafter(small_config()))


def _cells(keys: torch.Tensor, size: int) -> torch.Tensor:
    return torch.bincount(keys, minlength=size).double()


@pytest.mark.parametrize("mode", ["head", "control"])
def test_sampled_blocks_follow_the_target_distribution(mode):
    # One block of two drafted tokens, 200,000 rows at once, through the decoder's own pieces: the walk
    # (sample_walk over prefix-dependent pair scores for the head; a point mass for the control arm),
    # its candidate q scattered onto the vocabulary as SpeculativeDecoder._block does, then verify_sampled
    # against a target whose later positions depend on the drafted prefix. Every emitted position must follow
    # the target exactly: the first token, the second given the first was kept, the third given both were.
    vocab, k, rows, temperature = 6, 4, 200_000, 0.8
    g = torch.Generator().manual_seed(11)
    p1 = torch.softmax(torch.randn(vocab, generator=g), -1)
    p2 = torch.softmax(1.5 * torch.randn(vocab, vocab, generator=g), -1)  # p2[x] = target after x
    p3 = torch.softmax(torch.randn(vocab, vocab, vocab, generator=g), -1)  # p3[x, y] = target after x, y
    ids = torch.tensor([[0, 2, 3, 5], [1, 2, 4, 5]]).expand(rows, 2, k)  # tokens 1 and 4 never drafted first
    if mode == "head":
        start = (2 * torch.randn(k, generator=g)).expand(rows, k)
        pairs = (2 * torch.randn(1, k, k, generator=g)).expand(rows, 1, k, k)
        draft, q_cand = sample_walk(
            start,
            pairs,
            ids,
            torch.rand(rows, 2, generator=g),
            torch.full((rows,), temperature),
            torch.zeros(rows, dtype=torch.bool),
        )
        q = torch.zeros(rows, 2, vocab).scatter_(2, ids, q_cand)
    else:  # control: a drafter that guesses the target's argmax, verified as the point mass it is
        x = int(p1.argmax())
        draft = torch.tensor([x, int(p2[x].argmax())]).expand(rows, 2).clone()
        q = torch.zeros(rows, 2, vocab).scatter_(2, draft[..., None], 1.0)
    d1, d2 = draft[:, 0], draft[:, 1]
    target = torch.stack([p1.expand(rows, vocab), p2[d1], p3[d1, d2]], dim=1)
    accepted, nxt = verify_sampled(
        target, draft, q, torch.rand(rows, 2, generator=g), torch.rand(rows, generator=g)
    )

    first = torch.where(accepted >= 1, d1, nxt)
    assert chi_square_p_value(_cells(first, vocab), p1) > 1e-4
    # P(d1 = x kept) = min(p1, q1)(x); then the second emitted token follows p2[x]
    q1 = q[0, 0]
    kept1 = torch.minimum(p1, q1)
    one = accepted >= 1
    second = torch.where(accepted >= 2, d2, nxt)[one]
    expected2 = (kept1[:, None] * p2).flatten()
    assert chi_square_p_value(_cells(d1[one] * vocab + second, vocab**2), expected2 / expected2.sum()) > 1e-4
    # q2 depends on the first pick (the pair scores): read it per first token from the rows that drew it
    q2 = torch.stack(
        [q[d1 == x][0, 1] if bool((d1 == x).any()) else torch.zeros(vocab) for x in range(vocab)]
    )
    kept2 = kept1[:, None] * torch.minimum(p2, q2)  # P(d1 = x, d2 = y, both kept)
    two = accepted >= 2
    expected3 = (kept2[..., None] * p3).flatten()
    cell3 = (d1[two] * vocab + d2[two]) * vocab + nxt[two]
    assert chi_square_p_value(_cells(cell3, vocab**3), expected3 / expected3.sum()) > 1e-4
    torch.testing.assert_close(one.double().mean(), kept1.sum().double(), atol=0.005, rtol=0)
    # both the accept and the residual paths ran, many times
    assert int((accepted == 0).sum()) > 5_000 and int(two.sum()) > 5_000


def test_sampled_generate_end_to_end(drafter):
    # one small end-to-end run of the sampled decoder per arm: seeded, in the vocabulary, reproducible
    config = small_config(
        vocab_size=5,
        num_hidden_layers=1,
        num_target_layers=2,
        dflash={
            "mask_token_id": 4,
            "lilicorr_candidate_topk": 4,
            "target_layer_ids": [0, 1],
            "lilicorr_num_layers": 1,
        },
    )
    target = tiny_target("llama", vocab=5, init=0.1, layers=2)
    d = drafter(
        config, runtime="vllm"
    )  # it taps the target's last layer, which SGLang 0.5.23 refuses (LC148)
    for mode in ("head", "control"):
        runs = [
            SpeculativeDecoder(
                target, d, mode=mode, num_speculative_tokens=2, temperature=0.8, seed=seed
            ).generate([1, 2, 3, 0], 12)
            for seed in (1, 1, 2)
        ]
        assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 12
        assert all(0 <= t < 5 for r in runs for t in r.tokens)
        assert sum(b.committed for b in runs[2].blocks) == 11  # the first token is the prefill's


def test_acceptance_stats_definitions():
    def result(blocks, tokens, wall):
        return GenerationResult(
            mode="head",
            prompt_tokens=3,
            tokens=list(range(tokens)),
            blocks=blocks,
            wall_time_s=wall,
            block_size=4,
        )

    a = result([BlockRecord(3, 3, 4), BlockRecord(3, 0, 1), BlockRecord(3, 1, 2)], 8, 1.0)
    b = result([BlockRecord(3, 2, 3)], 4, 3.0)
    s = acceptance_stats([a, b])
    assert s.blocks == 4 and s.tokens == 12
    assert s.tau == pytest.approx(10 / 4)  # block-weighted, not the mean of per-request taus
    assert s.tau_per_request == pytest.approx([7 / 3, 3.0])
    assert s.committed_histogram == [1, 1, 1, 1]
    assert s.marginal_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert s.conditional_acceptance == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    assert s.tokens_per_second == pytest.approx(12 / 4.0)


@pytest.mark.parametrize("conv", [None, (3, 16)])
def test_incremental_context_equals_a_fresh_draft(drafter, conv):
    # every block's proposal equals the one drafted from scratch over the same committed prefix: the
    # draft cache holds exactly the accepted rows, and the anchor row is the one that predicted the anchor
    target = tiny_target("qwen3")
    d = drafter(small_config(conv=conv))
    result = SpeculativeDecoder(target, d, keep_proposals=True).generate(PROMPTS[0], 40)
    assert len(result.proposals) == len(result.blocks) > 3
    emitted = 1
    for block, proposal in zip(result.blocks, result.proposals, strict=True):
        prefix = PROMPTS[0] + result.tokens[: emitted - 1]
        anchor = result.tokens[emitted - 1]
        target.reset()
        with torch.inference_mode():
            step = target.forward(torch.tensor(prefix), d.target_layer_ids)
            cache = d.new_cache()
            context = d.project_context(step.features[None])
            d.append_context(cache, context)
            fresh = draft_block(
                d, cache, torch.tensor([anchor]), context[:, -1], 7, target.embed, target.logits, score=True
            )
        torch.testing.assert_close(proposal.logits, fresh.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(proposal.pairs, fresh.pairs, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(proposal.start, fresh.start, rtol=1e-4, atol=1e-4)
        emitted += block.committed
