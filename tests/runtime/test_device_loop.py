"""The device-resident decode loop (lilicorr_runtime.decode.device_loop) against the eager per-block loop, on the CPU: the same
tokens and per-block acceptance in every mode, greedy and sampled, one request or a batch of requests of
different lengths with slots refilled as requests end."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import ARCHS, small_config

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import SpeculativeDecoder
from lilicorr_runtime.decode.device_loop import DecodeLoop, prefill_bucket
from lilicorr_runtime.target.fast import FastTarget

PROMPTS = [[1, 4, 9, 3, 7, 2, 11], [5, 5, 6], [2, 13, 8, 1, 0, 4, 4, 9, 12, 3, 6], [7]]


def _fast_target(vocab: int = 16, seed: int = 0) -> FastTarget:
    config_cls, model_cls = ARCHS["qwen3"]
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
    torch.manual_seed(seed)
    return FastTarget(model_cls(config).eval())


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Token-by-token decoding of tiny models: more intra-op threads only contend (docs/performance.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = fixtures.write_checkpoint(tmp_path_factory.mktemp("d"), small_config(conv=(4, 16)), dtype="F32")
    return _fast_target(), load_drafter(path)


def _records(result):
    return [(b.drafted, b.accepted, b.committed) for b in result.blocks]


@pytest.mark.parametrize("mode", ["head", "control", "ar"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_device_loop_decodes_as_the_eager_loop(pair, mode, temperature):
    target, drafter = pair
    kwargs = {"mode": mode, "temperature": temperature, "seed": 3}
    eager = SpeculativeDecoder(target, None if mode == "ar" else drafter, loop="eager", **kwargs)
    device = SpeculativeDecoder(target, None if mode == "ar" else drafter, loop="device", **kwargs)
    prompts = PROMPTS[:2] if temperature > 0 else PROMPTS[:1]  # sampled: the generator carries over requests
    for prompt in prompts:
        a, b = eager.generate(prompt, 16), device.generate(prompt, 16)
        assert a.tokens == b.tokens
        assert _records(a) == _records(b)
        assert len(b.tokens) == 16 and b.wall_time_s > 0


def test_a_batch_of_different_lengths_decodes_as_one_at_a_time(pair):
    target, drafter = pair
    eager = SpeculativeDecoder(target, drafter, loop="eager")
    device = SpeculativeDecoder(target, drafter, loop="device")
    # 2 slots for 4 requests: a slot is refilled as soon as its request ends
    got = device.generate_many(PROMPTS, 20, batch=2)
    want = [eager.generate(p, 20) for p in PROMPTS]
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert [_records(g) for g in got] == [_records(w) for w in want]


def test_generate_many_reports_every_block_and_every_ended_request(pair):
    target, drafter = pair
    device = SpeculativeDecoder(target, drafter, loop="device")
    calls: list[tuple[int, float]] = []

    def record(ended: int, seconds: float) -> None:
        calls.append((ended, seconds))

    got = device.generate_many(PROMPTS, 20, batch=2, progress=record)
    [loop] = device._loops.values()
    assert sum(e for e, _ in calls) == len(PROMPTS) == len(got)
    assert len(calls) == loop.steps  # one call per block, 0 for a block that ended no request
    assert 0 in [e for e, _ in calls] and calls[-1][0] >= 1
    # each block's own time, admissions not included: they sum to the loop's step time
    assert all(s > 0 for _, s in calls) and abs(sum(s for _, s in calls) - loop.step_seconds) < 1e-6
    # a request whose first token is an eos: admission does not wait for the device, so the next block's
    # report ends it (one call, the request counted once, that block's time)
    first = device.generate(PROMPTS[0], 2).tokens[0]
    calls.clear()
    [alone] = device.generate_many(PROMPTS[:1], 20, [first], batch=1, progress=record)
    assert alone.tokens == [first] and [e for e, _ in calls] == [1] and calls[0][1] >= 0
    eager = SpeculativeDecoder(target, drafter, loop="eager")
    calls.clear()
    results = eager.generate_many(PROMPTS[:3], 8, progress=record)
    assert calls == [(1, r.wall_time_s) for r in results]  # one request at a time


def test_an_eos_in_the_middle_of_a_block_ends_the_request(pair):
    target, drafter = pair
    free = SpeculativeDecoder(target, drafter, loop="eager").generate(PROMPTS[0], 40)
    eos = free.tokens[10]  # a token the request emits; wherever it lands in its block, the request ends there
    for loop in ("eager", "device"):
        out = SpeculativeDecoder(target, drafter, loop=loop).generate_many([PROMPTS[0]], 40, [eos], batch=1)[
            0
        ]
        assert out.tokens == free.tokens[: free.tokens.index(eos) + 1]
        assert sum(b.committed for b in out.blocks) + 1 >= len(out.tokens)


@pytest.mark.parametrize("batch", [1, 2])
def test_blocks_launched_ahead_commit_the_same_tokens(pair, monkeypatch, batch):
    """With the next block launched before the current one is waited for (as on CUDA), a block that runs after
    its request ended commits nothing, a request admitted meanwhile joins the next block, and the loop reports
    every request ended exactly once with the tokens of the one-block-at-a-time loop."""
    target, drafter = pair
    want = SpeculativeDecoder(target, drafter, loop="device").generate_many(PROMPTS, 20, batch=batch)
    monkeypatch.setattr(DecodeLoop, "_pipelined", lambda self: True)
    monkeypatch.setattr(DecodeLoop, "_may_end", lambda self: False)  # always ahead, even at a request's end
    got = SpeculativeDecoder(target, drafter, loop="device").generate_many(PROMPTS, 20, batch=batch)
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert [_records(g) for g in got] == [_records(w) for w in want]


def test_a_first_token_eos_ends_the_request_at_its_prefill(pair):
    target, drafter = pair
    first = SpeculativeDecoder(target, drafter, loop="eager").generate(PROMPTS[2], 8).tokens[0]
    for loop in ("eager", "device"):
        decoder = SpeculativeDecoder(target, drafter, loop=loop)
        out = decoder.generate_many([PROMPTS[2], PROMPTS[0]], 8, [first], batch=1)
        assert out[0].tokens == [first] and out[0].blocks == [], loop
        assert out[1].tokens == decoder.generate(PROMPTS[0], 8, [first]).tokens


def test_prefill_buckets_round_up_to_few_sizes():
    assert [prefill_bucket(r) for r in (1, 16, 17, 64, 65, 97, 256, 257, 1024)] == [
        16,
        16,
        32,
        64,
        96,
        128,
        256,
        320,
        1024,
    ]
    assert prefill_bucket(1025) == 1025  # past PREFILL_ROWS: the prompt's own rows, eagerly
    assert len({prefill_bucket(r) for r in range(1, 1025)}) == 4 + 6 + 12


def test_the_device_loop_needs_a_fast_target(pair):
    from runtime_helpers import tiny_target

    _, drafter = pair
    with pytest.raises(ValueError, match="fast-path target"):
        SpeculativeDecoder(tiny_target("qwen3"), drafter, loop="device")
    with pytest.raises(ValueError, match="keep_proposals"):
        SpeculativeDecoder(pair[0], drafter, loop="device", keep_proposals=True)


CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _cuda_pair(tmp_path, dtype: torch.dtype, vocab: int = 16):
    target = _fast_target(vocab=vocab)
    target.model.to("cuda", dtype)
    target = FastTarget(target.model)
    cfg = small_config(conv=(4, 16), vocab_size=vocab, dflash={"mask_token_id": vocab - 1})
    return target, load_drafter(
        fixtures.write_checkpoint(tmp_path / "d", cfg, dtype="F32"), dtype=dtype, device="cuda"
    )


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["head", "control", "ar"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_gpu_graph_replayed_blocks_commit_the_eager_tokens(tmp_path, mode, temperature):
    target, drafter = _cuda_pair(tmp_path, torch.float32)
    kwargs = {"mode": mode, "temperature": temperature, "seed": 1}
    eager = SpeculativeDecoder(target, None if mode == "ar" else drafter, loop="eager", **kwargs)
    device = SpeculativeDecoder(target, None if mode == "ar" else drafter, loop="device", **kwargs)
    assert device.loop == "device"
    a = [eager.generate(p, 20) for p in PROMPTS]
    b = device.generate_many(PROMPTS, 20, batch=1)
    loop = next(iter(device._loops.values()))
    assert loop.graph is not None, "the block was not captured"
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [_records(r) for r in a] == [_records(r) for r in b]
    if temperature == 0:  # side by side, refilled: the same tokens and blocks
        c = device.generate_many(PROMPTS, 20, batch=3)
        assert [r.tokens for r in c] == [r.tokens for r in b]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_bf16_speculative_tokens_equal_target_only_bit_for_bit(tmp_path, batch):
    """The fast path computes a verify row exactly as the one-token step (batch-invariant step kernels), so greedy
    speculative decoding emits the target-only tokens even in bf16, where near-ties abound."""
    target, drafter = _cuda_pair(tmp_path, torch.bfloat16, vocab=64)
    prompts = [[(7 * i + j) % 60 for j in range(5 + 3 * i)] for i in range(6)]
    ar = SpeculativeDecoder(target, mode="ar").generate_many(prompts, 48, batch=batch)
    for mode in ("head", "control"):
        spec = SpeculativeDecoder(target, drafter, mode=mode).generate_many(prompts, 48, batch=batch)
        assert [r.tokens for r in spec] == [r.tokens for r in ar], mode
    one = SpeculativeDecoder(target, mode="ar").generate_many(prompts, 48, batch=1)
    assert [r.tokens for r in one] == [r.tokens for r in ar]  # and across batch sizes


def _cuda_bf16_fast_target() -> FastTarget:
    target = _fast_target(vocab=64)
    target.model.to("cuda", torch.bfloat16)
    return FastTarget(target.model)


@pytest.mark.gpu
@needs_cuda
def test_gpu_verify_rows_equal_one_token_steps_bit_for_bit():
    target = _cuda_bf16_fast_target()
    prompt, block = [3, 9, 27, 17, 51, 2, 8], [5, 6, 7, 8, 40, 41, 42, 43]
    target.reserve(64)
    target.reset()
    target.forward(torch.tensor(prompt), [1, 3])
    verify = target.forward(torch.tensor(block), [1, 3])
    target.crop(len(prompt))
    for i, token in enumerate(block):
        step = target.forward(torch.tensor([token]), [1, 3])
        assert torch.equal(step.logits[0], verify.logits[i])
        assert torch.equal(step.features[0], verify.features[i])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 3])
def test_gpu_captured_prefills_decode_as_the_eager_target(tmp_path, batch):
    """Prompts of many lengths (prefill graphs of several row buckets, padded; a staging cache copied into the
    slot when batch > 1) decode the tokens of the eager target-only loop bit for bit in bf16, in every arm."""
    target, drafter = _cuda_pair(tmp_path, torch.bfloat16, vocab=64)
    lengths = (33, 47, 64, 65, 100, 140)
    prompts = [[(5 * i + 3 * j + j * j) % 60 for j in range(n)] for i, n in enumerate(lengths)]
    want = [SpeculativeDecoder(target, mode="ar", loop="eager").generate(p, 24).tokens for p in prompts]
    for mode in ("ar", "head", "control"):
        decoder = SpeculativeDecoder(target, None if mode == "ar" else drafter, mode=mode)
        got = decoder.generate_many(prompts, 24, batch=batch)
        assert [r.tokens for r in got] == want, mode
        loop = next(iter(decoder._loops.values()))
        assert sorted(loop._admit_graphs) == [48, 64, 96, 128, 160], "a prefill was not captured"


@pytest.mark.gpu
@needs_cuda
def test_gpu_prefill_rows_equal_one_token_steps_bit_for_bit():
    target = _cuda_bf16_fast_target()
    prompt = [(11 * j + 5) % 64 for j in range(45)]  # past GRAPH_MAX_ROWS: an eager step-kernel prefill
    target.reserve(64)
    target.reset()
    whole = target.forward(torch.tensor(prompt), [1, 3])
    target.reset()
    for i, token in enumerate(prompt):
        step = target.forward(torch.tensor([token]), [1, 3])
        assert torch.equal(step.logits[0], whole.logits[i])
        assert torch.equal(step.features[0], whole.features[i])
