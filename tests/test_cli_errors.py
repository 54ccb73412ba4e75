"""How the command line ends when the environment, not the checkpoint, gets in the way: output paths that
cannot be written, I/O errors, Ctrl-C, SIGTERM and a reader that stops early."""

import errno
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from lilicorr_ckpt import cli
from lilicorr_ckpt.checks import run as validate_module

from helpers import run_cli


def _main(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(args))
    return exit_info.value.code, capsys.readouterr()


@pytest.fixture
def ckpt(make_ckpt):
    return make_ckpt()


def test_output_into_a_missing_directory_is_refused_before_any_work(ckpt, tmp_path):
    result = run_cli("validate", str(ckpt), "-o", str(tmp_path / "nodir" / "report.json"))
    assert result.returncode == 4 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_output_under_a_file_is_refused_as_such(ckpt, tmp_path):
    (tmp_path / "afile").write_text("")
    result = run_cli("validate", str(ckpt), "-o", str(tmp_path / "afile" / "report.txt"))
    assert result.returncode == 4 and "afile is not a directory" in result.stderr


def test_output_onto_a_directory_is_refused_and_leaves_nothing(ckpt, tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    result = run_cli("validate", str(ckpt), "-o", str(target))
    assert result.returncode == 4 and "is a directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out"]


def test_output_is_written_whole(ckpt, tmp_path):
    out = tmp_path / "report.json"
    result = run_cli("validate", str(ckpt), "-f", "json", "-o", str(out))
    assert result.returncode == 0 and result.stdout == ""
    assert out.read_text().startswith("{") and not list(tmp_path.glob("*.tmp"))


def test_a_failed_write_reports_the_reason_and_removes_its_temporary_file(ckpt, tmp_path, capsys, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    code, out = _main(capsys, "validate", str(ckpt), "-o", str(tmp_path / "report.txt"))
    assert code == 2 and "cannot write" in out.err and "No space left on device" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("raised, code, message", [
    (KeyboardInterrupt, 130, "interrupted"),
    (OSError(errno.EACCES, "Permission denied", "/some/file"), 2, "Permission denied: /some/file"),
])
def test_interrupts_and_environment_errors_are_not_called_bugs(ckpt, capsys, monkeypatch, raised, code, message):
    def run(*args, **kwargs):
        raise raised
    monkeypatch.setattr(validate_module, "validate", run)
    got, out = _main(capsys, "validate", str(ckpt))
    assert got == code and message in out.err and "bug" not in out.err


def test_sigterm_unwinds_and_exits_143(ckpt, capsys, monkeypatch):
    def run(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM was not delivered")
    monkeypatch.setattr(validate_module, "validate", run)
    previous = signal.getsignal(signal.SIGTERM)
    code, out = _main(capsys, "validate", str(ckpt))
    assert code == 143 and "terminated" in out.err
    assert signal.getsignal(signal.SIGTERM) is previous  # restored after the command


def test_a_reader_that_stops_early_is_not_a_failure():
    proc = subprocess.Popen([sys.executable, "-m", "lilicorr_ckpt.cli", "rules", "-f", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
