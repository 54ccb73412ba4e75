"""Helpers shared by the top-level tests (import as `from helpers import run_cli`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the command line in a fresh interpreter, as a user would."""
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lilicorr_ckpt.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=300,
    )


def raised_within(seconds: float, fn, *args, **kwargs) -> BaseException | None:
    """What fn(*args, **kwargs) raised (None when it returned), run in a daemon thread: a call still running after
    `seconds` (a read blocked on a FIFO) fails the calling test instead of hanging the suite."""
    import threading

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn(*args, **kwargs)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, (
        f"{getattr(fn, '__name__', fn)}{args} still running after {seconds} s (blocked on a read?)"
    )
    return outcome[0]
