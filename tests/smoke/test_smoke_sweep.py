"""`smoke --sweep`: every arm timed again per batch size (CPU, the tiny random pair of conftest.py)."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest

from lilicorr_ckpt.report.modelcard import _sweep_table
from lilicorr_ckpt.report.smoke import render_text
from lilicorr_ckpt.smoke.profile import SmokeReport

from helpers import REPO

SCHEMA = json.loads((REPO / "schemas" / "smoke-profile.schema.json").read_text())
# two prompts per category (6), a few tokens each
SMALL = ("--limit", "2", "--max-new-tokens", "12", "--no-warmup", "--quiet", "--min-head-gain", "-1")


def test_each_size_is_timed_for_every_arm_and_decodes_the_measured_tokens(smoke, drafter, target):
    ran = smoke(drafter, "-t", target, *SMALL, "--sweep", "1,3,6", "--format", "json")
    assert ran.code == 0, ran.stderr
    report = ran.report
    jsonschema.validate(report, SCHEMA)
    points = report["sweep"]
    assert [p["batch"] for p in points] == [1, 3, 6]  # in the order given
    for point in points:
        assert point["requests"] == 6
        assert set(point["tokens_per_second"]) == set(point["wall_time_s"]) == {"head", "control", "ar"}
        assert all(v > 0 for v in point["tokens_per_second"].values())
        assert point["speedup_vs_ar"]["ar"] == 1.0
        for arm in ("head", "control"):  # the ratio of the two rates it is printed beside
            ratio = point["tokens_per_second"][arm] / point["tokens_per_second"]["ar"]
            assert point["speedup_vs_ar"][arm] == pytest.approx(ratio, rel=1e-3)
        # greedy and lossless: every arm decodes, at every batch size, the tokens of the measured run
        assert point["same_tokens"] == 6
    # the measured run itself is untouched by the sweep: batch 1 on the CPU
    assert report["measurement_conditions"]["concurrency"] == 1
    # the sweep's time is a phase of its own, after the measured run's (no warm-up asked: none timed)
    phases = report["measurement_conditions"]["phase_seconds"]
    assert list(phases) == [
        "start",
        "drafter",
        "target",
        "first_forward",
        "decoders",
        "decode",
        "lossless",
        "sweep",
    ]
    sweep_wall = sum(sum(p["wall_time_s"].values()) for p in points)
    assert sweep_wall <= phases["sweep"] + 0.01  # the timed arms are inside it
    text = render_text(SmokeReport(**_struct(report)))
    table = text.split("speed by batch size")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in table[2:5]] == ["1", "3", "6"] and table[2].endswith("6/6")


def _struct(report: dict) -> dict:
    return msgspec.structs.asdict(msgspec.json.decode(json.dumps(report).encode(), type=SmokeReport))


def test_without_a_sweep_the_profile_has_none_and_the_card_the_measured_runs_speed(smoke, drafter, target):
    ran = smoke(drafter, "-t", target, *SMALL, "--limit", "1", "--batch", "2", "--format", "json")
    assert ran.code == 0, ran.stderr
    assert ran.report["sweep"] == []
    # batched: each arm decodes whole, one after another, and its phase holds its measured wall time
    phases = ran.report["measurement_conditions"]["phase_seconds"]
    assert list(phases)[-4:] == ["decode_head", "decode_control", "decode_ar", "lossless"]
    for arm in ("head", "control", "ar"):
        wall = ran.report["arms"][arm]["wall_time_s"]
        assert wall <= phases[f"decode_{arm}"] + 0.01 and phases[f"decode_{arm}"] < wall + 1.0
    report = SmokeReport(**_struct(ran.report))
    assert "speed by batch size" not in render_text(report)
    table = _sweep_table(report)
    assert table[1].startswith(
        f"Speed in the measured run ({report.arms['ar'].requests} requests, `batch` of them"
    )
    (row,) = [line for line in table if line.startswith("| 2 ")]  # the run's own batch, its only row
    arms = report.arms
    assert row.split(" | ")[1] == f"{arms['ar'].tokens_per_second:,.0f}"
    assert f"{arms['head'].speedup_vs_ar:.2f}×" in row and f"{arms['control'].speedup_vs_ar:.2f}×" in row
    # a run without its target-only arm timed nothing to compare with: no table
    no_ar = msgspec.structs.replace(report, arms={a: s for a, s in arms.items() if a != "ar"})
    assert _sweep_table(no_ar) == []


def test_sampling_times_the_sizes_without_comparing_tokens(smoke, drafter, target):
    ran = smoke(drafter, "-t", target, *SMALL, "--temperature", "0.7", "--sweep", "2", "--format", "json")
    assert ran.code == 0, ran.stderr
    (point,) = ran.report["sweep"]
    # a batch draws its random numbers in another order than one request at a time: not comparable
    assert point["batch"] == 2 and point["same_tokens"] is None


def test_the_card_shows_the_speed_up_per_batch_size(smoke, drafter, target):
    ran = smoke(drafter, "-t", target, *SMALL, "--sweep", "1,2", "--format", "json")
    report = SmokeReport(**_struct(ran.report))
    table = _sweep_table(report)
    rows = [line for line in table if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2 and "LiLiCorr head tok/s" in "\n".join(table)
    head = report.sweep[1]
    assert f"{head.speedup_vs_ar['head']:.2f}×" in rows[1]
    assert "on a CPU these measure Python" in "\n".join(table)  # a CPU figure says what it is


@pytest.mark.parametrize(
    ("sweep", "extra", "message"),
    [
        ("0", (), "--sweep takes batch sizes in [1, 4096], got 0"),
        ("1,1", (), "--sweep names a batch size twice"),
        ("1,x", (), "expected comma-separated integers"),
        (",".join(str(i) for i in range(1, 18)), (), "--sweep takes at most 16 batch sizes"),
        ("7", (), "--sweep 7: only 6 prompts run"),  # checked once the prompts are read, before any arm runs
        ("2", ("--engine", "vllm=http://127.0.0.1:9"), "--sweep times the reference runtime"),
    ],
)
def test_a_bad_sweep_is_a_usage_error(smoke, drafter, target, sweep, extra, message):
    ran = smoke(drafter, "-t", target, *SMALL, "--sweep", sweep, *extra)
    assert ran.code == 4 and message in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_sweep_counts_its_own_generations(smoke, drafter, target):
    """Each size's arms are counted against their own total (the lossless check's count ran on to 2520/252)."""
    import re

    quiet_free = tuple(a for a in SMALL if a != "--quiet")
    ran = smoke(drafter, "-t", target, *quiet_free, "--sweep", "1,3", "--format", "json")
    assert ran.code == 0, ran.stderr
    counts = [
        (int(a), int(b), unit) for a, b, unit in re.findall(r"(\d+)/(\d+) ([a-z ]+?\d*) \(", ran.stderr)
    ]
    assert counts, ran.stderr
    assert all(done <= total for done, total, _ in counts), ran.stderr
    assert {unit for _, _, unit in counts} >= {"generations at batch 1", "generations at batch 3"}, ran.stderr
