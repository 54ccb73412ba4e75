"""How many intra-op threads a batched CPU arm runs with, chosen by timing its own blocks.

A batched block multiplies matrices of hundreds of rows, which a second thread speeds up (each batched arm about
1.6x on an idle 2-core machine: docs/performance.md, "smoke on the CPU"). But torch's OpenMP threads spin at every
one of a block's ~600 parallel regions until all of them arrive: when another process holds a core, each region
waits for a descheduled thread, and two threads can then be slower than one. Neither count is right on a machine that is
shared part of the time, so the arm measures: it starts with one thread, times one block with the other count
after three blocks and then every `period` blocks (at once when a block takes 2.5x the recent ones), and keeps
whichever was faster. The period doubles while the count in use
keeps winning (a run on a quiet machine pays one slow probe block now and then) and starts over after a switch.

Torch-free: the caller passes the function that sets the count (torch.set_num_threads).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

FIRST_PROBE = 3  # units of work timed at the starting count before the first probe of the other
PERIOD = 16  # units of work between probes after a switch; doubled while the count in use keeps winning
MAX_PERIOD = 64
MARGIN = 0.15  # a probe must be this much faster than the recent units of work to switch
RECENT = 5  # units of work at the count in use that a probe is compared with (their median)
SLOWDOWN = (
    2.5  # a unit of work this much slower than the recent ones (another process took a core) probes now
)


class ThreadChooser:
    """Call `done(seconds)` after every unit of work (a block) with how long it took, made comparable (a request's
    check: seconds per row), and `restart()` before work of another kind (the next arm): the count stays, its
    timings start over. Between two calls the chooser may change the count through `set_threads`; `threads` is the
    count in use. The caller times the work alone: what runs between two units (the admission of new requests, at
    the same count) would make a unit look slower than it is."""

    def __init__(
        self,
        counts: Sequence[int],
        set_threads: Callable[[int], None],
        on_switch: Callable[[int, float, float], None] | None = None,
    ):
        if len(counts) < 2 or len(set(counts)) != len(counts):
            raise ValueError(f"ThreadChooser needs at least two different counts, got {list(counts)}")
        self.counts = list(counts)
        self.set_threads, self.on_switch = set_threads, on_switch
        self.threads = self.counts[0]
        self.switches: list[int] = []  # the counts switched to, in order
        self.probes = 0
        self.period = FIRST_PROBE
        self._next_other = 0  # round robin over the other counts
        self.probing: int | None = None  # the count the running unit of work is timed at, while probing
        self.recent: list[float] = []  # seconds per unit of work at self.threads, the newest last
        self.since = 0  # units of work since the last probe
        set_threads(self.threads)

    def restart(self) -> None:
        """Work of another kind follows: keep the count, forget the timings."""
        if self.probing is not None:
            self.set_threads(self.threads)
        self.probing, self.recent, self.since = None, [], 0

    def done(self, seconds: float) -> None:
        if self.probing is not None:
            self._judge(self.probing, seconds)
            return
        slow = len(self.recent) >= FIRST_PROBE and seconds > SLOWDOWN * statistics.median(self.recent)
        self.recent = [seconds] if slow else (self.recent + [seconds])[-RECENT:]
        self.since += 1
        if slow or (self.since >= self.period and len(self.recent) >= FIRST_PROBE):
            others = [c for c in self.counts if c != self.threads]
            self.probing = others[self._next_other % len(others)]
            self._next_other += 1
            self.probes += 1
            self.set_threads(self.probing)

    def _judge(self, probe: int, seconds: float) -> None:
        """The probe's unit of work took `seconds`: switch to its count if it beat the recent ones."""
        self.probing, self.since = None, 0
        baseline = statistics.median(self.recent)
        if seconds < baseline * (1 - MARGIN):
            if self.on_switch is not None:
                self.on_switch(probe, seconds, baseline)
            self.threads, self.recent, self.period = probe, [seconds], PERIOD
            self.switches.append(probe)
            return
        self.set_threads(self.threads)
        if seconds > SLOWDOWN * baseline:  # far slower (a busy machine): probe it seldom
            self.period = MAX_PERIOD
        else:
            self.period = min(self.period * 2, MAX_PERIOD) if self.period >= PERIOD else PERIOD
