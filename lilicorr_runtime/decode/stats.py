"""Acceptance statistics over decoding runs (definitions in docs/runtime.md)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .speculative import GenerationResult


class AcceptanceStats(msgspec.Struct, frozen=True, kw_only=True):
    requests: int
    blocks: int  # verification forwards
    tokens: int  # emitted tokens, the prefill's first token included
    tau: float  # block-weighted: Σ committed / blocks
    tau_per_request: list[float]  # Σ committed / blocks within each request (0 when it had no block)
    # index j-1 describes draft position j (1-based)
    conditional_acceptance: list[float]  # P(position j accepted | positions < j accepted, j drafted)
    marginal_acceptance: list[float]  # P(position j accepted | j drafted)
    committed_histogram: list[int]  # index c-1: blocks that committed c tokens
    wall_time_s: float
    tokens_per_second: float


def acceptance_stats(results: Sequence[GenerationResult]) -> AcceptanceStats:
    blocks = [b for r in results for b in r.blocks]
    width = max([r.block_size for r in results] + [b.committed for b in blocks] + [1])
    histogram = [0] * width
    for b in blocks:
        histogram[b.committed - 1] += 1
    max_drafted = max([b.drafted for b in blocks] + [0])
    conditional, marginal = [], []
    for j in range(1, max_drafted + 1):
        drafted = [b for b in blocks if b.drafted >= j]
        reached = [b for b in drafted if b.accepted >= j - 1]  # every earlier position accepted
        hits = sum(b.accepted >= j for b in drafted)
        conditional.append(hits / len(reached) if reached else 0.0)
        marginal.append(hits / len(drafted) if drafted else 0.0)
    committed = sum(b.committed for b in blocks)
    tokens = sum(len(r.tokens) for r in results)
    wall = sum(r.wall_time_s for r in results)
    return AcceptanceStats(
        requests=len(results),
        blocks=len(blocks),
        tokens=tokens,
        tau=committed / len(blocks) if blocks else 0.0,
        tau_per_request=[
            sum(b.committed for b in r.blocks) / len(r.blocks) if r.blocks else 0.0 for r in results
        ],
        conditional_acceptance=conditional,
        marginal_acceptance=marginal,
        committed_histogram=histogram,
        wall_time_s=wall,
        tokens_per_second=tokens / wall if wall > 0 else 0.0,
    )
