"""The step GEMM's tuned tile shapes, kept between processes.

Tuning a weight shape (tuner.tune) compiles and times every candidate tile: on a fresh machine that is
most of a smoke run's first minute. The choice depends only on the GPU, the Triton version, the candidate set and
the GEMM (its shape, epilogue and dtypes), never on the row count, so it can be stored and reused:

- a per-user file, `$XDG_CACHE_HOME/lilicorr/step_tiles.json` (default `~/.cache/...`), or the path in
  LILICORR_TILE_CACHE: written after every tuning, read by every later process;
- a table shipped with the package (tiles.json beside this module), measured on the GPUs named in it for the
  shapes of the bundled example models, so that a first process on such a GPU skips their tuning.

LILICORR_TILE_CACHE=off uses neither: every process tunes every shape (what the benches that study tuning
want). A stored tile is used only if it is one the tuner could have chosen (a candidate tile, the shape's
default, a listed split count), so a damaged or planted file can cost speed but never run a tile the kernel was
not written for; an unreadable file is ignored with one warning. The files are read through the checkpoint
reader's guarded reader (`read_table`): a FIFO, device, socket or directory is never opened for reading (it
would hang or never end), a file past TABLE_LIMIT is not read, and JSON nested past what the parser takes is
ignored like any other damaged table.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lilicorr_ckpt.checkpoint.readfile import decode_utf8, read_regular_file

from ... import settings

FORMAT = 1  # bump when the kernel changes what a tile means
BUNDLED = Path(__file__).with_name("tiles.json")
ENV = settings.TILE_CACHE.name
TILE_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
DIVISIONS = ("SPLIT", "STREAM")  # split-K slices, stream-K programs per SM (step_triton)

TABLE_LIMIT = 8 << 20  # bytes of a tile table (the bundled one is 3 kB; a machine's own, a few kB per GPU)

_loaded: dict[str, dict[str, dict[str, int]]] | None = None  # device key -> shape key -> tile
_warned: set[str] = set()


def warn_once(warned: set[str], key: str, message: str, stacklevel: int = 4) -> None:
    """A RuntimeWarning, once per `key` in `warned` (a damaged or unwritable file is named once, not per read)."""
    if key not in warned:
        warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _warn(key: str, message: str) -> None:
    warn_once(_warned, key, message, stacklevel=5)


def user_path() -> Path | None:
    """The per-user file, or None when LILICORR_TILE_CACHE=off (settings.py)."""
    return settings.tile_cache()


def read_table(path: Path, what: str, limit: int, warned: set[str] | None = None) -> Any | None:
    """The JSON in a table file, or None when there is none (no file yet) or it cannot be used: then `warn`s
    once, naming the file and why. Never blocks and never reads more than `limit` bytes: the file must be a regular
    file (symlinks followed), opened without blocking, of at most `limit` bytes."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing stored yet
        return None
    except (OSError, ValueError):
        pass  # a symlink loop, a permission: the guarded reader says which
    try:
        data = read_regular_file(path, what="it", max_bytes=limit)
        text = decode_utf8(data, what="it")
    except Exception as exc:  # noqa: BLE001 - the reader's InputError (the runtime imports only the reader)
        why = str(exc)  # "it is a FIFO (named pipe), not a regular file; ...": a cache never stops a run
    else:
        try:
            return json.loads(text)
        except RecursionError:  # nested past what the parser takes
            why = "its JSON is nested deeper than a table ever is"
        except ValueError as exc:  # not JSON
            why = f"it is not JSON ({str(exc)[:200]})"
    warn_once(
        _warned if warned is None else warned, str(path), f"ignoring {what} {path}: {why}", stacklevel=4
    )
    return None


REPLACE_LIMIT = 64 << 20  # bytes of an existing file write_json reads to see that it is a table of ours


def _a_table(path: Path, size: int) -> bool:
    """Whether the regular file at `path` (of `size` bytes) is empty or one of our tables (a JSON object with
    "format" and "devices"): what write_json may replace."""
    if size == 0:
        return True
    if size > REPLACE_LIMIT:
        return False
    try:
        data = json.loads(read_regular_file(path, what="it", max_bytes=REPLACE_LIMIT))
    except Exception:  # noqa: BLE001 - not readable, not UTF-8, not JSON, nested too deep: not a table
        return False
    return isinstance(data, dict) and "format" in data and isinstance(data.get("devices"), (dict, list))


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically (an unpredictable temporary beside it, created O_EXCL |
    O_NOFOLLOW by mkstemp, fsynced, then renamed over it). A FIFO, device or directory at `path` is left alone
    (OSError): a cache file is never anything but a regular file. So is a regular file that is not one of our
    tables (a LILICORR_TILE_CACHE pointed at a model's weights or config by mistake): a cache never destroys
    what it did not write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file; not replacing it")
        if not _a_table(path, st.st_size):
            raise OSError(f"{path} holds something other than a lilicorr table; not replacing it")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def device_key(device: torch.device, candidates: Any, splits: Any, rows: int) -> str:
    """The GPU (name and compute capability), the Triton version and a fingerprint of the candidate set and of
    the row count tiles are timed at (a tile chosen another way is not reused)."""
    import triton

    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    fingerprint = hashlib.sha256(repr((FORMAT, candidates, splits, rows)).encode()).hexdigest()[:12]
    return f"{torch.cuda.get_device_name(index)} sm{major}{minor} triton {triton.__version__} tiles {fingerprint}"


def shape_key(key: tuple) -> str:
    """The tuner's key of a GEMM (tuner.linear_key: N, K, epilogue flags, dtypes, two retired constants) as text."""
    return "|".join(str(part) for part in key)


def _read(path: Path) -> dict[str, dict[str, dict[str, int]]]:
    data = read_table(path, "the tile cache", TABLE_LIMIT)
    if data is None:
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(data.get("devices"), dict)
    ):
        _warn(str(path), f"ignoring the tile cache {path}: not a format-{FORMAT} tile table")
        return {}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for device, shapes in data["devices"].items():
        if isinstance(device, str) and isinstance(shapes, dict):
            out[device] = {k: v for k, v in shapes.items() if isinstance(k, str) and isinstance(v, dict)}
    return out


def _table() -> dict[str, dict[str, dict[str, int]]]:
    global _loaded
    if _loaded is None:
        table = _read(BUNDLED)
        path = user_path()
        if path is not None:
            for device, shapes in _read(path).items():  # the user's own measurements win
                table.setdefault(device, {}).update(shapes)
        _loaded = table
    return _loaded


def reset() -> None:
    """Forget what was read (tests; a changed LILICORR_TILE_CACHE)."""
    global _loaded
    _loaded = None


def lookup(device: str, shape: str, allowed: Callable[[dict[str, int]], bool]) -> dict[str, int] | None:
    """The stored tile for (device key, shape key), if there is one and `allowed` accepts it."""
    if user_path() is None:
        return None
    tile = _table().get(device, {}).get(shape)
    if tile is None:
        return None
    if set(tile) - {*TILE_KEYS, *DIVISIONS} or not all(type(tile.get(k)) is int for k in TILE_KEYS):
        return None
    clean = {k: tile[k] for k in TILE_KEYS}
    for k in DIVISIONS:
        if k in tile:
            if type(tile[k]) is not int:
                return None
            clean[k] = tile[k]
    return clean if allowed(clean) else None


def remember(device: str, shape: str, tile: dict[str, int]) -> None:
    """Store a tuned tile in the per-user file (merged with what other processes wrote; written atomically). A
    file that cannot be written costs a warning, never the run."""
    path = user_path()
    if path is None:
        return
    _table().setdefault(device, {})[shape] = dict(tile)
    try:
        on_disk = _read(path)
        on_disk.setdefault(device, {})[shape] = dict(tile)
        write_json(path, {"format": FORMAT, "devices": on_disk})
    except OSError as exc:
        _warn(f"write {path}", f"could not write the tile cache {path} ({exc}); later processes tune again")
