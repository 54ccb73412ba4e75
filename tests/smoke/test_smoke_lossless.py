"""The lossless check covers every token: at a numerical tie the target-only reference is regenerated from the
speculative prefix and the comparison goes on, so a real divergence after a tie is still found; the gate says in
one line how many ties there were and lists at most five."""

from __future__ import annotations

import torch

from lilicorr_ckpt.smoke.gates import Divergence, lossless_gate
from lilicorr_ckpt.smoke.probes import Probe
from lilicorr_ckpt.smoke.run import lossless_divergences
from lilicorr_runtime import BlockRecord, GenerationResult

VOCAB = 8
TIES = {(5, 1, 2)}  # after these ids the target's top two logits are equal (a bf16 tie)


def _next(prefix: list[int]) -> int:
    return (sum(prefix) * 3 + len(prefix)) % VOCAB  # the target's greedy continuation


class _Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


class _Step:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


class _Target:
    """The target seen by the check: one forward's last-row logits; a tie where TIES says."""

    tokenizer = _Tokenizer()

    def reset(self) -> None:
        pass

    def forward(self, ids: torch.Tensor, taps: object = None):
        prefix = ids.tolist()
        logits = torch.zeros(len(prefix), VOCAB)
        logits[-1, _next(prefix)] = 10.0
        if tuple(prefix[-3:]) in TIES:
            logits[-1, (_next(prefix) + 1) % VOCAB] = 10.0
        return _Step(logits)


class _Reference:
    """Target-only greedy decoding (generate_many) of the same target."""

    calls = 0

    def generate_many(self, prompts, max_new_tokens, eos, batch=1):
        _Reference.calls += 1
        out = []
        for prompt in prompts:
            ids = list(prompt)
            tokens = []
            while len(tokens) < max_new_tokens:
                tokens.append(_next(ids))
                ids.append(tokens[-1])
            out.append(_result(tokens))
        return out


def _result(tokens: list[int]) -> GenerationResult:
    return GenerationResult(
        mode="x", prompt_tokens=1, tokens=tokens, blocks=[BlockRecord(0, 0, 1)], wall_time_s=1.0, block_size=1
    )


def _greedy(prompt: list[int], n: int, flip_at: dict[int, int] | None = None) -> list[int]:
    ids, tokens = list(prompt), []
    for i in range(n):
        token = (flip_at or {}).get(i, _next(ids))
        tokens.append(token)
        ids.append(token)
    return tokens


def test_a_divergence_after_a_tie_is_found():
    prompt = [5, 1, 2]  # the first token is a tie
    ar = _greedy(prompt, 12)
    tie_token = (ar[0] + 1) % VOCAB
    after_tie = _greedy(prompt + [tie_token], 11)
    # the speculative arm takes the tie's other token, then follows the target, then (a bug) leaves it at token 7
    bad = (after_tie[6] + 3) % VOCAB
    got = [tie_token] + after_tie[:6] + [bad] + _greedy(prompt + [tie_token] + after_tie[:6] + [bad], 4)
    probe = Probe(id="p", category="code", prompt="", chat=False)
    runs = [(probe, 0, prompt, {"head": _result(got), "ar": _result(ar)})]
    found = lossless_divergences(_Target(), _Reference(), runs, "bfloat16", [], 12, 4)
    assert [(d.position, d.tie) for d in found] == [(0, True), (7, False)]
    gate = lossless_gate(1, found, 0.0, "bfloat16")
    assert (
        gate.status == "fail"
        and "1 numerical tie(s) in bfloat16 (largest target logit gap 0)" in gate.summary
    )


def test_ties_alone_pass_and_every_token_is_compared():
    prompt = [5, 1, 2]
    tie_token = (_greedy(prompt, 1)[0] + 1) % VOCAB
    got = [tie_token] + _greedy(prompt + [tie_token], 11)
    probe = Probe(id="p", category="code", prompt="", chat=False)
    runs = [(probe, 0, prompt, {"head": _result(got), "ar": _result(_greedy(prompt, 12))})]
    found = lossless_divergences(_Target(), _Reference(), runs, "bfloat16", [], 12, 4)
    assert [(d.position, d.tie) for d in found] == [(0, True)]
    assert lossless_gate(1, found, 0.0, "bfloat16").status == "pass"


def test_the_gate_lists_at_most_five_ties_and_names_the_largest_gap():
    ties = [
        Divergence(
            request=f"r{i}",
            seed=0,
            arm="head",
            position=i,
            expected=1,
            emitted=2,
            logit_gap=0.01 * i,
            tie=True,
        )
        for i in range(9)
    ]
    gate = lossless_gate(9, ties, 0.0, "bfloat16")
    assert gate.status == "pass"
    assert "9 numerical tie(s) in bfloat16 (largest target logit gap 0.08)" in gate.summary
    assert len(gate.details) == 6 and gate.details[-1] == "... and 4 more ties"
