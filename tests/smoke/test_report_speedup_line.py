"""The speed-up legend of the text report names the conditions the speed-up column was measured under."""

from __future__ import annotations

import msgspec

from lilicorr_ckpt.report.smoke import (
    CPU_SPEEDUP_LINE,
    GPU_BATCH_SPEEDUP_LINE,
    GPU_SPEEDUP_LINE,
    render_text,
)


def _on(report, device: str, concurrency: int):
    conditions = msgspec.structs.replace(
        report.measurement_conditions, device=device, concurrency=concurrency
    )
    return msgspec.structs.replace(report, measurement_conditions=conditions)


def test_a_batched_gpu_run_does_not_claim_one_request_at_a_time(zero_head_report):
    text = render_text(_on(zero_head_report, "NVIDIA H200", 252))
    assert GPU_BATCH_SPEEDUP_LINE in text and GPU_SPEEDUP_LINE not in text
    assert "one request at a time" not in text
    assert "at batch 252" in text


def test_a_batch_one_gpu_run_says_one_request_at_a_time(zero_head_report):
    text = render_text(_on(zero_head_report, "NVIDIA H200", 1))
    assert GPU_SPEEDUP_LINE in text and GPU_BATCH_SPEEDUP_LINE not in text


def test_the_cpu_legend_wins_whatever_the_batch(zero_head_report):
    for batch in (1, 24):
        text = render_text(_on(zero_head_report, "cpu (x86_64)", batch))
        assert CPU_SPEEDUP_LINE in text and GPU_BATCH_SPEEDUP_LINE not in text
