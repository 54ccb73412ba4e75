"""bench/decode.py's accounting of the device loop's wall time (steps, prefills, the rest) and its speed-up model,
on the CPU: a loop whose admissions queue work on a simulated asynchronous device, and the tiny example target."""

from __future__ import annotations

import time

import pytest
import torch

from lilicorr_runtime.decode.device_loop import DecodeLoop

from helpers import REPO, load_script


def _bench():
    return load_script("bench/decode.py", "decode_bench")


class _Device:
    """A stream on the host clock: work is queued without waiting, sync() sleeps until it has all run."""

    def __init__(self):
        self.free_at = time.perf_counter()

    def enqueue(self, seconds: float) -> None:
        self.free_at = max(self.free_at, time.perf_counter()) + seconds

    def sync(self) -> None:
        time.sleep(max(0.0, self.free_at - time.perf_counter()))


PREFILL, BLOCK = 0.04, 0.02


class _Loop:
    """DecodeLoop.run's contract over a simulated device: an admission queues a prefill and returns at once (as
    the AR arm's does on CUDA), a step queues a block and waits for it (so for a prefill queued before it), a
    copy-out syncs. Each request takes `blocks` steps."""

    def __init__(self, device: _Device, batch: int, blocks: int):
        self.device, self.batch, self.blocks = device, batch, blocks
        self.left: dict[int, int] = {}
        self.steps, self.step_seconds, self.host_seconds = 0, 0.0, 0.0

    def admit(self, slot, prompt, max_new_tokens):
        self.device.enqueue(PREFILL)
        self.left[slot] = self.blocks
        return True

    def step(self):
        begin = time.perf_counter()
        self.device.enqueue(BLOCK)
        self.device.sync()
        self.steps += 1
        self.step_seconds += time.perf_counter() - begin
        for slot in self.left:
            self.left[slot] -= 1
        ended = [s for s, n in self.left.items() if n == 0]
        for s in ended:
            del self.left[s]
        return ended

    def take(self, slot):
        self.device.sync()
        return slot


def test_queued_prefills_are_timed_as_prefill_not_as_the_next_step(monkeypatch):
    bench = _bench()
    device = _Device()
    monkeypatch.setattr(bench, "sync", device.sync)
    loop = _Loop(device, batch=4, blocks=3)
    begin = time.perf_counter()
    with bench._Accounting(loop) as accounting:
        DecodeLoop.run(loop, [torch.tensor([1])] * 8, 4)  # type: ignore[arg-type]
    wall = time.perf_counter() - begin
    assert accounting.admitted == 8 and loop.steps == 6
    # unaccounted, the first step after each group of 4 admissions would wait for their 80 ms of prefill
    assert accounting.prefill_s == pytest.approx(8 * PREFILL, rel=0.25)
    assert accounting.step_s == pytest.approx(6 * BLOCK, abs=0.03)
    assert (
        loop.step_seconds < 6 * BLOCK + 0.03
    )  # the loop's own count of its steps no longer holds them either
    assert wall - accounting.step_s - accounting.prefill_s < 0.02
    assert "admit" not in vars(loop)  # the loop's methods are its own again


@pytest.fixture(scope="module")
def rows():
    """bench/decode.py on the tiny example target and its drafter at batch 4, 8 new tokens a request (answers
    short enough that the prefills are a large part of either arm's time)."""
    from lilicorr_ckpt import load_drafter
    from lilicorr_runtime import load_target

    bench = _bench()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = load_target(str(REPO / "examples" / "tiny-target"), dtype=torch.float32, device="cpu")
        drafter = load_drafter(str(REPO / "examples" / "tiny-lilicorr"), dtype=torch.float32, device="cpu")
        out: list[dict] = []
        bench.run_real(target, drafter, "tiny", [4], 8, 8, out)
    finally:
        torch.set_num_threads(threads)
    return out


def test_steps_and_prefills_add_up_to_the_wall_time(rows):
    (row,) = rows
    assert row["requests"] == 8 and row["prefill_ms"] > 0 and row["ar_prefill_ms"] > 0
    for arm, step_ms in (("", row["block_ms"] + row["host_ms"]), ("ar_", row["ar_ms_per_step"])):
        wall_ms, steps = row[f"{arm}wall_s"] * 1e3, row[f"{arm}steps"]
        accounted = steps * step_ms + row["requests"] * row[f"{arm}prefill_ms"]
        # what is left (copy-outs, Python around the loop) is small; a loaded 2-core box adds a few ms to it
        assert wall_ms - accounted == pytest.approx(row[f"{arm}other_ms"] * steps, abs=1e-6)
        assert row[f"{arm}other_ms"] * steps < 0.05 * wall_ms + 5.0, (arm, row[f"{arm}other_ms"], wall_ms)


def test_the_model_with_its_prefill_terms_is_the_measured_speedup_less_what_neither_counts(rows):
    """The model's formula over the run's own per-block costs (each arm's step and prefill per block; the printed
    model takes the block and host timed apart, which drift on a shared 2-core CPU) is the measured speed-up but
    for the wall time outside steps and prefills (`other`), exactly: the accounting adds up."""
    bench = _bench()
    (row,) = rows
    args = (row["tau"], row["tau"], row["block_ms"] + row["host_ms"])
    ar = row["ar_ms_per_step"]
    model = bench.speedup_model(*args, row["prefill_ms_per_step"], ar, row["ar_prefill_ms_per_step"])
    counted = {
        arm: 1 - row[f"{arm}other_ms"] * row[f"{arm}steps"] / (row[f"{arm}wall_s"] * 1e3)
        for arm in ("", "ar_")
    }
    assert model == pytest.approx(row["speedup_measured"] * counted["ar_"] / counted[""], rel=1e-6)
    # the prefills weigh here: the model without them (the bench's before 2026-12-07) misses by far more
    without = bench.speedup_model(*args, 0.0, ar, 0.0)
    assert abs(without / model - 1) > 0.10


def test_the_model_spreads_the_heads_prefills_over_the_blocks_it_would_run_at_another_tau():
    """At tau 2 a head arm measured at tau 1 runs half the blocks for the same prefills: each block carries twice
    the prefill it carried. AR: 5 ms a step and 1 ms of prefill a step; head: 10 ms a block, 4 ms of prefill a block
    at tau 1 -> 2 x (5 + 1) / (10 + 4 x 2) = 2/3."""
    model = _bench().speedup_model
    assert model(2.0, 1.0, 10.0, 4.0, 5.0, 1.0) == pytest.approx(2 / 3)
    assert model(1.0, 1.0, 10.0, 4.0, 5.0, 1.0) == pytest.approx(6 / 14)
    assert model(3.0, 3.0, 10.0, 0.0, 5.0, 0.0) == pytest.approx(1.5)  # no prefill: tau x c_ar / c_head
