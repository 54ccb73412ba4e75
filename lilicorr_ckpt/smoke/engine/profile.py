"""`smoke --engine`'s report (schemas/smoke-engine.schema.json) and the arithmetic from the engine's counts to it.

Torch-free. The acceptance figures mean what the reference profile's mean (docs/smoke.md): τ is tokens committed
per verification step with the target's own token included, 1 + accepted drafts / steps; the rate at draft
position i is conditional (accepted given every earlier one was) and marginal (accepted with every earlier one);
both come from the engine's own per-step counts (SGLang's per-request histogram of accepted drafts, vLLM's
accepted-per-position counters), never from its derived figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.smoke.engine.servers import ServerRecord
from lilicorr_ckpt.smoke.profile import (
    ChatTemplate,
    DraftCheckpoint,
    Gate,
    MeasurementConditions,
    PositionCount,
    TargetRecord,
)

SCHEMA_VERSION = "1.0"


class EngineAcceptance(msgspec.Struct, frozen=True, kw_only=True):
    """Acceptance over a set of requests as the engine counted it."""

    requests: int
    blocks: int  # verification steps
    accepted: int  # drafted tokens the target accepted (the bonus token excluded)
    mean_accept_length: float  # tau = 1 + accepted / blocks
    # the mean over requests of each one's tau; None where the engine gives no per-request figures
    mean_accept_length_per_request: float | None
    # per draft position; None when the engine reported no per-position counts for some request
    conditional_accept_rates: list[float] | None
    marginal_accept_rates: list[float] | None
    acceptance_length_histogram: dict[int, int] | None  # committed tokens per step (bonus included) -> steps
    position_counts: list[PositionCount] | None
    tokens: int  # generated tokens (the engine's completion_tokens)
    wall_time_s: float  # overall: the request loop's wall time; per category: the requests' summed latencies
    tokens_per_second: float


class Throughput(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine delivered at the chosen concurrency, measured here (end to end: prefill, network)."""

    concurrency: int
    requests: int
    tokens: int
    wall_time_s: float
    tokens_per_second: float
    requests_per_second: float
    mean_latency_s: float
    # the engine's own timing (SGLang meta_info e2e_latency, vLLM's e2e_request_latency_seconds histogram): the
    # requests' latencies inside the server, summed, and the tokens over that sum (each request's rate without the
    # network; at concurrency 1 the server's throughput without this client's overhead). None: not reported
    engine_time_s: float | None = None
    engine_tokens_per_second: float | None = None


class EngineRequest(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    category: str
    seed: int
    prompt_tokens: int
    new_tokens: int  # the engine's completion_tokens
    finish: str  # stop | length | ...
    latency_s: float
    tokens_per_second: float
    blocks: int | None  # None: no per-request figure (vLLM above concurrency 1)
    accepted: int | None
    tau: float | None
    reported: dict[str, float] = {}  # the engine's own per-request figures, as it reported them
    engine_latency_s: float | None = None  # the request's time as the engine timed it (None: not per request)
    # greedy, with a reference: the engine's tokens equal the reference's up to `compared` tokens (None: not compared)
    tokens_match: bool | None = None
    compared: int | None = None


class TauItem(msgspec.Struct, frozen=True, kw_only=True):
    scope: str  # "all" or a category
    requests: int
    reference: float
    engine: float
    relative_delta: float  # engine / reference - 1


class PositionItem(msgspec.Struct, frozen=True, kw_only=True):
    position: int  # 1-based
    reference_conditional: float
    engine_conditional: float | None
    reference_marginal: float
    engine_marginal: float | None


class TokenDivergence(msgspec.Struct, frozen=True, kw_only=True):
    request: str
    seed: int
    position: int  # index into the generated tokens
    expected: int  # the reference's token (-1: the reference had ended)
    emitted: int  # the engine's (-1: the engine had ended)
    expected_text: str
    emitted_text: str
    near_tie_at: int | None  # the reference's first near-tie, which the comparison stops at


class ReferenceComparison(msgspec.Struct, frozen=True, kw_only=True):
    """The engine against the reference runtime on the same prompts."""

    source: str  # the --baseline profile's file, or "this run" (--reference)
    arm: str  # the reference arm compared: the head, or the control of a head-free drafter
    device: str  # where the reference ran
    dtype: str
    conditions_match: bool
    condition_differences: list[str]
    paired_requests: int  # requests both measured per request
    tolerance: float  # the relative tau difference allowed
    tolerance_source: str  # how it was set
    ci95: (
        list[float] | None
    )  # the 95% interval of engine / reference - 1 over the prompts (None: not computed)
    overall: TauItem
    per_category: list[TauItem]
    positions: list[PositionItem]
    greedy_requests_compared: int  # requests whose tokens were compared with the reference's
    greedy_requests_equal: int
    compared_to_near_tie: int  # of those, compared only up to the reference's first near-tie
    divergences: list[TokenDivergence]
    notes: list[str] = []


class EngineReport(msgspec.Struct, frozen=True, kw_only=True):
    """`lilicorr-ckpt smoke --engine ... --format json` prints exactly this (and --output writes it)."""

    schema_version: str = SCHEMA_VERSION
    tool: str = "lilicorr-ckpt smoke --engine"
    version: str = __version__
    engine: ServerRecord
    draft_checkpoint: DraftCheckpoint
    target_model: TargetRecord
    method: str  # lilicorr | dflash
    block_size: int
    num_speculative_tokens: int
    measured: bool
    per_request: bool  # the acceptance figures are per request (else: the whole run's only)
    measurement_conditions: MeasurementConditions
    chat_template: ChatTemplate
    acceptance: EngineAcceptance
    per_category: dict[str, EngineAcceptance]  # empty when the engine gave no per-request figures
    throughput: Throughput
    requests: list[EngineRequest]
    reference: ReferenceComparison | None
    gates: list[Gate]
    passed: bool


class Counted(msgspec.Struct, frozen=True):
    """One request's counts, as aggregation needs them."""

    blocks: int
    accepted: int
    position_accepted: list[int] | None


def acceptance(
    counted: Sequence[Counted], n: int, *, requests: int, tokens: int, wall_time_s: float, per_request: bool
) -> EngineAcceptance:
    """The figures over a set of requests. `counted` may be one entry for the whole run (an aggregate)."""
    blocks = sum(c.blocks for c in counted)
    accepted = sum(c.accepted for c in counted)
    tau = 1.0 + accepted / blocks if blocks else 0.0
    per_req = None
    if per_request:
        taus = [1.0 + c.accepted / c.blocks for c in counted if c.blocks]
        per_req = round(sum(taus) / len(taus), 6) if taus else 0.0
    have_positions = all(c.position_accepted is not None for c in counted)
    cond = marg = hist = counts = None
    if have_positions:
        pos = [
            sum(c.position_accepted[j] for c in counted if c.position_accepted is not None) for j in range(n)
        ]
        reached = [blocks, *pos[:-1]]
        cond = [round(pos[j] / reached[j], 6) if reached[j] else 0.0 for j in range(n)]
        marg = [round(pos[j] / blocks, 6) if blocks else 0.0 for j in range(n)]
        counts = [PositionCount(drafted=blocks, reached=reached[j], accepted=pos[j]) for j in range(n)]
        ends = [*reached, pos[-1] if n else blocks]  # steps that accepted at least k drafts, k = 0..n
        hist = {k + 1: ends[k] - (ends[k + 1] if k + 1 <= n else 0) for k in range(n + 1)}
    return EngineAcceptance(
        requests=requests,
        blocks=blocks,
        accepted=accepted,
        mean_accept_length=round(tau, 6),
        mean_accept_length_per_request=per_req,
        conditional_accept_rates=cond,
        marginal_accept_rates=marg,
        acceptance_length_histogram=hist,
        position_counts=counts,
        tokens=tokens,
        wall_time_s=round(wall_time_s, 6),
        tokens_per_second=round(tokens / wall_time_s, 3) if wall_time_s > 0 else 0.0,
    )


def encode(report: EngineReport) -> bytes:
    return msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n"
