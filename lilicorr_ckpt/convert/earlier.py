"""What `convert --force` may replace in an existing DST: only the files an earlier convert wrote, unchanged.

An earlier output's conversion.json lists every file that convert wrote, with its sha256 (`written`). --force
replaces those files and keeps every other entry of DST: a README.md that `card` wrote, a hand-edited model
card, the `.git/` and `.gitattributes` of a Hub clone. They are moved into the new output when it is swapped in.

- A weight, index or config file convert wrote that was changed since is refused by name: replacing it would
  lose the change, and keeping it beside new weights would give a mixed checkpoint.
- A file convert copied from SRC (model card, tokenizer, ...) that was changed since is the user's now: it is
  kept, and the new conversion does not copy SRC's file of that name over it.
- An entry convert did not write whose name this conversion writes (a hand-made hf_quant_config.json, say) is
  refused by name: convert never overwrites the user's files.
- conversion.json written by an older lilicorr-ckpt has no `written` list: its weights, index and config files
  are replaced as before; the files it copied cannot be told apart from edited ones, so they are refused by
  name; every other entry is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.source import read_small
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.errors import InputError, UsageError

RECORD_NAME = "conversion.json"
RECORD_LIMIT = 64 << 20  # bytes; a record lists a line per rename, repair and drop
RECORD_JSONS = (
    "config.json",
    "hf_quant_config.json",
    "model.safetensors.index.json",
)  # what convert generates
SHOWN_ENTRIES = 4  # entries of DST named in a refusal
HASH_BLOCK = 8 << 20

Signature = tuple[int, int, int, int, int]  # (device, inode, size, mtime_ns, ctime_ns) of a file when hashed


class EarlierOutput(msgspec.Struct, kw_only=True):
    """DST as --force found it."""

    record: bytes  # its conversion.json, byte for byte (empty for an empty DST)
    replaced: list[str]  # entries the earlier convert wrote, unchanged since: replaced by the new output
    kept: list[str]  # every other entry (names as in DST): moved into the new output
    changed_copies: list[str]  # of `kept`: files convert copied from SRC and that were changed since
    signatures: dict[str, Signature]  # replaced files whose sha256 was checked


def _signature(st: os.stat_result) -> Signature:
    return (
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )  # ctime: no utime() can reset it


def file_sha256(path: Path) -> str:
    """sha256 of a regular file, never following a symlink and never opening a FIFO or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        h = hashlib.sha256()
        while block := os.read(fd, HASH_BLOCK):
            h.update(block)
        return h.hexdigest()
    finally:
        os.close(fd)


def read_record(dst: Path) -> tuple[dict[str, Any] | None, bytes, str]:
    """(the conversion.json convert wrote into DST, its bytes, "") or (None, b"", why DST holds none)."""
    path = dst / RECORD_NAME
    if not os.path.lexists(path):
        return None, b"", f"it has no {RECORD_NAME}"
    try:
        data = read_small(path, f"{path}", RECORD_LIMIT)
    except InputError as exc:
        return None, b"", f"its {RECORD_NAME} cannot be read: {exc}"
    try:
        doc = json.loads(data)
    except ValueError:
        return None, b"", f"its {RECORD_NAME} is not JSON"
    if not (
        isinstance(doc, dict) and doc.get("tool") == "lilicorr-ckpt" and isinstance(doc.get("output"), dict)
    ):
        return None, b"", f"its {RECORD_NAME} was not written by lilicorr-ckpt convert"
    return doc, data, ""


def is_convert_output(path: Path) -> bool:
    """Whether a directory holds the conversion.json this tool writes."""
    return read_record(path)[0] is not None


def _plain_names(items: Any) -> list[str]:
    """The entries of a record's list (or map) that can name an entry of DST: one path component each."""
    if not isinstance(items, list | dict):
        return []
    return [
        n for n in items if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n and "\0" not in n
    ]


class _Owned(msgspec.Struct, kw_only=True):
    hashes: dict[str, str | None]  # what convert wrote -> its sha256 (None: the record has no checksum)
    copies: set[str]  # of those, the files copied from SRC
    version: str  # of the lilicorr-ckpt that wrote the record


def _owned(doc: dict[str, Any]) -> _Owned:
    version = str(doc.get("version") or "an older version")
    other_files = doc.get("other_files")
    other = other_files if isinstance(other_files, dict) else {}
    copies = set(_plain_names(other.get("copied")))
    written = doc.get("written")
    if isinstance(written, dict):
        hashes = {
            n: (h if isinstance(h, str) else None) for n, h in written.items() if n in _plain_names(written)
        }
        return _Owned(hashes=hashes, copies=copies & hashes.keys(), version=version)
    # an older record: its generated files by name, without checksums
    generated = set(RECORD_JSONS) | set(_plain_names(doc["output"].get("files")))
    return _Owned(hashes=dict.fromkeys(sorted(generated | copies)), copies=copies, version=version)


def _entries(dst: Path) -> list[os.DirEntry[str]]:
    try:
        return sorted(os.scandir(dst), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"cannot read DST {dst}: {exc.strerror or exc}") from None


def _shown(names: list[str]) -> str:
    return shorten(names, SHOWN_ENTRIES, quote="")


def _label(entry: os.DirEntry[str]) -> str:
    return entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")


def survey(dst: Path, generated: set[str], earlier: EarlierOutput | None = None) -> EarlierOutput:
    """What --force replaces and keeps in the existing directory DST, or a UsageError naming what it would lose.

    `generated` are the weight, index and config files the new conversion writes (a kept entry of DST of such
    a name is refused; one that SRC has a copy of is kept, and the copy skipped). `earlier` (the survey made before converting): files
    whose (device, inode, size, mtime, ctime) did not change since are not hashed again."""
    entries = _entries(dst)
    if not entries:
        return EarlierOutput(record=b"", replaced=[], kept=[], changed_copies=[], signatures={})
    doc, data, why = read_record(dst)
    if doc is None:
        names = [_label(e) for e in entries]
        raise UsageError(
            f"DST {dst} is not empty and is not an earlier convert output ({why}; it holds "
            f"{_shown(names)}); --force replaces only an empty directory or a previous convert "
            "output: choose another DST, or move its contents away first"
        )
    owned = _owned(doc)
    replaced: list[str] = []
    kept: list[str] = []
    changed_copies: list[str] = []
    changed: list[str] = []
    unverifiable: list[str] = []  # copies an older record names without checksums
    signatures: dict[str, Signature] = {}
    for entry in entries:
        name = entry.name
        if name == RECORD_NAME:
            replaced.append(name)
            continue
        if name not in owned.hashes:
            kept.append(name)
            continue
        expected = owned.hashes[name]
        if expected is None:  # an older record
            (unverifiable if name in owned.copies else replaced).append(name)
            continue
        unchanged = False
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                sig = _signature(st)
                before = earlier.signatures.get(name) if earlier is not None else None
                unchanged = before == sig or file_sha256(Path(entry.path)) == expected
                if unchanged:
                    signatures[name] = sig
        except OSError:  # unreadable, or swapped for a FIFO: not what convert wrote
            unchanged = False
        if unchanged:
            replaced.append(name)
        elif name in owned.copies:
            kept.append(name)
            changed_copies.append(name)
        else:
            changed.append(_label(entry))
    problems = []
    if changed:
        problems.append(
            f"{_shown(changed)} {'was' if len(changed) == 1 else 'were'} changed since convert wrote "
            f"{'it' if len(changed) == 1 else 'them'} (the sha256 in {RECORD_NAME} differs), and "
            "--force would lose the change"
        )
    if unverifiable:
        problems.append(
            f"its {RECORD_NAME} comes from lilicorr-ckpt {owned.version}, which recorded no checksums: "
            f"--force cannot tell whether {_shown(unverifiable)}, copied by that convert, "
            "were changed since (by `card`, or by hand)"
        )
    clashes = [n for n in kept if n in generated]
    if clashes:
        problems.append(
            f"{_shown(clashes)} {'is' if len(clashes) == 1 else 'are'} not from the earlier convert, and "
            "this one writes a file of that name"
        )
    if problems:
        raise UsageError(
            f"DST {dst}: " + "; ".join(problems) + ". --force replaces only the files an earlier "
            "convert wrote and keeps everything else: move those away (or delete them), then rerun"
        )
    return EarlierOutput(
        record=data, replaced=replaced, kept=kept, changed_copies=changed_copies, signatures=signatures
    )
