"""The head-loaded gate judges by a confidence interval over prompts: pass, fail, or too few prompts to tell."""

from __future__ import annotations

import math
import random

import pytest

from lilicorr_ckpt.smoke.gates import (
    ArmAgreement,
    PromptBlocks,
    gain_interval,
    head_gate,
    needed_prompts,
    t975,
)


def prompts(gains: list[float], *, blocks: int = 80, control_tau: float = 1.5) -> list[PromptBlocks]:
    """One prompt per gain: the control commits control_tau tokens per block, the head (1 + gain) times as many."""
    out = []
    for i, gain in enumerate(gains):
        out.append(
            PromptBlocks(
                id=f"p{i}",
                head_committed=round(blocks * control_tau * (1 + gain)),
                head_blocks=blocks,
                control_committed=round(blocks * control_tau),
                control_blocks=blocks,
            )
        )
    return out


def noisy(n: int, mean: float, sd: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean + rng.gauss(0.0, sd) for _ in range(n)]


def judge(per_prompt: list[PromptBlocks], min_gain: float = 0.05):
    a = sum(p.head_committed for p in per_prompt) / sum(p.head_blocks for p in per_prompt)
    c = sum(p.control_committed for p in per_prompt) / sum(p.control_blocks for p in per_prompt)
    evidence = ArmAgreement(
        requests=len(per_prompt), identical=0, head_accepted=1000, control_accepted=900, prompts=per_prompt
    )
    return head_gate(True, a, c, min_gain, {"code": 0.08}, evidence)


def test_a_gain_conclusively_above_the_threshold_passes():
    gate = judge(prompts(noisy(30, 0.10, 0.04)))
    assert gate.status == "pass" and not gate.inconclusive
    iv = gate.interval
    assert iv is not None and iv.conclusive and iv.prompts == 30 and 0.05 <= iv.low < iv.gain < iv.high
    assert "95% CI" in gate.summary and "over 30 prompts" in gate.summary


def test_a_gain_conclusively_below_the_threshold_fails_and_blames_the_weights():
    gate = judge(prompts(noisy(30, 0.00, 0.04)))
    assert gate.status == "fail" and not gate.inconclusive
    assert gate.interval.conclusive and gate.interval.high < 0.05 and gate.interval.needed_prompts is None
    assert "check that the lilicorr.* weights are the trained ones" in " ".join(gate.details)


def test_too_few_prompts_is_inconclusive_and_says_how_many_would_decide():
    # the case: six prompts, a gain of a few percent, prompts that differ a lot from each other
    gate = judge(prompts([0.12, -0.06, 0.05, 0.09, -0.03, 0.01]))
    assert gate.status == "fail" and gate.inconclusive  # still a failure: exit 1
    iv = gate.interval
    assert not iv.conclusive and iv.low < 0.05 <= iv.high and iv.needed_prompts > 6
    assert gate.summary.startswith(
        f"inconclusive: 6 prompts are too few to judge a 5% gain: about {iv.needed_prompts} are needed"
    )
    text = " ".join(gate.details)
    assert "lilicorr.* weights" not in text and "--limit" in text  # the advice is to run more prompts


def test_the_estimate_of_prompts_needed_is_what_decides_at_that_spread():
    # repeating the same prompts keeps the per-prompt spread the estimate assumes: at the estimated count the
    # interval decides, well below it it does not
    base = [0.10, -0.02, 0.13, 0.01, 0.12, 0.04]
    needed = judge(prompts(base)).interval.needed_prompts
    assert needed is not None and needed > len(base)
    enough = math.ceil(needed / len(base)) * len(base)
    assert judge(prompts(base * (enough // len(base)))).status == "pass"
    fewer = (needed // 2) // len(base) * len(base)
    assert fewer > len(base) and judge(prompts(base * (fewer // len(base)))).inconclusive


def test_seeds_of_a_prompt_are_one_draw_and_one_prompt_gives_no_interval():
    one = gain_interval(prompts([0.2]), 0.05)
    assert one.low is None and not one.conclusive
    gate = judge(prompts([0.2]))
    assert (
        gate.inconclusive and "1 prompt is too few to judge a 5% gain: at least 2 are needed" in gate.summary
    )
    assert (
        gain_interval(
            [PromptBlocks(id="p", head_committed=0, head_blocks=0, control_committed=0, control_blocks=0)],
            0.05,
        )
        is None
    )


def test_a_waived_gate_passes_whatever_the_spread():
    assert judge(prompts([0.3, -0.3]), min_gain=-1.0).status == "pass"


def test_a_gain_on_the_threshold_gives_no_count():
    assert needed_prompts(0.1, math.log1p(0.05), 0.05) is None
    assert needed_prompts(0.1, math.log1p(0.05) + 0.01, 0.05) > 100


def test_student_quantiles():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 10, 29, 30, 31, 45, 100, 1000):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)
