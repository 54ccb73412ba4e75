"""The writer: atomic (kill, SIGTERM, disk full), torch-free, memory bounded, quiet off a terminal."""

from __future__ import annotations

import errno
import io
import mmap
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from convert_helpers import EXAMPLE, REPO, tensors_of, tree_digest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.convert import destination, reader
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.pipeline import convert

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest, with torch loaded)
PROBE = """
import re, sys
from lilicorr_ckpt.cli import main
try:
    main(["convert", *sys.argv[1:]])
except SystemExit as exc:
    heavy = sorted(m for m in ("torch", "transformers", "lilicorr_runtime", "modelopt") if m in sys.modules)
    hwm = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
    print("HEAVY", heavy, "EXIT", exc.code, "MAXRSS_MB", hwm // 1024)
"""


# a convert slowed down from the outside (each tensor written, then a pause), so a test can kill it midway
SLOWED = """
import sys, time
from lilicorr_ckpt.cli import main
from lilicorr_ckpt.convert import writer
write_tensor = writer.write_tensor
def slowly(*args, **kwargs):
    write_tensor(*args, **kwargs)
    time.sleep(float(sys.argv[1]))
writer.write_tensor = slowly
main(["convert", *sys.argv[2:]])
"""


def _convert_process(*args, pause=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = ["-m", "lilicorr_ckpt.cli", "convert"] if pause is None else ["-c", SLOWED, str(pause)]
    return subprocess.Popen(
        [sys.executable, *command, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for_partial_write(parent, name, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tmp in parent.glob(f".{name}.convert-tmp.*"):
            shard = tmp / "model.safetensors"
            if shard.exists() and shard.stat().st_size > 4096:
                return tmp
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the slowed conversion never started writing")


def test_killed_mid_write_leaves_no_destination_and_the_next_run_cleans_up(tmp_path):
    before = tree_digest(EXAMPLE)
    dst = tmp_path / "out"
    proc = _convert_process(EXAMPLE, dst, pause=0.05)
    tmp = _wait_for_partial_write(tmp_path, "out", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not dst.exists()
    assert tmp.exists()  # a killed process cannot clean up; the next run does
    assert tree_digest(EXAMPLE) == before
    proc = _convert_process(EXAMPLE, dst)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not tmp.exists() and dst.exists()
    assert tensors_of(dst)  # complete and readable


def test_sigterm_mid_write_removes_the_temporary_directory(tmp_path):
    dst = tmp_path / "out"
    proc = _convert_process(EXAMPLE, dst, pause=0.05)
    _wait_for_partial_write(tmp_path, "out", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err.strip()) == (143, "terminated"), (proc.returncode, err)
    assert not dst.exists() and list(tmp_path.iterdir()) == []


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_a_full_disk_leaves_nothing_behind(tmp_path):
    dst = tmp_path / "out"
    proc = _convert_process(EXAMPLE, dst, preexec_fn=_limit_file_size)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert f"cannot write the output: File too large: {dst} (DST was not created)" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_stale_temporary_of_a_live_process_is_left_alone(tmp_path, cli):
    live = tmp_path / f".out.convert-tmp.{os.getppid()}"
    live.mkdir()
    dead = tmp_path / ".out.convert-tmp.999999999"
    dead.mkdir()
    assert cli("convert", EXAMPLE, tmp_path / "out").code == 0
    assert live.exists() and not dead.exists()


def test_convert_never_imports_torch_and_memory_does_not_follow_checkpoint_size(tmp_path):
    cfg = fixtures.draft_config(
        hidden_size=2048,
        num_hidden_layers=1,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=8192,
        dflash={"lilicorr_hidden_size": 512},
    )
    src = fixtures.write_sparse_checkpoint(tmp_path / "src", cfg)  # real headers, data are file holes
    size = (src / "model.safetensors").stat().st_size
    assert size > 150e6
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("HEAVY [] EXIT 0"), result.stdout + result.stderr
    rss_mb = int(line.rsplit(" ", 1)[1])
    assert rss_mb < 150, f"peak RSS {rss_mb} MB while converting {size / 1e6:.0f} MB"
    assert (tmp_path / "out" / "model.safetensors").stat().st_size > size - 4096


def test_progress_is_off_without_a_terminal_and_draws_one_line_on_one(cli, tmp_path):
    run = cli("convert", EXAMPLE, tmp_path / "out")
    assert run.code == 0 and run.err == ""
    stream = io.StringIO()
    progress = Progress(4_000_000_000, enabled=True, stream=stream, interval=0)
    progress.advance(1_000_000_000)
    progress.note("hashing the source")
    progress.finish()
    text = stream.getvalue()
    assert "1.00 / 4.00 GB ( 25.0%)" in text and "hashing the source" in text and "\n" not in text
    quiet = io.StringIO()
    Progress(10, enabled=False, stream=quiet).advance(5)
    assert quiet.getvalue() == ""


def test_mapped_window_copies_write_the_same_bytes_as_kernel_copies(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "SMALL", 256)  # route most tensors through the large-copy paths
    monkeypatch.setattr(reader, "WINDOW", 4096)  # and through several windows each
    src = fixtures.write_checkpoint(tmp_path / "src", key_prefix="dflash_module.")
    assert cli("convert", src, tmp_path / "kernel").code == 0
    monkeypatch.setattr(reader, "KERNEL_COPY", False)
    assert cli("convert", src, tmp_path / "mapped").code == 0
    assert tree_digest(tmp_path / "kernel") == tree_digest(tmp_path / "mapped")
    before = tensors_of(src)
    assert all(before["dflash_module." + n] == v for n, v in tensors_of(tmp_path / "mapped").items())


# ---------------------------------------------------------------- write errors: the real cause, nothing left


def _output_fd(fd: int) -> bool:
    try:
        return ".convert-tmp." in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _assert_clean_failure(run, dst, message):
    assert run.code == 2, run
    assert run.err == f"lilicorr-ckpt: error: {message}\n", run
    assert not dst.exists() or dst.is_dir()
    assert not list(dst.parent.glob(f".{dst.name}.convert-*"))


def test_disk_full_during_a_mapped_window_copy_reports_enospc_not_a_buffer_error(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "SMALL", 256)  # tensors go through the mapped-window path
    monkeypatch.setattr(reader, "KERNEL_COPY", False)
    real_write = os.write

    def write(fd, data):  # the disk fills up while a window of the mapped source is being written
        if _output_fd(fd) and isinstance(getattr(data, "obj", None), mmap.mmap):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst)
    _assert_clean_failure(
        run, dst, f"cannot write the output: No space left on device: {dst} (DST was not created)"
    )
    assert "BufferError" not in run.err and "internal error" not in run.err
    assert list(tmp_path.iterdir()) == []


def test_disk_full_during_a_kernel_copy_leaves_nothing_and_creates_no_parents(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "SMALL", 256)
    monkeypatch.setattr(os, "copy_file_range", _no_space)
    dst = tmp_path / "new" / "deeper" / "out"
    run = cli("convert", EXAMPLE, dst)
    _assert_clean_failure(
        run, dst, f"cannot write the output: No space left on device: {dst} (DST was not created)"
    )
    assert list(tmp_path.iterdir()) == []  # the parents convert created for DST are gone too


def test_disk_full_while_replacing_with_force_keeps_the_previous_output(cli, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    assert cli("convert", EXAMPLE, dst).code == 0
    before = tree_digest(dst)
    monkeypatch.setattr(os, "fsync", _no_space)  # every file is flushed before the swap
    run = cli("convert", EXAMPLE, dst, "--force")
    _assert_clean_failure(
        run, dst, f"cannot write the output: No space left on device: {dst} (the previous DST is unchanged)"
    )
    assert tree_digest(dst) == before


def test_an_unwritable_parent_is_an_io_error_naming_it(cli, tmp_path, monkeypatch):
    from pathlib import Path

    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):  # root ignores permissions, so the refusal is simulated
        if ".convert-tmp." in self.name:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    dst = tmp_path / "out"
    run = cli("convert", EXAMPLE, dst)
    _assert_clean_failure(
        run, dst, f"cannot write the output: Permission denied: {tmp_path} (DST was not created)"
    )
    assert not dst.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("below", ["out", "sub/out"])
def test_a_file_where_the_parent_directory_should_be_is_an_io_error(cli, tmp_path, below):
    afile = tmp_path / "afile"
    afile.write_text("a file, not a directory")
    dst = afile / below
    run = cli("convert", EXAMPLE, dst)
    assert run.code == 2, run
    assert (
        run.err == f"lilicorr-ckpt: error: cannot write the output: Not a directory: {afile} (DST was not "
        "created)\n"
    )
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
        and afile.read_text() == "a file, not a directory"
    )


def test_an_unwritable_parent_for_real_when_not_root(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions (the simulated test covers it)")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        proc = _convert_process(EXAMPLE, parent / "out")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and f"cannot write the output: Permission denied: {parent}" in err, err
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


def _earlier_output(cli, tmp_path, name):
    dst = tmp_path / name
    assert cli("convert", EXAMPLE, dst).code == 0
    (dst / "notes.txt").write_text("the user's own file")  # what an unrestored backup would lose
    return dst, tree_digest(dst)


def test_a_force_killed_between_its_renames_is_restored_by_the_next_run(cli, tmp_path):
    # kill -9 after `rename(DST, .DST.convert-old.PID)`, before the new output moved in: no DST, the old aside
    dst, before = _earlier_output(cli, tmp_path, "out")
    old = tmp_path / ".out.convert-old.999999999"
    dst.rename(old)
    result = cli("convert", EXAMPLE, dst)  # even a run that is then refused puts it back first
    assert result.code == 4 and "already exists; pass --force" in result.err, result
    assert "restored the previous output" in result.err and ".out.convert-old.999999999" in result.err
    assert not old.exists() and tree_digest(dst) == before


def test_a_force_killed_after_the_new_output_moved_in_drops_the_old_copy(cli, tmp_path):
    dst, _ = _earlier_output(cli, tmp_path, "out")
    old = tmp_path / ".out.convert-old.999999999"
    (old / "half-deleted").mkdir(parents=True)
    result = cli("convert", EXAMPLE, dst, "--force")
    assert result.code == 0 and not old.exists() and "removed .out.convert-old.999999999" in result.err


def test_temporaries_are_matched_literally_never_as_glob_patterns(cli, tmp_path):
    # DST `model[v2]` as a pattern matches `.model2.convert-tmp.N`: another conversion's leftovers
    other = tmp_path / ".modelv.convert-old.999999999"
    other.mkdir()
    (other / "keep").write_text("another directory's backup")
    stale = tmp_path / ".model[v2].convert-tmp.999999999"
    stale.mkdir()
    assert cli("convert", EXAMPLE, tmp_path / "model[v2]").code == 0
    assert (other / "keep").exists() and not stale.exists()


def test_a_destination_name_near_the_length_limit_gets_a_temporary_that_fits(cli, tmp_path):
    # `.NAME.convert-tmp.PID` for a 240-byte NAME is over 255 bytes: the temporary's name is cut and hashed
    for length in (230, 240, 255):
        dst = tmp_path / ("d" * (length - 4) + "é" * 2)  # multi-byte characters at the cut
        assert len(dst.name.encode()) == length
        result = cli("convert", EXAMPLE, dst)
        assert result.code == 0, result
        assert (dst / "conversion.json").is_file()
        assert cli("convert", EXAMPLE, dst, "--force").code == 0  # the replacement's hidden copy fits too
        assert sorted(p.name for p in tmp_path.iterdir()) == [dst.name]
        shutil.rmtree(dst)


def test_stale_temporaries_of_a_long_destination_name_are_found(tmp_path):
    dst = tmp_path / ("x" * 250)
    stale = destination.sibling(dst, destination.TMP_TAG, pid=999999999)
    old = destination.sibling(dst, destination.OLD_TAG, pid=999999998)
    assert len(stale.name.encode()) <= 255 and len(old.name.encode()) <= 255
    stale.mkdir()
    old.mkdir()
    (old / "config.json").write_text("{}")
    other = destination.sibling(
        tmp_path / ("x" * 249 + "y"), destination.TMP_TAG, pid=999999997
    )  # same cut, other hash
    other.mkdir()
    assert destination.restore_interrupted_replacement(dst) and (dst / "config.json").is_file()
    assert destination.remove_stale_temporaries(dst) == [stale]
    assert other.exists()


@pytest.mark.parametrize("force", [False, True])
def test_a_second_convert_that_loses_the_race_for_dst_says_what_dst_holds(cli, tmp_path, monkeypatch, force):
    # two converts into one DST: the other one renames its output into place just before this one does (with
    # --force: after this one moved the previous output aside)
    dst = tmp_path / "out"
    if force:
        assert cli("convert", EXAMPLE, dst).code == 0
    real_rename = os.rename
    winner: dict[str, str] = {}

    def racing_rename(src, target):
        if Path(target) == dst and not winner:
            monkeypatch.setattr(destination.os, "rename", real_rename)  # the winner runs unhindered,
            with monkeypatch.context() as m:  # as another process (its own temporary)
                m.setattr(destination.os, "getpid", lambda: 1)
                convert(str(EXAMPLE), str(dst), ConvertOptions(quiet=True))
            winner.update(tree_digest(dst))
        return real_rename(src, target)

    monkeypatch.setattr(destination.os, "rename", racing_rename)
    result = cli("convert", EXAMPLE, dst, *(["--force"] if force else []))
    assert winner and result.code == 4, result
    assert "was written by another process while converting" in result.err
    assert "nothing is left at DST" not in result.err and "Traceback" not in result.err
    assert tree_digest(dst) == winner  # the winner's output is intact
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the loser's temporary is gone
