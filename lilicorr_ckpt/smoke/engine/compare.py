"""The engine against the reference runtime: same conditions, τ within a tolerance, greedy tokens equal.

The tolerance is derived from the prompts unless --tolerance sets it: a paired bootstrap over the requests both
measured (each resample draws requests with replacement and takes the ratio of the engine's block-weighted τ to
the reference's on them), whose 95% interval half-width says how far apart two measurements of the same drafter
on these prompts may land by prompt sampling alone, and never less than ENGINE_TOLERANCE_FLOOR. Few prompts give
a wide tolerance: the gate then says so, and --limit 0 (every bundled prompt) narrows it.

Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import numpy as np

from lilicorr_ckpt.checkpoint.source import read_small
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.smoke.engine.profile import (
    EngineAcceptance,
    EngineRequest,
    PositionItem,
    ReferenceComparison,
    TauItem,
    TokenDivergence,
)
from lilicorr_ckpt.smoke.profile import (
    ChatTemplate,
    DraftCheckpoint,
    Gate,
    MeasurementConditions,
    RequestRecord,
    SmokeReport,
    TargetRecord,
)

ENGINE_TOLERANCE_FLOOR = 0.02  # two measurements of one drafter within 2% of each other reproduce it
LEGACY_TOLERANCE = 0.05  # for a profile without per-request blocks, which no interval can be computed from
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the same prompts and counts always give the same tolerance
PROFILE_LIMIT = 64 << 20
ENGINE_TOOL = "lilicorr-ckpt smoke --engine"


def read_reference(path: str) -> SmokeReport:
    """A reference profile written by `smoke --output` (the embedded runtime's measurement)."""
    what = f"--baseline {printable(path)}"
    file = Path(path).expanduser()
    if not file.exists() and not file.is_symlink():
        raise InputError(f"{what} does not exist")
    data = read_small(file, what, PROFILE_LIMIT)
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        raise InputError(f"{what} is not JSON") from None
    tool = doc.get("tool") if isinstance(doc, dict) else None
    if tool == ENGINE_TOOL:
        raise InputError(
            f"{what} is an engine report (smoke --engine); --baseline takes the reference runtime's "
            "profile: `lilicorr-ckpt smoke PATH --target T --gpu --output profile.json`"
        )
    if tool != "lilicorr-ckpt smoke":
        raise InputError(
            f"{what} is not a smoke profile (write one with `lilicorr-ckpt smoke PATH --target T --gpu "
            "--output profile.json`)"
        )
    try:
        report = msgspec.json.decode(data, type=SmokeReport)
    except (msgspec.ValidationError, RecursionError) as exc:
        raise InputError(f"{what} is not a smoke profile of this version: {printable(str(exc))}") from None
    primary = report.arms.get(report.primary_arm)
    if primary is None:
        raise InputError(f"{what} has no {report.primary_arm!r} arm, its primary arm")
    rates = primary.conditional_accept_rates + primary.marginal_accept_rates
    if not (
        math.isfinite(primary.mean_accept_length) and 0 <= primary.mean_accept_length <= report.block_size
    ) or any(not 0 <= r <= 1 for r in rates):
        raise InputError(
            f"{what} holds numbers no smoke run writes (tau {primary.mean_accept_length}, rates outside "
            "[0, 1])"
        )
    return report


class RunFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine run was, for the comparison of conditions."""

    conditions: MeasurementConditions
    num_speculative_tokens: int
    block_size: int
    target: TargetRecord
    drafter: DraftCheckpoint
    chat: ChatTemplate
    prompt_tokens: dict[tuple[str, int], int]  # (probe id, seed) -> prompt length


def _target_key(t: TargetRecord) -> str:
    return f"hidden {t.hidden_size}, {t.num_layers} layers, vocabulary {t.vocab_size}"


def condition_differences(ref: SmokeReport, run: RunFacts) -> list[str]:
    """Why the reference's numbers are not comparable with this run's (empty when they are)."""
    b, c = ref.measurement_conditions, run.conditions
    d = ref.draft_checkpoint
    pairs = [
        ("probes", b.probe_digest[:12], c.probe_digest[:12]),
        ("max_new_tokens", b.max_new_tokens, c.max_new_tokens),
        ("temperature", b.temperature, c.temperature),
        ("seeds", b.seeds, c.seeds),
        ("num_speculative_tokens", ref.num_speculative_tokens, run.num_speculative_tokens),
        ("block_size", ref.block_size, run.block_size),
        ("drafter head", d.head, run.drafter.head),
        ("drafter candidates K", d.candidate_topk, run.drafter.candidate_topk),
        ("target", _target_key(ref.target_model), _target_key(run.target)),
        (
            "chat template sha256",
            (ref.chat_template.template_sha256 or "none")[:12],
            (run.chat.template_sha256 or "none")[:12],
        ),
        ("eos token ids", ref.chat_template.eos_token_ids, run.chat.eos_token_ids),
    ]
    out = [
        f"{name}: reference {printable(str(old))}, this run {printable(str(new))}"
        for name, old, new in pairs
        if old != new
    ]
    lengths = [(r.id, r.seed, r.prompt_tokens, run.prompt_tokens.get((r.id, r.seed))) for r in ref.requests]
    differ = [x for x in lengths if x[3] is not None and x[2] != x[3]]
    if differ:
        shown = "; ".join(f"{printable(i)}: {a} vs {b_}" for i, _, a, b_ in differ[:3])
        out.append(
            f"prompt tokens differ for {len(differ)} request(s) ({shown}): another tokenizer or template"
        )
    return out


def _committed(record: RequestRecord, arm: str) -> tuple[float, int] | None:
    blocks = record.blocks.get(arm)
    tau = record.tau.get(arm)
    if blocks is None or tau is None:
        return None
    return round(tau * blocks), blocks


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def paired_interval(
    ref: Sequence[tuple[float, int]], eng: Sequence[tuple[float, int]]
) -> tuple[float, float, float]:
    """(delta, low, high): engine tau / reference tau - 1 over the paired requests, and its 95% bootstrap interval
    (requests resampled with replacement; a resample without any block is left out)."""
    rc = np.array([c for c, _ in ref], dtype=float)
    rb = np.array([b for _, b in ref], dtype=float)
    ec = np.array([c for c, _ in eng], dtype=float)
    eb = np.array([b for _, b in eng], dtype=float)
    delta = float(_ratio(np.array(ec.sum() / eb.sum()), np.array(rc.sum() / rb.sum())) - 1.0)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.integers(0, len(rc), size=(BOOTSTRAP_RESAMPLES, len(rc)))
    ratios = _ratio(_ratio(ec[idx].sum(1), eb[idx].sum(1)), _ratio(rc[idx].sum(1), rb[idx].sum(1))) - 1.0
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return delta, delta, delta
    low, high = np.percentile(ratios, [2.5, 97.5])
    return delta, float(low), float(high)


def reference_interval(ref: Sequence[tuple[float, int]]) -> float:
    """The 95% bootstrap half-width of the reference's own tau (relative), for an engine measured in aggregate."""
    rc = np.array([c for c, _ in ref], dtype=float)
    rb = np.array([b for _, b in ref], dtype=float)
    tau = rc.sum() / rb.sum()
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    idx = rng.integers(0, len(rc), size=(BOOTSTRAP_RESAMPLES, len(rc)))
    taus = _ratio(rc[idx].sum(1), rb[idx].sum(1))
    taus = taus[np.isfinite(taus)] / tau - 1.0
    if not len(taus):
        return 0.0
    low, high = np.percentile(taus, [2.5, 97.5])
    return float(max(-low, high))


def tokens_against(
    reference: Sequence[int], near_tie: int | None, engine: Sequence[int], stop_token: int | None
) -> tuple[int, int | None]:
    """(tokens compared, index of the first difference or None) of a greedy engine output against the reference's
    tokens, up to the reference's first near-tie. A stop the engine names but left out of its ids counts as
    emitted."""
    got = list(engine)
    if stop_token is not None and (not got or got[-1] != stop_token):
        got.append(stop_token)
    limit = len(reference) if near_tie is None else min(near_tie, len(reference))
    span = min(limit, len(got))
    for i in range(span):
        if got[i] != reference[i]:
            return i + 1, i
    if span < limit:  # the engine ended before the reference did
        return span, span
    if near_tie is None and len(got) > len(reference):  # the reference ended, the engine went on
        return span, span
    return span, None


class Compared(msgspec.Struct, frozen=True):
    comparison: ReferenceComparison
    request_flags: dict[tuple[str, int], tuple[bool, int]]  # (id, seed) -> (tokens equal, compared)


def compare(
    ref: SmokeReport,
    source: str,
    run: RunFacts,
    requests: Sequence[EngineRequest],
    outputs: dict[tuple[str, int], tuple[list[int], int | None]],
    overall: EngineAcceptance,
    per_category: dict[str, EngineAcceptance],
    per_request: bool,
    tolerance: float | None,
    decode: Callable[[int], str],
) -> Compared:
    """The engine's figures beside the reference's primary arm, and the token comparison."""
    arm = ref.primary_arm
    ref_arm = ref.arms[arm]
    differences = condition_differences(ref, run)
    notes: list[str] = []
    by_key = {(r.id, r.seed): r for r in ref.requests}
    pairs_ref, pairs_eng = [], []
    if per_request:
        for r in requests:
            rec = by_key.get((r.id, r.seed))
            counted = _committed(rec, arm) if rec is not None else None
            if counted is None or r.blocks is None or r.accepted is None:
                continue
            pairs_ref.append(counted)
            pairs_eng.append((r.blocks + r.accepted, r.blocks))
    legacy = any(not r.blocks for r in ref.requests)
    ci: list[float] | None = None
    delta = (
        overall.mean_accept_length / ref_arm.mean_accept_length - 1.0
        if ref_arm.mean_accept_length > 0
        else 0.0
    )
    if legacy:
        notes.append(
            "the reference profile predates per-request block counts (re-record it with this version): no "
            "interval over the prompts can be computed"
        )
        derived = LEGACY_TOLERANCE
        how = f"default {LEGACY_TOLERANCE:.0%} (the profile has no per-request counts)"
    elif per_request and pairs_ref and sum(b for _, b in pairs_ref) and sum(b for _, b in pairs_eng):
        point, low, high = paired_interval(pairs_ref, pairs_eng)
        ci = [round(low, 6), round(high, 6)]
        derived = max(ENGINE_TOLERANCE_FLOOR, point - low, high - point)
        how = f"95% paired bootstrap over {len(pairs_ref)} prompt(s), at least {ENGINE_TOLERANCE_FLOOR:.0%}"
    else:
        counted_ref = [c for rec in ref.requests if (c := _committed(rec, arm)) is not None and c[1]]
        half = reference_interval(counted_ref) if counted_ref else 0.0
        derived = max(ENGINE_TOLERANCE_FLOOR, math.sqrt(2.0) * half)
        how = (
            f"sqrt(2) x the reference's own 95% bootstrap half-width over {len(counted_ref)} prompt(s) (the engine "
            f"gave only the run's aggregate), at least {ENGINE_TOLERANCE_FLOOR:.0%}"
        )
    tol = derived if tolerance is None else tolerance
    if tolerance is not None:
        how = "--tolerance"

    overall_item = TauItem(
        scope="all",
        requests=overall.requests,
        reference=ref_arm.mean_accept_length,
        engine=overall.mean_accept_length,
        relative_delta=round(delta, 6),
    )
    items = []
    for category, acc in per_category.items():
        entry = ref.per_category.get(category)
        ref_cat = entry.arms.get(arm) if entry is not None else None
        if ref_cat is None or ref_cat.mean_accept_length <= 0:
            continue
        items.append(
            TauItem(
                scope=category,
                requests=acc.requests,
                reference=ref_cat.mean_accept_length,
                engine=acc.mean_accept_length,
                relative_delta=round(acc.mean_accept_length / ref_cat.mean_accept_length - 1.0, 6),
            )
        )
    positions = []
    for i in range(min(len(ref_arm.conditional_accept_rates), run.num_speculative_tokens)):
        positions.append(
            PositionItem(
                position=i + 1,
                reference_conditional=ref_arm.conditional_accept_rates[i],
                engine_conditional=overall.conditional_accept_rates[i]
                if overall.conditional_accept_rates
                else None,
                reference_marginal=ref_arm.marginal_accept_rates[i],
                engine_marginal=overall.marginal_accept_rates[i] if overall.marginal_accept_rates else None,
            )
        )

    compared = equal = to_tie = 0
    divergences = []
    flags: dict[tuple[str, int], tuple[bool, int]] = {}
    if run.conditions.temperature == 0:
        for r in requests:
            rec = by_key.get((r.id, r.seed))
            if rec is None or not rec.reference_tokens or (r.id, r.seed) not in outputs:
                continue
            engine_tokens, stop = outputs[(r.id, r.seed)]
            count, first = tokens_against(rec.reference_tokens, rec.first_near_tie, engine_tokens, stop)
            compared += 1
            to_tie += rec.first_near_tie is not None
            flags[(r.id, r.seed)] = (first is None, count)
            if first is None:
                equal += 1
                continue
            got = [
                *engine_tokens,
                *([stop] if stop is not None and (not engine_tokens or engine_tokens[-1] != stop) else []),
            ]
            want = rec.reference_tokens[first] if first < len(rec.reference_tokens) else -1
            emitted = got[first] if first < len(got) else -1
            divergences.append(
                TokenDivergence(
                    request=r.id,
                    seed=r.seed,
                    position=first,
                    expected=want,
                    emitted=emitted,
                    expected_text=decode(want) if want >= 0 else "<end>",
                    emitted_text=decode(emitted) if emitted >= 0 else "<end>",
                    near_tie_at=rec.first_near_tie,
                )
            )
        if not compared and any(not rec.reference_tokens for rec in ref.requests):
            notes.append(
                "the reference profile carries no token ids (recorded before this version, or sampled): "
                "re-record it to compare greedy outputs"
            )
    comparison = ReferenceComparison(
        source=source,
        arm=arm,
        device=ref.measurement_conditions.device,
        dtype=ref.measurement_conditions.dtype,
        conditions_match=not differences,
        condition_differences=differences,
        paired_requests=len(pairs_ref),
        tolerance=round(tol, 6),
        tolerance_source=how,
        ci95=ci,
        overall=overall_item,
        per_category=items,
        positions=positions,
        greedy_requests_compared=compared,
        greedy_requests_equal=equal,
        compared_to_near_tie=to_tie,
        divergences=divergences,
        notes=notes,
    )
    return Compared(comparison, flags)


def tau_gate(cmp: ReferenceComparison | None) -> Gate:
    if cmp is None:
        return Gate(
            name="engine-tau",
            status="skip",
            summary="no reference: give --baseline PROFILE (from `smoke --gpu --output`) or --reference to "
            "compare the engine's acceptance with the reference runtime's",
        )
    if not cmp.conditions_match:
        return Gate(
            name="engine-tau",
            status="fail",
            summary=f"the reference {printable(cmp.source)} was measured under other conditions; rerun with "
            "its settings or re-record it",
            details=cmp.condition_differences,
        )
    o = cmp.overall
    line = (
        f"tau(engine) {o.engine:.3f} vs tau(reference {cmp.arm}) {o.reference:.3f} ({o.relative_delta:+.1%}), "
        f"allowed +-{cmp.tolerance:.1%} ({cmp.tolerance_source})"
    )
    details = [
        f"{i.scope}: {i.engine:.3f} vs {i.reference:.3f} ({i.relative_delta:+.1%}, {i.requests} request(s))"
        for i in cmp.per_category
    ] + list(cmp.notes)
    if abs(o.relative_delta) <= cmp.tolerance + 1e-12:
        return Gate(name="engine-tau", status="pass", summary=line, details=details)
    if o.relative_delta < 0:
        why = (
            "the deployment accepts fewer drafted tokens than the reference: check the drafter's quantization, "
            "the engine's draft kernels and that the server runs this target"
        )
    else:
        why = "the engine accepts more than the reference: the reference may be stale, or measured another drafter"
    return Gate(name="engine-tau", status="fail", summary=f"{line}: {why}", details=details)


def tokens_gate(cmp: ReferenceComparison | None, temperature: float) -> Gate:
    if temperature > 0:
        return Gate(
            name="engine-tokens",
            status="skip",
            summary=f"sampled decoding (T={temperature:g}) matches in distribution, not token for token",
        )
    if cmp is None:
        return Gate(
            name="engine-tokens", status="skip", summary="no reference to compare greedy outputs with"
        )
    if not cmp.greedy_requests_compared:
        return Gate(
            name="engine-tokens",
            status="skip",
            summary="the reference carries no token ids to compare with",
            details=list(cmp.notes),
        )
    tie = (
        (
            f"; {cmp.compared_to_near_tie} compared up to the reference's first near-tie (bfloat16 round-off), where "
            "another stack may pick either token"
        )
        if cmp.compared_to_near_tie
        else ""
    )
    details = [
        f"{printable(d.request)} seed {d.seed}: token {d.position} is {d.emitted} ({printable(repr(d.emitted_text))}), "
        f"the reference's is {d.expected} ({printable(repr(d.expected_text))})"
        for d in cmp.divergences
    ]
    if cmp.divergences:
        return Gate(
            name="engine-tokens",
            status="fail",
            summary=f"{len(cmp.divergences)} of {cmp.greedy_requests_compared} greedy outputs differ from the "
            "reference's tokens before any near-tie: the server runs another target (or one "
            f"quantized differently) or decodes differently{tie}",
            details=details,
        )
    return Gate(
        name="engine-tokens",
        status="pass",
        summary=f"{cmp.greedy_requests_equal} greedy outputs equal the reference's token ids{tie}",
    )
