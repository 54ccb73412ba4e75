"""Progress when stderr is not a terminal (a log file, a CI job): whole lines every few seconds, never silence;
and the text report's definitions of its columns."""

from __future__ import annotations

import io

import msgspec
import torch
from conftest import QUICK

from lilicorr_ckpt import console
from lilicorr_ckpt.console import Progress, duration
from lilicorr_ckpt.report.smoke import CPU_SPEEDUP_LINE, GPU_SPEEDUP_LINE, TAU_LINE, TAU_REQ_LINE, render_text
from lilicorr_ckpt.smoke import cli as smoke_cli
from lilicorr_ckpt.smoke.profile import Gate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_batched_arm_counts_all_its_generations_at_once_and_estimates_from_them(monkeypatch):
    # a batched arm finishes its probes together: one line for the arm, and the estimate reads the whole count
    clock = Clock()
    monkeypatch.setattr(console.time, "monotonic", clock)
    log = io.StringIO()
    monkeypatch.setattr(console.sys, "stderr", log)
    progress = Progress.for_terminal(False, name="smoke", log_interval=10, unit="generations")
    progress.start(72)
    for arm in ("head", "control", "ar"):
        progress.note(f"decoding the {arm} arm: 24 probes, 24 at a time")
        clock.now += 60.0
        progress.step(f"{arm} arm, 24 probes", count=24)
    assert log.getvalue().splitlines() == [
        "smoke: decoding the head arm: 24 probes, 24 at a time...",
        "smoke: 24/72 generations (last: head arm, 24 probes), 1m00s, about 2m00s left",
        "smoke: decoding the control arm: 24 probes, 24 at a time...",
        "smoke: 48/72 generations (last: control arm, 24 probes), 2m00s, about 1m00s left",
        "smoke: decoding the ar arm: 24 probes, 24 at a time...",
        "smoke: 72/72 generations (last: ar arm, 24 probes), 3m00s, done",
    ]


def test_a_batch_that_has_finished_nothing_yet_still_gets_its_line_every_interval(monkeypatch):
    # a batched arm reports every block, most of which end no request: count 0 redraws, with no estimate yet
    clock = Clock()
    monkeypatch.setattr(console.time, "monotonic", clock)
    log = io.StringIO()
    monkeypatch.setattr(console.sys, "stderr", log)
    progress = Progress.for_terminal(False, name="smoke", log_interval=10, unit="generations")
    progress.start(6)
    for block in range(1, 32):
        clock.now += 1.0  # a block a second; the first request ends in block 25
        progress.step(f"head arm, block {block}", count=1 if block in (25, 31) else 0)
    assert log.getvalue().splitlines() == [
        "smoke: 0/6 generations (last: head arm, block 1), 1s",
        "smoke: 0/6 generations (last: head arm, block 11), 11s",
        "smoke: 0/6 generations (last: head arm, block 21), 21s",
        "smoke: 2/6 generations (last: head arm, block 31), 31s, about 1m02s left",
    ]
    progress.start(4, unit="requests checked")  # the next stage counts something else
    clock.now += 2.0
    progress.step("p0")
    assert log.getvalue().splitlines()[-1] == "smoke: 1/4 requests checked (last: p0), 2s, about 6s left"


def test_a_log_gets_a_line_every_interval_with_the_count_and_the_time_left(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(console.time, "monotonic", clock)
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(console.sys, "stderr", log)
    progress = Progress.for_terminal(False, name="smoke", log_interval=10, unit="generations")
    assert progress.enabled and progress.lines
    progress.note("loading the target")
    progress.start(30)
    for i in range(30):
        clock.now += 4.0  # a generation every 4 s
        progress.step(f"head p{i}")
    progress.finish()
    lines = log.getvalue().splitlines()
    assert lines[0] == "smoke: loading the target..."
    assert lines[1] == "smoke: 1/30 generations (last: head p0), 4s, about 1m56s left"
    assert (
        lines[2] == "smoke: 4/30 generations (last: head p3), 16s, about 1m44s left"
    )  # 12 s after the first
    assert lines[-1] == "smoke: 30/30 generations (last: head p29), 2m00s, done"
    assert len(lines) == 1 + 11 and "\r" not in log.getvalue() and "\033" not in log.getvalue()


def test_quiet_and_plain_callers_stay_silent_off_a_terminal(monkeypatch):
    monkeypatch.setattr(console.sys, "stderr", io.StringIO())
    assert not Progress.for_terminal(True, name="smoke", log_interval=10).enabled
    assert not Progress.for_terminal(
        False, name="convert"
    ).enabled  # no log_interval: convert's bar, as before


def test_durations_read_as_a_log_line_does():
    assert [duration(s) for s in (0, 44.6, 80, 3599, 3720)] == ["0s", "45s", "1m20s", "59m59s", "1h02m"]


def test_smoke_with_stderr_redirected_prints_periodic_progress(smoke, drafter, target):
    # capsys's stderr is not a terminal, as when a CI job or `2> log` captures it
    quick = [a for a in QUICK if a != "--quiet"]
    result = smoke(drafter, "-t", target, *quick, "--min-head-gain", "-1")
    assert result.code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "smoke: loading the drafter..." in lines and "smoke: loading the target..." in lines
    counts = [line for line in lines if " generations (last: " in line]
    assert counts and counts[0].startswith("smoke: 1/9 generations (last: head ")
    assert counts[-1].startswith("smoke: 9/9 generations (last: ar ") and counts[-1].endswith(", done")
    assert smoke(drafter, "-t", target, *QUICK, "--min-head-gain", "-1").stderr == ""


def test_batched_smoke_in_a_log_reports_while_each_arm_decodes(smoke, drafter, target, monkeypatch):
    # --batch: each arm decodes its probes side by side; its progress comes per block, not once at its end
    monkeypatch.setattr(smoke_cli, "LOG_INTERVAL", 0.0)  # a line for every block
    quick = [a for a in QUICK if a != "--quiet"]
    threads = torch.get_num_threads()
    result = smoke(drafter, "-t", target, *quick, "--batch", "3", "--min-head-gain", "-1")
    assert result.code == 0, result.stderr
    assert torch.get_num_threads() == threads  # whatever the arms chose, the process gets its count back
    lines = result.stderr.splitlines()
    for arm in ("head", "control", "ar"):
        assert f"smoke: decoding the {arm} arm: 3 probes, 3 at a time..." in lines
        blocks = [line for line in lines if f" generations (last: {arm} arm, block " in line]
        assert len(blocks) > 2, lines  # 24 new tokens: several blocks, each one reported
    counts = [int(line.split()[1].split("/")[0]) for line in lines if " generations (last: " in line]
    assert counts == sorted(counts) and counts[0] < 3 and counts[-1] == 9  # 3 arms x 3 probes
    assert lines[lines.index("smoke: checking losslessness...") + 1].startswith("smoke: 1/3 requests checked")


def test_the_text_report_defines_tau_and_says_cpu_speedups_mean_nothing(zero_head_report):
    text = render_text(zero_head_report)
    assert zero_head_report.measurement_conditions.device.startswith("cpu")
    for line in (TAU_LINE, TAU_REQ_LINE, CPU_SPEEDUP_LINE):
        assert f"\n  {line}\n" in text
    assert "on the CPU it means nothing" in CPU_SPEEDUP_LINE and GPU_SPEEDUP_LINE not in text
    gpu = msgspec.structs.replace(
        zero_head_report,
        measurement_conditions=msgspec.structs.replace(
            zero_head_report.measurement_conditions, device="NVIDIA H200"
        ),
    )
    assert GPU_SPEEDUP_LINE in render_text(gpu) and CPU_SPEEDUP_LINE not in render_text(gpu)


def test_the_verdict_counts_inconclusive_gates(zero_head_report):
    gates = [
        Gate(name="measured", status="pass", summary="ok"),
        Gate(
            name="head-loaded",
            status="fail",
            inconclusive=True,
            summary="inconclusive: 6 prompts are too few",
        ),
        Gate(name="kernel-parity", status="skip", summary="needs --gpu"),
    ]
    text = render_text(msgspec.structs.replace(zero_head_report, gates=gates, passed=False))
    assert text.rstrip().endswith("FAIL 1 of 2 gates failed (1 inconclusive; 1 skipped)")
