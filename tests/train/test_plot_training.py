"""scripts/plot_training.py against hostile logs and outputs, by the recipe's exit codes (lilicorr_train.script): it
wrote the curve over its own input log (`--out RUN/log.jsonl`: the log was lost), a directory, a missing or
symlink-looping --out, a log not in UTF-8 and a log holding NaN or Infinity ended in tracebacks (exit 1), a usage
error was argparse's exit 2, the curve was written in place (a failed write left half an SVG) and an empty log
drew an empty plot, exit 0."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("plot_training", REPO / "scripts" / "plot_training.py")
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)

TRAINING = {"step": 25, "control_accept": 0.5, "head_accept": 0.75, "dflash": 4.0}
HELD = {"heldout_step": 25, "val_tau_control": 1.5, "val_tau_head": 1.75, "val_dflash": 4.2}


def _log(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _plot(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = plot.main(list(argv))
    except SystemExit as exc:  # argparse's usage errors exit
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_curve_never_writes_over_a_log_it_reads(tmp_path, capsys):
    log = _log(tmp_path / "log.jsonl", TRAINING, HELD)
    before = _digest(log)
    code, err = _plot(capsys, str(log), "--out", str(log))
    assert code == 4 and "usage error: --out" in err and "an input of this command" in err, err
    (tmp_path / "curve.svg").symlink_to(log)
    code, err = _plot(capsys, f"a={log}", "--out", str(tmp_path / "curve.svg"))
    assert code == 4 and "resolves to" in err, err
    assert _digest(log) == before


@pytest.mark.parametrize(
    "out, said",
    [
        ("", "is a directory; give a file name"),
        ("curve.png", "is written as SVG: give a file name ending in .svg"),
        ("afile/curve.svg", "is not a directory"),
        ("missing/curve.svg", "does not exist"),
        ("loop", "a dangling symlink or a symlink loop"),
        ("x" * 300 + ".svg", "File name too long"),
    ],
    ids=["directory", "not svg", "under a file", "missing directory", "symlink loop", "too long"],
)
def test_an_output_that_cannot_be_the_curve_is_a_usage_error(tmp_path, capsys, out, said):
    log = _log(tmp_path / "log.jsonl", TRAINING)
    (tmp_path / "afile").write_text("precious")
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    if out == "loop":
        out = "loop/curve.svg"
    listing = sorted(os.listdir(tmp_path))
    code, err = _plot(capsys, str(log), "--out", str(tmp_path / out))
    assert code == 4 and "usage error: --out" in err and said in err, err
    assert sorted(os.listdir(tmp_path)) == listing and (tmp_path / "afile").read_text() == "precious"


def test_a_usage_error_is_exit_4(tmp_path, capsys):
    code, err = _plot(capsys, str(tmp_path / "log.jsonl"))
    assert code == 4 and "usage error" in err and "--out" in err, err


@pytest.mark.parametrize(
    "make, code, said",
    [
        (lambda p: None, 2, "No such file or directory"),
        (lambda p: p.mkdir(), 2, "is a directory, not a regular file"),
        (lambda p: os.mkfifo(p), 2, "is a FIFO"),
        (lambda p: p.write_bytes(b'{"step": 1}\n\xff\xfe\n'), 2, "is not UTF-8 text (byte 12"),
        (lambda p: p.write_text(""), 1, "holds no training or held-out record"),
        (lambda p: p.write_text('{"step": 1}\nnot json\n'), 1, "holds no training or held-out record"),
    ],
    ids=["missing", "directory", "fifo", "not utf-8", "empty", "no record"],
)
def test_a_log_that_cannot_be_drawn_is_named(tmp_path, capsys, make, code, said):
    good, bad = _log(tmp_path / "good.jsonl", TRAINING), tmp_path / "log.jsonl"
    make(bad)
    got, err = _plot(capsys, str(good), f"second={bad}", "--out", str(tmp_path / "curve.svg"))
    assert got == code and f"log {bad}" in err and said in err, err
    assert not (tmp_path / "curve.svg").exists()


def test_garbage_lines_and_values_that_are_no_finite_number_are_skipped_with_a_warning(tmp_path, capsys):
    log = _log(
        tmp_path / "log.jsonl",
        "garbage",
        "[1, 2]",
        TRAINING,
        '{"step": 50, "control_accept": NaN, "head_accept": "x", "dflash": Infinity}',
        {"step": True, "control_accept": 0.1},
        HELD,
        '{"heldout_step": 50, "val_tau_control": 1.6, "val_tau_head": -Infinity, "val_dflash": null}',
    )
    out = tmp_path / "curve.svg"
    code, err = _plot(capsys, str(log), "--out", str(out))
    assert code == 0, err
    assert f"warning: log {log}: 2 lines are not JSON records (skipped; the first: line 1)" in err, err
    text = out.read_text()
    assert text.startswith("<svg") and "polyline" in text
    assert "nan" not in text.lower() and "inf" not in text.lower()
    assert sorted(os.listdir(tmp_path)) == ["curve.svg", "log.jsonl"]  # no temporary left


def test_a_log_without_held_out_lines_draws_its_training_curve(tmp_path, capsys):
    log = _log(tmp_path / "log.jsonl", TRAINING, {**TRAINING, "step": 50})
    code, err = _plot(capsys, f"train only={log}", "--out", str(tmp_path / "curve.svg"))
    assert code == 0 and "warning" not in err, err
    assert "train only" in (tmp_path / "curve.svg").read_text()
