"""How a batched CPU run tunes itself. The intra-op thread count (smoke.threads.ThreadChooser), on a simulated
machine: two threads when they are faster (an idle machine), one when another process holds a core, and a switch
back within a block or two when that process starts mid-run. And glibc's thresholds (smoke.run.cpu_heap), which
keep a step's big temporaries on the heap."""

from __future__ import annotations

import pytest
import torch

from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.smoke import run as smoke_run
from lilicorr_ckpt.smoke.threads import MAX_PERIOD, ThreadChooser

# seconds a block takes at 1 and 2 threads, as measured on the 2-core box (docs/performance.md): idle, and with
# another process spinning on one core
IDLE = {1: 0.40, 2: 0.25}
BUSY = {1: 0.42, 2: 2.9}


class Machine:
    """The thread count the chooser sets; `run` does units of work at the count set when each starts, reporting each
    one's time to done() as smoke's block callback does."""

    def __init__(self) -> None:
        self.threads, self.ran = 0, []

    def set_threads(self, n: int) -> None:
        self.threads = n

    def run(self, chooser: ThreadChooser, costs: dict[int, float], units: int) -> None:
        for _ in range(units):
            self.ran.append(self.threads)
            chooser.done(costs[self.threads])


def _chooser(machine: Machine, switches: list | None = None) -> ThreadChooser:
    def note(threads: int, seconds: float, baseline: float) -> None:
        if switches is not None:
            switches.append((threads, round(baseline / seconds, 2)))

    return ThreadChooser([1, 2], machine.set_threads, on_switch=note)


def test_an_idle_machine_switches_to_two_threads_after_one_probe_and_rarely_looks_back():
    machine, notes = Machine(), []
    chooser = _chooser(machine, notes)
    assert machine.threads == 1  # the safe count first
    machine.run(chooser, IDLE, 150)
    # three blocks at 1, then the probe at 2 wins
    assert machine.ran[:4] == [1, 1, 1, 2] and notes == [(2, 1.6)]
    assert chooser.threads == 2 and chooser.switches == [2]
    # after the switch, a block at 1 thread after 16, 32 and 64 more: never switched back
    assert machine.ran[5:].count(1) == 3 and chooser.period == MAX_PERIOD


def test_a_busy_machine_keeps_one_thread_and_probes_two_seldom():
    machine = Machine()
    chooser = _chooser(machine)
    machine.run(chooser, BUSY, 150)
    assert chooser.threads == 1 and chooser.switches == []
    # one probe after three blocks, seven times slower: the next only MAX_PERIOD blocks later
    assert machine.ran.count(2) == 3 and machine.ran.index(2) == 3
    cost = sum(BUSY[t] for t in machine.ran)
    assert cost < 1.2 * 150 * BUSY[1]  # the probes cost under 20% (two threads throughout: 7x)


def test_a_process_that_takes_a_core_mid_run_sends_it_back_to_one_thread_at_once():
    machine = Machine()
    chooser = _chooser(machine)
    machine.run(chooser, IDLE, 40)
    assert chooser.threads == 2
    machine.run(chooser, BUSY, 60)
    # the first busy block at 2 threads is 10x the recent ones: the next block probes 1, which wins
    assert machine.ran[40:42] == [2, 1] and chooser.switches == [2, 1]
    assert machine.ran[42:].count(2) <= 1
    machine.run(chooser, IDLE, 100)  # the other process ended: two threads again at the next probe
    assert chooser.threads == 2 and chooser.switches == [2, 1, 2]


def test_work_of_other_sizes_is_compared_per_unit_and_restart_keeps_the_count():
    machine = Machine()
    chooser = _chooser(machine)
    machine.run(chooser, IDLE, 30)
    assert chooser.threads == 2
    chooser.restart()  # the check phase: seconds per row, on another scale than a block's
    probes = chooser.probes
    machine.run(chooser, {1: 0.0016, 2: 0.001}, 20)
    assert chooser.threads == 2 and chooser.switches == [2]
    assert chooser.probes - probes <= 1  # the new scale alone never looks like a speed-up or a slowdown
    # a restart during a probe puts the count in use back
    chooser.probing = 1
    machine.set_threads(1)
    chooser.restart()
    assert machine.threads == 2 and chooser.probing is None


def test_the_counts_must_differ():
    with pytest.raises(ValueError, match="at least two different counts"):
        ThreadChooser([2, 2], lambda n: None)


class _Libc:
    def __init__(self, accepts: bool) -> None:
        self.accepts, self.calls = accepts, []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return int(self.accepts)


def test_cpu_heap_raises_glibcs_mmap_and_trim_thresholds(monkeypatch):
    libc = _Libc(accepts=True)
    monkeypatch.setattr(smoke_run.platform, "system", lambda: "Linux")
    monkeypatch.setattr(smoke_run.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(smoke_run.ctypes, "CDLL", lambda name: libc)
    assert smoke_run.cpu_heap()
    # M_MMAP_THRESHOLD (-3) above a 32 x 8-row step's fp32 logits, M_TRIM_THRESHOLD (-1) above that
    assert libc.calls == [(-3, 256 << 20), (-1, 512 << 20)] and 32 * 8 * 49152 * 4 < 256 << 20
    refusing = _Libc(accepts=False)
    monkeypatch.setattr(smoke_run.ctypes, "CDLL", lambda name: refusing)
    assert not smoke_run.cpu_heap()


def test_cpu_heap_changes_nothing_off_glibc(monkeypatch):
    def no_libc(name: str):
        raise AssertionError("no C library is opened off glibc")

    monkeypatch.setattr(smoke_run.ctypes, "CDLL", no_libc)
    monkeypatch.setattr(smoke_run.platform, "system", lambda: "Linux")
    monkeypatch.setattr(smoke_run.platform, "libc_ver", lambda: ("", ""))  # musl
    assert not smoke_run.cpu_heap()
    monkeypatch.setattr(smoke_run.platform, "system", lambda: "Darwin")
    assert not smoke_run.cpu_heap()


def test_the_chooser_stays_out_when_omp_num_threads_is_set_or_one_core_is_all(monkeypatch):
    progress = Progress(enabled=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's count
    assert smoke_run.batch_thread_chooser(progress) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(smoke_run, "_cores", lambda: 1)
    assert smoke_run.batch_thread_chooser(progress) is None
    monkeypatch.setattr(smoke_run, "_cores", lambda: 2)
    calls: list[int] = []
    monkeypatch.setattr(smoke_run.torch, "set_num_threads", calls.append)
    chooser = smoke_run.batch_thread_chooser(progress)
    assert chooser is not None and chooser.counts == [1, 2] and calls == [1]


def test_a_batched_run_leaves_the_thread_count_as_it_found_it(monkeypatch):
    monkeypatch.setattr(smoke_run, "cpu_heap", lambda: True)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(smoke_run, "_cores", lambda: 2)
    before = torch.get_num_threads()
    with (
        pytest.raises(KeyboardInterrupt),
        smoke_run.batch_cpu_tuning(Progress(enabled=False), True) as chooser,
    ):
        assert chooser is not None
        torch.set_num_threads(2)  # as the chooser's probe would
        raise KeyboardInterrupt
    assert torch.get_num_threads() == before
    with smoke_run.batch_cpu_tuning(Progress(enabled=False), False) as none:
        assert none is None
