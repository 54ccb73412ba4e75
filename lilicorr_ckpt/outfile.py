"""Report files named on the command line (validate --output, smoke --out): checked before any work, so a bad path
costs nothing, and written atomically, so a failed write leaves neither a partial file nor a temporary one."""

from __future__ import annotations

import contextlib
import os
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


def write_output(data: str | bytes, out: str) -> None:
    """Write data to out through a hidden temporary sibling renamed over it; an OSError is exit 2, naming out."""
    path = Path(out).expanduser()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
