"""Reading the source for convert: tensor bytes into an output file without passing through Python where the
kernel can copy them (copy_file_range), else through memory-mapped windows (never the whole file), and the
sha256 of every source file, hashed by a background thread while the tensors are written.

Read errors are InputError naming the source file (`cannot read the source: ...`); write errors propagate as
OSError for the caller to report against DST (destination.output_error).
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from pathlib import Path

from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import InputError

WINDOW = 64 << 20  # bytes of source mapped at once
SMALL = 1 << 20  # tensors up to this size are read with pread instead of a mapping
KERNEL_COPY = hasattr(os, "copy_file_range")  # False: copy through mapped windows / pread instead
FALLBACK_ERRNOS = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)  # copy_file_range


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data`. Every view taken here is released before an error propagates: a memory map with
    a live view cannot be closed, and the BufferError would hide the real error (ENOSPC)."""
    with memoryview(data) as view, view.cast("B") as whole:
        done, total = 0, whole.nbytes
        while done < total:
            with whole[done:] as rest:
                done += os.write(fd, rest)


def source_error(exc: OSError, path: Path | str) -> InputError:
    return InputError(f"cannot read the source: {exc.strerror or exc}: {path}")


class Cancelled(Exception):
    pass


def hash_file(path: Path, stop: threading.Event | None = None) -> str:
    try:
        return sha256_file(path, stop)
    except OSError as exc:
        raise source_error(exc, path) from None


def sha256_file(path: Path, stop: threading.Event | None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= SMALL:
            h.update(f.read())
            return h.hexdigest()
        offset = 0
        while offset < size:
            if stop is not None and stop.is_set():
                raise Cancelled(path.name)
            length = min(WINDOW, size - offset)
            with mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as m:
                view = memoryview(m)
                try:
                    h.update(view)
                finally:
                    view.release()
            offset += length
    return h.hexdigest()


class SourceReader:
    """Read-only access to the source files, one descriptor each."""

    def __init__(self, root: Path, kernel_copy: bool = True):
        self.root = root
        self.fds: dict[str, int] = {}
        self.kernel_copy = kernel_copy and KERNEL_COPY
        self._copied = 0

    def fd(self, rel: str) -> int:
        if rel not in self.fds:
            try:
                self.fds[rel] = os.open(self.root / rel, os.O_RDONLY)
            except OSError as exc:
                raise source_error(exc, self.root / rel) from None
        return self.fds[rel]

    def read(self, info: TensorInfo, offset: int, length: int) -> bytes:
        try:
            data = os.pread(self.fd(info.file), length, info.start + offset)
        except OSError as exc:
            raise source_error(exc, self.root / info.file) from None
        if len(data) != length:
            raise InputError(f"{info.file} is shorter than its header says ({info.name})")
        return data

    def copy(self, info: TensorInfo, out_fd: int, progress: Progress) -> None:
        if info.nbytes <= SMALL:
            write_all(out_fd, self.read(info, 0, info.nbytes))
            progress.advance(info.nbytes)
            return
        fd = self.fd(info.file)
        if self.kernel_copy:
            try:
                self._kernel_copy(fd, info, out_fd, progress)
                return
            except OSError as exc:  # another filesystem or kernel: fall back to mapped windows
                if exc.errno not in FALLBACK_ERRNOS:
                    raise
                self.kernel_copy = False
                os.lseek(out_fd, -self._copied, os.SEEK_CUR)
                progress.advance(-self._copied)
        gran = mmap.ALLOCATIONGRANULARITY
        pos, end = info.start, info.end
        while pos < end:
            base = pos - pos % gran
            length = min(end, base + WINDOW) - base
            try:
                m = mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=base)
            except OSError as exc:
                raise source_error(exc, self.root / info.file) from None
            with m:  # closing needs every view released first (the with-blocks below do it, errors included)
                m.madvise(mmap.MADV_SEQUENTIAL)
                with memoryview(m) as view, view[pos - base : length] as window:
                    write_all(out_fd, window)
            progress.advance(base + length - pos)
            pos = base + length

    def _kernel_copy(self, fd: int, info: TensorInfo, out_fd: int, progress: Progress) -> None:
        """copy_file_range in WINDOW-sized steps: the bytes never enter this process."""
        self._copied = 0
        pos = info.start
        while pos < info.end:
            n = os.copy_file_range(fd, out_fd, min(WINDOW, info.end - pos), pos)
            if n <= 0:
                raise InputError(f"{info.file} is shorter than its header says ({info.name})")
            pos += n
            self._copied += n
            progress.advance(n)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def copy_file(src: Path, dst: Path) -> None:
    """Copy a whole file (copy_file_range, or pread/write across filesystems). Read errors name the source;
    write errors propagate as OSError for the caller to report."""
    try:
        in_fd = os.open(src, os.O_RDONLY)
    except OSError as exc:
        raise source_error(exc, src) from None
    try:
        out_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            size = os.fstat(in_fd).st_size
            kernel = KERNEL_COPY
            pos = 0
            while pos < size:
                if kernel:
                    try:
                        n = os.copy_file_range(in_fd, out_fd, min(WINDOW, size - pos), pos)
                    except OSError as exc:
                        if exc.errno not in FALLBACK_ERRNOS:
                            raise
                        kernel = False
                        continue
                else:
                    try:
                        data = os.pread(in_fd, min(SMALL, size - pos), pos)
                    except OSError as exc:
                        raise source_error(exc, src) from None
                    write_all(out_fd, data)
                    n = len(data)
                if n <= 0:
                    raise InputError(f"cannot read the source: {src} shrank while it was copied")
                pos += n
            os.fsync(out_fd)
        finally:
            os.close(out_fd)
    finally:
        os.close(in_fd)
