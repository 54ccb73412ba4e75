"""Progress on stderr for long conversions: one self-overwriting line, only on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, *, enabled: bool, stream: TextIO | None = None, interval: float = 0.25):
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.started = time.monotonic()
        self._last = 0.0
        self._dirty = False

    @classmethod
    def for_terminal(cls, total: int, quiet: bool) -> Progress:
        return cls(total, enabled=not quiet and sys.stderr.isatty())

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= self.interval or self.done >= self.total:
            self._last = now
            elapsed = max(now - self.started, 1e-9)
            rate = self.done / elapsed / 1e6
            self.stream.write(f"\r  writing {self.done / 1e9:6.2f} / {self.total / 1e9:.2f} GB "
                              f"({100 * self.done / self.total:5.1f}%)  {rate:7.0f} MB/s")
            self.stream.flush()
            self._dirty = True

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r\033[K" if self._dirty else "") + f"  {text}...")
        self.stream.flush()
        self._dirty = True

    def finish(self) -> None:
        if self.enabled and self._dirty:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._dirty = False
