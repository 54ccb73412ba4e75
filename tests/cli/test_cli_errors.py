"""How the command line ends when the environment, not the checkpoint, gets in the way: output paths that
cannot be written, I/O errors, Ctrl-C, SIGTERM and a reader that stops early."""

import errno
import os
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


def test_a_failed_write_reports_the_reason_and_removes_its_temporary_file(
    ckpt, tmp_path, capsys, monkeypatch
):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(
        "lilicorr_ckpt.outfile.os.replace", full_disk
    )  # the temporary is written, then this fails
    code, out = _main(capsys, "validate", str(ckpt), "-o", str(tmp_path / "report.txt"))
    assert code == 2 and "cannot write" in out.err and "No space left on device" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize(
    "raised, code, message",
    [
        (KeyboardInterrupt, 130, "interrupted"),
        (OSError(errno.EACCES, "Permission denied", "/some/file"), 2, "Permission denied: /some/file"),
    ],
)
def test_interrupts_and_environment_errors_are_not_called_bugs(
    ckpt, capsys, monkeypatch, raised, code, message
):
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "lilicorr_ckpt.cli", "rules", "-f", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err


def test_a_symlink_planted_at_the_predictable_temporary_is_never_written_through(ckpt, tmp_path):
    # main's `.NAME.PID.tmp` was predictable: a link planted there for a range of pids overwrote its target
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for pid in range(os.getpid(), os.getpid() + 3000):
        (tmp_path / f".report.json.{pid}.tmp").symlink_to(victim)
    out = tmp_path / "report.json"
    result = run_cli("validate", str(ckpt), "-f", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious" and not out.is_symlink() and out.read_text().startswith("{")


def test_a_symlink_at_the_destination_is_replaced_never_followed(ckpt, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "report.txt"
    out.symlink_to(victim)
    assert run_cli("validate", str(ckpt), "-o", str(out)).returncode == 0
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and "PASS" in out.read_text()
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # a report file keeps the usual mode


INTERRUPT_EARLY = """
import os, signal, sys
from lilicorr_ckpt._entry import main  # what the console script imports first (pyproject [project.scripts])
# Ctrl-C after DELAY seconds, counted from before the command line's own imports
signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
signal.setitimer(signal.ITIMER_REAL, float(sys.argv[1]))
sys.argv = ["lilicorr-ckpt", "validate", sys.argv[2]]
sys.exit(main())
"""


@pytest.mark.parametrize("delay", [0.001, 0.005, 0.01, 0.02, 0.035, 0.05, 0.08])
def test_ctrl_c_in_the_first_milliseconds_is_a_clean_interrupt(ckpt, delay):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", INTERRUPT_EARLY, str(delay), str(ckpt)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    assert result.returncode in (0, 130), result.stderr  # 0: validate finished first


def test_the_console_script_imports_nothing_before_its_ctrl_c_handler():
    # the generated script runs `from lilicorr_ckpt._entry import main` outside any handler: importing the
    # package and the entry module must not pull in anything else (each module is a window for a traceback)
    import subprocess
    import sys

    probe = (
        "import sys; before = set(sys.modules); import lilicorr_ckpt._entry; "
        "print(sorted(set(sys.modules) - before))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['lilicorr_ckpt', 'lilicorr_ckpt._entry']"


# ---------------------------------------------------------------- the catch-all (exits.run_command)


@pytest.mark.parametrize(
    "raised, message",
    [
        (
            TypeError("boom"),
            "internal error: TypeError: boom (while running `lilicorr-ckpt validate {ckpt}`)\n"
            "  This is a bug in lilicorr-ckpt",
        ),
        (
            MemoryError(),
            "error: out of memory while running `lilicorr-ckpt validate {ckpt}`; the input is larger than "
            "this machine can read",
        ),
        (
            RecursionError(),
            "error: the input of `lilicorr-ckpt validate {ckpt}` is nested too deeply to read",
        ),
        (
            OSError(errno.EIO, "Input/output error"),
            "error: Input/output error (while running `lilicorr-ckpt validate {ckpt}`)",
        ),
    ],
)
def test_the_catch_all_names_the_command_line_it_ran(ckpt, capsys, monkeypatch, raised, message):
    def run(*args, **kwargs):
        raise raised

    monkeypatch.setattr(validate_module, "validate", run)
    code, out = _main(capsys, "validate", str(ckpt))
    assert code == 2 and "Traceback" not in out.err
    assert f"lilicorr-ckpt: {message.format(ckpt=ckpt)}" in out.err, out.err
    assert ("bug" in out.err) == isinstance(raised, TypeError)


def test_the_hook_has_the_same_catch_all(ckpt, capsys, monkeypatch):
    from lilicorr_ckpt import precommit

    def run(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(precommit, "validate_dir", run)
    with pytest.raises(SystemExit) as exit_info:
        precommit.main([str(ckpt / "config.json")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err  # never 1, which a hook reads as "findings"
    assert (
        "lilicorr-ckpt-pre-commit: internal error: KeyError: 'surprise' (while running "
        f"`lilicorr-ckpt-pre-commit -- {ckpt}/config.json`)"
    ) in err


def _file_size_limit(limit: int):
    import resource

    def apply() -> None:
        resource.setrlimit(
            resource.RLIMIT_FSIZE, (limit, limit)
        )  # Python ignores SIGXFSZ: writes fail with EFBIG

    return apply


@pytest.mark.parametrize("args", [("rules",), ("validate", "{ckpt}", "-f", "json")])
def test_a_report_cut_short_on_stdout_is_exit_2_naming_standard_output(ckpt, tmp_path, args):
    out = tmp_path / "report.out"
    with out.open("wb") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "lilicorr_ckpt", *(a.format(ckpt=ckpt) for a in args)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            preexec_fn=_file_size_limit(1024),
        )
    assert result.returncode == 2, (
        result.stderr
    )  # `validate -f json > report.json` ended 0 with half a report
    assert "lilicorr-ckpt: error: cannot write standard output: File too large" in result.stderr, (
        result.stderr
    )
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


def test_the_buffered_stdout_a_command_runs_with_never_closes_the_callers(tmp_path, monkeypatch):
    """run_command swaps in a buffered stdout over an unbuffered one for the command's run. Dropping that wrapper
    afterwards must not close the caller's descriptor: in a test it closed pytest's capture file, and every later
    test failed at setup with "I/O operation on closed file"."""
    import gc
    import io

    from lilicorr_ckpt import exits

    raw = io.FileIO(str(tmp_path / "stdout.txt"), "w")
    callers = io.TextIOWrapper(raw, encoding="utf-8")  # unbuffered FileIO beneath, as under `python -u`
    monkeypatch.setattr(sys, "stdout", callers)
    exits._buffered_stdout()
    swapped = sys.stdout
    assert swapped is not callers
    swapped.write("from the command\n")
    sys.stdout = callers
    del swapped
    gc.collect()
    assert not raw.closed
    callers.write("still open\n")
    callers.flush()
    monkeypatch.undo()
    assert (tmp_path / "stdout.txt").read_text() == "from the command\nstill open\n"


UNRAISABLE_INTERRUPT = """
import sys, time, weakref
from lilicorr_ckpt import _entry
sys.unraisablehook = _entry._interrupt_again  # what main() installs first
class Lock: pass
lock = Lock()
def callback(ref):  # as importlib's module-lock callback does when Ctrl-C lands inside it
    raise KeyboardInterrupt
ref = weakref.ref(lock, callback)
try:
    del lock
    time.sleep(2)
    print("lost")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_inside_a_callback_python_cannot_raise_from_is_delivered_again_not_printed():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", UNRAISABLE_INTERRUPT], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "interrupted", result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
