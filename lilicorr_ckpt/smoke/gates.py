"""The `smoke` gates: each turns measurements into a pass / fail / skip verdict with a reason. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from lilicorr_ckpt.checkpoint.config import check_json_shape
from lilicorr_ckpt.checkpoint.source import read_small
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.smoke.profile import (
    BaselineComparison,
    BaselineItem,
    GainInterval,
    Gate,
    MeasurementConditions,
    TargetRecord,
)

DEFAULT_MIN_HEAD_GAIN = 0.05
DEFAULT_TOLERANCE = 0.05
# below this control tau (about one accepted draft per ten blocks) the drafter alone barely predicts the target,
# and the head gate's verdict is reported as inconclusive rather than blamed on the head
WEAK_DRAFTER_TAU = 1.1


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """The first token where an arm left target-only greedy decoding."""

    request: str
    seed: int
    arm: str
    position: int  # index into the emitted tokens
    expected: int  # the "ar" arm's token
    emitted: int
    logit_gap: float | None  # target logit(expected) - logit(emitted) at that position, recomputed
    tie: bool  # the gap is within the dtype's round-off: two kernels may pick either token
    expected_text: str = ""
    emitted_text: str = ""


class ParityCheck(msgspec.Struct, frozen=True, kw_only=True):
    block: int
    op: str  # topk_lse | greedy_walk | sample_walk
    passed: bool
    detail: str = ""


def measured_gate(blocks: int, requests: int, arm: str) -> Gate:
    if blocks > 0:
        return Gate(
            name="measured",
            status="pass",
            summary=f"{blocks} verification blocks over {requests} request(s) in the {arm} arm",
        )
    return Gate(
        name="measured",
        status="fail",
        summary=f"no verification block ran in the {arm} arm: every generation ended at its first token",
        details=["raise --max-new-tokens, or check that the target does not emit eos right away"],
    )


SHOWN_DIVERGENCES = 5  # the lossless gate lists at most this many ties (and as many bugs)


def lossless_gate(checked: int, divergences: Sequence[Divergence], temperature: float, dtype: str) -> Gate:
    """Every speculative generation equals target-only greedy decoding at every token: a numerical tie is
    re-anchored (smoke.run.greedy_checks) and only counted; any other divergence fails."""
    if temperature > 0:
        return Gate(
            name="lossless",
            status="skip",
            summary=f"sampled decoding (T={temperature:g}) is lossless in distribution, not token for "
            "token; run with --temperature 0 for this gate",
        )
    bugs = [d for d in divergences if not d.tie]
    ties = [d for d in divergences if d.tie]
    details = [_divergence_line(d, dtype) for d in bugs[:SHOWN_DIVERGENCES]]
    if len(bugs) > SHOWN_DIVERGENCES:
        details.append(f"... and {len(bugs) - SHOWN_DIVERGENCES} more divergences that are not ties")
    tie_line = ""
    if ties:
        largest = max(abs(d.logit_gap or 0.0) for d in ties)
        tie_line = (
            f"{len(ties)} numerical tie(s) in {dtype} (largest target logit gap {largest:.3g}), each "
            "re-anchored: every later token was checked against the target's greedy choice after the "
            "speculative tokens"
        )
        details += [_divergence_line(d, dtype) for d in ties[:SHOWN_DIVERGENCES]]
        if len(ties) > SHOWN_DIVERGENCES:
            details.append(f"... and {len(ties) - SHOWN_DIVERGENCES} more ties")
    if bugs:
        arms = sorted({d.arm for d in bugs})
        generations = len({(d.request, d.seed, d.arm) for d in bugs})
        return Gate(
            name="lossless",
            status="fail",
            summary=f"{generations} of {checked} speculative generations differ from target-only greedy "
            f"decoding ({', '.join(arms)}): a runtime bug, not a checkpoint defect; report it "
            "with this command line" + (f"; besides, {tie_line}" if tie_line else ""),
            details=details,
        )
    tail = f"; {tie_line}" if tie_line else ""
    return Gate(
        name="lossless",
        status="pass",
        summary=f"{checked} speculative generations equal target-only greedy decoding at every token{tail}",
        details=details,
    )


def _divergence_line(d: Divergence, dtype: str) -> str:
    gap = "" if d.logit_gap is None else f", target logit gap {d.logit_gap:.4g}"
    kind = f"numerical tie in {dtype}" if d.tie else "not a tie"
    texts = f" ({d.expected_text!r} vs {d.emitted_text!r})" if d.expected_text or d.emitted_text else ""
    return (
        f"{d.request} seed {d.seed} {d.arm}: token {d.position} is {d.emitted}, target-only gives "
        f"{d.expected}{texts}{gap} ({kind})"
    )


class PromptBlocks(msgspec.Struct, frozen=True, kw_only=True):
    """One prompt's verification blocks in the head and control arms (every seed pooled): the unit the head gate's
    confidence interval resamples, since the prompts, not the blocks, are the independent draws."""

    id: str
    head_committed: int  # tokens the head arm's blocks committed (the target's bonus token included)
    head_blocks: int
    control_committed: int
    control_blocks: int


class ArmAgreement(msgspec.Struct, frozen=True, kw_only=True):
    """How the head arm's verification blocks compare with the control's, request by request: the evidence the
    head gate's diagnosis rests on (not part of the profile)."""

    requests: int  # requests both arms decoded
    identical: (
        int | None
    )  # greedy only: requests whose blocks (accepted drafts per block) equal the control's
    head_accepted: int  # drafted tokens the target accepted, over every block of the arm
    control_accepted: int
    prompts: list[
        PromptBlocks
    ] = []  # per prompt, for the confidence interval; empty: the overall taus alone decide


CONFIDENCE = 0.95  # two-sided: the gate passes when the interval's lower end clears the threshold
# Student's t quantiles t(0.975, df) for df = 1..30 (beyond, a Cornish-Fisher expansion in the normal quantile is
# accurate to 1e-5): the interval is over prompts, and a smoke run has few of them
_T975 = (
    12.7062,
    4.3027,
    3.1824,
    2.7764,
    2.5706,
    2.4469,
    2.3646,
    2.3060,
    2.2622,
    2.2281,
    2.2010,
    2.1788,
    2.1604,
    2.1448,
    2.1314,
    2.1199,
    2.1098,
    2.1009,
    2.0930,
    2.0860,
    2.0796,
    2.0739,
    2.0687,
    2.0639,
    2.0595,
    2.0555,
    2.0518,
    2.0484,
    2.0452,
    2.0423,
)
_Z975 = 1.959963984540054
MAX_NEEDED = 10**6  # beyond this many prompts the measured gain sits on the threshold: no estimate is given


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def gain_interval(prompts: Sequence[PromptBlocks], min_gain: float) -> GainInterval | None:
    """A 95% confidence interval for tau(head) / tau(control) - 1 over prompts, paired.

    Both taus are block-weighted means (committed tokens over blocks, every prompt pooled), so the ratio is
    R = (sum a / sum b) / (sum c / sum d) over prompts i with a, b the head's committed tokens and blocks and c, d
    the control's. log R is linearised in the prompt sums (the delta method): prompt i contributes
    u_i = n (a_i / sum a - b_i / sum b - c_i / sum c + d_i / sum d), whose spread between prompts is the
    per-prompt variance, pairing included (a prompt easy for both arms moves both sums and cancels). The
    interval is log R +- t(0.975, n - 1) s_u / sqrt(n), mapped back to a gain. None when an arm ran no block."""
    used = [p for p in prompts if p.head_blocks or p.control_blocks]
    n = len(used)
    a, b = sum(p.head_committed for p in used), sum(p.head_blocks for p in used)
    c, d = sum(p.control_committed for p in used), sum(p.control_blocks for p in used)
    if not (a and b and c and d):
        return None
    log_ratio = math.log(a / b) - math.log(c / d)
    gain = math.exp(log_ratio) - 1.0
    if n < 2:  # one prompt shows no spread between prompts
        return GainInterval(
            prompts=n,
            confidence=CONFIDENCE,
            gain=round(gain, 6),
            low=None,
            high=None,
            required=min_gain,
            needed_prompts=None,
            conclusive=False,
        )
    u = [
        n * (p.head_committed / a - p.head_blocks / b - p.control_committed / c + p.control_blocks / d)
        for p in used
    ]
    spread = math.sqrt(sum(x * x for x in u) / (n - 1))  # s_u
    half = t975(n - 1) * spread / math.sqrt(n)
    low, high = math.exp(log_ratio - half) - 1.0, math.exp(log_ratio + half) - 1.0
    conclusive = low >= min_gain or high < min_gain
    return GainInterval(
        prompts=n,
        confidence=CONFIDENCE,
        gain=round(gain, 6),
        low=round(low, 6),
        high=round(high, 6),
        required=min_gain,
        conclusive=conclusive,
        needed_prompts=None if conclusive else needed_prompts(spread, log_ratio, min_gain),
    )


def needed_prompts(spread: float, log_ratio: float, min_gain: float) -> int | None:
    """About how many prompts make the interval's half-width reach the distance between the measured gain and the
    threshold, at this per-prompt spread (so that it would be decided if the gain stayed where it is). None when
    the gain sits on the threshold (beyond MAX_NEEDED prompts)."""
    if min_gain <= -1.0:
        return None
    distance = abs(log_ratio - math.log1p(min_gain))
    if distance == 0 or (_Z975 * spread / distance) ** 2 > MAX_NEEDED:
        return None
    m = max(2, math.ceil((_Z975 * spread / distance) ** 2))
    while t975(m - 1) * spread / math.sqrt(m) > distance:
        m += 1
    return m


def _pct(value: float) -> str:
    """A threshold as people write it: 0.05 -> 5%, 0.075 -> 7.5%."""
    return f"{value * 100:.4g}%"


def _ci(iv: GainInterval) -> str:
    if iv.low is None or iv.high is None:
        return f"over {iv.prompts} prompt(s), no interval"
    return f"{iv.confidence:.0%} CI {iv.low:+.1%} .. {iv.high:+.1%} over {iv.prompts} prompts"


def head_gate(
    has_head: bool,
    head_tau: float | None,
    control_tau: float,
    min_gain: float,
    per_category: dict[str, float | None],
    agreement: ArmAgreement | None = None,
) -> Gate:
    """PASS when the head's gain over the control is conclusively at least `min_gain` (the lower end of the 95%
    interval over prompts), FAIL when conclusively below (its upper end), and otherwise a failure marked
    inconclusive that says how many prompts would decide. Without per-prompt evidence the overall taus decide."""
    if not has_head or head_tau is None:
        return Gate(
            name="head-loaded",
            status="skip",
            summary="the checkpoint has no LiLiCorr head (a plain DFlash drafter): nothing to compare",
        )
    need = control_tau * (1.0 + min_gain)
    gain = head_tau / control_tau - 1.0 if control_tau > 0 else None
    gain_text = "n/a" if gain is None else f"{gain:+.1%}"
    threshold = f"tau(control) {control_tau:.3f} x {1.0 + min_gain:.3f} = {need:.3f}"
    iv = gain_interval(agreement.prompts, min_gain) if agreement is not None and agreement.prompts else None
    measured = gain_text if iv is None else f"{gain_text}, {_ci(iv)}"
    waived = min_gain <= -1.0  # tau(head) / tau(control) > 0 > 1 + min_gain: nothing can fail it
    if waived or (head_tau >= need if iv is None else iv.low is not None and iv.low >= min_gain):
        return Gate(
            name="head-loaded",
            status="pass",
            interval=iv,
            summary=f"tau(head) {head_tau:.3f} >= {threshold} (gain {measured})",
        )
    categories = ", ".join(f"{c} {'n/a' if g is None else f'{g:+.1%}'}" for c, g in per_category.items())
    details = [f"gain per category: {categories}"] if categories else []
    head = (
        f"tau(head) {head_tau:.3f} < {threshold}"
        if head_tau < need
        else f"tau(head) {head_tau:.3f} >= {threshold}, but not conclusively"
    )
    check = (
        "a trained head clears the head-free DFlash control; check that the lilicorr.* weights are the "
        "trained ones, then the target layer ids and mask token (`lilicorr-ckpt validate PATH --target T --deep`)"
    )
    weak_drafter = [
        "the head only reorders the drafter's top-K candidates, and they rarely hold the target's token: a random "
        "or untrained drafter, one trained for another target, or wrong target layer ids or mask token "
        "(`lilicorr-ckpt validate PATH --target T --deep`), so this run cannot tell whether the head works",
        "to check only the pipeline (losslessness, the profile), waive this gate with --min-head-gain -1",
    ]
    requests = agreement.requests if agreement is not None else 0
    identical = agreement.identical if agreement is not None else None  # None: sampled, or not compared
    if agreement is not None and requests and agreement.head_accepted == agreement.control_accepted == 0:
        return Gate(
            name="head-loaded",
            status="fail",
            interval=iv,
            inconclusive=True,
            summary=f"{head} (gain {gain_text}; inconclusive: no drafted token was accepted in either arm, "
            "every block committed only the target's own token)",
            details=details + weak_drafter,
        )
    if identical is not None and requests and identical == requests and head_tau == control_tau:
        return Gate(
            name="head-loaded",
            status="fail",
            interval=iv,
            summary=f"{head} (gain {gain_text}; equal: the head took the control's top-1 candidates, as a "
            "zero or missing head does)",
            details=details
            + [
                f"the head arm's blocks equal the control's block for block in all {requests} request(s)",
                check,
            ],
        )
    if identical is not None and identical < requests:
        details.append(
            f"the head arm's blocks differ from the control's in {requests - identical} of {requests} "
            "request(s): the head is loaded and reorders the candidates, but not into a clear gain"
        )
    if control_tau < WEAK_DRAFTER_TAU:
        return Gate(
            name="head-loaded",
            status="fail",
            interval=iv,
            inconclusive=True,
            summary=f"{head} (gain {gain_text}; inconclusive: tau(control) is barely above 1, the drafter "
            "alone rarely predicts this target)",
            details=details + weak_drafter,
        )
    if iv is not None and not iv.conclusive:
        return _too_few(iv, head_tau, control_tau, min_gain, details)
    verdict = (
        "no gain over the control" if gain is None or gain <= 0 else f"below the required {min_gain:+.1%}"
    )
    return Gate(
        name="head-loaded",
        status="fail",
        interval=iv,
        summary=f"{head} (gain {measured}: {verdict})",
        details=details + [check],
    )


def _too_few(
    iv: GainInterval, head_tau: float, control_tau: float, min_gain: float, details: list[str]
) -> Gate:
    """The interval straddles the threshold: the run is too small to judge the head, whatever its weights."""
    n, m = iv.prompts, iv.needed_prompts
    few = f"{n} prompt{'s are' if n != 1 else ' is'} too few to judge a {_pct(min_gain)} gain"
    if iv.low is None:
        need, why = f"{few}: at least 2 are needed", "one prompt shows no spread between prompts to judge by"
    elif m is None:
        need = f"{few}: the measured gain is too close to it for any number of prompts to settle"
        why = f"the gain measured, {iv.gain:+.1%}, sits on the required {min_gain:+.1%}"
    else:
        need = f"{few}: about {m} are needed"
        why = (
            f"about {m} prompts narrow the interval to a verdict if the gain stays near {iv.gain:+.1%} "
            f"(estimated from the spread between these {n} prompts)"
        )
    return Gate(
        name="head-loaded",
        status="fail",
        interval=iv,
        inconclusive=True,
        summary=f"inconclusive: {need} (tau(head) {head_tau:.3f} vs tau(control) {control_tau:.3f}: gain "
        f"{iv.gain:+.1%}, {_ci(iv)})",
        details=details
        + [
            f"the {iv.confidence:.0%} interval is over prompts, each prompt's head and control blocks paired: "
            f"its lower end must reach {min_gain:+.1%} to pass, its upper end fall below it to fail; this run "
            "says nothing for or against the head",
            why,
            "run more prompts: raise --limit (prompts per bundled category; math holds only 8) or give "
            "--probes a larger file",
        ],
    )


def tau_floor_gate(min_tau: float, tau: float, arm: str) -> Gate:
    ok = tau >= min_tau
    return Gate(
        name="min-tau",
        status="pass" if ok else "fail",
        summary=f"tau({arm}) {tau:.3f} {'>=' if ok else '<'} {min_tau:.3f}",
    )


def position_gate(floors: Sequence[float], marginal: Sequence[float], arm: str) -> Gate:
    low = [
        f"position {i + 1}: {marginal[i]:.3f} < {floor:.3f}"
        for i, floor in enumerate(floors)
        if i >= len(marginal) or marginal[i] < floor
    ]
    shown = ", ".join(f"{m:.3f}" for m in marginal[: len(floors)])
    if low:
        return Gate(
            name="min-accept-rates",
            status="fail",
            summary=f"{len(low)} of {len(floors)} positions below their floor ({arm}, marginal)",
            details=low,
        )
    return Gate(
        name="min-accept-rates",
        status="pass",
        summary=f"marginal acceptance ({arm}) [{shown}] >= [{', '.join(f'{f:.3f}' for f in floors)}]",
    )


def parity_gate(gpu: bool, checks: Sequence[ParityCheck] | None, reason: str = "") -> Gate:
    if not gpu:
        return Gate(
            name="kernel-parity",
            status="skip",
            summary="needs --gpu (on the CPU the draft step runs the torch references only)",
        )
    if checks is None:
        return Gate(name="kernel-parity", status="skip", summary=reason or "not checked")
    if not checks:
        return Gate(
            name="kernel-parity", status="skip", summary="the first prompt ended before its first block"
        )
    failed = [c for c in checks if not c.passed]
    blocks = len({c.block for c in checks})
    if failed:
        return Gate(
            name="kernel-parity",
            status="fail",
            summary=f"{len(failed)} of {len(checks)} kernel checks over {blocks} blocks differ from the torch "
            "reference (a runtime bug)",
            details=[f"block {c.block} {c.op}: {c.detail}" for c in failed],
        )
    ops = ", ".join(dict.fromkeys(c.op for c in checks))
    return Gate(
        name="kernel-parity",
        status="pass",
        summary=f"Triton and reference agree on {blocks} blocks of this run's logits ({ops})",
    )


# -- baseline ---------------------------------------------------------------------------------------------


class _ArmTau(msgspec.Struct):
    mean_accept_length: float


class _CategoryArms(msgspec.Struct):
    arms: dict[str, _ArmTau] = {}


class BaselineView(msgspec.Struct):
    """The part of a saved smoke profile a comparison reads (other fields are ignored)."""

    schema_version: str
    num_speculative_tokens: int
    arms: dict[str, _ArmTau]
    measurement_conditions: MeasurementConditions
    target_model: TargetRecord
    per_category: dict[str, _CategoryArms] = {}


def read_baseline(path: str) -> BaselineView:
    if not Path(path).exists() and not Path(path).is_symlink():
        raise InputError(f"baseline {path!r} does not exist")
    data = read_small(Path(path), f"baseline {path!r}", 16 << 20)
    check_json_shape(data, f"baseline {path!r}")
    try:
        return msgspec.json.decode(data, type=BaselineView)
    except msgspec.DecodeError as exc:
        raise InputError(
            f"baseline {path!r} is not a smoke profile (written by `smoke --out`): {exc}"
        ) from None


def compare_baseline(
    file: str,
    baseline: BaselineView,
    *,
    taus: dict[str, float],
    category_taus: dict[str, dict[str, float]],
    conditions: MeasurementConditions,
    num_speculative_tokens: int,
    target: TargetRecord,
    tolerance: float,
) -> BaselineComparison:
    """tau per arm and per category against the baseline; a drop by more than `tolerance` (relative) fails."""
    b = baseline.measurement_conditions
    differences = [
        f"{name}: baseline {old}, now {new}"
        for name, old, new in (
            ("probes", b.probe_digest[:12], conditions.probe_digest[:12]),
            ("max_new_tokens", b.max_new_tokens, conditions.max_new_tokens),
            ("temperature", b.temperature, conditions.temperature),
            ("seeds", b.seeds, conditions.seeds),
            ("num_speculative_tokens", baseline.num_speculative_tokens, num_speculative_tokens),
            ("target", _target_key(baseline.target_model), _target_key(target)),
        )
        if old != new
    ]
    items = []
    for arm, tau in taus.items():
        if arm != "ar" and arm in baseline.arms:
            items.append(_item(f"{arm} tau", baseline.arms[arm].mean_accept_length, tau, tolerance))
    for category, arms in category_taus.items():
        old_arms = baseline.per_category.get(category)
        for arm, tau in arms.items():
            if arm != "ar" and old_arms is not None and arm in old_arms.arms:
                items.append(
                    _item(f"{arm} tau [{category}]", old_arms.arms[arm].mean_accept_length, tau, tolerance)
                )
    return BaselineComparison(
        file=file,
        tolerance=tolerance,
        conditions_match=not differences,
        condition_differences=differences,
        items=items,
    )


def _target_key(t: TargetRecord) -> str:
    return f"{t.architecture} hidden {t.hidden_size} layers {t.num_layers} vocab {t.vocab_size}"


def _item(metric: str, old: float, new: float, tolerance: float) -> BaselineItem:
    delta = new / old - 1.0 if old > 0 else (0.0 if new == old else float("inf"))
    return BaselineItem(
        metric=metric,
        baseline=old,
        measured=new,
        relative_delta=round(delta, 6),
        passed=new >= old * (1.0 - tolerance),
    )


def baseline_gate(cmp: BaselineComparison) -> Gate:
    failed = [i for i in cmp.items if not i.passed]
    if not cmp.conditions_match:
        return Gate(
            name="baseline",
            status="fail",
            summary=f"{cmp.file} was measured under other conditions; re-record it (smoke --out) or rerun "
            "with its settings",
            details=cmp.condition_differences,
        )
    if not cmp.items:
        return Gate(name="baseline", status="fail", summary=f"{cmp.file} shares no arm with this run")
    lines = [f"{i.metric}: {i.measured:.3f} vs {i.baseline:.3f} ({i.relative_delta:+.1%})" for i in failed]
    if failed:
        return Gate(
            name="baseline",
            status="fail",
            summary=f"{len(failed)} of {len(cmp.items)} metrics dropped more than {cmp.tolerance:.1%} "
            f"below {cmp.file}",
            details=lines,
        )
    risen = [i for i in cmp.items if i.relative_delta > cmp.tolerance]
    note = [f"{i.metric} rose {i.relative_delta:+.1%}: the baseline may be stale" for i in risen]
    return Gate(
        name="baseline",
        status="pass",
        summary=f"{len(cmp.items)} metrics within -{cmp.tolerance:.1%} of {cmp.file}",
        details=note,
    )
