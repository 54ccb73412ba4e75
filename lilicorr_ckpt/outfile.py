"""Report files named on the command line (validate --output, smoke --out): checked before any work, so a bad path
costs nothing, and written atomically, so a failed write leaves neither a partial file nor a temporary one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from lilicorr_ckpt.errors import InputError, UsageError


def check_output_path(out: str, option: str, example: str) -> Path:
    """Refuse (exit 4) a path whose directory is missing or not writable, or that is not a file name."""
    path = Path(out).expanduser()
    if path.is_dir():
        raise UsageError(f"{option} {out} is a directory; give a file name, e.g. {Path(out) / example}")
    parent = path.parent
    if not parent.exists():
        raise UsageError(f"{option} {out}: directory {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{option} {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {out}: directory {parent} is not writable")
    if path.exists() and not path.is_file():
        raise UsageError(f"{option} {out} exists and is not a regular file")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_output(data: str | bytes, out: str, mode: int | None = None) -> None:
    """Write data to out through a temporary sibling renamed over it; an OSError is exit 2, naming out. `mode`:
    the permissions the file gets (default: the usual 0666 less the umask), e.g. those of the file it replaces.

    The temporary comes from tempfile in out's directory: an unpredictable name created with O_EXCL (never
    through a planted symlink), renamed into place, so a symlink already at `out` is replaced, never followed."""
    path = Path(out).expanduser()
    payload = data.encode() if isinstance(data, str) else data
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent or ".")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(
                f.fileno(), 0o666 & ~_umask() if mode is None else mode
            )  # a report file: the usual mode
            f.write(payload)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
