"""Execute a plan: stream tensor bytes into a temporary sibling of DST, then rename it into place.

Copies go through memory-mapped windows of the source (never the whole file), written sequentially;
a background thread hashes the source files at the same time (hashlib and file I/O release the GIL).
Each shard's header is written last: its length was fixed with a same-length hash placeholder, so
the bytes are deterministic. Peak memory is one window per thread plus one block of a repaired module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import shutil
import stat
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lilicorr_ckpt.checkpoint.stwrite import header_bytes
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.convert.earlier import RECORD_NAME, EarlierOutput, is_convert_output, read_record, survey
from lilicorr_ckpt.convert.plan import OutTensor, Plan, shard_metadata
from lilicorr_ckpt.convert.repair import BadScales, dequantize_blocks
from lilicorr_ckpt.errors import ConversionRefused, InputError, UsageError

WINDOW = 64 << 20  # bytes of source mapped at once
SMALL = 1 << 20  # tensors up to this size are read with pread instead of a mapping
TMP_TAG = ".convert-tmp."
OLD_TAG = ".convert-old."
REF_TAG = ".convert-ref."  # --verify's loadable copy of the source
DELAY_ENV = "LILICORR_CONVERT_TEST_DELAY"  # seconds to sleep after each tensor (tests kill a slow write)
MMAP_ENV = "LILICORR_CONVERT_MMAP_COPY"  # set: copy through mapped windows even where copy_file_range works
FALLBACK_ERRNOS = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)  # copy_file_range


def _write_all(fd: int, data: bytes | memoryview) -> None:
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
        return _hash_file(path, stop)
    except OSError as exc:
        raise source_error(exc, path) from None


def _hash_file(path: Path, stop: threading.Event | None) -> str:
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
        self.kernel_copy = kernel_copy and hasattr(os, "copy_file_range") and not os.environ.get(MMAP_ENV)
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
            _write_all(out_fd, self.read(info, 0, info.nbytes))
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
                with memoryview(m) as view, view[pos - base:length] as window:
                    _write_all(out_fd, window)
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


# ---------------------------------------------------------------- destination handling

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
            raise UsageError(f"DST {dst} already exists; pass --force to replace it, or choose another directory")
        if not dst.is_dir() or dst.is_symlink():
            raise UsageError(f"DST {dst} exists and is not a directory; refusing to replace it even with --force")
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
            pid_text = entry.name[len(prefix):]
            if entry.name.startswith(prefix) and pid_text.isdigit() and entry.is_dir(follow_symlinks=False) \
                    and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
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
        return (f"{_shown_names(stuck)} could not be moved back into {dst}: "
                f"{'it is' if len(stuck) == 1 else 'they are'} in {kept}; move them back by hand")
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
                raise InputError(f"an interrupted `convert --force` left the previous output in {old}, and it "
                                 f"cannot be moved back to {dst}: {exc.strerror or exc}; move it back by hand") from None
            notes.append(f"restored the previous output {dst} from {old.name} (an earlier `convert --force` "
                         "was interrupted while replacing it)")
        elif dst.is_dir() and not dst.is_symlink() and is_convert_output(dst):
            shutil.rmtree(old, ignore_errors=True)
            notes.append(f"removed {old.name}: the previous output an interrupted `convert --force` had already "
                         f"replaced with the new {dst}")
        else:
            notes.append(f"left {old.name} in place: it holds the output an interrupted `convert --force` was "
                         f"replacing, and {dst} is not a convert output; move one of them away")
    for tmp in _dead_siblings(dst, (TMP_TAG,)):
        names = moved_entries(tmp)
        if not names:
            continue
        stuck = _give_back(tmp, dst, names)
        back = [n for n in names if n not in stuck]
        if back:
            notes.append(f"moved {_shown_names(back)} back into {dst} from {tmp.name} (an earlier `convert --force` "
                         "was interrupted while keeping them)")
        if stuck:
            notes.append(f"left {tmp.name} in place: it holds {_shown_names(stuck)} from {dst}, which an interrupted "
                         f"`convert --force` was keeping, and {dst} "
                         f"{'has entries of those names' if dst.is_dir() else 'is not a directory'}; move them "
                         "back by hand")
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
            if parent.exists() or parent.is_symlink():  # a file (or a dangling link) where a directory must be
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
        raise UsageError(f"DST {dst} was written by another process while converting (a second convert into the "
                         "same DST?); it was left as that process wrote it, and this output was discarded") from None


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
    return UsageError(f"DST {dst} was written by another process while converting (a second convert into the "
                      f"same DST?); it was left as that process wrote it, {previous}, and this output was discarded")


def move_into_place(tmp: Path, dst: Path, force: bool, generated: set[str],
                    earlier: EarlierOutput | None = None) -> list[str]:
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
            raise UsageError(f"DST {dst} was replaced by something that is not a directory while converting; "
                             "nothing was replaced")
        now = survey(dst, generated, earlier)  # again: it may have changed while converting
        kept = now.kept
        taken = [n for n in kept if os.path.lexists(tmp / n)]
        if taken:  # the convert's own files of those names were skipped when the plan was made; a new entry
            raise UsageError(f"DST {dst} gained {_shown_names(taken)} while converting, which this conversion "
                             "writes too; nothing was replaced: move them away, then rerun")
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


# ---------------------------------------------------------------- writing


def _dump_json(path: Path, doc: Any) -> str:
    """Write `doc` as JSON; returns the sha256 of the bytes written."""
    data = (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest()


def write_json(path: Path, doc: Any) -> None:
    _dump_json(path, doc)


def generated_files(plan: Plan) -> list[str]:
    """The files a conversion generates in DST (besides conversion.json): shards, index, config files."""
    return ([s.file for s in plan.shards] + (["model.safetensors.index.json"] if plan.index is not None else [])
            + ["config.json"] + (["hf_quant_config.json"] if plan.hf_quant_config is not None else []))


def planned_files(plan: Plan) -> list[str]:
    """Every file a conversion writes into DST except conversion.json, which lists them (`written`)."""
    return sorted(generated_files(plan) + list(plan.copies))


def _write_tensor(t: OutTensor, reader: SourceReader, fd: int, progress: Progress,
                  repair_errors: dict[str, float]) -> None:
    if t.op == "copy":
        assert t.source is not None
        reader.copy(t.source, fd, progress)
        return
    worst = 0.0
    assert len(t.shape) == 2
    try:
        for block, err in dequantize_blocks(t.kind, t.inputs, (t.shape[0], t.shape[1]), t.dtype, reader.read,
                                            t.group_size):
            _write_all(fd, block)
            progress.advance(len(block))
            worst = max(worst, err)
    except BadScales as exc:
        raise ConversionRefused(f"cannot repair {t.canonical.removesuffix('.weight')}: its scales are corrupt",
                                [str(exc)]) from None
    repair_errors[t.canonical] = worst


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
            kernel = hasattr(os, "copy_file_range") and not os.environ.get(MMAP_ENV)
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
                    _write_all(out_fd, data)
                    n = len(data)
                if n <= 0:
                    raise InputError(f"cannot read the source: {src} shrank while it was copied")
                pos += n
            os.fsync(out_fd)
        finally:
            os.close(out_fd)
    finally:
        os.close(in_fd)


def write_plan(plan: Plan, tmp: Path, progress: Progress) -> dict[str, Any]:
    """Write every file of the plan into `tmp` (other files of the source included). Returns facts for
    conversion.json (hashes, repair errors). A write error propagates as OSError (see output_error)."""
    delay = float(os.environ.get(DELAY_ENV, "0") or 0)
    root = plan.source.root
    reader = SourceReader(root)
    repair_errors: dict[str, float] = {}
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lilicorr-hash")
    stop = threading.Event()
    hashes: dict[str, Future[str]] = {f: pool.submit(hash_file, root / f, stop) for f in plan.source_files}
    try:
        for shard in plan.shards:
            path = tmp / shard.file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.lseek(fd, shard.header_length, os.SEEK_SET)
                for entry in shard.entries:
                    _write_tensor(plan.tensors[entry.name], reader, fd, progress, repair_errors)
                    if delay:
                        time.sleep(delay)
            finally:
                os.close(fd)
        progress.note("hashing the source")
        source_hashes = {f: fut.result() for f, fut in hashes.items()}
        metadata = shard_metadata(source_hashes)
        written: dict[str, Future[str] | str] = {}
        for shard in plan.shards:
            head = header_bytes(shard.entries, metadata)
            if len(head) != shard.header_length:  # pragma: no cover - the placeholder guarantees it
                raise RuntimeError(f"{shard.file}: header length changed from {shard.header_length} to {len(head)}")
            fd = os.open(tmp / shard.file, os.O_WRONLY)
            try:
                os.pwrite(fd, head, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            written[shard.file] = pool.submit(_hash_file, tmp / shard.file, stop)  # what a later --force checks
        written["config.json"] = _dump_json(tmp / "config.json", plan.config)
        if plan.hf_quant_config is not None:
            written["hf_quant_config.json"] = _dump_json(tmp / "hf_quant_config.json", plan.hf_quant_config)
        if plan.index is not None:
            written["model.safetensors.index.json"] = _dump_json(tmp / "model.safetensors.index.json", plan.index)
        if plan.copies:
            progress.note(f"copying {len(plan.copies)} other files")
        for name in plan.copies:
            copy_file(root / name, tmp / name)
            written[name] = pool.submit(_hash_file, tmp / name, stop)
        progress.note("hashing the output")
        output_hashes = {name: h if isinstance(h, str) else h.result() for name, h in sorted(written.items())}
    finally:
        stop.set()  # an interrupted run does not wait for a multi-GB hash to finish
        pool.shutdown(wait=True, cancel_futures=True)
        reader.close()
    return {"source_sha256": source_hashes, "written": output_hashes,
            "repair_rounding": {k: repair_errors[k] for k in sorted(repair_errors)}}
