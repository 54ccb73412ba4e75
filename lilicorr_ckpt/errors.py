"""Exceptions that end a command with a message for people rather than a traceback: InputError (exit 2),
UsageError (exit 4), Refused and its kinds (exit 1)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotation only: importing errors stays free of msgspec
    from lilicorr_ckpt.results import Report


class InputError(Exception):
    """The input cannot be read at all (exit code 2): not a checkpoint, corrupt file, unsafe path."""


class UsageError(Exception):
    """The command line asks for something impossible (exit code 4)."""


class Refused(Exception):
    """The input can be read but not used as asked (exit code 1); nothing was written. Reasons a person can act on."""

    def __init__(self, summary: str, reasons: list[str] | None = None):
        super().__init__(summary)
        self.summary = summary
        self.reasons = list(reasons or [])

    def __str__(self) -> str:
        return "\n".join([self.summary] + [f"  - {r}" for r in self.reasons])


class ConversionRefused(Refused):
    """`convert` cannot convert the source as asked."""


class SmokeRefused(Refused):
    """`smoke` cannot measure the checkpoint against this target: validate refuses it, or the drafter and target do
    not fit together."""


class CheckpointInvalid(Refused):
    """validate finds errors for the runtime the checkpoint is to be served by."""

    def __init__(self, summary: str, reasons: list[str], report: Report):
        super().__init__(summary, reasons)
        self.report = report


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (temporary files removed) like Ctrl-C does."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated where the process is, so `finally` blocks clean up as for
    Ctrl-C. A Python-level handler already in place (an outer block's, or the application's) is left in charge."""
    if threading.current_thread() is not threading.main_thread() or callable(
        signal.getsignal(signal.SIGTERM)
    ):
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
