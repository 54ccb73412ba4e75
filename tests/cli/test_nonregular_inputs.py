"""Every file the tool reads goes through the guarded reader: a FIFO, /dev/zero or a huge file given where a report,
a smoke profile, a waiver file, a target's tokenizer or a probe file is expected is refused by name (exit 2, or 4
for a waiver file) within seconds, never read until it blocks or fills memory.

The command lines run in a child process with a deadline and a 1 GB address-space limit, so a regression fails
(a timeout, or MemoryError) instead of hanging the suite or swapping the machine."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from lilicorr_ckpt import precommit
from lilicorr_ckpt.checkpoint.target import resolve_target_spec
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.errors import InputError

from helpers import REPO, raised_within

DRAFTER = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"
AS_LIMIT = 1 << 30
DEADLINE_S = 60


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _bounded(module: str, *args: str, stdin=None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m module args` under the memory limit; a run past the deadline fails the test (a hang)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True,
            text=True,
            stdin=stdin,
            cwd=cwd,
            timeout=DEADLINE_S,
            preexec_fn=_limit_memory,
            env={**os.environ, "NO_COLOR": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{module} {' '.join(args)} still running after {DEADLINE_S} s: it read a FIFO or a device"
        )


def _in_process(capsys, entry, *args: str) -> subprocess.CompletedProcess:
    """entry(args) in this process, in a thread with a deadline (a read blocked on a FIFO fails the test)."""
    raised = raised_within(DEADLINE_S, entry, list(args))
    assert isinstance(raised, SystemExit), raised
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, raised.code, out.out, out.err)


def _clean_exit(result: subprocess.CompletedProcess, code: int, needle: str) -> None:
    assert result.returncode == code, result.stdout[-1000:] + result.stderr[-2000:]
    assert needle in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr[-2000:]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def test_report_refuses_a_fifo(fifo, capsys):
    _clean_exit(
        _in_process(capsys, main, "report", str(fifo), "-f", "text"),
        2,
        f"report {fifo} is a FIFO (named pipe), not a regular file; refusing to open it",
    )


def test_report_refuses_dev_zero_by_name(tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to("/dev/zero")
    _clean_exit(
        _bounded("lilicorr_ckpt", "report", str(link), "-f", "text"),
        2,
        f"report {link} is a character device, not a regular file",
    )


def test_report_reads_standard_input_with_a_cap():
    with open("/dev/zero", "rb") as zero:
        _clean_exit(
            _bounded("lilicorr_ckpt", "report", "-", "-f", "text", stdin=zero),
            2,
            "the report on standard input is larger than the limit for this input, 268435456 bytes (256 MiB)",
        )


def test_the_report_line_finder_does_not_read_a_huge_file_a_finding_names(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.link(DRAFTER / "model.safetensors", ckpt / "model.safetensors")
    config = json.loads((DRAFTER / "config.json").read_text())
    config["dflash_config"]["lilicorr_candidate_topk"] = 3  # a finding that points into config.json
    (ckpt / "config.json").write_text(json.dumps(config))
    saved = tmp_path / "report.json"
    assert _in_process(capsys, main, "validate", str(ckpt), "-f", "json", "-o", str(saved)).returncode == 1
    with (ckpt / "config.json").open("wb") as f:  # now 3 GiB (sparse): where the line numbers would come from
        f.truncate(3 << 30)
    result = _bounded("lilicorr_ckpt", "report", str(saved), "-f", "github")
    assert result.returncode == 0, result.stderr
    assert (
        "::error file=" in result.stdout and "title=LC104" in result.stdout
    )  # the file named, no line taken


def test_card_refuses_a_fifo_profile(fifo, capsys):
    _clean_exit(
        _in_process(
            capsys, main, "card", str(DRAFTER), "--target", str(TARGET), "--profile", str(fifo), "-o", "-"
        ),
        2,
        f"--profile {fifo} is a FIFO (named pipe)",
    )


def test_the_hook_does_not_read_a_fifo_config(tmp_path, capsys):
    ckpt = tmp_path / "drafter"
    ckpt.mkdir()
    os.link(DRAFTER / "model.safetensors", ckpt / "model.safetensors")
    os.mkfifo(ckpt / "config.json")
    _clean_exit(
        _in_process(capsys, precommit.main, str(ckpt / "config.json")),
        2,
        "config.json is a FIFO (named pipe), not a regular file",
    )


@pytest.mark.parametrize(
    "content, needle",
    [
        (
            None,
            "waiver file {path} is 3221225472 bytes; the limit for this file is 4194304 bytes (4 MiB)",
        ),  # sparse
        (b"[tool.lilicorr-ckpt]\n# \xff\n", "{path} is not valid TOML: not UTF-8 (byte 0xff at offset 23)"),
    ],
)
def test_a_huge_or_binary_waiver_file_is_a_usage_error_naming_it(tmp_path, content, needle):
    ckpt = tmp_path / "drafter"
    ckpt.mkdir()
    (tmp_path / ".git").mkdir()  # the search stops at the work tree's root
    for name in ("config.json", "model.safetensors"):
        os.link(DRAFTER / name, ckpt / name)
    pyproject = tmp_path / "pyproject.toml"
    if content is None:
        with pyproject.open("wb") as f:
            f.truncate(3 << 30)
    else:
        pyproject.write_bytes(content)
    _clean_exit(_bounded("lilicorr_ckpt", "validate", str(ckpt)), 4, needle.format(path=pyproject))


def _target_copy(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    target.mkdir()
    for entry in TARGET.iterdir():
        os.link(entry, target / entry.name)
    return target


def test_a_fifo_target_config_is_named_as_a_fifo_not_as_missing(tmp_path, capsys):
    target = _target_copy(tmp_path)
    (target / "config.json").unlink()
    os.mkfifo(target / "config.json")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(DRAFTER), "--target", str(target)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"target {str(target)!r}: config.json is a FIFO (named pipe), not a regular file" in err, err
    assert "has no config.json" not in err


@pytest.mark.parametrize(
    "name, make, needle",
    [
        ("tokenizer.json", os.mkfifo, "tokenizer.json is a FIFO (named pipe)"),
        (
            "tokenizer_config.json",
            lambda p: p.symlink_to("/dev/zero"),
            "tokenizer_config.json is a character device",
        ),
        ("added_tokens.json", os.mkfifo, "added_tokens.json is a FIFO"),
        ("generation_config.json", os.mkfifo, "generation_config.json is a FIFO"),
        ("chat_template.jinja", os.mkfifo, "chat_template.jinja is a FIFO"),
        ("vocab.json", os.mkdir, "vocab.json is a directory"),
        (
            "tokenizer.json",
            lambda p: p.open("wb").truncate(200 << 20),
            "tokenizer.json is 209715200 bytes; the limit for this file is 134217728 bytes (128 MiB)",
        ),
    ],
)
def test_a_target_file_a_loader_would_open_is_checked_before_any_loader_opens_it(
    tmp_path, name, make, needle
):
    target = _target_copy(tmp_path)
    if (target / name).exists():
        (target / name).unlink()
    make(target / name)
    with pytest.raises(InputError) as refused:
        resolve_target_spec(str(target))
    assert str(refused.value) == f"target {str(target)!r}: {needle}" or needle in str(refused.value)


def test_a_target_directory_with_ordinary_extras_still_resolves(tmp_path):
    target = _target_copy(tmp_path)
    (target / "notes.json").mkdir()  # a folder that merely ends in .json
    (target / "old.json").symlink_to(tmp_path / "gone")  # a broken link no loader opens by name
    assert resolve_target_spec(str(target)).path == target.resolve()


def test_a_gguf_fifo_target_is_named_as_a_fifo(tmp_path):
    gguf = tmp_path / "model.gguf"
    os.mkfifo(gguf)
    with pytest.raises(InputError, match=r"model.gguf' is a FIFO \(named pipe\), not a regular file"):
        resolve_target_spec(str(gguf))
