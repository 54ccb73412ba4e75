"""Progress on stderr: one self-overwriting line, only on a terminal. convert counts bytes written
(`advance(nbytes)`), smoke counts decoding steps (`step(label)`); `note` names a stage without a count."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int = 0, *, enabled: bool, stream: TextIO | None = None, interval: float = 0.25,
                 name: str = ""):
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.name = name  # smoke's lines read "  smoke [###...] 3/8 ..." and "  smoke: loading the target..."
        self.started = time.monotonic()
        self._last = 0.0
        self._dirty = False

    @classmethod
    def for_terminal(cls, quiet: bool, *, total: int = 0, name: str = "") -> Progress:
        return cls(total, enabled=not quiet and sys.stderr.isatty(), name=name)

    @property
    def _named(self) -> str:
        return f"{self.name} " if self.name else ""

    def _write(self, text: str) -> None:
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._dirty = True

    def start(self, total: int) -> None:
        """Count `total` steps (or bytes) from now on."""
        self.total, self.done, self.started = total, 0, time.monotonic()

    def advance(self, nbytes: int) -> None:
        """`nbytes` more written: the byte count, percentage and rate, redrawn at most every `interval` seconds."""
        self.done += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= self.interval or self.done >= self.total:
            self._last = now
            total = max(self.total, 1)
            rate = self.done / max(now - self.started, 1e-9) / 1e6
            self._write(f"  {self._named}writing {self.done / 1e9:6.2f} / {total / 1e9:.2f} GB "
                        f"({100 * self.done / total:5.1f}%)  {rate:7.0f} MB/s")

    def step(self, label: str) -> None:
        """One more of `total` steps done: a bar, the count, what was done and the time so far."""
        self.done += 1
        if not self.enabled:
            return
        width = 24
        filled = width * self.done // max(self.total, 1)
        elapsed = time.monotonic() - self.started
        self._write(f"  {self._named}[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label} "
                    f"({elapsed:.0f} s)")

    def note(self, text: str) -> None:
        if self.enabled:
            self._write(f"  {self.name + ': ' if self.name else ''}{text}...")

    def finish(self) -> None:
        if self.enabled and self._dirty:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._dirty = False
