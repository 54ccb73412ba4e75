"""The torch-free half of `smoke`: the SmokeReport assembled from decoded runs, and the head arm's agreement
with the control's.

smoke/run.py decodes (torch, the runtime) and hands its runs here; this module imports neither, so the
arithmetic is tested and reused without them (the results are duck-typed GenerationResults: `.tokens`,
`.blocks` with `.drafted`, `.accepted`, `.committed`, `.wall_time_s`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from lilicorr_ckpt.smoke.gates import (
    ArmAgreement,
    Divergence,
    ParityCheck,
    PromptBlocks,
    baseline_gate,
    compare_baseline,
    head_gate,
    lossless_gate,
    measured_gate,
    parity_gate,
    position_gate,
    tau_floor_gate,
)
from lilicorr_ckpt.smoke.options import SmokeOptions
from lilicorr_ckpt.smoke.probes import Probe
from lilicorr_ckpt.smoke.profile import (
    Arm,
    ArmStats,
    CategoryProfile,
    ChatTemplate,
    DraftCheckpoint,
    HeadGain,
    MeasurementConditions,
    RequestRecord,
    SmokeReport,
    SweepPoint,
    TargetRecord,
    dense_histogram,
    dense_rates,
    per_request_mean,
    position_counts,
    relative_gain,
    validation_of,
)


def assemble(
    *,
    opts: SmokeOptions,
    runs: Sequence[tuple[Probe, int, list[int], dict[str, Any]]],
    arms: Sequence[str],
    has_head: bool,
    n: int,
    block_size: int,
    draft_info: DraftCheckpoint,
    near_ties: dict[tuple[str, int], int | None] | None = None,
    target_info: TargetRecord,
    chat: ChatTemplate,
    conditions: MeasurementConditions,
    divergences: Sequence[Divergence],
    parity: Sequence[ParityCheck] | None,
    parity_reason: str,
    baseline: Any,
    acceptance_stats: Callable[[Sequence[Any]], Any],
    elapsed: dict[str, float] | None = None,
    sweep: Sequence[SweepPoint] = (),
) -> SmokeReport:
    """The report of a smoke run from its decoded runs (probe, seed, prompt ids, arm -> GenerationResult).
    `acceptance_stats` is the runtime's (lilicorr_runtime.acceptance_stats): the caller that decoded passes it.
    `elapsed` (batched arms): each arm's wall time over all its probes, which the overall tok/s divide by; per
    category, and per request, tok/s divide by the requests' own (overlapping) wall times."""
    primary: Arm = "head" if has_head else "control"

    def arm_stats(
        results: Sequence[Any], arm: str, ar_tps: float | None, wall: float | None = None
    ) -> ArmStats:
        s = acceptance_stats(results)
        if wall is not None:
            s = msgspec.structs.replace(
                s, wall_time_s=wall, tokens_per_second=s.tokens / wall if wall > 0 else 0.0
            )
        width = 0 if arm == "ar" else n
        return ArmStats(
            requests=s.requests,
            blocks=s.blocks,
            tokens=s.tokens,
            mean_accept_length=round(s.tau, 6),
            mean_accept_length_per_request=round(
                per_request_mean(s.tau_per_request, [len(r.blocks) for r in results]), 6
            ),
            conditional_accept_rates=[round(x, 6) for x in dense_rates(s.conditional_acceptance, width)],
            marginal_accept_rates=[round(x, 6) for x in dense_rates(s.marginal_acceptance, width)],
            acceptance_length_histogram=dense_histogram(
                s.committed_histogram, 1 if arm == "ar" else block_size
            ),
            wall_time_s=round(s.wall_time_s, 6),
            tokens_per_second=round(s.tokens_per_second, 3),
            speedup_vs_ar=None if not ar_tps else round(s.tokens_per_second / ar_tps, 4),
            position_counts=position_counts(
                [(b.drafted, b.accepted) for r in results for b in r.blocks], width
            ),
        )

    def arms_for(selected: Sequence[Any], walls: dict[str, float] | None = None) -> dict[str, ArmStats]:
        ar = arm_stats([r[3]["ar"] for r in selected], "ar", None, walls["ar"] if walls else None)
        out = {
            arm: arm_stats(
                [r[3][arm] for r in selected], arm, ar.tokens_per_second, walls[arm] if walls else None
            )
            for arm in arms
            if arm != "ar"
        }
        return {**out, "ar": ar}

    overall = arms_for(runs, elapsed)
    categories = list(dict.fromkeys(r[0].category for r in runs))
    per_category = {}
    for c in categories:
        c_arms = arms_for([r for r in runs if r[0].category == c])
        p = c_arms[primary]
        per_category[c] = CategoryProfile(
            requests=p.requests,
            mean_accept_length=p.mean_accept_length,
            mean_accept_length_per_request=p.mean_accept_length_per_request,
            conditional_accept_rates=p.conditional_accept_rates,
            marginal_accept_rates=p.marginal_accept_rates,
            acceptance_length_histogram=p.acceptance_length_histogram,
            arms=c_arms,
        )
    main = overall[primary]

    def tau(arms_: dict[str, ArmStats], arm: str) -> float:
        return arms_[arm].mean_accept_length

    gains = {
        c: relative_gain(tau(p.arms, "head"), tau(p.arms, "control")) if has_head else None
        for c, p in per_category.items()
    }
    head_gain = HeadGain(
        overall=relative_gain(tau(overall, "head"), tau(overall, "control")) if has_head else None,
        per_category=gains,
    )

    diverged = {
        (d.request, d.seed, d.arm) for d in divergences if not d.tie
    }  # a tie is re-anchored, not a loss
    requests = []
    for probe, seed, ids, by_arm in runs:
        lossless = None if opts.temperature > 0 else not any((probe.id, seed, a) in diverged for a in by_arm)
        requests.append(
            RequestRecord(
                id=probe.id,
                category=probe.category,
                seed=seed,
                prompt_tokens=len(ids),
                new_tokens={a: len(r.tokens) for a, r in by_arm.items()},
                tau={
                    a: round(sum(b.committed for b in r.blocks) / len(r.blocks), 6) if r.blocks else 0.0
                    for a, r in by_arm.items()
                },
                tokens_per_second={
                    a: round(len(r.tokens) / r.wall_time_s, 3) if r.wall_time_s > 0 else 0.0
                    for a, r in by_arm.items()
                },
                lossless=lossless,
                blocks={a: len(r.blocks) for a, r in by_arm.items()},
                reference_tokens=list(by_arm["ar"].tokens) if opts.temperature == 0 else [],
                first_near_tie=(near_ties or {}).get((probe.id, seed)),
            )
        )

    spec_runs = len(runs) * (len(arms) - 1)
    gates = [
        measured_gate(main.blocks, main.requests, primary),
        lossless_gate(spec_runs, divergences, opts.temperature, conditions.dtype),
        head_gate(
            has_head,
            tau(overall, "head") if has_head else None,
            tau(overall, "control"),
            opts.min_head_gain,
            gains,
            agreement(runs, opts.temperature) if has_head else None,
        ),
    ]
    if opts.min_tau is not None:
        gates.append(tau_floor_gate(opts.min_tau, main.mean_accept_length, primary))
    if opts.min_accept_rates:
        gates.append(position_gate(opts.min_accept_rates, main.marginal_accept_rates, primary))
    comparison = None
    if baseline is not None:
        assert opts.baseline is not None
        comparison = compare_baseline(
            opts.baseline,
            baseline,
            taus={a: s.mean_accept_length for a, s in overall.items()},
            category_taus={
                c: {a: s.mean_accept_length for a, s in p.arms.items()} for c, p in per_category.items()
            },
            conditions=conditions,
            num_speculative_tokens=n,
            target=target_info,
            tolerance=opts.tolerance,
        )
        gates.append(baseline_gate(comparison))
    gates.append(parity_gate(opts.gpu, parity, parity_reason))

    return SmokeReport(
        measured=main.blocks > 0,
        method="lilicorr" if has_head else "dflash",
        draft_checkpoint=draft_info,
        target_model=target_info,
        num_speculative_tokens=n,
        block_size=block_size,
        max_supported_k=block_size - 1,
        conditional_accept_rates=main.conditional_accept_rates,
        marginal_accept_rates=main.marginal_accept_rates,
        mean_accept_length=main.mean_accept_length,
        mean_accept_length_per_request=main.mean_accept_length_per_request,
        accept_length_by_k={str(n): main.mean_accept_length},
        acceptance_length_histogram=main.acceptance_length_histogram,
        per_category=per_category,
        measurement_conditions=conditions,
        validation=validation_of(main),
        primary_arm=primary,
        arms=overall,
        head_gain=head_gain,
        chat_template=chat,
        requests=requests,
        gates=gates,
        baseline=comparison,
        sweep=list(sweep),
        passed=all(gate.status != "fail" for gate in gates),
    )


def agreement(
    runs: Sequence[tuple[Probe, int, list[int], dict[str, Any]]], temperature: float
) -> ArmAgreement:
    """The head arm's blocks against the control's. Under greedy decoding both arms emit the target's tokens, so
    equal accepted counts in every block of every request is what a head that takes the control's top-1 candidate
    (a zero or missing head) produces; sampled arms draw differently, and only the accepted totals are compared."""

    def accepted(result: Any) -> list[int]:
        return [b.accepted for b in result.blocks]

    identical = None
    if temperature == 0:
        identical = sum(accepted(r[3]["head"]) == accepted(r[3]["control"]) for r in runs)
    pooled: dict[
        str, list[int]
    ] = {}  # probe id -> head committed, head blocks, control committed, control blocks
    for probe, _, _, by_arm in runs:
        sums = pooled.setdefault(probe.id, [0, 0, 0, 0])
        for i, arm in ((0, "head"), (2, "control")):
            sums[i] += sum(b.committed for b in by_arm[arm].blocks)
            sums[i + 1] += len(by_arm[arm].blocks)
    return ArmAgreement(
        requests=len(runs),
        identical=identical,
        head_accepted=sum(sum(accepted(r[3]["head"])) for r in runs),
        control_accepted=sum(sum(accepted(r[3]["control"])) for r in runs),
        prompts=[
            PromptBlocks(
                id=k, head_committed=v[0], head_blocks=v[1], control_committed=v[2], control_blocks=v[3]
            )
            for k, v in pooled.items()
        ],
    )
