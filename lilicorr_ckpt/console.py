"""Progress on stderr. On a terminal, one self-overwriting line; elsewhere (stderr redirected to a file, a CI log),
whole lines at most every few seconds for commands that ask for them (`lines`), and otherwise nothing. convert
counts bytes written (`advance(nbytes)`), smoke counts decoding steps (`step(label)`); `note` names a stage
without a count."""

from __future__ import annotations

import sys
import time
from typing import TextIO

LOG_INTERVAL = 10.0  # seconds between two progress lines in a log


def duration(seconds: float) -> str:
    """45s, 1m20s, 1h02m: how long, as a log line reads it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(
        self,
        total: int = 0,
        *,
        enabled: bool,
        stream: TextIO | None = None,
        interval: float = 0.25,
        name: str = "",
        lines: bool = False,
        unit: str = "steps",
    ):
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.name = name  # smoke's lines read "  smoke [###...] 3/8 ..." and "  smoke: loading the target..."
        # whole lines, each on its own, at most every `interval` seconds (a log file or a CI job reads them; a
        # self-overwriting line there is one endless line, or nothing until the end)
        self.lines = lines
        self.unit = unit  # what step() counts, in the line mode's "12/84 generations"
        self.started = time.monotonic()
        self._last: float | None = None
        self._dirty = False

    @classmethod
    def for_terminal(
        cls,
        quiet: bool,
        *,
        total: int = 0,
        name: str = "",
        log_interval: float | None = None,
        unit: str = "steps",
    ) -> Progress:
        """A self-overwriting line when stderr is a terminal; when it is not, a line every `log_interval` seconds
        if given, else nothing. Nothing with `quiet`."""
        if quiet:
            return cls(total, enabled=False, name=name, unit=unit)
        if sys.stderr.isatty():
            return cls(total, enabled=True, name=name, unit=unit)
        if log_interval is None:
            return cls(total, enabled=False, name=name, unit=unit)
        return cls(total, enabled=True, name=name, interval=log_interval, lines=True, unit=unit)

    @property
    def _named(self) -> str:
        return f"{self.name} " if self.name else ""

    @property
    def _prefix(self) -> str:
        return f"{self.name}: " if self.name else ""

    def _write(self, text: str) -> None:
        if self.lines:
            self.stream.write(text.strip() + "\n")
        else:
            self.stream.write("\r\033[K" + text)
            self._dirty = True
        self.stream.flush()

    def _due(self, now: float) -> bool:
        """Whether to redraw now: the first time, the last step, and at most every `interval` seconds between."""
        if self._last is None or now - self._last >= self.interval or self.done >= self.total:
            self._last = now
            return True
        return False

    def start(self, total: int, unit: str | None = None) -> None:
        """Count `total` steps (or bytes) from now on, in `unit` if given (the line mode's "12/84 generations")."""
        self.total, self.done, self.started, self._last = total, 0, time.monotonic(), None
        if unit is not None:
            self.unit = unit

    def advance(self, nbytes: int) -> None:
        """`nbytes` more written: the byte count, percentage and rate, redrawn at most every `interval` seconds."""
        self.done += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if self._due(now):
            total = max(self.total, 1)
            rate = self.done / max(now - self.started, 1e-9) / 1e6
            self._write(
                f"  {self._named}writing {self.done / 1e9:6.2f} / {total / 1e9:.2f} GB "
                f"({100 * self.done / total:5.1f}%)  {rate:7.0f} MB/s"
            )

    def step(self, label: str, count: int = 1) -> None:
        """`count` more of `total` steps done (a batch finishes many at once, or none in a block: count 0 still
        redraws, so a long batch is never silent): a bar, the count, what was done and the time so far (on a
        terminal); in a log, at most every `interval` seconds, a line with the count, the last step, the time so far
        and an estimate of the time left."""
        self.done += count
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.started
        if self.lines:
            if self._due(now):
                left = self.total - self.done
                if left <= 0:
                    eta = ", done"
                elif self.done:
                    eta = f", about {duration(elapsed / self.done * left)} left"
                else:  # nothing finished yet (a batch of long generations): no rate to estimate from
                    eta = ""
                self._write(
                    f"{self._prefix}{self.done}/{self.total} {self.unit} (last: {label}), "
                    f"{duration(elapsed)}{eta}"
                )
            return
        width = 24
        filled = width * self.done // max(self.total, 1)
        self._write(
            f"  {self._named}[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label} "
            f"({elapsed:.0f} s)"
        )

    def note(self, text: str) -> None:
        if self.enabled:
            self._write(f"  {self._prefix}{text}...")

    def finish(self) -> None:
        if self.enabled and self._dirty:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._dirty = False
