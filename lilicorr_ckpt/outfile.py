"""Files the commands write (validate's reports, inspect's summary, the card, smoke's profile, report's
rendering, the training recipe's data and run files): one rule for where they may go, and one writer.

Where: an output is checked before any work (so a bad path costs nothing) and again when it is written. It is
refused (UsageError, exit 4) when its directory is missing or read-only, when it is a directory, and when it
would write over an input of the same command (`Inputs`): a file the command reads (a profile, a training log,
a report being rendered, a waiver file, a probe file, training data), or a model file of a directory it reads
(the checkpoint's or the target's config.json, weights, index, tokenizer, card; `model_file_name`), however it
is spelled: `..`, a symlink at the output or above it (compared by resolved path) or a hard link (compared by
(st_dev, st_ino)). A command that updates one of its inputs in place on purpose (card's README.md) says so with
`Inputs.own`.

How: `atomic_writer` writes through a temporary that tempfile.mkstemp creates in the destination directory (an
unpredictable name, O_EXCL and O_NOFOLLOW: never through a planted symlink), fsyncs it, renames it into place
(a symlink already at the output is replaced, never followed) and fsyncs the directory; a failed write leaves
neither a partial file nor a temporary.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from lilicorr_ckpt.errors import InputError, UsageError

# The files a model directory's readers open by name (the checkpoint reader, the target and tokenizer loaders,
# the waiver search, card): an output there would change or destroy the model, so none may be written over.
MODEL_SUFFIXES = (
    ".safetensors",
    ".gguf",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".pkl",
    ".pickle",
    ".msgpack",
    ".h5",
    ".jinja",
    ".model",
    ".tiktoken",
)
MODEL_NAMES = (
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "lilicorr.toml",
    "pyproject.toml",
    "README.md",
)
_SCAN_LIMIT = 4096  # entries of an input directory looked at for hard links


def model_file_name(name: str) -> bool:
    """Whether a file of this name in a model directory is part of the model (config.json, generation_config.json,
    hf_quant_config.json and the other *config.json, the weights and their index, the tokenizer's files, the
    waiver file, the card)."""
    return (
        name in MODEL_NAMES
        or name.endswith(MODEL_SUFFIXES)
        or name.endswith("config.json")
        or name.endswith(".index.json")
    )


def _resolved(path: str | Path) -> str | None:
    try:
        return os.path.realpath(os.path.expanduser(os.fspath(path)))
    except (OSError, ValueError):  # a NUL byte in the name
        return None


def _identity(path: str | Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a regular file (symlinks followed), or None."""
    try:
        st = os.stat(os.path.expanduser(os.fspath(path)))
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _inside(path: str, directory: str) -> bool:
    return path != directory and path.startswith(directory.rstrip(os.sep) + os.sep)


class Inputs:
    """What a command reads, so that no output of it writes over any of it (`clash`)."""

    def __init__(self) -> None:
        self._files: list[tuple[str, str]] = []  # (what, resolved path)
        self._dirs: list[tuple[str, str]] = []
        self._own: set[str] = set()  # resolved paths the command updates in place on purpose

    def add(self, spec: str | Path | None, what: str) -> Inputs:
        """A path the command reads, described as `what` ("the checkpoint", "the --profile file"): a directory
        (a model directory: its model files are inputs), or a file. A spec that names neither on this machine
        (a Hub repo id, a bundled probe set, nothing yet) adds nothing."""
        if spec is None or spec == "" or spec == "-":
            return self
        resolved = _resolved(spec)
        if resolved is None:
            return self
        if os.path.isdir(resolved):
            self._dirs.append((what, resolved))
        elif os.path.exists(resolved):
            self._files.append((what, resolved))
        return self

    def own(self, path: str | Path) -> Inputs:
        """An input this command updates in place on purpose (card's PATH/README.md): not refused."""
        resolved = _resolved(path)
        if resolved is not None:
            self._own.add(resolved)
        return self

    def _identities(self) -> dict[tuple[int, int], str]:
        """(st_dev, st_ino) -> what, for every input file and every model file at the top of an input directory."""
        found: dict[tuple[int, int], str] = {}
        for what, path in self._files:
            if path not in self._own and (ident := _identity(path)) is not None:
                found.setdefault(ident, what)
        own = {i for p in self._own if (i := _identity(p)) is not None}
        for what, directory in self._dirs:
            try:
                with os.scandir(directory) as entries:
                    for n, entry in enumerate(entries):
                        if n >= _SCAN_LIMIT:
                            break
                        if not model_file_name(entry.name):
                            continue
                        ident = _identity(entry.path)
                        if ident is not None and ident not in own:
                            found.setdefault(ident, f"{entry.name} of {what}")
            except OSError:
                continue
        return found

    def clash(self, out: str | Path) -> str | None:
        """Why writing `out` would write over an input ("is config.json of the checkpoint"), or None."""
        resolved = _resolved(out)
        if resolved is None or resolved in self._own:
            return None
        plain = os.path.abspath(os.path.expanduser(os.fspath(out)))
        how = "is" if resolved == plain else "resolves to"
        for what, path in self._files:
            if resolved == path:
                return f"{how} {what} ({path})"
        for what, directory in self._dirs:
            if _inside(resolved, directory) and model_file_name(os.path.basename(resolved)):
                rel = os.path.relpath(resolved, directory)
                return f"{how} {rel} of {what} ({resolved})"
        ident = _identity(out)
        if ident is not None:
            what_file = self._identities().get(ident)
            if what_file is not None:
                return f"is a hard link to {what_file} (the same file: device {ident[0]}, inode {ident[1]})"
        return None

    def refuse(self, out: str | Path, option: str, fix: str = "write the output to another file") -> None:
        """UsageError (exit 4) when `out` would write over an input."""
        why = self.clash(out)
        if why is not None:
            raise UsageError(
                f"{option} {out} {why}, an input of this command: writing there would destroy it; {fix}"
            )


def resolved(path: str | Path) -> str:
    """`path` with `~`, `..` and every symlink resolved (never raises: a symlink loop resolves as far as it goes),
    for comparing outputs with each other."""
    return _resolved(path) or os.path.abspath(os.fspath(path))


def check_output_path(out: str, option: str, example: str, inputs: Inputs | None = None) -> Path:
    """Refuse (exit 4) a path whose directory is missing or not writable, that is not a file name, or that would
    write over one of `inputs`."""
    try:
        return _check_output_path(out, option, example, inputs)
    except (OSError, RuntimeError, ValueError) as exc:
        raise _unusable(out, option, exc, "file name") from None


def _unusable(out: str, option: str, exc: Exception, what: str) -> UsageError:
    """The usage error for an output path the system would not take: an OSError (a name too long for the file
    system, a permission or a symlink loop on the way) by its strerror; pathlib's symlink loop (RuntimeError) or a
    NUL byte (ValueError) by its message."""
    if isinstance(exc, OSError):
        return UsageError(f"{option} {out}: {exc.strerror or exc}; give another {what}")
    return UsageError(f"{option} {out}: cannot use this path ({exc}); give another {what}")


NAME_MAX = 255  # bytes in one path component on Linux and macOS file systems, where pathconf cannot say


def _name_max(path: Path) -> int:
    """The longest name the file system holding `path`'s nearest existing directory takes."""
    for directory in (path.absolute(), *path.absolute().parents):
        try:
            if directory.is_dir():
                return int(os.pathconf(directory, "PC_NAME_MAX"))
        except (OSError, ValueError):
            break
    return NAME_MAX


def check_output_name(out: str, option: str, what: str = "file name") -> Path:
    """Refuse (UsageError, exit 4) a path the file system cannot name, before any work: a component longer than
    it takes (an output under a missing directory found out only once the directory was made), a NUL byte, or a
    lookup that fails for another reason than a missing entry (a symlink loop on the way, a permission). For an
    output that is a directory of the command's own (check_output_path refuses a directory)."""
    path = Path(out).expanduser()
    longest = _name_max(path)
    for part in path.parts:
        if len(os.fsencode(part)) > longest:
            raise UsageError(
                f"{option} {out}: a name of {len(os.fsencode(part))} bytes is longer than the file system "
                f"takes ({longest}); give a shorter {what}"
            )
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # a new output, or one under a file: the command names that
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte
        raise _unusable(out, option, exc, what) from None
    return path


SYSTEM_DIRS = ("/dev", "/proc", "/sys")  # their entries are devices, links to them or the kernel's files


def _system_path(path: Path) -> bool:
    """A path under /dev, /proc or /sys, as written or with its directory's symlinks resolved."""
    for spelled in (os.path.abspath(path.parent), _resolved(path.parent) or ""):
        if any(spelled == d or spelled.startswith(d + os.sep) for d in SYSTEM_DIRS):
            return True
    return False


def _check_output_path(out: str, option: str, example: str, inputs: Inputs | None) -> Path:
    path = Path(out).expanduser()
    if _system_path(path):
        # /dev/stdout resolves to whatever stdout is (a regular file when redirected): the atomic writer's rename
        # would then replace the system's link itself, and nothing would reach stdout
        hint = ", or leave the option out to print to stdout" if option in ("-o", "--output") else ""
        raise UsageError(
            f"{option} {out} is a system path (/dev, /proc, /sys): outputs are written as a new file renamed "
            f"into place, which would replace it; give a regular file name{hint}"
        )
    if path.is_dir():
        raise UsageError(f"{option} {out} is a directory; give a file name, e.g. {Path(out) / example}")
    parent = path.parent
    if parent.is_symlink() and not parent.exists():
        raise UsageError(f"{option} {out}: {parent} is a dangling symlink or a symlink loop")
    if not parent.exists():
        raise UsageError(f"{option} {out}: directory {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{option} {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {out}: directory {parent} is not writable")
    if path.exists() and not path.is_file():
        raise UsageError(f"{option} {out} exists and is not a regular file")
    if inputs is not None:
        inputs.refuse(out, option)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (where the file system lets a directory be opened and synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(out: str | Path, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file whose content replaces `out` when the block ends without an exception (nothing changes
    otherwise). `mode`: the permissions the file gets (default: 0666 less the umask). OSErrors propagate.

    The temporary is tempfile.mkstemp's in out's directory (an unpredictable name created O_EXCL | O_NOFOLLOW,
    so never through a planted symlink); it is fsynced, renamed over `out` (a symlink at `out` is replaced, not
    followed) and the directory fsynced. A rename that fails (a directory at `out`) raises an OSError naming
    `out`, not the temporary."""
    path = Path(out).expanduser()
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=directory)
    pending: str | None = tmp
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except OSError as exc:  # named by `out`, not by the temporary (removed below)
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        pending = None
        _fsync_directory(directory)
    finally:
        if pending is not None:
            with contextlib.suppress(OSError):
                os.unlink(pending)


def write_output(
    data: str | bytes,
    out: str,
    mode: int | None = None,
    *,
    inputs: Inputs | None = None,
    option: str = "--output",
) -> None:
    """Write data to out through atomic_writer; an OSError is exit 2, naming out. `mode`: the permissions the
    file gets (default: the usual 0666 less the umask), e.g. those of the file it replaces. `inputs`: checked
    again just before the write (exit 4 when out now resolves to one of them)."""
    if inputs is not None:
        inputs.refuse(out, option)
    payload = data.encode() if isinstance(data, str) else data
    try:
        with atomic_writer(out, mode) as f:
            f.write(payload)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
