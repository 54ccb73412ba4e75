"""The device-resident decode loop (lilicorr_runtime.loop) against the eager per-block loop, on the CPU: the same
tokens and per-block acceptance in every mode, greedy and sampled, one request or a batch of requests of
different lengths with slots refilled as requests end."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import ARCHS, small_config

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime import SpeculativeDecoder
from lilicorr_runtime.fast_target import FastTarget

PROMPTS = [[1, 4, 9, 3, 7, 2, 11], [5, 5, 6], [2, 13, 8, 1, 0, 4, 4, 9, 12, 3, 6], [7]]


def _fast_target(vocab: int = 16, seed: int = 0) -> FastTarget:
    config_cls, model_cls = ARCHS["qwen3"]
    config = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, vocab_size=vocab, max_position_embeddings=1024,
                        tie_word_embeddings=False, initializer_range=0.3)
    torch.manual_seed(seed)
    return FastTarget(model_cls(config).eval())


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
    for prompt in PROMPTS[:2]:  # the generator carries over from one request to the next in both
        a, b = eager.generate(prompt, 24), device.generate(prompt, 24)
        assert a.tokens == b.tokens
        assert _records(a) == _records(b)
        assert len(b.tokens) == 24 and b.wall_time_s > 0


def test_a_batch_of_different_lengths_decodes_as_one_at_a_time(pair):
    target, drafter = pair
    eager = SpeculativeDecoder(target, drafter, loop="eager")
    device = SpeculativeDecoder(target, drafter, loop="device")
    # 2 slots for 4 requests: the two short ones end first and their slots take the waiting ones
    budgets = [30, 9, 30, 12]
    for max_new in (30, 9):
        got = device.generate_many(PROMPTS, max_new, batch=2)
        want = [eager.generate(p, max_new) for p in PROMPTS]
        assert [g.tokens for g in got] == [w.tokens for w in want]
        assert [_records(g) for g in got] == [_records(w) for w in want]
    assert budgets  # (documents the refill case above)


def test_an_eos_in_the_middle_of_a_block_ends_the_request(pair):
    target, drafter = pair
    free = SpeculativeDecoder(target, drafter, loop="eager").generate(PROMPTS[0], 40)
    eos = free.tokens[10]  # a token the request emits; wherever it lands in its block, the request ends there
    for loop in ("eager", "device"):
        out = SpeculativeDecoder(target, drafter, loop=loop).generate_many([PROMPTS[0]], 40, [eos], batch=1)[0]
        assert out.tokens == free.tokens[:free.tokens.index(eos) + 1]
        assert sum(b.committed for b in out.blocks) + 1 >= len(out.tokens)


def test_the_device_loop_needs_a_fast_target(pair):
    from runtime_helpers import tiny_target

    _, drafter = pair
    with pytest.raises(ValueError, match="fast-path target"):
        SpeculativeDecoder(tiny_target("qwen3"), drafter, loop="device")
    with pytest.raises(ValueError, match="keep_proposals"):
        SpeculativeDecoder(pair[0], drafter, loop="device", keep_proposals=True)
