"""Helpers shared by the top-level tests (import as `from helpers import run_cli`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the command line in a fresh interpreter, as a user would."""
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lilicorr_ckpt.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=300)
