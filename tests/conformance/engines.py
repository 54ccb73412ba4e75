"""The released engine wheels the conformance suite judges validate by.

Only a wheel's Python sources are needed (its `.py` and `.json` files outside `.dist-info/`), unpacked into
`.cache/engines/<name>-<version>/` (gitignored, never committed) and marked `.complete`. They are fetched one of
two ways:

- members only (the default): the wheel is found through PyPI's simple JSON API (`/simple/<name>/`,
  `Accept: application/vnd.pypi.simple.v1+json`; the manylinux x86_64 or py3-none-any wheel), its zip central
  directory is read with HTTP Range requests, and only the wanted members are fetched (neighbouring members in
  one request). Each member is checked against its zip CRC and its sha256 in the wheel's RECORD. A vLLM wheel
  is ~320 MB; its sources ~11-15 MB in about a dozen requests;
- the whole wheel: when the server does not answer a Range request with 206, when the JSON API is not served
  (then `pip download`), or with `LILICORR_ENGINE_FETCH=wheel`. The wheel is kept in `.cache/engines/wheels/`, and a
  wheel already there is unpacked without any network access.

Under `CI=true` a failed fetch fails the run instead of skipping it.

The releases are the project's own data: every release `lilicorr_ckpt/runtimes/` models (RELEASES), so a bump is
one entry there (docs/validate.md, "Bumping an engine"). z-lab's `dflash` is pinned here: it is a producer, not an
engine validate judges.

    versions(name)           the releases the suite executes, oldest first
    sources(name, version)   the directory holding the release's top-level packages (fetched on first use)
    wheel(name, version)     the whole wheel file (downloaded on first use)
    deciding(name)           the files of a release that decide loading: what the harness executes or extracts
                             from, and what the fuzzer reads config keys from (one list: the bump tool diffs it)
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lilicorr_ckpt.runtimes import RELEASES

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "engines"

# the packages the suite executes that are not engines validate judges
PRODUCERS = {"dflash": "0.1.0"}

SIMPLE_INDEX = os.environ.get("LILICORR_SIMPLE_INDEX", "https://pypi.org/simple")
TIMEOUT = 60  # seconds, per HTTP request
# members closer than this in the wheel are fetched in one request (the bytes between them are discarded)
COALESCE = 64 << 10


def versions(name: str) -> tuple[str, ...]:
    """Every release of `name` the suite executes, oldest first (an engine's: the ones validate models)."""
    if name in PRODUCERS:
        return (PRODUCERS[name],)
    return tuple(p.version for p in RELEASES[name] if p.released)


def newest(name: str) -> str:
    return versions(name)[-1]


def _fail_or_skip(message: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def _one_at_a_time(lock: Path) -> Iterator[None]:
    """Test workers asking for the same wheel at once: the first fetches (or unpacks) it, the others wait and
    reuse it. Without fcntl (Windows) each worker does its own, as before."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wanted(member: str) -> bool:
    """The members the suite reads: the Python sources and their JSON data (model configs)."""
    return member.endswith((".py", ".json")) and ".dist-info/" not in member


# ---------------------------------------------------------------- the whole wheel


def _cached_wheel(name: str, version: str) -> Path | None:
    found = sorted((CACHE / "wheels").glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def wheel(name: str, version: str | None = None) -> Path:
    """The wheel of `name` at `version` (its newest supported release when None), downloaded on first use."""
    version = version or newest(name)
    found = _cached_wheel(name, version)
    if found:
        return found
    folder = CACHE / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    with _one_at_a_time(folder / f".{stem}-{version}.lock"):
        found = _cached_wheel(name, version)
        if found:  # another worker downloaded it while this one waited
            return found
        try:
            return _download_from_index(name, version, folder)
        except IndexUnavailable:
            return _pip_download(name, version, folder, stem)
        except (OSError, FetchError) as exc:
            _fail_or_skip(f"could not download {name}=={version}: {exc}")


def _download_from_index(name: str, version: str, folder: Path) -> Path:
    """The wheel the JSON API names, streamed to a file of this process's own, its sha256 checked, renamed in."""
    found = find_wheel(name, version)
    partial = folder / f".{found['filename']}.partial-{os.getpid()}"
    digest = hashlib.sha256()
    with _get(found["url"]) as response, open(partial, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    expected = (found.get("hashes") or {}).get("sha256")
    if expected and digest.hexdigest() != expected:
        partial.unlink()
        raise FetchError(f"{found['filename']}: sha256 {digest.hexdigest()} where the index says {expected}")
    target = folder / found["filename"]
    os.replace(partial, target)  # atomic; a wheel another worker put there first is the same
    return target


def _pip_download(name: str, version: str, folder: Path, stem: str) -> Path:
    # into a folder of this process's own, then renamed in: test workers running side by side never see a wheel
    # half written by another
    partial = folder / f".{stem}-{version}.partial-{os.getpid()}"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["-d", str(partial), f"{name}=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _fail_or_skip(f"could not download {name}=={version}: {exc}")
    fetched = sorted(partial.glob(f"{stem}-{version}-*.whl"))
    if done.returncode != 0 or not fetched:
        _fail_or_skip(f"could not download {name}=={version}: {done.stderr.strip()[-500:]}")
    os.replace(fetched[0], folder / fetched[0].name)
    shutil.rmtree(partial, ignore_errors=True)
    return sorted(folder.glob(f"{stem}-{version}-*.whl"))[0]


# ---------------------------------------------------------------- the sources


def sources(name: str, version: str | None = None) -> Path:
    """A directory holding the wheel's Python sources (the wheel's top-level packages inside it), for `version`
    (the newest supported release when None)."""
    version = version or newest(name)
    root = CACHE / f"{name}-{version}"
    marker = root / ".complete"
    if marker.exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with _one_at_a_time(CACHE / f".{name}-{version}.lock"):
        if marker.exists():  # another worker unpacked it while this one waited
            return root
        partial = CACHE / f".{name}-{version}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            note = _fill(name, version, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        (partial / ".complete").write_text(note)
        try:
            partial.rename(root)
        except OSError:  # another process unpacked it first (no fcntl: no lock)
            shutil.rmtree(partial, ignore_errors=True)
            if not marker.exists():
                raise
    return root


def _fill(name: str, version: str, partial: Path) -> str:
    """Unpack the wanted members into `partial`; the marker's text (the wheel's file name first)."""
    whl = _cached_wheel(name, version)
    if whl is None and os.environ.get("LILICORR_ENGINE_FETCH", "members") == "members":
        try:
            stats = fetch_members(name, version, partial)
            return (
                f"{stats['wheel']}\nmembers only: {stats['members']} members, {stats['bytes']} bytes in "
                f"{stats['requests']} requests\n"
            )
        except (RangesNotServed, IndexUnavailable):
            shutil.rmtree(partial, ignore_errors=True)  # the whole wheel, below
        except (OSError, FetchError, zipfile.BadZipFile) as exc:
            _fail_or_skip(f"could not fetch the sources of {name}=={version}: {exc}")
    whl = whl or wheel(name, version)
    with zipfile.ZipFile(whl) as z:
        for member in z.namelist():
            if _wanted(member):
                z.extract(member, partial)
    return f"{whl.name}\n"


# ---------------------------------------------------------------- members only, by HTTP Range


class FetchError(RuntimeError):
    """The index or the file server answered, but not with what was asked (a wrong hash, a short range)."""


class RangesNotServed(FetchError):
    """The file server answers a Range request with the whole file: fetch the wheel instead."""


class IndexUnavailable(FetchError):
    """The index does not serve the simple JSON API (a mirror): let pip find the wheel."""


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"User-Agent": "lilicorr-ckpt-conformance", **(headers or {})})


def _get(url: str, headers: dict[str, str] | None = None, attempts: int = 3) -> Any:
    """urlopen with a few retries on a dropped connection or a server error."""
    for attempt in range(attempts):
        try:
            return urllib.request.urlopen(_request(url, headers), timeout=TIMEOUT)
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == attempts - 1:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt == attempts - 1:
                raise
        time.sleep(1 + attempt)
    raise AssertionError("unreachable")


_PYTHON_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def find_wheel(name: str, version: str) -> dict[str, Any]:
    """The simple JSON API's entry for the release's wheel: py3-none-any, else manylinux x86_64 (this
    interpreter's tag, then abi3, then any), never a yanked one."""
    url = f"{SIMPLE_INDEX.rstrip('/')}/{name}/"
    try:
        with _get(url, {"Accept": "application/vnd.pypi.simple.v1+json"}) as response:
            kind = response.headers.get("Content-Type", "")
            if "json" not in kind:
                raise IndexUnavailable(f"{url} answers {kind or 'no content type'}, not the JSON API")
            files = json.loads(response.read())["files"]
    except urllib.error.HTTPError as exc:
        raise IndexUnavailable(f"{url}: HTTP {exc.code}") from exc
    stem = re.escape(name.replace("-", "_"))
    pattern = re.compile(rf"^{stem}-{re.escape(version)}-([^-]+)-([^-]+)-([^-]+)\.whl$", re.IGNORECASE)

    def rank(entry: dict[str, Any]) -> tuple[int, int] | None:
        match = pattern.match(entry["filename"])
        if not match or entry.get("yanked"):
            return None
        python, abi, platform = match.groups()
        if platform == "any":
            return (0, 0)
        if "manylinux" not in platform or not platform.endswith("x86_64"):
            return None
        return (1, 0 if _PYTHON_TAG in python.split(".") else 1 if abi == "abi3" else 2)

    ranked = sorted((r, e["filename"], e) for e in files if (r := rank(e)) is not None)
    if not ranked:
        raise FetchError(f"{url}: no py3-none-any or manylinux x86_64 wheel of {name}=={version}")
    return ranked[0][2]


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a file served over HTTP, read by Range requests: what zipfile needs to read
    a wheel's central directory and members without downloading the rest. Fetched spans are kept in memory;
    `prefetch` fetches several spans at once, before zipfile asks for them."""

    def __init__(self, url: str, tail: int = 64 << 10):
        super().__init__()
        self.url = url
        self.lock = threading.Lock()  # prefetch's threads count their requests
        self.requests = 0
        self.fetched = 0
        self.spans: list[tuple[int, bytes]] = []  # (start, data), sorted by start
        self.pos = 0
        start, data, self.size = self._range(f"-{tail}")
        self._keep(start, data)

    def _range(self, spec: str) -> tuple[int, bytes, int]:
        with _get(self.url, {"Range": f"bytes={spec}"}) as response:
            if response.status != 206:
                # the whole file would follow: not read
                raise RangesNotServed(f"{self.url} answers a Range request with HTTP {response.status}")
            match = re.match(r"bytes (\d+)-(\d+)/(\d+)", response.headers.get("Content-Range", ""))
            if not match:
                raise RangesNotServed(f"{self.url}: a 206 without a Content-Range")
            data = response.read()
        first, last, size = (int(g) for g in match.groups())
        if len(data) != last - first + 1:
            raise FetchError(f"{self.url}: asked bytes {spec}, got {len(data)} of {last - first + 1}")
        with self.lock:
            self.requests += 1
            self.fetched += len(data)
        return first, data, size

    def _keep(self, start: int, data: bytes) -> None:
        self.spans.append((start, data))
        self.spans.sort(key=lambda s: s[0])

    def _fetch(self, start: int, end: int) -> None:
        first, data, _ = self._range(f"{start}-{end - 1}")
        self._keep(first, data)

    def prefetch(self, spans: list[tuple[int, int]], workers: int = 4) -> None:
        """Fetch the [start, end) spans, neighbours closer than COALESCE in one request each."""
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start - merged[-1][1] <= COALESCE:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        with ThreadPoolExecutor(workers) as pool:
            for first, data, _ in pool.map(lambda s: self._range(f"{s[0]}-{s[1] - 1}"), merged):
                self._keep(first, data)

    # -- io protocol

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        view = memoryview(buffer)
        done = 0
        while done < want:
            at = self.pos + done
            span = next(((s, d) for s, d in self.spans if s <= at < s + len(d)), None)
            if span is None:  # not fetched yet: this read and a little beyond
                self._fetch(at, min(self.size, at + max(want - done, COALESCE)))
                continue
            start, data = span
            n = min(want - done, start + len(data) - at)
            view[done : done + n] = data[at - start : at - start + n]
            done += n
        self.pos += done
        return done


def _record(z: zipfile.ZipFile) -> dict[str, str]:
    """The wheel's RECORD: member -> its sha256 as RECORD writes it (urlsafe base64, unpadded)."""
    name = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
    if name is None:
        return {}
    rows = csv.reader(io.StringIO(z.read(name).decode()))
    return {row[0]: row[1].split("=", 1)[1] for row in rows if len(row) >= 2 and row[1].startswith("sha256=")}


def fetch_members(name: str, version: str, into: Path) -> dict[str, Any]:
    """Unpack the wanted members of the release's wheel into `into`, fetching only them (module docstring).
    Returns what it fetched: the wheel's name and size, the members, the bytes and requests."""
    entry = find_wheel(name, version)
    remote = RemoteFile(entry["url"])
    with zipfile.ZipFile(remote) as z:
        members = [i for i in z.infolist() if _wanted(i.filename)]
        ends = _member_ends(z)
        record_name = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        chosen = members + [z.getinfo(record_name)] if record_name else members
        remote.prefetch([(i.header_offset, ends[i.filename]) for i in chosen])
        record = _record(z)
        for info in members:
            data = z.read(info)  # zipfile checks the member's CRC
            expected = record.get(info.filename)
            if expected is not None:
                actual = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                if actual != expected:
                    raise FetchError(
                        f"{entry['filename']}: {info.filename} sha256 {actual}, RECORD {expected}"
                    )
            target = into / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return {
        "wheel": entry["filename"],
        "wheel_bytes": remote.size,
        "members": len(members),
        "bytes": remote.fetched,
        "requests": remote.requests,
    }


def _member_ends(z: zipfile.ZipFile) -> dict[str, int]:
    """Where each member's stored bytes end: the next member's local header (or the central directory)."""
    infos = sorted(z.infolist(), key=lambda i: i.header_offset)
    starts = [i.header_offset for i in infos[1:]] + [z.start_dir]
    return {i.filename: end for i, end in zip(infos, starts, strict=True)}


# ---------------------------------------------------------------- the files that decide loading


class Deciding:
    """The files of an engine's release that decide whether a drafter loads, as the conformance suite reads them:
    `modules` the harness executes (None: the whole file) or extracts definitions from (the set of top-level names
    and `Class.method`s it keeps), `globs` the fuzzer reads config keys from (fuzz/keys.py), and `stubbed` the
    modules the harness replaces with stubs of its own (their released code is never run: a change there is a blind
    spot, listed apart by the bump tool)."""

    def __init__(
        self,
        modules: dict[str, frozenset[str] | None],
        globs: tuple[str, ...],
        functions: dict[str, frozenset[str]],
        stubbed: tuple[str, ...],
    ):
        self.modules = modules
        self.globs = globs
        self.functions = functions
        self.stubbed = stubbed

    @staticmethod
    def file_of(module: str, root: Path) -> str:
        """The wheel-relative path of a dotted module (a package's `__init__.py`)."""
        base = module.replace(".", "/")
        return f"{base}/__init__.py" if (root / base / "__init__.py").exists() else f"{base}.py"

    def files(self, *roots: Path) -> dict[str, frozenset[str] | None]:
        """wheel-relative path -> what the suite reads of it (None: all of it), over the files present in any of
        `roots` (two releases: a file only one has is listed too)."""
        out: dict[str, frozenset[str] | None] = {}
        for root in roots:
            for module, names in self.modules.items():
                rel = self.file_of(module, root)
                if (root / rel).exists():
                    out[rel] = _merge(out.get(rel, frozenset()), names)
            for pattern in self.globs:
                for path in root.glob(pattern):
                    out[path.relative_to(root).as_posix()] = None
            for rel, names in self.functions.items():
                if (root / rel).exists():
                    out[rel] = _merge(out.get(rel, frozenset()), names)
        return dict(sorted(out.items()))

    def stubbed_files(self, *roots: Path) -> list[str]:
        found = {self.file_of(m, r) for r in roots for m in self.stubbed}
        return sorted(f for f in found if any((r / f).exists() for r in roots))


def _merge(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return None if a is None or b is None else a | b


def _harness_path(name: str) -> None:
    here = Path(__file__).resolve().parent
    for path in (here.parent, here / "vllm"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def deciding(name: str, root: Path | None = None) -> Deciding:
    """The files of engine `name` that decide loading, read from the harness's own tables (vllm_release.py REAL,
    EXTRACTED, EXECUTED_MODULES, STUBS; sglang/infra.py WHOLE, PARTIAL, stubs()) and the fuzzer's (fuzz/keys.py
    FILES, FUNCTIONS). `root` (a release's sources) is needed for SGLang's stub table only."""
    _harness_path(name)
    from conformance.fuzz import keys

    globs = tuple(keys.FILES.get(name, ()))
    functions = {rel: frozenset(names) for rel, names in keys.FUNCTIONS.get(name, {}).items()}
    modules: dict[str, frozenset[str] | None] = {}
    if name == "vllm":
        import vllm_release

        for module in (*vllm_release.REAL, *vllm_release.EXECUTED_MODULES):
            modules[module] = None
        for module, spec in vllm_release.EXTRACTED.items():
            if spec.closure:  # the file's own definitions the kept ones use: any of them
                modules[module] = None
                continue
            kept = set(spec.names) | set(spec.only)
            kept |= {f"{c}.{m}" for c, ms in spec.methods.items() for m in ms}
            kept |= {f"{s.cls}.{s.method}" for s in spec.spans.values()}
            modules[module] = _merge(modules.get(module, frozenset()), frozenset(kept))
        stubbed = tuple(m for m in vllm_release.STUBS if m not in modules)
    elif name == "sglang":
        from conformance.sglang import infra

        for module in infra.WHOLE:
            modules[module] = None
        for module, part in infra.PARTIAL.items():
            kept = set(part.names) | {f"{c}.{m}" for c, ms in part.methods.items() for m in ms}
            modules[module] = _merge(modules.get(module, frozenset()), frozenset(kept))
        table = infra.stubs(root) if root is not None else {}
        stubbed = tuple(m for m in table if m not in modules)
    else:
        raise KeyError(f"no conformance harness for {name!r}")
    return Deciding(dict(sorted(modules.items())), globs, functions, stubbed)
