"""bench/decode.py's accounting of the device loop's wall time (steps, prefills, the rest) and its speed-up model,
on the CPU: a loop whose admissions queue work on a simulated asynchronous device, and the tiny example target."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from lilicorr_runtime.decode.device_loop import DecodeLoop

from helpers import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("decode_bench", REPO / "bench" / "decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Device:
    """A stream on the host clock: work is queued without waiting, sync() sleeps until it has all run."""

    def __init__(self):
        self.free_at = time.perf_counter()

    def enqueue(self, seconds: float) -> None:
        self.free_at = max(self.free_at, time.perf_counter()) + seconds

    def sync(self) -> None:
        time.sleep(max(0.0, self.free_at - time.perf_counter()))


PREFILL, BLOCK = 0.02, 0.005


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
    assert accounting.step_s == pytest.approx(6 * BLOCK, abs=0.015)
    assert loop.step_seconds - accounting.step_s < 0.01  # the loop's own count no longer holds them either
    assert wall - accounting.step_s - accounting.prefill_s < 0.01
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
        assert accounted == pytest.approx(wall_ms, rel=0.05), (arm, accounted, wall_ms)
        assert row[f"{arm}other_ms"] * steps < 0.05 * wall_ms


def test_the_model_with_its_prefill_terms_reproduces_the_measured_speedup(rows):
    """The model's formula over the run's own per-block costs (each arm's step and prefill per block, as the
    printed model takes them but with the block and host of the run itself: on a shared 2-core CPU the pieces,
    timed apart from the run, drift by up to 20 %, where CUDA events over graph replays do not)."""
    bench = _bench()
    (row,) = rows
    args = (row["tau"], row["tau"], row["block_ms"] + row["host_ms"])
    ar = row["ar_ms_per_step"]
    model = bench.speedup_model(*args, row["prefill_ms_per_step"], ar, row["ar_prefill_ms_per_step"])
    assert model == pytest.approx(row["speedup_measured"], rel=0.05)
    # the prefills weigh here: the model without them (the bench's before 2026-12-07) misses by far more
    without = bench.speedup_model(*args, 0.0, ar, 0.0)
    assert abs(without / row["speedup_measured"] - 1) > 0.10
