"""The one guarded way to read a file the tool was pointed at: checkpoint configs and headers, reports, smoke
profiles and baselines, probe files, waiver files, target and tokenizer files, training state.

A path that is not a regular file is refused by name before it is opened: a FIFO blocks the reader forever, a
character device such as /dev/zero never ends, a directory or socket is not data. A regular file is refused when it
is larger than the cap its caller gives, and read with that cap too, so a file that grows while being read cannot
get past it. The stat that judges the path and the open that reads it are two steps, so the open is non-blocking
(a FIFO swapped in between cannot hang it) and the descriptor is checked again with fstat.

Every refusal is an InputError (exit 2) naming the file as the caller describes it (`what`) and, for a size, the
cap. Torch-free and numpy-free: the command line imports this before anything heavy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from lilicorr_ckpt.errors import InputError

MiB = 1 << 20
_OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
)


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, by name (None for a regular file)."""
    for test, name in (
        (stat.S_ISREG, None),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def describe_bytes(n: int) -> str:
    """`4194304 bytes (4 MiB)`: exact, and readable at a glance."""
    if n >= MiB:
        return f"{n} bytes ({n / MiB:g} MiB)"
    return f"{n} bytes"


def too_large(what: str, size: int, max_bytes: int) -> InputError:
    return InputError(f"{what} is {size} bytes; the limit for this file is {describe_bytes(max_bytes)}")


def regular_size(path: Path | str, *, what: str) -> int:
    """The size of `path`, refused (InputError) unless it is a regular file (symlinks followed). Nothing is
    opened: a device is never touched. Symlink loops and other OSErrors are messages too."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None
    except (RuntimeError, ValueError) as exc:  # a symlink loop on some versions; a NUL byte in the name
        raise InputError(f"cannot read {what}: {exc}") from None
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise InputError(f"{what} is {kind}, not a regular file; refusing to open it")
    return st.st_size


def open_regular_file(path: Path | str, *, what: str, max_bytes: int | None = None) -> BinaryIO:
    """A binary file object for a regular file of at most `max_bytes` (None: any size), opened without blocking
    and checked again once open (a path swapped for a FIFO or device after the stat is refused, never read).
    The caller closes it (`with open_regular_file(...) as f`); a cap the caller gives is the caller's to keep
    when reading (read_regular_file does)."""
    size = regular_size(path, what=what)
    if max_bytes is not None and size > max_bytes:
        raise too_large(what, size, max_bytes)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:
            raise InputError(f"{what} became {kind} while being opened; refusing to read it")
        if max_bytes is not None and st.st_size > max_bytes:
            raise too_large(what, st.st_size, max_bytes)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_stream(stream: BinaryIO, *, what: str, max_bytes: int) -> bytes:
    """At most `max_bytes` of an open stream (standard input), refused when there is more."""
    try:
        data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} is larger than the limit for this input, {describe_bytes(max_bytes)}")
    return data


def read_regular_file(path: Path | str, *, what: str, max_bytes: int) -> bytes:
    """The whole of a regular file of at most `max_bytes`, read with that cap."""
    try:
        with open_regular_file(path, what=what, max_bytes=max_bytes) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{what} grew past {describe_bytes(max_bytes)} while being read")
    return data


def decode_utf8(data: bytes, *, what: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped), or an InputError naming the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{what} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def read_regular_text(path: Path | str, *, what: str, max_bytes: int) -> str:
    """read_regular_file decoded as UTF-8 (decode_utf8)."""
    return decode_utf8(read_regular_file(path, what=what, max_bytes=max_bytes), what=what)
