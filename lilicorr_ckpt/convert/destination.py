"""The destination's atomics for convert: DST is written as a hidden sibling `.DST.convert-tmp.PID` and renamed into
place when complete, so DST is either absent, the previous output, or the new one, never half of either.

`--force` over an earlier output first moves the entries of DST that convert did not write into the new output,
then swaps: DST aside (`.DST.convert-old.PID`), the new output in, the old removed. A run killed at any step
leaves siblings the next run recognises by their tag and process id and puts back (restore_interrupted_replacement)
or removes (remove_stale_temporaries); entries of DST are never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.convert.earlier import RECORD_NAME, EarlierOutput, is_convert_output, read_record, survey
from lilicorr_ckpt.errors import InputError, UsageError

TMP_TAG = ".convert-tmp."
OLD_TAG = ".convert-old."
REF_TAG = ".convert-ref."  # --verify's loadable copy of the source

KEPT_TAG = ".convert-kept."  # entries of DST that could not be moved back after a failed --force (named)


def output_error(exc: OSError, dst: Path, tmp: Path | None = None, *, existed: bool = False) -> InputError:
    """`cannot write the output: <reason>: <path> (<what DST holds now>)`; a path inside the temporary directory is
    named as it would be in DST (the temporary directory is gone by the time the user reads this). `existed`:
    DST was there before this run (a --force replacement), and a failed run leaves it as it was."""
    where: Path = dst
    if exc.filename:
        where = Path(os.fsdecode(exc.filename))
        if tmp is not None and (where == tmp or where.is_relative_to(tmp)):
            where = dst / where.relative_to(tmp)
    if existed:
        state = "the previous DST is unchanged"
    elif os.path.lexists(dst):
        state = "DST was written by another process meanwhile and is left as it is"
    else:
        state = "DST was not created"
    return InputError(f"cannot write the output: {exc.strerror or exc}: {where} ({state})")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_destination(src_root: Path, dst: Path, force: bool, generated: set[str]) -> EarlierOutput | None:
    """Refuse any DST that would write into, or delete, the source; refuse an existing DST without --force, and
    with --force one whose replacement would lose anything (see lilicorr_ckpt.convert.earlier). Returns what
    --force replaces and keeps (None when DST does not exist)."""
    dst_abs = dst.resolve()
    if dst_abs == src_root or dst_abs.is_relative_to(src_root):
        raise UsageError(f"DST {dst} is inside the source {src_root}; convert never writes into its source")
    if dst.exists() or dst.is_symlink():
        if not force:
            raise UsageError(
                f"DST {dst} already exists; pass --force to replace it, or choose another directory"
            )
        if not dst.is_dir() or dst.is_symlink():
            raise UsageError(
                f"DST {dst} exists and is not a directory; refusing to replace it even with --force"
            )
        if src_root.is_relative_to(dst_abs):
            raise UsageError(f"the source {src_root} is inside DST {dst}; --force would delete it")
        return survey(dst, generated)
    return None


NAME_MAX = 255  # bytes in one path component on Linux and macOS file systems
_PID_DIGITS = 10


def _sibling_stem(dst: Path) -> str:
    """`.DST`, the start of every hidden sibling's name. A DST name so long that `.DST.convert-tmp.PID` would
    not fit in one path component is cut at a character boundary and told apart by a hash of the whole name."""
    stem = f".{dst.name}"
    room = NAME_MAX - max(len(tag) for tag in (TMP_TAG, OLD_TAG, REF_TAG, KEPT_TAG)) - _PID_DIGITS
    if len(os.fsencode(stem)) <= room:
        return stem
    digest = "~" + hashlib.sha256(os.fsencode(dst.name)).hexdigest()[:8]
    cut = stem
    while len(os.fsencode(cut)) > room - len(digest):
        cut = cut[:-1]
    return cut + digest


def sibling(dst: Path, tag: str, pid: int | None = None) -> Path:
    """The hidden sibling `.DST<tag><pid>` of DST (this process's by default)."""
    return dst.parent / f"{_sibling_stem(dst)}{tag}{os.getpid() if pid is None else pid}"


def _dead_siblings(dst: Path, tags: tuple[str, ...]) -> list[Path]:
    """Directories `.DST<tag><pid>` beside DST whose process is gone, matched literally (DST may hold glob
    characters such as `model[v2]`: no pattern is ever built from it)."""
    parent = dst.parent
    prefixes = [f"{_sibling_stem(dst)}{tag}" for tag in tags]
    try:
        entries = list(os.scandir(parent)) if parent.is_dir() else []
    except OSError:  # an unreadable parent: make_temporary reports it
        return []
    found = []
    for entry in entries:
        for prefix in prefixes:
            pid_text = entry.name[len(prefix) :]
            if (
                entry.name.startswith(prefix)
                and pid_text.isdigit()
                and entry.is_dir(follow_symlinks=False)
                and int(pid_text) != os.getpid()
                and not _pid_alive(int(pid_text))
            ):
                found.append(Path(entry.path))
    return sorted(found)


def moved_entries(tmp: Path) -> list[str]:
    """The entries of DST that a --force run moved into its finished temporary directory `tmp`: everything there
    that its conversion.json does not list as written. A temporary without a record (not finished) has none:
    entries are moved in only after the record is written."""
    doc, _, _ = read_record(tmp)
    if doc is None or not isinstance(doc.get("written"), dict):
        return []
    written = set(doc["written"]) | {RECORD_NAME}
    try:
        return sorted(e.name for e in os.scandir(tmp) if e.name not in written)
    except OSError:
        return []


def _give_back(tmp: Path, dst: Path, names: list[str]) -> list[str]:
    """Move `names` from tmp back into the directory DST; returns those that could not be (DST gone, or a
    name taken there meanwhile)."""
    stuck = []
    for name in names:
        target = dst / name
        try:
            if not dst.is_dir() or dst.is_symlink() or os.path.lexists(target):
                raise FileExistsError(name)
            os.rename(tmp / name, target)
        except OSError:
            stuck.append(name)
    return stuck


def _keep_aside(tmp: Path, dst: Path, stuck: list[str]) -> Path:
    """The temporary directory still holding entries of DST, renamed to `.DST.convert-kept.PID` so that nothing
    removes it; returns the new name."""
    kept = sibling(dst, KEPT_TAG)
    n = 0
    while os.path.lexists(kept):
        n += 1
        kept = dst.parent / f"{sibling(dst, KEPT_TAG).name}-{n}"
    os.rename(tmp, kept)
    return kept


def discard_temporary(tmp: Path, dst: Path) -> str | None:
    """Remove this run's temporary directory after a failure. Entries of DST that a --force run had already moved
    into it go back into DST first; any that cannot are kept in a named sibling, and the note says where."""
    names = moved_entries(tmp) if tmp.is_dir() else []
    stuck = _give_back(tmp, dst, names) if names else []
    if stuck:
        try:
            kept = _keep_aside(tmp, dst, stuck)
        except OSError:
            kept = tmp
        return (
            f"{_shown_names(stuck)} could not be moved back into {dst}: "
            f"{'it is' if len(stuck) == 1 else 'they are'} in {kept}; move them back by hand"
        )
    shutil.rmtree(tmp, ignore_errors=True)
    return None


def _shown_names(names: list[str]) -> str:
    return shorten(names, 6, quote="")


def restore_interrupted_replacement(dst: Path) -> list[str]:
    """First thing convert does, undoing what a `convert --force` killed midway left behind:
    - the previous output moved to `.DST.convert-old.PID` and no DST: put back (and said so). With a DST in
      place the new output was moved in before the kill, and the old copy is what was being deleted: removed.
    - entries of DST (the user's own files) moved into its finished `.DST.convert-tmp.PID`: moved back into DST,
      so that the stale temporary can be removed without them."""
    notes = []
    for old in _dead_siblings(dst, (OLD_TAG,)):
        if not dst.exists() and not dst.is_symlink():
            try:
                os.rename(old, dst)
            except OSError as exc:
                raise InputError(
                    f"an interrupted `convert --force` left the previous output in {old}, and it "
                    f"cannot be moved back to {dst}: {exc.strerror or exc}; move it back by hand"
                ) from None
            notes.append(
                f"restored the previous output {dst} from {old.name} (an earlier `convert --force` "
                "was interrupted while replacing it)"
            )
        elif dst.is_dir() and not dst.is_symlink() and is_convert_output(dst):
            shutil.rmtree(old, ignore_errors=True)
            notes.append(
                f"removed {old.name}: the previous output an interrupted `convert --force` had already "
                f"replaced with the new {dst}"
            )
        else:
            notes.append(
                f"left {old.name} in place: it holds the output an interrupted `convert --force` was "
                f"replacing, and {dst} is not a convert output; move one of them away"
            )
    for tmp in _dead_siblings(dst, (TMP_TAG,)):
        names = moved_entries(tmp)
        if not names:
            continue
        stuck = _give_back(tmp, dst, names)
        back = [n for n in names if n not in stuck]
        if back:
            notes.append(
                f"moved {_shown_names(back)} back into {dst} from {tmp.name} (an earlier `convert --force` "
                "was interrupted while keeping them)"
            )
        if stuck:
            notes.append(
                f"left {tmp.name} in place: it holds {_shown_names(stuck)} from {dst}, which an interrupted "
                f"`convert --force` was keeping, and {dst} "
                f"{'has entries of those names' if dst.is_dir() else 'is not a directory'}; move them "
                "back by hand"
            )
    return notes


def remove_stale_temporaries(dst: Path) -> list[Path]:
    """Temporary siblings left by a convert that was killed (its process is gone); never the previous output
    (`restore_interrupted_replacement` runs first and puts that back), never one that still holds entries of DST."""
    removed = []
    for path in _dead_siblings(dst, (TMP_TAG, REF_TAG)):
        if moved_entries(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def make_temporary(dst: Path) -> tuple[Path, list[Path]]:
    """(the temporary sibling of DST, the missing parent directories created for it, outermost first).
    Errors are `cannot write the output: <reason>: <path>`, with nothing left behind."""
    missing: list[Path] = []
    parent = dst.parent
    try:
        while not parent.is_dir():
            if (
                parent.exists() or parent.is_symlink()
            ):  # a file (or a dangling link) where a directory must be
                raise output_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent)), dst)
            missing.append(parent)
            if parent.parent == parent:
                break
            parent = parent.parent
    except OSError as exc:  # an ancestor that cannot be looked into
        raise output_error(exc, dst) from None
    created: list[Path] = []
    try:
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except OSError as exc:
                raise output_error(_named(exc, directory.parent), dst) from None
            created.append(directory)
        tmp = sibling(dst, TMP_TAG)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        except OSError as exc:
            raise output_error(_named(exc, dst.parent), dst) from None
    except BaseException:
        remove_created(created)
        raise
    return tmp, created


def _named(exc: OSError, path: Path) -> OSError:
    """The error about creating an entry, reported for the directory it was created in (what the user fixes)."""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
        return OSError(exc.errno, exc.strerror, str(path))
    return exc


def remove_created(created: list[Path]) -> None:
    """Remove the parent directories make_temporary created (innermost first) if they are still empty."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            break


def fsync_path(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_new(tmp: Path, dst: Path) -> None:
    """Rename the finished output onto DST. Another process (a second convert into the same DST, say) may have
    put a directory there since the checks: that one is left as it is, and the error says so."""
    try:
        os.rename(tmp, dst)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise UsageError(
            f"DST {dst} was written by another process while converting (a second convert into the "
            "same DST?); it was left as that process wrote it, and this output was discarded"
        ) from None


def _lost_race(dst: Path, old: Path, tmp: Path, kept: list[str]) -> UsageError:
    """--force moved the previous output aside, then another process put its own output at DST. That output is
    left as it is; the previous one is dropped as --force asked, unless DST is not a convert output (then it is
    kept beside DST, and named). The entries of DST this run was keeping go into the new DST."""
    if is_convert_output(dst):
        shutil.rmtree(old, ignore_errors=True)
        previous = "the previous output was removed, as --force asked"
    else:
        previous = f"the previous output is kept in {old}"
    stuck = _give_back(tmp, dst, kept)
    if kept and not stuck:
        previous += f", {_shown_names(kept)} (DST's own files) were moved into it"
    elif stuck:
        previous += f", {_shown_names(stuck)} (DST's own files) are kept in {_keep_aside(tmp, dst, stuck)}"
    return UsageError(
        f"DST {dst} was written by another process while converting (a second convert into the "
        f"same DST?); it was left as that process wrote it, {previous}, and this output was discarded"
    )


def move_into_place(
    tmp: Path, dst: Path, force: bool, generated: set[str], earlier: EarlierOutput | None = None
) -> list[str]:
    """Swap the finished output in at DST. With --force over an earlier output, the entries of DST that convert
    did not write are first moved into the new output (they are listed in no `written` of its record, which is
    how an interrupted run finds them again), then DST is renamed aside, the new output renamed in and the old
    one removed. Returns the entries kept."""
    fsync_path(tmp)
    kept: list[str] = []
    if dst.exists() or dst.is_symlink():
        if not force:
            raise UsageError(f"DST {dst} appeared while converting; nothing was replaced")
        if not dst.is_dir() or dst.is_symlink():
            raise UsageError(
                f"DST {dst} was replaced by something that is not a directory while converting; "
                "nothing was replaced"
            )
        now = survey(dst, generated, earlier)  # again: it may have changed while converting
        kept = now.kept
        taken = [n for n in kept if os.path.lexists(tmp / n)]
        if taken:  # the convert's own files of those names were skipped when the plan was made; a new entry
            raise UsageError(
                f"DST {dst} gained {_shown_names(taken)} while converting, which this conversion "
                "writes too; nothing was replaced: move them away, then rerun"
            )
        with contextlib.suppress(OSError):
            os.chmod(tmp, stat.S_IMODE(os.stat(dst).st_mode))  # DST keeps its permissions
        for name in kept:
            os.rename(dst / name, tmp / name)  # an error: discard_temporary moves the others back
        if kept:
            fsync_path(tmp)
        old = sibling(dst, OLD_TAG)
        try:
            os.rename(dst, old)
        except FileNotFoundError:  # another process moved DST away since the check: nothing to keep
            _rename_new(tmp, dst)
        else:
            try:
                _rename_new(tmp, dst)
            except UsageError:  # another process wrote DST after the previous output was moved aside
                raise _lost_race(dst, old, tmp, kept) from None
            except BaseException:
                os.rename(old, dst)
                raise
            shutil.rmtree(old, ignore_errors=True)  # the new DST is in place; a leftover is cleaned next run
    else:
        _rename_new(tmp, dst)
    # DST is complete and in place; a failure here leaves only the durability of its directory entry unconfirmed
    with contextlib.suppress(OSError):
        fsync_path(dst.parent)
    return kept
