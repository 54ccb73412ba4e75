"""Validate a repo on the Hugging Face Hub without downloading its weights.

`lilicorr-ckpt validate org/name[@revision]` resolves the revision to one commit, then reads at that
commit, through huggingface_hub's HTTP session (so HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE apply):

- config.json, hf_quant_config.json and model.safetensors.index.json, whole (they are small);
- every safetensors file's first 8 bytes, then exactly its header (two HTTP range reads); never a byte of
  tensor data, even from a server that ignores Range (the response is closed once the header is in);
- the one exception: the 4-byte global scales of NVFP4 weights (`*.weight_scale_2`, scalar F32), by range
  reads of at most MAX_SCALE_RANGE_BYTES each (neighbouring scales coalesced, at most MAX_SCALE_RANGES in all):
  whether a fused linear's shards share one scale (LC327) is a served-silently-wrong verdict that no header
  shows. A repo with more scales than that, or a server that will not serve the ranges, is judged without
  them (the report's `hub.scale_bytes` is then 0 and LC327 is not checked).

Plug point: the files are laid out in a temporary *header-only stand-in directory*: the small files as
they are, each safetensors file as its real header followed by a hole up to the file's real size (a sparse
file: no disk blocks, zeros if read), pickle weight files as empty placeholders. The unchanged local
pipeline (`checkpoint.load.load_checkpoint`, so source.py and tensors.py with the safetensors library's own header
validation against the file size) then reads that directory. Only `--deep` would read tensor data, so it
refuses Hub input. The report names the repo at its resolved commit (`path` = `org/name@<sha>`, and
`hub` with the revision asked for, the commit and the endpoint).

A Hub is input like any other, so nothing it says is trusted:
- bounds: the whole read has one deadline (`--timeout`, DEFAULT_TIMEOUT) besides each request's own timeout;
  every reply is read with a byte cap, decompressed bytes included (MODEL_INFO_LIMIT, the local JSON limits,
  the local header limit per file, MAX_TOTAL_HEADER_BYTES for all headers together, checked from the length
  prefixes before any header is fetched);
- shapes: the model info is decoded into typed structs; the commit must be 40 hex digits; file names must be
  plain repo paths and sizes plausible; anything else is an InputError that names what was wrong;
- signals: the requests run in daemon threads, and the main thread only waits, so SIGTERM / Ctrl-C end the
  read at once and the stand-in directory is removed on the way out. Workers never touch the filesystem: the
  main thread writes every stand-in file, so an abandoned worker cannot recreate what was cleaned up;
- credentials: every message and the report's endpoint go through `lilicorr_ckpt.redact.redact`.

With HF_HUB_OFFLINE set the Hub is never asked: the repo must be in the local Hugging Face cache (the
revision, when given, must be cached too), and a miss says offline mode is why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import queue
import re
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import quote

import msgspec

from lilicorr_ckpt.checkpoint.load import Checkpoint, load_checkpoint
from lilicorr_ckpt.checkpoint.pathhint import looks_like_path
from lilicorr_ckpt.checkpoint.source import INDEX_LIMIT, INDEX_NAME, JSON_LIMIT, PICKLE_SUFFIXES, resolve_path
from lilicorr_ckpt.checkpoint.tensors import MAX_HEADER_BYTES
from lilicorr_ckpt.errors import InputError, UsageError
from lilicorr_ckpt.redact import redact, remember
from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.results import HubOrigin  # the report's record of where it was read, filled here

HUB_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?:@(?P<rev>[^\s@]+))?$")
_REPO_CHARS = re.compile(r"^[\w.\-]+/[\w.\-]+$")
_REVISION = re.compile(r"^[^\s@\x00-\x1f\x7f]{1,255}$")
COMMIT_ID = re.compile(r"^[0-9a-fA-F]{40}$")
# what each small file may weigh: the limits a local checkpoint's files have (source.read_small)
SMALL_FILES = {"config.json": JSON_LIMIT, "hf_quant_config.json": JSON_LIMIT, INDEX_NAME: INDEX_LIMIT}
MODEL_INFO_LIMIT = 16 << 20  # decompressed; the listing of a repo of ~50k files
ERROR_BODY_LIMIT = 64 << 10  # of an error reply: enough for its message
_RAW_SLACK = 1 << 20  # compressed bytes may exceed the decompressed cap by this much (framing), no more
# one header is bounded as a local one is (tensors.MAX_HEADER_BYTES); all of a checkpoint's headers together
# get the same budget, so a remote tensor table is never larger than the largest local one
MAX_TOTAL_HEADER_BYTES = MAX_HEADER_BYTES
MAX_SHARDS = 10_000
MAX_FILE_SIZE = 1 << 50  # 1 PiB: a listed size past this is no real file
# NVFP4 global scales read from the Hub: neighbours within MAX_SCALE_GAP bytes share one range read of at most
# MAX_SCALE_RANGE_BYTES; past MAX_SCALE_RANGES reads the scales are not read at all
MAX_SCALE_GAP = 4096
MAX_SCALE_RANGE_BYTES = 64 << 10
MAX_SCALE_RANGES = 256
SCALE_SUFFIX = ".weight_scale_2"
DEFAULT_TIMEOUT = 60.0  # seconds for the whole remote read
REQUEST_TIMEOUT = 10.0  # seconds per request unless HF_HUB_DOWNLOAD_TIMEOUT says otherwise
WORKERS = 8
_CHUNK = 65536
_TRUE = {"1", "on", "yes", "true"}

T = TypeVar("T")


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


def _request_timeout() -> float:
    try:
        value = float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", REQUEST_TIMEOUT))
    except ValueError:
        return REQUEST_TIMEOUT
    return value if math.isfinite(value) and value > 0 else REQUEST_TIMEOUT


def _import_huggingface_hub() -> None:
    """huggingface_hub parses its HF_* variables when imported: a bad one (HF_HUB_DOWNLOAD_TIMEOUT=0.5, it wants
    whole seconds) is named here rather than ending as an internal error."""
    try:
        import huggingface_hub.constants  # noqa: F401
    except ValueError as exc:
        raise UsageError(
            f"huggingface_hub cannot start: {printable(str(exc))[:200]}; check the HF_* environment "
            f"variables (HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_ETAG_TIMEOUT take whole seconds)"
        ) from None


_REPO_ID_RULES = (
    "a repo id is org/name: letters, digits, '-', '_' and '.', each part starting and ending with a "
    "letter or digit, no '--' or '..', at most 96 characters, not ending in .git"
)


def hub_spec(path: str, revision: str | None = None, *, deep: bool = False) -> HubSpec | None:
    """The Hub repo PATH names, or None when PATH is (or looks like) a local path.

    `org/name@REV` takes any revision the Hub does: a branch, a tag, a commit, refs/pr/N. Raises UsageError
    for --revision on a local directory, two different revisions, an unusable revision, and --deep on a repo
    that would be read from the Hub (only headers are fetched); InputError for a repo-id-shaped PATH that
    huggingface_hub would refuse (`adv/..`, `a..b/c`, `-x/y`), which is no directory either."""
    local = Path(path).expanduser()
    repo_part, at, inline = path.partition("@")
    if local.exists() or looks_like_path(repo_part) or not _REPO_CHARS.match(repo_part):
        if revision is not None:
            raise UsageError(f"--revision applies to a Hub repo id (org/name); {path!r} is a local path")
        return None  # neither: source.resolve_path explains
    _import_huggingface_hub()
    if at and not HUB_SPEC.match(path):
        raise UsageError(
            f"{path!r}: the revision after @ is empty or has spaces or a second @; write "
            f"org/name@REV (a branch, tag, commit or refs/pr/N)"
        )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_part)
    except HFValidationError:
        raise InputError(
            f"{path!r} is not a local directory, and {repo_part!r} is not a Hub repo id ({_REPO_ID_RULES})"
        ) from None
    for given in (inline, revision):
        # git refuses `..` in a ref name too; here it would also walk out of the cache's refs/ in offline mode
        if given and (not _REVISION.match(given) or ".." in given or given.startswith("/") or "\\" in given):
            raise UsageError(
                f"{printable(given)!r} is not a revision: expected a branch, tag, commit or refs/pr/N "
                f"(no spaces, control characters, @, .., leading / or \\; at most 255 characters)"
            )
    if revision is not None and not revision:
        raise UsageError("--revision is empty; name a branch, tag, commit or refs/pr/N")
    if inline and revision and inline != revision:
        raise UsageError(f"two revisions: {path!r} and --revision {revision}; give one")
    spec = HubSpec(repo_part, inline or revision)
    if deep and not offline_mode():
        raise UsageError(
            f"--deep reads tensor data, and {spec.label} would be read from the Hub headers-only "
            f"(its weights are never downloaded); download it first (`hf download {spec.repo_id}"
            f"{' --revision ' + spec.revision if spec.revision else ''} --local-dir DIR`) and run "
            f"validate DIR --deep"
        )
    return spec


# --- the model info, as typed structs ---------------------------------------------------------------------


class _Lfs(msgspec.Struct, kw_only=True):
    size: int | None = None


class _Sibling(msgspec.Struct, kw_only=True):
    rfilename: str
    size: int | None = None
    lfs: _Lfs | None = None


class _ModelInfo(msgspec.Struct, kw_only=True):
    sha: str | None = None
    siblings: list[_Sibling] | None = None


def _bad_name(name: str) -> str | None:
    """Why `name` is not a plain repo path (None when it is one)."""
    if not name:
        return "an empty name"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in name):
        return "a control character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not UTF-8)"
    if name.startswith("/") or "\\" in name:
        return "an absolute or backslashed path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' component"
    if len(name) > 1024 or any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts):
        return "a name too long for a file system"
    return None


# --- deadline and worker threads --------------------------------------------------------------------------


class _Stopped(Exception):
    """The read was abandoned (the deadline passed, the process is interrupted, or another read failed)."""


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.stop = threading.Event()

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def check(self) -> None:
        if self.stop.is_set() or self.remaining() <= 0:
            raise _Stopped

    def request_timeout(self) -> float:
        """A request may wait this long: its own timeout, never past the overall deadline."""
        return max(0.05, min(_request_timeout(), self.remaining()))


class _BadBody(Exception):
    """A reply body that cannot be decoded: an encoding not asked for, or a corrupt compressed stream."""


class HubReadBug(RuntimeError):
    """An exception no HTTP failure explains, raised during a Hub read: a bug, reported as one (redacted)."""


class _TooLarge(Exception):
    def __init__(self, limit: int, decompressed: bool):
        super().__init__(limit)
        self.limit = limit
        self.decompressed = decompressed


class _Reply(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    total: int | None  # the file's full size, when the answer states it


@contextlib.contextmanager
def _stream(
    method: str, url: str, headers: dict[str, str], timeout: float
) -> Iterator[tuple[int, Mapping[str, str], Iterator[bytes]]]:
    """One request through huggingface_hub's session: (status, headers, the body's raw, still encoded, chunks)."""
    from huggingface_hub.utils import get_session

    session = get_session()
    if type(session).__module__.split(".")[0] == "requests":  # huggingface_hub < 1.0
        # the stubs type get_session() as huggingface_hub 1.x's httpx Client; this branch is its requests Session
        response = session.request(method, url, headers=headers, timeout=timeout, stream=True)  # type: ignore[call-arg]
        try:
            yield (response.status_code, response.headers, response.raw.stream(_CHUNK, decode_content=False))  # type: ignore[attr-defined]
        finally:
            response.close()
        return
    with session.stream(method, url, headers=headers, timeout=timeout) as response:  # httpx (>= 1.0)
        yield response.status_code, response.headers, response.iter_raw(_CHUNK)


def _decoder(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib framing, by the stream's own header
    raise _BadBody(f"Content-Encoding {printable(encoding)[:40]!r}, which was not asked for")


def _read_body(
    chunks: Iterator[bytes], encoding: str, *, skip: int, want: int | None, limit: int, deadline: _Deadline
) -> bytes:
    """The body's bytes [skip, skip+want) (all of it when want is None: _TooLarge past `limit`), decompressed
    with a cap, reading no further than needed; the deadline is checked between chunks."""
    decoder = _decoder(encoding)
    out = bytearray()
    raw = 0
    cap = limit + skip
    for chunk in chunks:
        deadline.check()
        raw += len(chunk)
        if raw > cap + _RAW_SLACK:
            raise _TooLarge(limit, decoder is not None)
        if decoder is None:
            out += chunk
        else:
            data = chunk
            while data:
                try:
                    out += decoder.decompress(
                        data, cap + 1 - len(out)
                    )  # never 0, which would mean "unbounded"
                except zlib.error as exc:
                    raise _BadBody(f"a corrupt {encoding.strip().lower()} body ({exc})") from None
                if len(out) > cap:
                    break
                data = decoder.unconsumed_tail
        if want is not None and len(out) >= skip + want:
            break
        if len(out) > cap:
            raise _TooLarge(limit, decoder is not None)
    if decoder is not None and len(out) <= cap:
        out += decoder.flush()[: cap + 1 - len(out)]
    if want is None and len(out) > cap:
        raise _TooLarge(limit, decoder is not None)
    return bytes(out[skip : skip + want] if want is not None else out[skip:])


def _run_all(
    deadline: _Deadline,
    tasks: list[tuple[str, Callable[[], T]]],
    on_result: Callable[[int, T], None],
    on_timeout: Callable[[str], InputError],
) -> None:
    """Run tasks (what, fn) in daemon threads, WORKERS at a time, handing each result to on_result in this
    thread. The first failure stops the rest and is raised; so is on_timeout(what is still pending) once the
    deadline passes. This thread only waits, interruptibly: SIGTERM and Ctrl-C end the wait at once."""
    if not tasks:
        return
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(tasks)):
        todo.put(i)
    done: queue.SimpleQueue[tuple[int, bool, Any]] = queue.SimpleQueue()

    def work() -> None:
        while not deadline.stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, True, tasks[i][1]()))
            except BaseException as exc:  # handed to the main thread, which decides
                done.put((i, False, exc))

    for _ in range(min(WORKERS, len(tasks))):
        threading.Thread(target=work, name="lilicorr-hub-read", daemon=True).start()
    pending = set(range(len(tasks)))
    try:
        while pending:
            left = deadline.remaining()
            if left <= 0:
                raise on_timeout(tasks[min(pending)][0])
            try:
                i, ok, value = done.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            pending.discard(i)
            if not ok:
                if isinstance(value, _Stopped):
                    raise on_timeout(tasks[i][0])
                if isinstance(value, (InputError, UsageError, HubReadBug)):
                    raise value
                # a bug, not the Hub: its text may still quote a URL, so it is redacted too
                raise HubReadBug(redact(f"{type(value).__name__}: {value}")) from value
            on_result(i, value)
    finally:
        if (
            pending
        ):  # a failure, the deadline or a signal ended the wait: the workers left stop at their next chunk
            deadline.stop.set()


# --- the Hub ----------------------------------------------------------------------------------------------


class _Hub:
    """One repo at one commit, read through huggingface_hub's HTTP session, within one deadline."""

    def __init__(self, spec: HubSpec, deadline: _Deadline):
        from huggingface_hub.utils import build_hf_headers

        self.spec = spec
        self.deadline = deadline
        self.endpoint = hub_endpoint()
        self.shown_endpoint = redact(self.endpoint)
        self.headers = build_hf_headers()  # HF_TOKEN (or the saved token) when there is one
        authorization = self.headers.get("authorization") or self.headers.get("Authorization")
        if authorization:
            remember(authorization.partition(" ")[2] or authorization)
        self.revision = spec.revision or "main"
        self.commit = ""
        self.sizes: dict[str, int | None] = {}
        self.header_bytes = 0
        # every range read so far was answered 206: a server that sends whole files is never asked for the
        # scales, which lie past the header (skipping to them would stream tensor data)
        self.ranges_honoured = True

    # messages

    def fail(self, text: str) -> InputError:
        return InputError(redact(text))

    def timed_out(self, what: str) -> InputError:
        seconds = f"{self.deadline.seconds:g}"
        return self.fail(
            f"{self.spec.label}: the Hub at {self.shown_endpoint} did not finish within {seconds} s "
            f"(still reading {what}); a slow or stalled server or network. Raise the limit with "
            f"--timeout SECONDS (default {DEFAULT_TIMEOUT:g})"
        )

    def status_error(self, reply: _Reply, what: str) -> InputError:
        """An HTTP error answer as one line for people, by the X-Error-Code huggingface_hub also reads."""
        name, ep, status = self.spec.label, self.shown_endpoint, reply.status
        code = reply.headers.get("x-error-code", "")
        detail = reply.headers.get("x-error-message", "")
        if not detail and reply.body:
            text = reply.body.decode("utf-8", "replace")
            with contextlib.suppress(ValueError, RecursionError):
                doc = json.loads(text)
                text = str(doc.get("error", text)) if isinstance(doc, dict) else text
            detail = text.strip().splitlines()[0] if text.strip() else ""
        detail = printable(redact(detail.strip()))[:200]  # redacted whole: a cut token would no longer match
        if code == "GatedRepo" or (status == 403 and "gated" in detail.lower()):
            return self.fail(
                f"{name} is a gated repo on {ep}: accept its terms on the Hub, then set HF_TOKEN to "
                f"a token of that account"
            )
        if code == "RevisionNotFound":
            asked = (
                f"revision {self.revision!r}"
                if self.spec.revision
                else "branch 'main' (no revision was given, so the default branch was asked for; name one with "
                "@REV)"
            )
            return self.fail(
                f"{self.spec.repo_id} has no {asked} on {ep} (expected a branch, a tag, a commit "
                f"or refs/pr/N)"
            )
        if code == "EntryNotFound" and what != "model info":
            return self.fail(
                f"{name}: {what} is listed by the Hub but cannot be fetched (removed meanwhile?)"
            )
        if code == "RepoNotFound" or (what == "model info" and status in (401, 404)):
            token = (
                "HF_TOKEN is set but has no access to it"
                if self.headers.get("authorization") or self.headers.get("Authorization")
                else "HF_TOKEN is not set"
            )
            return self.fail(
                f"{self.spec.repo_id} was not found on {ep} (it does not exist, or it is private and "
                f"{token}); a local directory would need ./ in front"
            )
        if status == 429:
            return self.fail(
                f"{name}: the Hub at {ep} is rate-limiting requests (429) for {what}; wait and retry, "
                f"or set HF_TOKEN (authenticated requests get a larger quota)"
            )
        kind = "a server error; try again later" if status >= 500 else "refused"
        return self.fail(
            f"{name}: the Hub at {ep} answered {status} for {what} ({kind}){': ' + detail if detail else ''}"
        )

    def transport_error(self, exc: BaseException, what: str) -> Exception:
        """A network-level failure as an InputError; anything else is a bug (redacted: it may quote a URL)."""
        from huggingface_hub import errors

        name, ep = self.spec.label, self.shown_endpoint
        if isinstance(exc, errors.OfflineModeIsEnabled):
            return self.fail(
                f"{name}: offline mode (HF_HUB_OFFLINE is set), so the Hub is not asked; unset it to "
                f"read the repo from {ep}"
            )
        module = type(exc).__module__.split(".")[0]
        if isinstance(exc, OSError) or module in (
            "httpx",
            "httpx2",
            "httpcore",
            "httpcore2",
            "requests",
            "urllib3",
            "h11",
            "ssl",
            "socket",
        ):
            if isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
                if self.deadline.remaining() <= 0.05:  # the request waited as long as the whole read had left
                    return self.timed_out(what)
                return self.fail(
                    f"{name}: the Hub at {ep} did not answer within {_request_timeout():g} "
                    f"s for {what} (HF_HUB_DOWNLOAD_TIMEOUT sets how long one request may wait; "
                    f"--timeout the whole read)"
                )
            detail = printable(redact(str(exc) or type(exc).__name__))[:300]
            return self.fail(
                f"{name}: cannot reach the Hub at {ep} ({detail}); check the network or HF_ENDPOINT, "
                f"or set HF_HUB_OFFLINE=1 to validate a copy in the local Hugging Face cache "
                f"(`hf download {self.spec.repo_id}` fills it)"
            )
        return HubReadBug(redact(f"{type(exc).__name__}: {exc}"))

    # HTTP (called in worker threads: no filesystem access here)

    def get(
        self,
        url: str,
        what: str,
        *,
        limit: int,
        start: int = 0,
        length: int | None = None,
        method: str = "GET",
        whole_file_ok: bool = True,
    ) -> _Reply:
        """Bytes [start, start+length) of url, or all of it (a JSON document, up to `limit` decompressed). A range
        answered with the whole file (200) is read up to the range's end, unless `whole_file_ok` is false: then it
        is hung up on at once (a scale range lies past the header: reaching it would stream the tensor data)."""
        self.deadline.check()
        headers = dict(self.headers)
        if length is not None:
            headers["Range"] = f"bytes={start}-{start + length - 1}"
            headers["Accept-Encoding"] = "identity"
        else:
            headers["Accept-Encoding"] = "gzip, deflate"
        try:
            with _stream(method, url, headers, self.deadline.request_timeout()) as (
                status,
                raw_headers,
                chunks,
            ):
                h = {k.lower(): v for k, v in raw_headers.items()}
                if status >= (400 if method == "HEAD" else 300):  # HEAD may stop at the LFS redirect
                    body = b""
                    with contextlib.suppress(
                        _BadBody, _TooLarge
                    ):  # the message is a courtesy, the status not
                        body = _read_body(
                            chunks,
                            h.get("content-encoding", ""),
                            skip=0,
                            want=ERROR_BODY_LIMIT,
                            limit=ERROR_BODY_LIMIT,
                            deadline=self.deadline,
                        )
                    raise self.status_error(_Reply(status, h, body, None), what)
                if method == "HEAD":
                    return _Reply(
                        status,
                        h,
                        b"",
                        _int_header(h.get("x-linked-size")) or _int_header(h.get("content-length")),
                    )
                skip = 0
                total: int | None = None
                encoding = h.get("content-encoding", "")
                if status == 206:
                    content_range = h.get("content-range", "")
                    tail = content_range.rpartition("/")[2]
                    total = _int_header(tail)
                    if not content_range.startswith(f"bytes {start}-"):
                        raise self.fail(
                            f"{self.spec.label}: the Hub at {self.shown_endpoint} answered range "
                            f"{printable(content_range)[:80]!r} for {what} bytes {start}-"
                        )
                elif length is not None:  # 200: the whole file from byte 0, of which we take what was asked
                    if not whole_file_ok:
                        raise self.fail(
                            f"{self.spec.label}: the Hub at {self.shown_endpoint} answered {what} with the whole "
                            f"file (status {status}) though a byte range was asked for"
                        )
                    skip = start
                    total = (
                        _int_header(h.get("content-length"))
                        if encoding.strip().lower() in ("", "identity")
                        else None
                    )
                if length is not None and encoding.strip().lower() not in ("", "identity"):
                    raise self.fail(
                        f"{self.spec.label}: the Hub at {self.shown_endpoint} compressed {what} "
                        f"(Content-Encoding {printable(encoding)[:40]!r}) though a byte range was "
                        f"asked for"
                    )
                body = _read_body(
                    chunks,
                    encoding,
                    skip=skip,
                    want=length,
                    limit=limit if length is None else length,
                    deadline=self.deadline,
                )
                return _Reply(status, h, body, total)
        except (InputError, _Stopped):
            raise
        except _BadBody as exc:
            raise self.fail(
                f"{self.spec.label}: the Hub at {self.shown_endpoint} sent {what} with {exc}"
            ) from None
        except _TooLarge as exc:
            raise self.fail(
                f"{self.spec.label}: {what} from the Hub at {self.shown_endpoint} is over {exc.limit} "
                f"bytes{' decompressed' if exc.decompressed else ''}, the limit for it "
                f"({exc.limit >> 20} MiB); refusing to read more"
            ) from None
        except Exception as exc:
            raise self.transport_error(exc, what) from exc

    def url(self, filename: str) -> str:
        return f"{self.endpoint}/{self.spec.repo_id}/resolve/{self.commit}/{quote(filename)}"

    # the model info

    def resolve(self) -> None:
        """The commit the revision names, and the repo's files with their sizes."""
        url = f"{self.endpoint}/api/models/{self.spec.repo_id}/revision/{quote(self.revision, safe='')}?blobs=true"
        replies: list[_Reply] = []
        _run_all(
            self.deadline,
            [("model info", lambda: self.get(url, "model info", limit=MODEL_INFO_LIMIT))],
            lambda _, reply: replies.append(reply),
            self.timed_out,
        )
        where = f"{self.spec.label}: the Hub at {self.shown_endpoint}"
        try:
            info = msgspec.json.decode(replies[0].body, type=_ModelInfo)
        except msgspec.ValidationError as exc:
            raise self.fail(
                f"{where} sent model info that does not describe a repo ({printable(str(exc))[:200]})"
            ) from None
        except msgspec.DecodeError as exc:
            raise self.fail(
                f"{where} sent model info that is not JSON ({printable(str(exc))[:200]})"
            ) from None
        if not info.sha:
            raise self.fail(f"{where} did not say which commit {self.revision} is")
        if not COMMIT_ID.match(info.sha):
            raise self.fail(
                f"{where} named {printable(info.sha)[:80]!r} as the commit of {self.revision}, which is "
                f"not a commit id (40 hex digits); refusing to read the repo"
            )
        if info.siblings is None:
            raise self.fail(f"{where} did not list the files of {self.revision}")
        self.commit = info.sha.lower()
        for sibling in info.siblings:
            name = sibling.rfilename
            why = _bad_name(name)
            if why is not None:
                raise self.fail(
                    f"{where} lists a file {printable(name)[:120]!r} with {why}, which no repo holds; "
                    f"refusing the listing"
                )
            size = (
                sibling.lfs.size if sibling.lfs is not None and sibling.lfs.size is not None else sibling.size
            )
            if size is not None and not 0 <= size <= MAX_FILE_SIZE:
                raise self.fail(
                    f"{where} lists {printable(name)[:120]} as {size} bytes, which is no file's size"
                )
            self.sizes[name] = size

    # the files

    def small_body(self, name: str) -> bytes:
        return self.get(self.url(name), name, limit=SMALL_FILES[name]).body

    def read_small(self, names: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        _run_all(
            self.deadline,
            [(n, functools.partial(self.small_body, n)) for n in names],
            lambda i, body: out.__setitem__(names[i], body),
            self.timed_out,
        )
        return out

    def prefix(self, name: str) -> tuple[bytes, int]:
        """The first 8 bytes of a safetensors file and the file's size."""
        reply = self.get(self.url(name), name, limit=8, start=0, length=8)
        if reply.status != 206:
            self.ranges_honoured = False
        size = reply.total if reply.total is not None else self.sizes.get(name)
        if size is None:  # neither the listing nor the answer said: ask with HEAD
            size = self.get(self.url(name), name, limit=0, method="HEAD").total
        if size is None:
            raise self.fail(f"{self.spec.label}: the Hub did not say how large {name} is")
        if not 0 <= size <= MAX_FILE_SIZE:
            raise self.fail(
                f"{self.spec.label}: the Hub says {name} is {size} bytes, which is no file's size"
            )
        return reply.body, size

    def header(self, name: str, length: int) -> bytes:
        return self.get(self.url(name), name, limit=length, start=8, length=length).body

    def span(self, name: str, start: int, length: int) -> bytes:
        return self.get(
            self.url(name),
            f"{name} bytes {start}-{start + length - 1}",
            limit=length,
            start=start,
            length=length,
            whole_file_ok=False,
        ).body


def scale_spans(header: bytes, base: int, size: int) -> list[tuple[int, int]] | None:
    """The byte spans (start, length) of a safetensors file that hold its NVFP4 global scales (scalar F32
    `*.weight_scale_2` tensors), neighbours coalesced; `base` is where the data section starts (8 + header
    length), `size` the file's size. None: the header is not JSON (the local pipeline names what is wrong)."""
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    offsets: list[int] = []
    for name, entry in doc.items():
        if not (isinstance(name, str) and name.endswith(SCALE_SUFFIX) and isinstance(entry, dict)):
            continue
        span = entry.get("data_offsets")
        if entry.get("dtype") != "F32" or not isinstance(span, list) or len(span) != 2:
            continue
        begin, end = span
        if not (type(begin) is int and type(end) is int and end - begin == 4 and begin >= 0):
            continue
        if base + end <= size:
            offsets.append(base + begin)
    spans: list[tuple[int, int]] = []
    for at in sorted(set(offsets)):
        if spans:
            first, length = spans[-1]
            if at - (first + length) <= MAX_SCALE_GAP and at + 4 - first <= MAX_SCALE_RANGE_BYTES:
                spans[-1] = (first, max(length, at + 4 - first))
                continue
        spans.append((at, 4))
    return spans


# a size in a header (Content-Length, Content-Range's total, X-Linked-Size): ASCII digits only (str.isdigit also
# takes `²` and `٣`, which int() refuses or reads), and few enough for int() (past MAX_FILE_SIZE anyway)
_DECIMAL = re.compile(r"[0-9]{1,20}")


def _int_header(value: str | None) -> int | None:
    """A header's non-negative decimal number, or None when it is anything else."""
    text = value.strip() if value is not None else ""
    return int(text) if _DECIMAL.fullmatch(text) else None


def _index_shards(index_bytes: bytes) -> set[str]:
    """Shard names the index references (leniently: the pipeline reports a malformed index itself)."""
    try:
        doc = json.loads(index_bytes)
    except (ValueError, RecursionError):
        return set()
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        return set()
    out = set()
    for shard in weight_map.values():
        if isinstance(shard, str) and not shard.startswith("/") and ".." not in PurePosixPath(shard).parts:
            out.add(shard)
    return out


def _header_length(prefix: bytes) -> int | None:
    return struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None


@contextlib.contextmanager
def hub_checkout(spec: HubSpec, timeout: float = DEFAULT_TIMEOUT) -> Iterator[tuple[Path, HubOrigin]]:
    """A header-only stand-in directory for spec at its resolved commit, removed on exit (also on SIGTERM or
    Ctrl-C). The whole read finishes within `timeout` seconds or is an InputError that says so."""
    hub = _Hub(spec, _Deadline(timeout))
    hub.resolve()
    label = f"{spec.repo_id}@{hub.commit}"
    files = hub.sizes
    if "config.json" not in files:
        top = sorted(n for n in files if "/" not in n)
        shown = (
            ", ".join(printable(n) for n in top[:6]) + (" ..." if len(top) > 6 else "") if top else "no files"
        )
        raise hub.fail(f"{label} has no config.json (found: {shown}); expected a drafter checkpoint repo")
    small = hub.read_small([n for n in SMALL_FILES if n in files])
    shards = {n for n in files if "/" not in n and n.endswith(".safetensors")}
    shards |= {s for s in _index_shards(small.get(INDEX_NAME, b"")) if s in files}
    ordered = sorted(shards)
    if len(ordered) > MAX_SHARDS:
        raise hub.fail(
            f"{label} has {len(ordered)} safetensors files; more than {MAX_SHARDS} is no drafter checkpoint"
        )
    prefixes: dict[str, tuple[bytes, int]] = {}
    _run_all(
        hub.deadline,
        [(n, functools.partial(hub.prefix, n)) for n in ordered],
        lambda i, got: prefixes.__setitem__(ordered[i], got),
        hub.timed_out,
    )
    # the header budget, from the length prefixes alone: in name order, so the shard named is always the same
    wanted: dict[str, int] = {}
    total = 0
    for name in ordered:
        prefix, size = prefixes[name]
        n = _header_length(prefix)
        if n is not None and 0 < n <= MAX_HEADER_BYTES and 8 + n <= size:
            total += n
            if total > MAX_TOTAL_HEADER_BYTES:
                raise hub.fail(
                    f"{label}: the safetensors headers come to over {MAX_TOTAL_HEADER_BYTES} bytes "
                    f"({MAX_TOTAL_HEADER_BYTES >> 20} MiB, the limit for one checkpoint's tensor table) "
                    f"by {name} ({n} bytes of header, {total} in all so far); refusing to fetch them"
                )
            wanted[name] = n
        # otherwise the prefix alone: tensors.read_header names the absurd or overlong length, as for a local file
    hub.header_bytes = sum(len(p) for p, _ in prefixes.values())
    with tempfile.TemporaryDirectory(prefix="lilicorr-hub-") as tmp:
        root = Path(tmp)

        def lay_out(name: str, data: bytes, size: int | None = None) -> None:
            """One stand-in file (in this thread only): data, then a hole up to size."""
            dest = root / name
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(dest, "wb") as f:
                    f.write(data)
                    if size is not None:
                        f.truncate(max(size, len(data)))
            except OSError as exc:
                raise hub.fail(
                    f"{label}: cannot lay out the header-only stand-in of {printable(name)}"
                    f"{f' ({size} bytes, sparse)' if size is not None else ''} in the temporary "
                    f"directory: {exc.strerror or exc}"
                ) from None

        for name, data in small.items():
            lay_out(name, data)
        for name in ordered:
            if name not in wanted:
                lay_out(name, prefixes[name][0], prefixes[name][1])

        headers: dict[str, bytes] = {}

        def got_header(i: int, header: bytes) -> None:
            name = headered[i]
            hub.header_bytes += len(header)
            headers[name] = header
            lay_out(name, prefixes[name][0] + header, prefixes[name][1])

        headered = sorted(wanted)
        _run_all(
            hub.deadline,
            [(n, functools.partial(hub.header, n, wanted[n])) for n in headered],
            got_header,
            hub.timed_out,
        )
        scale_bytes = _read_scales(hub, root, headers, {n: prefixes[n][1] for n in headers})
        for name in files:  # present, never fetched: LC601 sees them
            if "/" not in name and name.endswith(PICKLE_SUFFIXES):
                lay_out(name, b"")
        yield (
            root,
            HubOrigin(
                repo_id=spec.repo_id,
                revision=hub.revision,
                commit=hub.commit,
                read_from="hub",
                endpoint=hub.shown_endpoint,
                header_bytes=hub.header_bytes,
                scale_bytes=scale_bytes or 0,
                scales_read=scale_bytes is not None,
            ),
        )


def _read_scales(hub: _Hub, root: Path, headers: dict[str, bytes], sizes: dict[str, int]) -> int | None:
    """Read every NVFP4 global scale into the stand-in files, at its real offset; the bytes read (0: the repo
    has none), or None when they were not read (too many ranges, or the Hub would not serve them)."""
    wanted: list[tuple[str, int, int]] = []
    for name in sorted(headers):
        spans = scale_spans(headers[name], 8 + len(headers[name]), sizes[name])
        wanted += [(name, start, length) for start, length in spans or ()]
    if not wanted:
        return 0
    if len(wanted) > MAX_SCALE_RANGES or not hub.ranges_honoured:
        return None
    got: dict[int, bytes] = {}
    try:
        _run_all(
            hub.deadline,
            [(f"{n} scales", functools.partial(hub.span, n, start, length)) for n, start, length in wanted],
            got.__setitem__,
            hub.timed_out,
        )
    except InputError:
        if hub.deadline.remaining() <= 0:
            raise
        return None  # the Hub would not serve a range: judged without the scales, as the report says
    total = 0
    for i, (name, start, length) in enumerate(wanted):
        data = got[i]
        if len(data) != length:
            return None
        try:
            with open(root / name, "r+b") as f:
                f.seek(start)
                f.write(data)
        except OSError:
            return None
        total += length
    return total


def _cached_snapshot(spec: HubSpec) -> Path:
    """The cached snapshot of spec in offline mode, or an InputError that names offline mode."""
    offline = "offline mode (HF_HUB_OFFLINE is set), so only the local Hugging Face cache is read"
    if spec.revision is None:
        try:
            root, _ = resolve_path(spec.repo_id)
        except InputError as exc:
            raise InputError(f"{exc} [{offline}]") from None
    else:
        from huggingface_hub import snapshot_download

        try:
            root = Path(
                snapshot_download(spec.repo_id, revision=spec.revision, local_files_only=True)
            ).resolve()
        except Exception:
            raise InputError(
                f"{spec.label}: revision {spec.revision!r} of {spec.repo_id} is not in the Hugging Face "
                f"cache; {offline}; fetch it with `hf download {spec.repo_id} --revision "
                f"{spec.revision}`"
            ) from None
    if not COMMIT_ID.match(root.name):
        raise InputError(
            f"{spec.label}: the Hugging Face cache resolves it to {printable(str(root))!r}, which is not "
            f"a snapshot named by its commit (40 hex digits); refusing it"
        )
    return root


@contextlib.contextmanager
def open_hub(spec: HubSpec, timeout: float = DEFAULT_TIMEOUT) -> Iterator[tuple[Checkpoint, HubOrigin]]:
    """The checkpoint spec names, read headers-only (from the Hub, or the cached snapshot in offline mode),
    and where it came from. Valid inside the `with` only: a Hub read lives in a temporary directory.
    `timeout`: seconds the whole remote read may take."""
    if offline_mode():
        root = _cached_snapshot(spec)
        origin = HubOrigin(
            repo_id=spec.repo_id,
            revision=spec.revision or "main",
            commit=root.name.lower(),
            read_from="hf_cache",
        )
        yield _load(load_checkpoint, root, spec.label), origin
        return
    with hub_checkout(spec, timeout) as (root, origin):
        yield _load(load_checkpoint, root, f"{spec.repo_id}@{origin.commit}"), origin


def hub_label(spec: HubSpec, origin: HubOrigin) -> str:
    """How a report names a Hub checkpoint: at its resolved commit when read from the Hub."""
    return spec.label if origin.read_from == "hf_cache" else f"{spec.repo_id}@{origin.commit}"


def _load(load: Callable[[str], Any], root: Path, label: str) -> Any:
    try:
        return load(str(root))
    except InputError as exc:  # name the repo, not the stand-in directory
        raise InputError(redact(str(exc).replace(str(root), label))) from None
