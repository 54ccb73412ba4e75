"""Every figure a server reports, held to what an engine can produce before smoke reports it or gates on it.

The server's counts are the measurement, and the server is a stranger (transport.py): a modified build, a proxy
that rewrites replies, or a stand-in may report what no engine counts (a tau above the block, an acceptance rate of
1400%, negative counts, more tokens than were asked for). A report built on such a figure would pass or fail its
gates on nothing, so the run ends (exit 2) at the first one, naming the figure, its value and the bound it breaks.

The bounds, for n drafted tokens per verification step (num_speculative_tokens; DFlash's block is n + 1):

- every count is a whole number >= 0 (the reply decoders read ints only; the sign is checked here);
- generated tokens: each request's completion tokens and output ids <= its max_new_tokens (both engines stop at
  it: SGLang caps a speculative run that crosses it, vLLM likewise), the run's <= max_new_tokens x requests;
- accepted <= drafted: SGLang's accepted drafts <= steps x n; vLLM's accepted tokens <= its draft tokens <= steps
  x n;
- per position: vLLM's accepted-per-position counters are non-increasing, the first <= steps (a draft is accepted
  only with every one before it: verification keeps a prefix), and they sum to the accepted tokens; SGLang's
  per-step histogram has at most n + 1 entries, summing to the steps and, weighted by k, to the accepted drafts;
- tokens per verification step <= n + 1: with SGLang every token after the prefill's comes out of a verification
  step (or the re-prefill after a retraction), so completion tokens <= 1 + retractions + steps x (n + 1); and the
  steps' committed tokens (steps + accepted) exceed the tokens after the prefill's by at most the n drafts of a last
  step cut short by a stop or the length cap (vLLM: by the margin settled_delta allows, past which another client
  shares the server);
- what follows from those, checked again on the totals before the gates: tau = 1 + accepted / steps in [1, n + 1],
  every conditional and marginal rate in [0, 1]; SGLang's own spec_accept_rate in [0, 1] and spec_accept_length
  (completion tokens / steps) <= n + 1 + (1 + retractions) / steps; latencies finite and >= 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lilicorr_ckpt.smoke.engine.transport import EngineError

if TYPE_CHECKING:
    from lilicorr_ckpt.smoke.engine.profile import EngineAcceptance

FIX = (
    "no engine counts that, so nothing this server reports can be trusted and the run measured nothing; check that "
    "it runs an unmodified release and that no proxy between it and smoke rewrites its replies"
)


def refusal(where: str, figure: str, value: object, bound: str) -> EngineError:
    """The run's end at a figure no engine reports: which, its value, the bound it breaks, and what to check."""
    return EngineError(f"{where}: {figure} is {value}, {bound}: {FIX}")


def _count(where: str, figure: str, value: int) -> None:
    if value < 0:
        raise refusal(where, figure, value, "below 0 (a count)")


def _at_most(where: str, figure: str, value: int | float, bound: int | float, why: str) -> None:
    if value > bound:
        raise refusal(where, figure, value, f"above {bound} ({why})")


def generated(where: str, figure: str, tokens: int, max_new_tokens: int, requests: int = 1) -> None:
    """Generated tokens: a count, at most max_new_tokens per request."""
    _count(where, figure, tokens)
    bound = max_new_tokens * requests
    why = (
        f"the --max-new-tokens {max_new_tokens} asked of the request"
        if requests == 1
        else f"--max-new-tokens {max_new_tokens} x {requests} requests"
    )
    _at_most(where, figure, tokens, bound, why)


def latency(where: str, figure: str, seconds: float | None) -> None:
    if seconds is not None and not (math.isfinite(seconds) and 0 <= seconds <= 1e6):
        raise refusal(where, figure, repr(seconds), "not the seconds a request took (finite, 0 to 1e6)")


def sglang_request(
    where: str,
    *,
    n: int,
    max_new_tokens: int,
    completion_tokens: int,
    output_ids: int,
    blocks: int,
    accepted: int,
    histogram: Sequence[int] | None,
    retractions: int,
    accept_length: float | None,
    accept_rate: float | None,
) -> None:
    """One SGLang reply's meta_info (and its output ids' count)."""
    generated(where, "completion_tokens", completion_tokens, max_new_tokens)
    generated(where, "the number of output_ids", output_ids, max_new_tokens)
    _count(where, "spec_verify_ct", blocks)
    _count(where, "spec_num_correct_drafts", accepted)
    _count(where, "num_retractions", retractions)
    _at_most(
        where,
        "spec_num_correct_drafts",
        accepted,
        blocks * n,
        f"accepted <= drafted: spec_verify_ct {blocks} x {n} drafted per step",
    )
    _at_most(
        where,
        "completion_tokens",
        completion_tokens,
        1 + retractions + blocks * (n + 1),
        f"at most {n + 1} tokens per verification step: 1 from the prefill, {retractions} from re-prefills after "
        f"retractions, and spec_verify_ct {blocks} x {n + 1}",
    )
    _at_most(
        where,
        "spec_verify_ct + spec_num_correct_drafts (the tokens the verification steps committed)",
        blocks + accepted,
        max(completion_tokens - 1, 0) + (n if blocks else 0),
        f"the {max(completion_tokens - 1, 0)} tokens after the prefill's, plus the {n} drafts a last step cut "
        "short may have counted",
    )
    if histogram is not None and blocks:
        for k, steps in enumerate(histogram):
            _count(where, f"spec_correct_drafts_histogram[{k}]", steps)
        shown = list(histogram[: n + 2])
        if len(histogram) > n + 1:
            raise refusal(
                where,
                "spec_correct_drafts_histogram",
                shown,
                f"longer than {n + 1} entries (a step accepts 0 to {n} drafts)",
            )
        if sum(histogram) != blocks:
            raise refusal(
                where,
                "spec_correct_drafts_histogram",
                shown,
                f"whose steps add up to {sum(histogram)}, not spec_verify_ct {blocks}",
            )
        weighted = sum(k * h for k, h in enumerate(histogram))
        if weighted != accepted:
            raise refusal(
                where,
                "spec_correct_drafts_histogram",
                shown,
                f"whose accepted drafts add up to {weighted}, not spec_num_correct_drafts {accepted}",
            )
    if accept_rate is not None and not (math.isfinite(accept_rate) and 0 <= accept_rate <= 1):
        raise refusal(where, "spec_accept_rate", repr(accept_rate), "outside [0, 1] (a rate)")
    if accept_length is not None:
        bound = n + 1 + (1 + retractions) / blocks if blocks else float(completion_tokens)
        if not (math.isfinite(accept_length) and 0 <= accept_length <= bound + 1e-9):
            raise refusal(
                where,
                "spec_accept_length",
                repr(accept_length),
                f"outside [0, {bound:g}] (completion_tokens / spec_verify_ct: at most {n + 1} tokens per step, "
                "and the prefill's)",
            )


def vllm_counters(
    where: str,
    *,
    n: int,
    drafts: int,
    draft_tokens: int,
    accepted: int,
    per_position: Sequence[int],
) -> None:
    """vLLM's speculative-decoding counters, or their change over some requests."""
    _count(where, "the change of vllm:spec_decode_num_drafts (verification steps)", drafts)
    _count(where, "the change of vllm:spec_decode_num_draft_tokens", draft_tokens)
    _count(where, "the change of vllm:spec_decode_num_accepted_tokens", accepted)
    for j, count in enumerate(per_position):
        _count(where, f"the change of vllm:spec_decode_num_accepted_tokens_per_pos at position {j}", count)
    _at_most(
        where,
        "the change of vllm:spec_decode_num_draft_tokens",
        draft_tokens,
        drafts * n,
        f"{drafts} steps x {n} drafted per step",
    )
    _at_most(
        where,
        "the change of vllm:spec_decode_num_accepted_tokens",
        accepted,
        draft_tokens,
        f"accepted <= drafted: {draft_tokens} draft tokens",
    )
    if per_position:
        _at_most(
            where,
            "the change of vllm:spec_decode_num_accepted_tokens_per_pos at position 0",
            per_position[0],
            drafts,
            f"a step accepts its first draft at most once: {drafts} steps",
        )
    for j in range(1, len(per_position)):
        _at_most(
            where,
            f"the change of vllm:spec_decode_num_accepted_tokens_per_pos at position {j}",
            per_position[j],
            per_position[j - 1],
            f"position {j - 1}'s: a draft is accepted only with every one before it",
        )
    if sum(per_position) != accepted:
        raise refusal(
            where,
            "the change of vllm:spec_decode_num_accepted_tokens_per_pos",
            list(per_position),
            f"whose sum is {sum(per_position)}, not the {accepted} accepted tokens",
        )


def acceptance(where: str, acc: EngineAcceptance, n: int, max_new_tokens: int) -> None:
    """The figures over a set of requests, as the report will carry them and the gates read them."""
    generated(where, "tokens", acc.tokens, max_new_tokens, max(acc.requests, 1))
    _count(where, "blocks (verification steps)", acc.blocks)
    _count(where, "accepted drafts", acc.accepted)
    tau = acc.mean_accept_length
    if acc.blocks and not (math.isfinite(tau) and 1 <= tau <= n + 1 + 1e-9):
        raise refusal(
            where, "tau", f"{tau:g}", f"outside [1, {n + 1}] (1 + at most {n} accepted drafts per step)"
        )
    per_request = acc.mean_accept_length_per_request
    if (
        per_request is not None
        and acc.blocks
        and not (math.isfinite(per_request) and 1 <= per_request <= n + 1 + 1e-9)
    ):
        raise refusal(where, "tau per request", f"{per_request:g}", f"outside [1, {n + 1}]")
    for name, rates in (
        ("conditional acceptance rate", acc.conditional_accept_rates),
        ("marginal acceptance rate", acc.marginal_accept_rates),
    ):
        for j, rate in enumerate(rates or ()):
            if not (math.isfinite(rate) and 0 <= rate <= 1):
                raise refusal(
                    where, f"the {name} at position {j + 1}", f"{rate:g}", "outside [0, 1] (a rate)"
                )
    for j, c in enumerate(acc.position_counts or ()):
        if not 0 <= c.accepted <= c.reached <= c.drafted:
            raise refusal(
                where,
                f"position {j + 1}'s counts",
                f"{c.accepted} accepted of {c.reached} reached of {c.drafted} drafted",
                "not accepted <= reached <= drafted",
            )
