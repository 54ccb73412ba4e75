"""The pieces of smoke --engine on their own: the Prometheus reader, the counts-to-rates arithmetic, the tolerance,
the token comparison, the names a drafter goes by, the --engine value, and the reference profile's new fields."""

from __future__ import annotations

import pytest
import torch

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.smoke.engine import prometheus
from lilicorr_ckpt.smoke.engine.compare import ENGINE_TOLERANCE_FLOOR, paired_interval, tokens_against
from lilicorr_ckpt.smoke.engine.profile import Counted, acceptance
from lilicorr_ckpt.smoke.engine.servers import checkpoint_names
from lilicorr_ckpt.smoke.engine.transport import parse_engine
from lilicorr_ckpt.smoke.ties import first_near_tie


def test_prometheus_reads_labels_escapes_and_skips_what_is_not_asked():
    text = "\n".join(
        [
            "# HELP x_total a counter",
            "# TYPE x_total counter",
            'x_total{engine="0",model_name="a \\"quoted\\" \\\\ name"} 12.0',
            'x_total{engine="1",model_name="b",} 3',
            "x_created 1.7e9",
            "y_total not-a-number",  # not asked for: never parsed
            "x_total 7 1712345678",
        ]
    )
    samples = prometheus.parse(text, {"x_total"})
    assert [(s.labels, s.value) for s in samples] == [
        ({"engine": "0", "model_name": 'a "quoted" \\ name'}, 12.0),
        ({"engine": "1", "model_name": "b"}, 3.0),
        ({}, 7.0),
    ]
    with pytest.raises(prometheus.ExpositionError):
        prometheus.parse("y_total not-a-number", {"y_total"})
    with pytest.raises(prometheus.ExpositionError):
        prometheus.parse("x_total{engine=0} 1", {"x_total"})
    with pytest.raises(prometheus.ExpositionError):
        prometheus.count(1.5, "x")
    assert prometheus.count(4.0, "x") == 4


def test_acceptance_turns_per_position_counts_into_the_profiles_rates():
    # steps accepting 0, 1, 3 and 3 of 3 drafts: positions reached by 4, 3, 2 steps and accepted by 3, 2, 2
    counted = [Counted(2, 1, [1, 0, 0]), Counted(2, 6, [2, 2, 2])]
    a = acceptance(counted, 3, requests=2, tokens=11, wall_time_s=2.0, per_request=True)
    assert (a.blocks, a.accepted, a.mean_accept_length) == (4, 7, 2.75)
    assert a.marginal_accept_rates == [0.75, 0.5, 0.5]
    assert a.conditional_accept_rates == [0.75, pytest.approx(0.666667), 1.0]
    assert a.acceptance_length_histogram == {1: 1, 2: 1, 3: 0, 4: 2}
    assert 1 + sum(a.marginal_accept_rates) == a.mean_accept_length  # longest-prefix: tau = 1 + sum(marginal)
    assert a.mean_accept_length_per_request == pytest.approx((1.5 + 4.0) / 2)
    assert a.tokens_per_second == 5.5
    unknown = acceptance([Counted(2, 1, None)], 3, requests=1, tokens=3, wall_time_s=1.0, per_request=False)
    assert unknown.marginal_accept_rates is None and unknown.mean_accept_length_per_request is None


def test_the_paired_interval_is_zero_for_identical_runs_and_widens_with_spread():
    same = [(30.0, 10), (12.0, 10), (50.0, 20)]
    assert paired_interval(same, same) == (0.0, 0.0, 0.0)
    noisy_engine = [(33.0, 10), (10.0, 10), (52.0, 20), (20.0, 10), (15.0, 10), (28.0, 10)]
    reference = [(30.0, 10), (12.0, 10), (50.0, 20), (22.0, 10), (13.0, 10), (30.0, 10)]
    delta, low, high = paired_interval(reference, noisy_engine)
    assert low < delta < high and high - low > 2 * ENGINE_TOLERANCE_FLOOR
    assert paired_interval(reference, noisy_engine) == (delta, low, high)  # seeded: the same every run


def test_tokens_are_compared_up_to_the_near_tie_and_a_named_stop_counts_as_emitted():
    ref = [5, 6, 7, 2]
    assert tokens_against(ref, None, [5, 6, 7, 2], None) == (4, None)
    assert tokens_against(ref, None, [5, 6, 7], 2) == (4, None)  # the stop left out of the ids
    assert tokens_against(ref, None, [5, 9, 7, 2], None) == (2, 1)
    assert tokens_against(ref, 2, [5, 6, 9, 9], None) == (2, None)  # past the near-tie the engine may differ
    assert tokens_against(ref, None, [5, 6], None) == (2, 2)  # ended early
    assert tokens_against(ref, None, [5, 6, 7, 2, 4], None) == (4, 4)  # went on


def test_the_names_a_drafter_goes_by():
    assert {"org/drafter", "drafter"} <= checkpoint_names("/hub/models--org--drafter/snapshots/abc123")
    assert "abc123" not in checkpoint_names("/hub/models--org--drafter/snapshots/abc123")
    assert checkpoint_names("/models/My-Drafter/") >= {"my-drafter", "models/my-drafter"}


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("sglang=http://gpu-box:30000", "http://gpu-box:30000"),
        ("vllm=localhost", "http://localhost:8000"),
        ("SGLang=https://serve.example/sglang/", "https://serve.example:443/sglang"),
        ("vllm=http://[::1]:9000", "http://[::1]:9000"),
    ],
)
def test_engine_values(value, url):
    assert parse_engine(value).url == url


@pytest.mark.parametrize(
    "value",
    [
        "sglang=",
        "vllm:http://x",
        "sglang=http://h:notaport",
        "vllm=http://h/?a=1",
        "sglang=http://user:secret1234@h",
    ],
)
def test_bad_engine_values_are_usage_errors(value):
    with pytest.raises(UsageError) as info:
        parse_engine(value)
    assert "secret1234" not in str(info.value)


def test_first_near_tie():
    clear = [5.0, 1.0, 0.0]
    tied = [3.0, 3.0 - 2**-7, 0.0]
    assert first_near_tie(torch.tensor([clear, clear]), [0, 0]) is None
    assert first_near_tie(torch.tensor([clear, tied, tied]), [0, 0, 1]) == 1
    big = [100.0, 100.0 - 2.0, 0.0]  # 2.0 is within 2^-5 of a logit of 100
    assert first_near_tie(torch.tensor([big]), [0]) == 0


def test_a_greedy_profile_carries_the_reference_tokens_and_blocks(
    zero_head_report, smoke, drafter, constant_target
):
    for r in zero_head_report.requests:
        assert len(r.reference_tokens) == r.new_tokens["ar"] and set(r.blocks) == {"head", "control", "ar"}
        assert r.first_near_tie is None or 0 <= r.first_near_tie < len(r.reference_tokens)
    # a constant target's logits are all equal: every greedy token is a tie, the first at position 0
    result = smoke(
        drafter,
        "-t",
        constant_target,
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
        "--no-warmup",
        "-q",
        "--format",
        "json",
        "--min-head-gain",
        "-1",
    )
    assert [r["first_near_tie"] for r in result.report["requests"]] == [0, 0, 0]
    sampled = smoke(
        drafter,
        "-t",
        constant_target,
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
        "--no-warmup",
        "-q",
        "--format",
        "json",
        "--min-head-gain",
        "-1",
        "--temperature",
        "1",
    )
    assert all(
        r["reference_tokens"] == [] and r["first_near_tie"] is None for r in sampled.report["requests"]
    )
