"""The fast target path (static KV cache, taps inside the forward, CUDA graphs) against transformers' forward:
the same logits and tapped features, the same greedy tokens through prefill, verify blocks and crops, the
same speculative decoding; batched greedy generation against one-at-a-time decoding."""

from __future__ import annotations

import pytest
import torch
import transformers
from runtime_helpers import ARCHS, small_config

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import SpeculativeDecoder, TargetModel
from lilicorr_runtime.target.fast import FastTarget, fast_path_problem

CUDA = torch.cuda.is_available()


def _pair(
    arch: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0, vocab: int = 16
) -> tuple[TargetModel, FastTarget]:
    """(transformers target, fast target) over two copies of one random model."""
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    models = []
    for _ in range(2):
        torch.manual_seed(seed)
        models.append(model_cls(config).eval().to(device=device, dtype=dtype))
    return TargetModel(models[0]), FastTarget(models[1])


def _greedy(target: TargetModel, prompt: list[int], n: int) -> list[int]:
    target.reserve(len(prompt) + n + 1)
    target.reset()
    step = target.forward(torch.tensor(prompt))
    tokens = [int(step.logits[-1].argmax())]
    while len(tokens) < n:
        step = target.forward(torch.tensor([tokens[-1]]))
        tokens.append(int(step.logits[-1].argmax()))
    return tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_logits_and_taps_match_transformers_through_prefill_verify_and_crop(arch):
    ref, fast = _pair(arch)
    for t in (ref, fast):
        t.reserve(64)
        t.reset()
    layers = [0, 2, 3]  # 3 is the last layer: its tap is taken after the final norm, as transformers does
    steps = [
        (torch.tensor([1, 5, 7, 9, 11, 3, 4, 2]), layers),
        (torch.tensor([3, 4, 5, 6]), [1, 3]),
        (torch.tensor([6]), None),
    ]
    for i, (ids, taps) in enumerate(steps):
        if i == 2:
            for t in (ref, fast):
                t.crop(10)  # drop two rows of the verified block
        a, b = ref.forward(ids, taps), fast.forward(ids, taps)
        assert ref.length == fast.length
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
        if taps is None:
            assert a.features is None and b.features is None
        else:
            torch.testing.assert_close(b.features, a.features, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_tokens_identical_and_cache_grows(arch):
    ref, fast = _pair(arch, vocab=64)
    prompt = [3, 9, 27, 17, 51]
    fast.reserve(8)  # far too small: forward must grow the cache and keep what it holds
    fast.reset()
    assert _greedy(ref, prompt, 40) == _greedy(fast, prompt, 40)
    fast.reserve(8)
    fast.reset()
    step = fast.forward(torch.tensor(prompt * 60))  # 300 rows > the 256-row default capacity
    assert fast.static_cache.capacity >= 300 and step.logits.shape == (300, 64)


def test_batched_greedy_matches_one_at_a_time():
    ref, fast = _pair("llama", vocab=64)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [5], [40, 41]]
    outputs = fast.generate_batch(prompts, 12, eos_token_ids=[], batch_size=3)
    assert outputs == [_greedy(ref, p, 12) for p in prompts]
    # an eos ends that row's output (inclusive) and no other
    eos = outputs[1][4]
    cut = fast.generate_batch(prompts, 12, eos_token_ids=[eos], batch_size=4)
    for full, short in zip(outputs, cut, strict=True):
        stop = full.index(eos) + 1 if eos in full else len(full)
        assert short == full[:stop]


def test_batched_sampling_draws_from_the_targets_distribution():
    ref, fast = _pair("llama", vocab=64)
    prompt = [3, 14, 15, 9]
    probs = torch.softmax(ref.forward(torch.tensor(prompt)).logits[-1].double() / 0.8, -1)
    rows = fast.generate_batch([prompt] * 4000, 1, eos_token_ids=[], batch_size=4000, temperature=0.8, seed=1)
    counts = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=64).double()
    expected = probs * 4000
    keep = expected >= 5  # chi-square over the cells with enough mass; the rest pooled
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    wanted = torch.cat([expected[keep], expected[~keep].sum()[None]])
    chi2 = float(((observed - wanted) ** 2 / wanted.clamp_min(1e-9)).sum())
    assert chi2 < 2.0 * observed.numel() + 30, chi2  # far above a chi-square's mean (df) only when wrong
    again = fast.generate_batch([prompt] * 8, 6, eos_token_ids=[], temperature=0.8, seed=1)
    assert again == fast.generate_batch([prompt] * 8, 6, eos_token_ids=[], temperature=0.8, seed=1)
    assert again != fast.generate_batch([prompt] * 8, 6, eos_token_ids=[], temperature=0.8, seed=2)
    greedy = fast.generate_batch([prompt], 6, eos_token_ids=[])
    assert fast.generate_batch([prompt], 6, eos_token_ids=[], temperature=1e-6, seed=5) == greedy


@pytest.mark.parametrize("mode", ["ar", "control", "head"])
def test_speculative_decoding_is_the_same_on_both_paths(tmp_path, mode):
    ref, fast = _pair("qwen3")
    drafter = load_drafter(fixtures.write_checkpoint(tmp_path / "d", small_config(), dtype="F32"))
    prompt = [1, 4, 9, 3, 7, 2, 11]
    results = [
        SpeculativeDecoder(t, drafter if mode != "ar" else None, mode=mode).generate(prompt, 30)
        for t in (ref, fast)
    ]
    assert results[0].tokens == results[1].tokens
    assert [b.accepted for b in results[0].blocks] == [b.accepted for b in results[1].blocks]


def test_architectures_without_a_fast_path_are_named():
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=16, n_positions=64)
    assert "gpt2" in fast_path_problem(transformers.GPT2LMHeadModel(config))
    config_cls, model_cls = ARCHS["llama"]
    gelu = model_cls(
        config_cls(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=16,
            hidden_act="gelu",
        )
    )
    assert "hidden_act" in fast_path_problem(gelu)
    with pytest.raises(ValueError, match="no fast path"):
        FastTarget(gelu)


def test_load_target_picks_the_fast_path_and_says_so(tmp_path):
    from lilicorr_runtime import load_target

    target = load_target("examples/tiny-target")
    assert isinstance(target, FastTarget) and target.path == "fast"
    slow = load_target("examples/tiny-target", fast=False)
    assert type(slow) is TargetModel and slow.path == "transformers"
    prompt = [1, 60, 70, 80]
    assert _greedy(target, prompt, 16) == _greedy(slow, prompt, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_replay_matches_eager_and_transformers_on_gpu(arch):
    ref, fast = _pair(arch, device="cuda", dtype=torch.bfloat16, vocab=64)
    eager = FastTarget(ref.model, cuda_graphs=False)
    prompt = [3, 9, 27, 17, 51, 2, 8]
    graphed = _greedy(fast, prompt, 48)
    assert fast._graphs, "the one-token step was not captured"
    assert graphed == _greedy(eager, prompt, 48)
    # against transformers: each greedy token is transformers' top token up to bf16 round-off (the fused step
    # kernels round differently from transformers' unfused ops, so an exact near-tie may go either way)
    with torch.inference_mode():
        hf = (
            ref.model(torch.tensor([prompt + graphed[:-1]], device="cuda"))
            .logits[0, len(prompt) - 1 :]
            .float()
        )
    chosen = hf.gather(1, torch.tensor(graphed, device="cuda")[:, None])[:, 0]
    top = hf.max(dim=1).values
    assert bool((chosen >= top - 2.0**-5 * top.abs().clamp_min(1.0)).all()), (chosen - top).min()
    for t in (fast, eager):
        t.reserve(64)
        t.reset()
        t.forward(torch.tensor(prompt), [1, 3])
    a, b = fast.forward(torch.tensor([5, 6, 7, 8]), [1, 3]), eager.forward(torch.tensor([5, 6, 7, 8]), [1, 3])
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.features, b.features)
    assert fast.generate_batch([prompt, prompt[:3]], 16, eos_token_ids=[]) == eager.generate_batch(
        [prompt, prompt[:3]], 16, eos_token_ids=[]
    )
