"""Helpers shared by the top-level tests (import as `from helpers import run_cli`)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from lilicorr_ckpt import fixtures

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str):
    """A script of the checkout (bench/, scripts/) imported as a module called `name`, without running its main."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def smollm2_drafter_config():
    """A LiLiCorr drafter of SmolLM2's geometry: hidden 576, vocabulary 49152, 30 target layers."""
    return fixtures.draft_config(
        block_size=4,
        hidden_size=576,
        num_hidden_layers=1,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        num_target_layers=30,
        rope_theta=100000.0,
        dflash={
            "block_size": 4,
            "target_layer_ids": [1, 15, 28],
            "mask_token_id": 49151,
            "lilicorr_candidate_topk": 8,
            "lilicorr_hidden_size": 256,
            "lilicorr_num_heads": 4,
        },
    )
