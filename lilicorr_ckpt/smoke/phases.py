"""Where a smoke run's wall time goes: its phases timed one after another, for the report (torch-free).

A cold run on a fresh machine spends most of its time before the first token (imports, loading, compiling
kernels, capturing graphs); the phases say how much each took, so a slow first run can be told from a slow
decode, and a machine's first runs compared with its later ones."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime, to the
    kernel's clock tick, usually 10 ms); None where neither can be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        # field 22 (starttime, in clock ticks since boot); the fields after the command name's ")" start at 3
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        hertz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    if hertz <= 0:
        return None
    return max(0.0, uptime - ticks / hertz)


class Phases:
    """Named phases, each timed from the end of the one before (`mark(name)` ends one). A name marked twice
    adds up. `start`, when given, is the process's time before the first phase (interpreter and imports)."""

    def __init__(self, start: float | None = None, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}
        if start is not None:
            self.seconds["start"] = start

    def mark(self, name: str) -> float:
        """End the phase `name` now; its seconds (this stretch only)."""
        now = self._clock()
        spent = max(0.0, now - self._last)
        self._last = now
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        return spent

    def skip(self) -> None:
        """Start the next phase now, leaving the time since the last mark out of every phase."""
        self._last = self._clock()

    def report(self) -> dict[str, float]:
        """The phases in order, in seconds to the millisecond."""
        return {name: round(seconds, 3) for name, seconds in self.seconds.items()}
