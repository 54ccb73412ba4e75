"""Exceptions that end a command with a message for people rather than a traceback."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class InputError(Exception):
    """The input cannot be read at all (exit code 2): not a checkpoint, corrupt file, unsafe path."""


class UsageError(Exception):
    """The command line asks for something impossible (exit code 4)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (temporary files removed) like Ctrl-C does."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated where the process is, so `finally` blocks clean up as for
    Ctrl-C. A Python-level handler already in place (an outer block's, or the application's) is left in charge."""
    if threading.current_thread() is not threading.main_thread() or callable(signal.getsignal(signal.SIGTERM)):
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
