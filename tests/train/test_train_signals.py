"""SIGTERM ends the recipe's commands as it ends lilicorr-ckpt's: the temporaries are removed as for Ctrl-C, the
command says "terminated" and exits 143. Before, the signal killed the process where it was, and an export's
temporary directory (or a shard's, a run state's, a build's temporary file) stayed beside its output."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import lilicorr_train.__main__ as train_main
import lilicorr_train.export as export_module
from lilicorr_train.export import build_drafter
from lilicorr_train.script import run_script

from helpers import REPO


def _terminate_self() -> None:
    # without a Python handler the signal would kill the test process itself: fail instead
    assert callable(signal.getsignal(signal.SIGTERM)), "no SIGTERM handler is in place: the process would die"
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this ends
    raise AssertionError("SIGTERM was not delivered")


def test_sigterm_during_an_export_leaves_nothing_and_exits_143(tmp_path, monkeypatch, capsys):
    config = json.loads((REPO / "examples" / "tiny-lilicorr" / "config.json").read_text())
    drafter = build_drafter(config)
    monkeypatch.setattr(train_main, "load_run_drafter", lambda run: (drafter, config, 7))
    real_save = export_module.save_file

    def save_then_terminate(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)  # the temporary directory now holds the weights
        assert Path(path).is_file() and Path(path).parent.name.startswith(".export.export-")
        _terminate_self()

    monkeypatch.setattr(export_module, "save_file", save_then_terminate)
    run = tmp_path / "run"
    run.mkdir()
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        train_main.main.main(["export", str(run), "--out", str(tmp_path / "export")])
    assert exit_info.value.code == 143
    assert "terminated" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no export, no temporary beside it
    assert signal.getsignal(signal.SIGTERM) is previous  # restored after the command


def test_sigterm_in_a_script_runs_its_cleanups_and_exits_143(tmp_path, capsys):
    partial = tmp_path / ".shard-0001.npz.tmp"

    def body() -> int:
        partial.write_bytes(b"half a shard")
        try:
            _terminate_self()
        finally:
            partial.unlink()
        return 0

    previous = signal.getsignal(signal.SIGTERM)
    assert run_script("python -m lilicorr_train.mixes", body) == 143
    assert "terminated" in capsys.readouterr().err
    assert not partial.exists()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_ctrl_c_in_a_script_is_still_130(capsys):
    def body() -> int:
        raise KeyboardInterrupt

    assert run_script("python -m lilicorr_train.pieces", body) == 130
    assert "interrupted" in capsys.readouterr().err
