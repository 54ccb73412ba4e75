"""Validate a repo on the Hugging Face Hub without downloading its weights.

`lilicorr-ckpt validate org/name[@revision]` resolves the revision to one commit, then reads at that
commit, through huggingface_hub's HTTP session (so HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE apply):

- config.json, hf_quant_config.json and model.safetensors.index.json, whole (they are small);
- every safetensors file's first 8 bytes, then exactly its header (two HTTP range reads); never a byte of
  tensor data, even from a server that ignores Range (the response is closed once the header is in).

Plug point: the files are laid out in a temporary *header-only stand-in directory*: the small files as
they are, each safetensors file as its real header followed by a hole up to the file's real size (a sparse
file: no disk blocks, zeros if read), pickle weight files as empty placeholders. The unchanged local
pipeline (`checkpoint.load.load_checkpoint`, so source.py and tensors.py with the safetensors library's own header
validation against the file size) then reads that directory. Only `--deep` would read tensor data, so it
refuses Hub input. The report names the repo at its resolved commit (`path` = `org/name@<sha>`, and
`hub` with the revision asked for, the commit and the endpoint).

With HF_HUB_OFFLINE set the Hub is never asked: the repo must be in the local Hugging Face cache (the
revision, when given, must be cached too), and a miss says offline mode is why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import msgspec

from lilicorr_ckpt.checkpoint.load import Checkpoint, load_checkpoint
from lilicorr_ckpt.checkpoint.pathhint import looks_like_path
from lilicorr_ckpt.checkpoint.source import INDEX_NAME, PICKLE_SUFFIXES, resolve_path
from lilicorr_ckpt.errors import InputError, UsageError

HUB_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?:@(?P<rev>[^\s@]+))?$")
SMALL_FILES = ("config.json", "hf_quant_config.json", INDEX_NAME)
SMALL_FILE_LIMIT = 64 << 20  # as source.read_small: a JSON config this large is not a config
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit (tensors.MAX_HEADER_BYTES)
_TRUE = {"1", "on", "yes", "true"}

T = TypeVar("T")


class HubOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """Where a validated checkpoint came from when it was not a local directory."""

    repo_id: str
    revision: str  # as asked for (a branch, tag or commit); "main" when none was given
    commit: str  # the commit every file was read at (for the cache: the snapshot's name)
    read_from: Literal["hub", "hf_cache"]
    endpoint: str | None = None  # the Hub endpoint asked (HF_ENDPOINT), None for the cache
    header_bytes: int = 0  # bytes of safetensors files read: their length prefixes and headers, nothing else


class HubSpec(msgspec.Struct, frozen=True):
    repo_id: str
    revision: str | None

    @property
    def label(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def offline_mode() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now and as huggingface_hub read it at import."""
    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    if env in _TRUE:
        return True
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "10"))
    except ValueError:
        return 10.0


def hub_spec(path: str, revision: str | None = None, *, deep: bool = False) -> HubSpec | None:
    """The Hub repo PATH names, or None when PATH is (or looks like) a local path.

    Raises UsageError for --revision on a local directory, two different revisions, and --deep on a repo
    that would be read from the Hub (only headers are fetched)."""
    local = Path(path).expanduser()
    if local.exists() or looks_like_path(path):
        if revision is not None:
            raise UsageError(f"--revision applies to a Hub repo id (org/name); {path!r} is a local path")
        return None
    match = HUB_SPEC.match(path)
    if match is None:
        return None  # neither: source.resolve_path explains
    inline = match.group("rev")
    if inline and revision and inline != revision:
        raise UsageError(f"two revisions: {path!r} and --revision {revision}; give one")
    spec = HubSpec(match.group("repo"), inline or revision)
    if deep and not offline_mode():
        raise UsageError(f"--deep reads tensor data, and {spec.label} would be read from the Hub headers-only "
                         f"(its weights are never downloaded); download it first (`hf download {spec.repo_id}"
                         f"{' --revision ' + spec.revision if spec.revision else ''} --local-dir DIR`) and run "
                         f"validate DIR --deep")
    return spec


# --- errors ------------------------------------------------------------------------------------------------

def _hub_error(exc: Exception, spec: HubSpec, endpoint: str, what: str) -> InputError:
    """A huggingface_hub / HTTP exception as one line for people."""
    from huggingface_hub import errors

    name = spec.label
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return InputError(f"{name}: offline mode (HF_HUB_OFFLINE is set), so the Hub is not asked; unset it to "
                          f"read the repo from {endpoint}")
    if isinstance(exc, errors.GatedRepoError):
        return InputError(f"{name} is a gated repo on {endpoint}: accept its terms on the Hub, then set HF_TOKEN to "
                          f"a token of that account")
    if isinstance(exc, errors.RevisionNotFoundError):
        return InputError(f"{spec.repo_id} has no revision {spec.revision!r} on {endpoint} (expected a branch, "
                          f"a tag or a commit sha)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        token = "HF_TOKEN is set but has no access to it" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set"
        return InputError(f"{spec.repo_id} was not found on {endpoint} (it does not exist, or it is private and "
                          f"{token}); a local directory would need ./ in front")
    if isinstance(exc, errors.EntryNotFoundError):
        return InputError(f"{name}: {what} is listed by the Hub but cannot be fetched (removed meanwhile?)")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return InputError(f"{name}: the Hub at {endpoint} answered {status or 'an error'} for {what}: {first}")
    module = type(exc).__module__.split(".")[0]
    if isinstance(exc, OSError) or module in ("httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3"):
        detail = str(exc) or type(exc).__name__
        return InputError(f"{name}: cannot reach the Hub at {endpoint} ({detail}); check the network or "
                          f"HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to validate a copy in the local cache")
    raise exc  # not an HTTP problem: a bug, reported as one


def _calling(spec: HubSpec, endpoint: str, what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except InputError:
        raise
    except Exception as exc:
        raise _hub_error(exc, spec, endpoint, what) from None


# --- HTTP --------------------------------------------------------------------------------------------------

def _read(url: str, headers: dict[str, str], start: int, length: int | None, limit: int) -> tuple[bytes, int | None]:
    """Bytes [start, start+length) of url (all of it from start when length is None, refused past `limit`),
    and the file's full size when the server states it. Reads only what it returns: a server that ignores
    Range is read up to the end of the wanted bytes and then hung up on."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    want = length if length is not None else limit + 1
    range_header = f"bytes={start}-{start + length - 1}" if length is not None else f"bytes={start}-"
    h = {**headers, "Range": range_header, "Accept-Encoding": "identity"}
    session = get_session()
    if hasattr(session, "stream"):  # httpx (huggingface_hub >= 1.0)
        cm = session.stream("GET", url, headers=h, timeout=_timeout())
        iterate = "iter_bytes"
    else:  # requests (huggingface_hub < 1.0)
        cm = contextlib.closing(session.get(url, headers=h, timeout=_timeout(), stream=True))
        iterate = "iter_content"
    with cm as response:
        if response.status_code >= 400:
            if hasattr(response, "read"):  # httpx: a streamed body must be read before it is inspected
                response.read()
            hf_raise_for_status(response)
        total = None
        skip = 0
        if response.status_code == 206:
            content_range = response.headers.get("Content-Range", "")
            tail = content_range.rpartition("/")[2]
            total = int(tail) if tail.isdigit() else None
            if not content_range.startswith(f"bytes {start}-"):
                raise InputError(f"{url}: the server answered range {content_range!r} for {range_header!r}")
        else:  # 200: the whole file from byte 0
            cl = response.headers.get("Content-Length", "")
            total = int(cl) if cl.isdigit() else None
            skip = start
        buf = bytearray()
        for chunk in getattr(response, iterate)(*((65536,) if iterate == "iter_content" else ())):
            if skip:
                drop = min(skip, len(chunk))
                chunk, skip = chunk[drop:], skip - drop
            buf += chunk
            if len(buf) >= want:
                break
    if length is None and len(buf) > limit:
        raise InputError(f"{url} is over {limit} bytes; a JSON config this large is not a config")
    return bytes(buf[:want]), total


class _Hub:
    """One repo at one commit, read through huggingface_hub."""

    def __init__(self, spec: HubSpec):
        from huggingface_hub import HfApi
        from huggingface_hub.utils import build_hf_headers

        self.spec = spec
        self.endpoint = hub_endpoint()
        self.api = HfApi(endpoint=self.endpoint)
        self.headers = build_hf_headers()  # HF_TOKEN (or the saved token) when there is one
        self.header_bytes = 0
        revision = spec.revision or "main"
        info = _calling(spec, self.endpoint, f"revision {revision}",
                        lambda: self.api.model_info(spec.repo_id, revision=revision, files_metadata=True,
                                                    timeout=_timeout()))
        if not info.sha:
            raise InputError(f"{spec.label}: the Hub at {self.endpoint} did not say which commit {revision} is")
        self.revision = revision
        self.commit: str = info.sha
        self.sizes: dict[str, int | None] = {
            s.rfilename: (s.lfs.size if s.lfs else s.size) for s in (info.siblings or [])}

    def url(self, filename: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.spec.repo_id, filename, revision=self.commit, endpoint=self.endpoint)

    def read_whole(self, filename: str) -> bytes:
        data, _ = _calling(self.spec, self.endpoint, filename,
                           lambda: _read(self.url(filename), self.headers, 0, None, SMALL_FILE_LIMIT))
        return data

    def read_range(self, filename: str, start: int, length: int) -> tuple[bytes, int | None]:
        data, total = _calling(self.spec, self.endpoint, filename,
                               lambda: _read(self.url(filename), self.headers, start, length, length))
        if filename.endswith(".safetensors"):
            self.header_bytes += len(data)
        return data, total

    def size_of(self, filename: str, stated: int | None) -> int:
        """The file's size: as listed, as the range answer stated, or from a HEAD request."""
        if self.sizes.get(filename) is not None:
            return int(self.sizes[filename])  # type: ignore[arg-type]
        if stated is not None:
            return stated
        from huggingface_hub import get_hf_file_metadata

        meta = _calling(self.spec, self.endpoint, filename,
                        lambda: get_hf_file_metadata(self.url(filename), timeout=_timeout()))
        if meta.size is None:
            raise InputError(f"{self.spec.label}: the Hub did not say how large {filename} is")
        return int(meta.size)

    def mirror_header(self, filename: str, dest: Path) -> None:
        """dest: filename's length prefix and header, then a hole to the real size (see the module doc)."""
        prefix, stated = self.read_range(filename, 0, 8)
        size = self.size_of(filename, stated)
        data = prefix
        if len(prefix) == 8:
            (n,) = struct.unpack("<Q", prefix)
            if 0 < n <= MAX_HEADER_BYTES and 8 + n <= size:
                header, _ = self.read_range(filename, 8, n)
                data = prefix + header
            # otherwise the prefix alone: tensors.read_header names the absurd or overlong length
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            f.write(data)
            f.truncate(max(size, len(data)))


def _index_shards(index_bytes: bytes) -> set[str]:
    """Shard names the index references (leniently: the pipeline reports a malformed index itself)."""
    try:
        doc = json.loads(index_bytes)
    except ValueError:
        return set()
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        return set()
    out = set()
    for shard in weight_map.values():
        if isinstance(shard, str) and not shard.startswith("/") and ".." not in PurePosixPath(shard).parts:
            out.add(shard)
    return out


@contextlib.contextmanager
def hub_checkout(spec: HubSpec) -> Iterator[tuple[Path, HubOrigin]]:
    """A header-only stand-in directory for spec at its resolved commit, removed on exit."""
    hub = _Hub(spec)
    label = f"{spec.repo_id}@{hub.commit}"
    files = hub.sizes
    if "config.json" not in files:
        top = sorted(n for n in files if "/" not in n)
        shown = ", ".join(top[:6]) + (" ..." if len(top) > 6 else "") if top else "no files"
        raise InputError(f"{label} has no config.json (found: {shown}); expected a drafter checkpoint repo")
    with tempfile.TemporaryDirectory(prefix="lilicorr-hub-") as tmp:
        root = Path(tmp)
        index_bytes = b""
        for name in SMALL_FILES:
            if name in files:
                data = hub.read_whole(name)
                (root / name).write_bytes(data)
                if name == INDEX_NAME:
                    index_bytes = data
        shards = {n for n in files if "/" not in n and n.endswith(".safetensors")}
        shards |= {s for s in _index_shards(index_bytes) if s in files}
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(shards)))) as pool:
            for future in [pool.submit(hub.mirror_header, s, root / s) for s in sorted(shards)]:
                future.result()
        for name in files:  # present, never fetched: LC601 sees them
            if "/" not in name and name.endswith(PICKLE_SUFFIXES):
                (root / name).touch()
        yield root, HubOrigin(repo_id=spec.repo_id, revision=hub.revision, commit=hub.commit, read_from="hub",
                              endpoint=hub.endpoint, header_bytes=hub.header_bytes)


def _cached_snapshot(spec: HubSpec) -> Path:
    """The cached snapshot of spec in offline mode, or an InputError that names offline mode."""
    offline = "offline mode (HF_HUB_OFFLINE is set), so only the local Hugging Face cache is read"
    if spec.revision is None:
        try:
            root, _ = resolve_path(spec.repo_id)
        except InputError as exc:
            raise InputError(f"{exc} [{offline}]") from None
        return root
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec.repo_id, revision=spec.revision, local_files_only=True)).resolve()
    except Exception:
        raise InputError(f"{spec.label}: revision {spec.revision!r} of {spec.repo_id} is not in the Hugging Face "
                         f"cache; {offline}; fetch it with `hf download {spec.repo_id} --revision "
                         f"{spec.revision}`") from None


@contextlib.contextmanager
def open_hub(spec: HubSpec) -> Iterator[tuple[Checkpoint, HubOrigin]]:
    """The checkpoint spec names, read headers-only (from the Hub, or the cached snapshot in offline mode),
    and where it came from. Valid inside the `with` only: a Hub read lives in a temporary directory."""
    if offline_mode():
        root = _cached_snapshot(spec)
        origin = HubOrigin(repo_id=spec.repo_id, revision=spec.revision or "main", commit=root.name,
                           read_from="hf_cache")
        yield _load(load_checkpoint, root, spec.label), origin
        return
    with hub_checkout(spec) as (root, origin):
        yield _load(load_checkpoint, root, f"{spec.repo_id}@{origin.commit}"), origin


def hub_label(spec: HubSpec, origin: HubOrigin) -> str:
    """How a report names a Hub checkpoint: at its resolved commit when read from the Hub."""
    return spec.label if origin.read_from == "hf_cache" else f"{spec.repo_id}@{origin.commit}"


def _load(load: Callable[[str], Any], root: Path, label: str) -> Any:
    try:
        return load(str(root))
    except InputError as exc:  # name the repo, not the stand-in directory
        raise InputError(str(exc).replace(str(root), label)) from None
