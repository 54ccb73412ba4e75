"""The lossless check covers every token: at a numerical tie the speculative tokens after it are checked against
the target's greedy choice given the speculative prefix, so a real divergence after a tie is still found; nothing
is regenerated (one target forward per request, one more per arm past a tie); the gate says in one line how many
ties there were and lists at most five."""

from __future__ import annotations

import torch

from lilicorr_ckpt.smoke.gates import Divergence, lossless_gate
from lilicorr_ckpt.smoke.probes import Probe
from lilicorr_ckpt.smoke.run import greedy_checks
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
    """A causal LM as the check sees it: a cache of the tokens fed so far (reset, crop), and per fed row the logits
    of the next token after the prefix through it; a tie where TIES says. Counts the rows it computes."""

    tokenizer = _Tokenizer()
    device = torch.device("cpu")

    def __init__(self, ties: set[tuple[int, ...]] = TIES) -> None:
        self.ties, self.cached, self.forwards, self.rows = ties, [], 0, 0

    def reset(self) -> None:
        self.cached = []

    def crop(self, length: int) -> None:
        self.cached = self.cached[:length]

    def forward(self, ids: torch.Tensor, taps: object = None):
        self.forwards += 1
        rows = []
        for token in ids.tolist():
            self.cached.append(token)
            row = torch.zeros(VOCAB)
            row[_next(self.cached)] = 10.0
            if any(tuple(self.cached[-len(t) :]) == t for t in self.ties):
                row[(_next(self.cached) + 1) % VOCAB] = 10.0
            rows.append(row)
        self.rows += len(rows)
        return _Step(torch.stack(rows))


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
    found, near = greedy_checks(_Target(), runs, "bfloat16", [], 12)
    assert [(d.position, d.tie) for d in found] == [(0, True), (7, False)]
    assert (found[1].expected, found[1].emitted) == (after_tie[6], bad)  # the target's choice after the tie
    assert near == {("p", 0): 0}  # the reference's own first token is the tie
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
    found, _ = greedy_checks(_Target(), runs, "bfloat16", [], 12)
    assert [(d.position, d.tie) for d in found] == [(0, True)]
    assert lossless_gate(1, found, 0.0, "bfloat16").status == "pass"


def _other(prefix: list[int]) -> int:
    return (_next(prefix) + 1) % VOCAB  # the tied runner-up where the target ties


def test_arms_tied_at_different_tokens_share_one_reference_forward_and_nothing_is_regenerated():
    prompt = [1, 2]
    ar = _greedy(prompt, 12)
    # the target ties after prompt + ar[:2] and after prompt + ar[:5] (full prefixes: nowhere else)
    ties = {tuple(prompt + ar[:2]), tuple(prompt + ar[:5])}
    head = ar[:2] + [_other(prompt + ar[:2])]
    head += _greedy(prompt + head, 12 - len(head))
    control = ar[:5] + [_other(prompt + ar[:5])]
    after = _greedy(prompt + control, 2)
    control += after + [(_next(prompt + control + after) + 3) % VOCAB]  # a bug at token 8
    control += _greedy(prompt + control, 12 - len(control))
    probe = Probe(id="p", category="code", prompt="", chat=False)
    runs = [(probe, 0, prompt, {"head": _result(head), "control": _result(control), "ar": _result(ar)})]
    target = _Target(ties)
    found, near = greedy_checks(target, runs, "bfloat16", [], 12)
    assert [(d.arm, d.position, d.tie) for d in found] == [
        ("head", 2, True),
        ("control", 5, True),
        ("control", 8, False),
    ]
    assert near == {("p", 0): 2}
    # the reference, each arm's tokens from its tie on, and the control's prefix rows the head's overwrote
    assert target.forwards == 4
    assert target.rows == len(prompt) + 12 + (12 - 2) + (5 - 2) + (12 - 5)


def test_a_generation_that_stops_early_after_a_tie_diverges_at_its_end():
    prompt = [5, 1, 2]
    tie_token = _other(prompt)
    got = [tie_token] + _greedy(prompt + [tie_token], 5)  # 6 tokens, no eos, below max_new_tokens 12
    probe = Probe(id="p", category="code", prompt="", chat=False)
    runs = [(probe, 0, prompt, {"head": _result(got), "ar": _result(_greedy(prompt, 12))})]
    found, _ = greedy_checks(_Target(), runs, "bfloat16", [], 12)
    assert [(d.position, d.tie, d.emitted) for d in found] == [(0, True, tie_token), (6, False, -1)]
    assert found[1].expected == _next(prompt + got) and found[1].emitted_text == "<end>"
    # the same generation ending in an eos is complete
    eos = got[-1]
    found, _ = greedy_checks(_Target(), runs, "bfloat16", [eos], 12)
    assert [(d.position, d.tie) for d in found] == [(0, True)]


def test_equal_generations_cost_one_forward_per_request():
    prompt = [3, 4]
    ar = _greedy(prompt, 12)
    probe = Probe(id="p", category="code", prompt="", chat=False)
    runs = [(probe, 0, prompt, {"head": _result(ar), "control": _result(ar), "ar": _result(ar)})]
    target = _Target(set())
    assert greedy_checks(target, runs, "float32", [], 12) == ([], {("p", 0): None})
    assert target.forwards == 1


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


def _tiny_fast_target():
    import transformers

    from lilicorr_runtime.target.fast import FastTarget

    config = transformers.Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    torch.manual_seed(3)
    target = FastTarget(transformers.Qwen3ForCausalLM(config).eval())
    target.tokenizer = _Tokenizer()
    return target


def test_equal_generations_take_their_near_ties_from_batched_forwards(monkeypatch):
    """Requests whose arms all equal the reference are forwarded several at a time, right-padded in fresh caches:
    their near-ties are the ones a forward of each request alone gives, and no one-request forward runs."""
    from lilicorr_ckpt.smoke import run as smoke_run
    from lilicorr_ckpt.smoke.ties import first_near_tie

    target = _tiny_fast_target()
    requests = []
    for i, (p, n) in enumerate([(3, 20), (9, 14), (5, 30), (2, 7), (12, 25), (4, 1)]):
        prompt = [(7 * i + 3 * j) % 16 for j in range(p)]
        target.reserve(p + n + 1)
        target.reset()
        step = target.forward(torch.tensor(prompt))
        tokens = [int(step.logits[-1].argmax())]
        while len(tokens) < n:
            tokens.append(int(target.forward(torch.tensor([tokens[-1]])).logits[-1].argmax()))
        target.reset()
        alone = target.forward(torch.tensor(prompt + tokens)).logits[p - 1 : p - 1 + n]
        requests.append((Probe(id=f"r{i}", category="code", prompt="", chat=False), prompt, tokens, alone))
    want = {(probe.id, 0): first_near_tie(alone, tokens) for probe, _, tokens, alone in requests}
    assert any(v is not None for v in want.values()) and any(v is None for v in want.values())
    runs = [
        (probe, 0, prompt, {"head": _result(tokens), "control": _result(tokens), "ar": _result(tokens)})
        for probe, prompt, tokens, _ in requests
    ]
    monkeypatch.setattr(smoke_run, "REFERENCE_BATCH", 4)  # two batches: 4 requests, then 2
    forwards = []
    monkeypatch.setattr(type(target), "forward", lambda self, *a, **k: forwards.append(a))
    found, near = greedy_checks(target, runs, "float32", [], 30)
    assert found == [] and near == want and forwards == []


def test_batched_reference_forwards_stay_within_their_memory_budget(monkeypatch):
    from lilicorr_ckpt.smoke import run as smoke_run

    target = _tiny_fast_target()
    per_row = smoke_run.reference_row_bytes(target)
    core = target.core
    assert per_row > target.vocab_size * 4 + core.num_layers * 2 * core.num_kv_heads * core.head_dim * 4
    requests = [([1 + i % 5] * (3 + i), [2] * (5 + 2 * i)) for i in range(9)]  # 8 to 32 rows
    monkeypatch.setattr(smoke_run, "REFERENCE_BYTES", per_row * 70)
    seen, sizes = [], []
    for batch, logits in smoke_run._batched_reference(target, requests):
        sizes.append(len(batch))
        longest = max(len(requests[i][0]) + len(requests[i][1]) for i in batch)
        assert len(batch) == 1 or len(batch) * longest * per_row <= smoke_run.REFERENCE_BYTES
        assert logits.shape[:2] == (len(batch), longest)
        for j, i in enumerate(batch):  # each request's rows are what its own forward gives
            rows = list(requests[i][0]) + list(requests[i][1])
            target.reset()
            alone = target.forward(torch.tensor(rows)).logits
            torch.testing.assert_close(logits[j, : len(rows)], alone, rtol=1e-5, atol=1e-5)
        seen += batch
    assert sorted(seen) == list(range(len(requests)))
    assert len(sizes) > 1 and max(sizes) > 1  # cut into several forwards, some of several requests
