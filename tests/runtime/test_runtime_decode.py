"""Speculative decoding is lossless: greedy output equals target-only greedy decoding token for token,
and sampled output follows the target's distribution."""

from __future__ import annotations

import itertools

import pytest
import torch
from runtime_helpers import chi_square_p_value, small_config, tiny_target

from lilicorr_runtime import BlockRecord, GenerationResult, SpeculativeDecoder, acceptance_stats, draft_block

PROMPTS = [[5, 7, 3, 2, 9, 8, 12, 7, 13, 3, 11, 6], [4, 1, 2]]


def greedy_reference(target, prompt, n):
    ids = torch.tensor([prompt])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_ar_mode_is_hf_greedy_decoding(arch):
    target = tiny_target(arch)
    result = SpeculativeDecoder(target, mode="ar").generate(PROMPTS[0], 24)
    assert result.tokens == greedy_reference(target, PROMPTS[0], 24)
    assert [b.committed for b in result.blocks] == [1] * 23


GREEDY_CASES = {
    "llama-K4-B8": ("llama", small_config(), {}),
    "qwen3-K1": ("qwen3", small_config(dflash={"lilicorr_candidate_topk": 1}), {}),
    "qwen2-K8-B4": ("qwen2", small_config(block_size=4, dflash={"block_size": 4, "lilicorr_candidate_topk": 8}),
                    {}),
    "llama-K2-n3": ("llama", small_config(dflash={"lilicorr_candidate_topk": 2}),
                    {"num_speculative_tokens": 3}),
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
    d = drafter(config, load_dtype=kwargs.pop("load_dtype", None), runtime=kwargs.pop("runtime", "all"),
                **({"quant": kwargs.pop("quant")} if "quant" in kwargs else {}))
    decoder = SpeculativeDecoder(target, d, **kwargs)
    reference = SpeculativeDecoder(target, mode="ar")
    results = []
    for prompt in PROMPTS:
        result = decoder.generate(prompt, 48)
        assert result.tokens == reference.generate(prompt, 48).tokens
        n = decoder.num_tokens
        assert all(b.drafted == n and 0 <= b.accepted <= n and b.committed == b.accepted + 1 for b in result.blocks)
        # every emitted token is accounted for: the prefill's one plus each block's commits (last block cut)
        assert 1 + sum(b.committed for b in result.blocks[:-1]) < len(result.tokens) <= 1 + sum(
            b.committed for b in result.blocks)
        results.append(result)
    assert greedy_reference(target, PROMPTS[1], 48) == results[1].tokens


def test_greedy_decoding_runs_partial_and_full_acceptance(drafter):
    # the losslessness cases above would pass vacuously if nothing were ever accepted
    target = tiny_target("llama", seed=0)
    seen = []
    for config, n in ((small_config(), None), (small_config(), 1)):
        result = SpeculativeDecoder(target, drafter(config), mode="control", num_speculative_tokens=n).generate(
            PROMPTS[0], 64)
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


def exact_distribution(target, prompt, steps, temperature):
    """p(x_1..x_steps | prompt) over every sequence, from the target alone."""
    vocab = target.vocab_size
    probs = {}
    for seq in itertools.product(range(vocab), repeat=steps):
        p = 1.0
        for i in range(steps):
            ids = torch.tensor([prompt + list(seq[:i])])
            with torch.no_grad():
                logits = target.model(ids).logits[0, -1].double()
            p *= float(torch.softmax(logits / temperature, -1)[seq[i]])
        probs[seq] = p
    return probs


@pytest.mark.parametrize("mode,temperature,samples", [("head", 1.0, 2000), ("control", 0.8, 1000)])
def test_sampled_decoding_follows_the_target_distribution(drafter, mode, temperature, samples):
    # vocabulary of 5, three emitted tokens: the prefill's, then one block of 2 drafted tokens
    # (a 2-layer target and a 1-layer drafter keep the thousands of runs cheap)
    config = small_config(vocab_size=5, num_hidden_layers=1, num_target_layers=2,
                          dflash={"mask_token_id": 4, "lilicorr_candidate_topk": 4, "target_layer_ids": [0, 1],
                                  "lilicorr_num_layers": 1})
    target = tiny_target("llama", vocab=5, init=0.1, layers=2)
    prompt = [1, 2, 3, 0]
    decoder = SpeculativeDecoder(target, drafter(config), mode=mode, num_speculative_tokens=2,
                                 temperature=temperature, seed=1)
    results = [decoder.generate(prompt, 3) for _ in range(samples)]
    exact = exact_distribution(target, prompt, 3, temperature)
    cells = list(exact)
    counts = torch.zeros(len(cells))
    for r in results:
        counts[cells.index(tuple(r.tokens))] += 1
    assert chi_square_p_value(counts, torch.tensor([exact[c] for c in cells])) > 1e-4
    first = [r.blocks[0] for r in results]  # both the accept and the residual paths ran, many times
    assert sum(b.accepted >= 1 for b in first) > 50 and sum(b.accepted == 0 for b in first) > 50


def test_acceptance_stats_definitions():
    def result(blocks, tokens, wall):
        return GenerationResult(mode="head", prompt_tokens=3, tokens=list(range(tokens)), blocks=blocks,
                                wall_time_s=wall, block_size=4)

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
        prefix = PROMPTS[0] + result.tokens[:emitted - 1]
        anchor = result.tokens[emitted - 1]
        target.reset()
        with torch.inference_mode():
            step = target.forward(torch.tensor(prefix), d.target_layer_ids)
            cache = d.new_cache()
            context = d.project_context(step.features[None])
            d.append_context(cache, context)
            fresh = draft_block(d, cache, torch.tensor([anchor]), context[:, -1], 7, target.embed, target.logits,
                                score=True)
        torch.testing.assert_close(proposal.logits, fresh.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(proposal.pairs, fresh.pairs, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(proposal.start, fresh.start, rtol=1e-4, atol=1e-4)
        emitted += block.committed
