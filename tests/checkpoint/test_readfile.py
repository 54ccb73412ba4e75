"""The guarded reader every input goes through: FIFOs, devices, directories and sockets are refused by name without
blocking; sizes are capped before and while reading; the stat/open swap is caught on the open descriptor."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from lilicorr_ckpt.checkpoint import readfile
from lilicorr_ckpt.checkpoint.readfile import (
    open_regular_file,
    read_regular_file,
    read_regular_text,
    read_stream,
)
from lilicorr_ckpt.errors import InputError

from helpers import raised_within


def _refusal(fn, *args, **kw) -> str:
    """The InputError message of fn(*args, **kw), which must come back within 5 s (a FIFO read would block)."""
    raised = raised_within(5, fn, *args, **kw)
    assert isinstance(raised, InputError), raised
    return str(raised)


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "report.json"
    path.write_bytes(b'{"a": 1}')
    assert read_regular_file(path, what="report report.json", max_bytes=8) == b'{"a": 1}'
    with open_regular_file(path, what="report report.json") as f:
        assert f.read() == b'{"a": 1}'


def test_a_fifo_is_refused_by_name_without_blocking(tmp_path):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    message = _refusal(read_regular_file, fifo, what=f"report {fifo}", max_bytes=1 << 20)
    assert message == f"report {fifo} is a FIFO (named pipe), not a regular file; refusing to open it"
    assert "FIFO" in _refusal(open_regular_file, fifo, what="state.pt")


def test_a_device_is_refused_and_never_opened(tmp_path):
    link = tmp_path / "tokenizer.json"
    link.symlink_to("/dev/zero")
    assert "tokenizer.json is a character device" in _refusal(
        read_regular_file, link, what="tokenizer.json", max_bytes=1 << 20
    )
    assert "a character device" in _refusal(read_regular_text, "/dev/zero", what="/dev/zero", max_bytes=10)


def test_a_directory_and_a_socket_are_refused(tmp_path):
    assert "probes is a directory" in _refusal(read_regular_file, tmp_path, what="probes", max_bytes=10)
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        assert "s is a socket" in _refusal(read_regular_file, path, what="s", max_bytes=10)
    finally:
        server.close()


def test_a_missing_file_or_a_symlink_loop_is_a_message(tmp_path):
    assert (
        _refusal(read_regular_file, tmp_path / "nope", what="waivers nope", max_bytes=10)
        == "cannot read waivers nope: No such file or directory"
    )
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "cannot read loop" in _refusal(read_regular_file, loop, what="loop", max_bytes=10)


def test_a_file_over_the_cap_is_refused_naming_the_file_and_the_cap(tmp_path):
    path = tmp_path / "profile.json"
    path.write_bytes(b"x" * (3 << 20))
    assert _refusal(read_regular_file, path, what=f"--profile {path}", max_bytes=2 << 20) == (
        f"--profile {path} is {3 << 20} bytes; the limit for this file is {2 << 20} bytes (2 MiB)"
    )
    assert "the limit for this file is 1000 bytes" in _refusal(
        open_regular_file, path, what="p", max_bytes=1000
    )


def test_the_cap_holds_while_reading_when_stat_understates_the_size():
    # /proc files report st_size 0 and hold more: the read itself is capped, the cap is named
    message = _refusal(read_regular_file, "/proc/self/maps", what="maps", max_bytes=10)
    assert message == "maps grew past 10 bytes while being read"


def test_a_fifo_swapped_in_after_the_stat_is_refused_on_the_open_descriptor(tmp_path, monkeypatch):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    monkeypatch.setattr(readfile, "regular_size", lambda path, what: 0)  # the stat saw a regular file
    message = _refusal(read_regular_file, fifo, what="config.json", max_bytes=100)
    assert message == "config.json became a FIFO (named pipe) while being opened; refusing to read it"


def test_a_stream_is_read_with_the_cap(tmp_path):
    path = tmp_path / "in"
    path.write_bytes(b"y" * 11)
    with path.open("rb") as f:
        assert "stdin is larger than the limit for this input, 10 bytes" in _refusal(
            read_stream, f, what="stdin", max_bytes=10
        )
    with path.open("rb") as f:
        assert read_stream(f, what="stdin", max_bytes=11) == b"y" * 11


def test_text_is_utf8_with_the_bad_byte_named(tmp_path):
    path = tmp_path / "w.toml"
    path.write_bytes(b"\xef\xbb\xbfa = 1\n")
    assert read_regular_text(path, what="w.toml", max_bytes=100) == "a = 1\n"
    path.write_bytes(b"a = '\xff'\n")
    assert (
        _refusal(read_regular_text, path, what="w.toml", max_bytes=100)
        == "w.toml is not UTF-8 text (byte 5: b'\\xff')"
    )


def test_the_checkpoint_guards_are_the_same_reader(tmp_path):
    from lilicorr_ckpt.checkpoint.source import read_small, require_regular

    fifo = tmp_path / "hf_quant_config.json"
    os.mkfifo(fifo)
    assert "FIFO" in _refusal(read_small, fifo, "hf_quant_config.json")
    assert "FIFO" in _refusal(require_regular, Path(fifo), "hf_quant_config.json")
