"""One output rule for every command (issue 40): an output that resolves to one of the command's inputs (the
checkpoint's or the target's files, a profile, a training log, the report being rendered, a waiver or probe file)
is refused with exit 4 before any work, however it is spelled (`..`, a symlink at the output or above it, a hard
link), and the input is left byte for byte as it was. Writes go through the atomic writer: an unpredictable
temporary in the destination directory, never through a symlink, fsynced and renamed."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from lilicorr_ckpt import outfile
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.errors import UsageError

from helpers import REPO

DRAFTER = REPO / "examples" / "tiny-lilicorr"
TARGET = REPO / "examples" / "tiny-target"


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A copy of the tiny drafter (D) and target (T), a profile, a training log and a saved report, cwd there."""
    shutil.copytree(DRAFTER, tmp_path / "D")
    shutil.copytree(TARGET, tmp_path / "T")
    (tmp_path / "profile.json").write_text('{"not": "a profile"}\n')
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (tmp_path / "probes.jsonl").write_text('{"id": "a", "category": "x", "prompt": "hi", "chat": false}\n')
    (tmp_path / "lilicorr.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    assert _cli(capsys=None, args=["validate", "D", "-f", "json", "-o", "report.json", "-q"])[0] == 0
    return tmp_path


def _cli(capsys, args: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        main([str(a) for a in args])
    err = capsys.readouterr().err if capsys is not None else ""
    return ended.value.code, err


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# (the command line, the output that must be refused): every command's every output option
CASES = [
    (["validate", "D"], ["-o", "D/config.json"]),
    (["validate", "D"], ["--json", "D/model.safetensors"]),
    (["validate", "D"], ["--junit", "D/config.json"]),
    (["validate", "D"], ["--sarif", "D/model.safetensors"]),
    (["validate", "D"], ["--markdown", "D/config.json"]),
    (["validate", "D", "-t", "T"], ["--json", "T/tokenizer.json"]),
    (["validate", "D", "--config", "lilicorr.toml"], ["--sarif", "lilicorr.toml"]),
    (["inspect", "D", "-f", "json"], ["-o", "D/config.json"]),
    (["card", "D", "-t", "T", "--profile", "profile.json"], ["-o", "profile.json"]),
    (["card", "D", "-t", "T", "--training-log", "log.jsonl"], ["-o", "log.jsonl"]),
    (["card", "D", "-t", "T"], ["-o", "T/config.json"]),
    (["smoke", "D", "-t", "T"], ["-o", "D/model.safetensors"]),
    (["smoke", "D", "-t", "T"], ["--out", "T/model.safetensors"]),
    (["smoke", "D", "-t", "T", "--baseline", "profile.json"], ["-o", "profile.json"]),
    (["smoke", "D", "-t", "T", "--probes", "probes.jsonl"], ["-o", "probes.jsonl"]),
    (["report", "report.json", "-f", "sarif"], ["-o", "report.json"]),
    (["report", "report.json", "-f", "sarif"], ["-o", "D/config.json"]),  # the checkpoint the report names
]


@pytest.mark.parametrize(("command", "output"), CASES, ids=[" ".join(c + o) for c, o in CASES])
def test_an_output_over_an_input_is_refused_and_the_input_is_untouched(work, capsys, command, output):
    before = _digest(work)
    code, err = _cli(capsys, command + output)
    assert code == 4, err
    option = {"-o": "--output"}.get(output[0], output[0])
    assert f"{option} {output[1]} is " in err and "an input of this command" in err, err
    assert "Traceback" not in err and "Error:" not in err.split("usage error:")[-1], err
    assert _digest(work) == before


@pytest.mark.parametrize(
    "spelling",
    [
        "D/../D/config.json",  # `..`
        "./D/./config.json",
        "link-to-config.json",  # a symlink at the output
        "linked-dir/config.json",  # a symlink above it
        "hard-link.json",  # another name of the same file
    ],
)
def test_every_spelling_of_an_input_is_refused(work, capsys, spelling):
    (work / "link-to-config.json").symlink_to(work / "D" / "config.json")
    (work / "linked-dir").symlink_to(work / "D")
    os.link(work / "D" / "config.json", work / "hard-link.json")
    before = _digest(work / "D")
    code, err = _cli(capsys, ["validate", "D", "-f", "json", "-o", spelling])
    assert code == 4, err
    assert "config.json of the checkpoint" in err, err
    assert ("hard link" in err) == (spelling == "hard-link.json"), err
    assert _digest(work / "D") == before


@pytest.mark.parametrize(
    ("where", "command"),
    [
        (
            "lilicorr.toml",
            ["validate", "D", "-f", "json"],
        ),  # at the git work tree's root, above the checkpoint
        ("pyproject.toml", ["validate", "D", "--sarif"]),
        ("D/lilicorr.toml", ["validate", "D", "--junit"]),  # beside the checkpoint
        ("lilicorr.toml", ["card", "D", "-t", "T"]),
    ],
)
def test_the_waiver_file_found_for_the_checkpoint_is_an_input(work, capsys, where, command):
    """No --config: validate (and card, whose verdicts apply waivers) finds the waiver file from the checkpoint
    up to the git work tree's root. Before, only --config FILE was an input, and `-o` over the found file
    replaced the waivers with the report."""
    (work / ".git").mkdir()
    waivers = '[[waivers]]\nrules = ["LC3"]\nreason = "checked by hand"\n'
    if where == "pyproject.toml":
        waivers = "[tool.lilicorr-ckpt]\n" + waivers.replace("[[waivers]]", "[[tool.lilicorr-ckpt.waivers]]")
    (work / where).write_text(waivers)
    before = _digest(work)
    flag = command[-1] if command[-1].startswith("--") else "-o"
    args = command[:-1] if flag != "-o" else command
    code, err = _cli(capsys, [*args, flag, where])
    assert code == 4, err
    assert "a waiver file" in err and "an input of this command" in err, err
    assert _digest(work) == before
    # the same command with another output still applies the file and writes
    code, err = _cli(capsys, [*args, flag, "elsewhere.out"])
    assert code == 0 and (work / "elsewhere.out").stat().st_size > 0, err


@pytest.mark.parametrize("spelling", ["/dev/stdout", "/dev/null", "/proc/self/fd/1", "devices/stdout"])
def test_a_system_path_is_refused_as_an_output(tmp_path, spelling, monkeypatch):
    """`-o /dev/stdout` with stdout redirected to a file resolved to that file and passed; the atomic writer then
    made its temporary in /dev and renamed it over the system's /dev/stdout link (as root). Checked through
    check_output_path alone, so that a regression here never writes into /dev."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "devices").symlink_to("/dev")  # a directory symlinked to /dev is the same place
    with pytest.raises(UsageError, match="is a system path") as refused:
        outfile.check_output_path(spelling, "--output", "report.txt")
    assert "leave the option out to print to stdout" in str(refused.value)
    assert os.path.islink("/dev/stdout") or not os.path.exists("/dev/stdout")


def test_outputs_beside_the_inputs_are_still_written(work, capsys):
    # a report in the checkpoint's directory that is not one of its files, and a card updated in place
    assert _cli(capsys, ["validate", "D", "--json", "D/validate.json", "-q"])[0] == 0
    assert _cli(capsys, ["validate", "D", "--json", "D/validate.json", "-q"])[0] == 0  # and rewritten
    code, err = _cli(capsys, ["card", "D", "-t", "T", "-q"])
    assert code == 0, err
    assert (work / "D" / "README.md").is_file()
    code, err = _cli(capsys, ["card", "D", "-t", "T", "-q", "-o", "D/README.md"])
    assert code == 0, err
    code, err = _cli(capsys, ["report", "report.json", "-f", "markdown", "-o", "summary.md"])
    assert code == 0 and (work / "summary.md").read_text(), err


def test_the_rule_is_checked_again_when_the_file_is_written(work):
    inputs = outfile.Inputs().add(work / "D", "the checkpoint")
    (work / "late.json").symlink_to(work / "D" / "config.json")  # appeared while the command ran
    before = (work / "D" / "config.json").read_bytes()
    with pytest.raises(UsageError, match="resolves to config.json of the checkpoint"):
        outfile.write_output("{}", str(work / "late.json"), inputs=inputs)
    assert (work / "D" / "config.json").read_bytes() == before


def test_the_atomic_writer_replaces_a_symlink_and_never_follows_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out.json").symlink_to(victim)
    outfile.write_output("new", str(tmp_path / "out.json"))
    assert victim.read_text() == "keep"
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]  # no temporary left


def test_the_atomic_writer_fsyncs_and_leaves_nothing_when_the_write_fails(tmp_path, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(outfile.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    outfile.write_output("x", str(tmp_path / "a.txt"))
    assert len(synced) >= 1
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o666 & ~_umask()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), outfile.atomic_writer(tmp_path / "b.txt") as f:
        f.write(b"partial")
        raise Boom
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    "command",
    [["validate", "D", "-q", "-o"], ["inspect", "D", "-o"], ["report", "report.json", "-f", "json", "-o"]],
)
@pytest.mark.parametrize("spelling", ["loop/x.json", "x" * 300 + ".json", "/".join(["d"] * 3000) + "/x.json"])
def test_an_unusable_output_path_is_a_usage_error_not_an_internal_one(work, capsys, command, spelling):
    (work / "loop").symlink_to(work / "loop")
    code, err = _cli(capsys, command + [spelling])
    assert code == 4, err
    assert "internal error" not in err and "RuntimeError" not in err and "OSError" not in err, err
