"""HTTP to the user's engine server with the standard library only: every request bounded in time and in reply
size, 429 / 503 retried with a bounded backoff, and the credential never in a message.

A server is a stranger here: it may be down, starting, overloaded, behind a proxy that answers HTML, or hostile
(a reply that never ends, a body of gigabytes, a header that echoes the key back). Each of those ends the run
with exit 2 and one sentence saying which, never a traceback or a hung process.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.errors import InputError, SmokeRefused, UsageError
from lilicorr_ckpt.redact import MASK, redact, remember
from lilicorr_ckpt.report.escape import printable

ENGINES = ("sglang", "vllm")
API_KEY_ENV = "LILICORR_ENGINE_API_KEY"
DEFAULT_TIMEOUT = 300.0  # seconds one request may take, answer included (a long generation on a big target)
RETRY_STATUSES = (429, 503)  # overloaded or starting: nothing was processed, so asking again is safe
MAX_ATTEMPTS = 6
BACKOFF_FIRST = 0.5  # seconds; doubled per attempt
BACKOFF_CAP = 8.0
RETRY_AFTER_CAP = 30.0  # a Retry-After header is honoured up to this
CHUNK = 1 << 16
MESSAGE_CHARS = 300  # of a server's own error text, in our message


class EngineError(InputError):
    """The server cannot be used as it answers: unreachable, misconfigured, or its replies make no sense (exit 2)."""


class EngineUnreachable(EngineError):
    """Nothing answers at the URL (connection refused, no such host, connect timeout)."""


class EngineRefused(SmokeRefused):
    """The server answers but does not serve this drafter: none at all, another one, or another block (exit 1)."""


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # sglang | vllm
    scheme: str  # http | https
    host: str
    port: int
    base_path: str  # "" or "/prefix" (a server behind a path-routing proxy)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"


def parse_engine(value: str) -> Endpoint:
    """`sglang=URL` or `vllm=URL` (URL: http[s]://host[:port][/prefix]; a bare host:port means http)."""
    kind, sep, url = value.partition("=")
    kind = kind.strip().lower()
    if not sep or kind not in ENGINES or not url.strip():
        raise UsageError(
            f"--engine takes sglang=URL or vllm=URL (e.g. sglang=http://localhost:30000), got "
            f"{printable(redact(value))!r}"
        )
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"--engine {kind}=...: not a URL ({exc})") from None
    if parts.username is not None or parts.password is not None:
        raise UsageError(
            f"--engine {kind}={printable(redact(url))}: credentials do not go in the URL; give the key "
            f"with --api-key or the {API_KEY_ENV} environment variable"
        )
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"--engine {kind}=...: the URL scheme must be http or https, got {parts.scheme!r}")
    if not parts.hostname:
        raise UsageError(f"--engine {kind}=...: the URL names no host")
    if parts.query or parts.fragment:
        raise UsageError(
            f"--engine {kind}=...: the URL must be the server's base address, without ?query or #fragment"
        )
    default_port = {"sglang": 30000, "vllm": 8000}[kind] if parts.scheme == "http" else 443
    return Endpoint(
        kind=kind,
        scheme=parts.scheme,
        host=parts.hostname,
        port=port or default_port,
        base_path=parts.path.rstrip("/"),
    )


class Reply(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    content_type: str


class Client:
    """One server, many requests (from several threads: each request has its own connection)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        api_key: str | None,
        timeout: float = DEFAULT_TIMEOUT,
        notify: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint
        self._api_key = api_key or None
        self.timeout = timeout
        self.notify = notify or (lambda text: None)
        self.sleep = sleep
        remember(self._api_key)  # masked wherever it shows up, should a server echo it

    # -- what people see ---------------------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """Server text fit to print: credentials masked (the key too, whatever its length), one line, printable."""
        text = redact(text)
        if self._api_key:
            text = text.replace(self._api_key, MASK)
        return printable(" ".join(text.split()))

    def where(self, path: str) -> str:
        return f"{self.endpoint.url}{path}"

    # -- requests ------------------------------------------------------------------------------------------------

    def get(self, path: str, limit: int, *, accept: tuple[int, ...] = (200,)) -> Reply:
        return self.request("GET", path, None, limit, accept=accept)

    def post_json(self, path: str, payload: Any, limit: int, *, accept: tuple[int, ...] = (200,)) -> Reply:
        return self.request("POST", path, json.dumps(payload).encode(), limit, accept=accept)

    def request(
        self, method: str, path: str, body: bytes | None, limit: int, *, accept: tuple[int, ...] = (200,)
    ) -> Reply:
        """The reply to one request, after at most MAX_ATTEMPTS tries of a 429 / 503 (and of a dropped connection,
        for a GET); EngineError for anything else than a status in `accept`."""
        started = time.monotonic()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                reply, retry_after = self._once(method, path, body, limit)
            except _Dropped as exc:
                if method != "GET" or attempt == MAX_ATTEMPTS:
                    raise EngineError(
                        f"{self.where(path)} closed the connection without an answer ({exc}); is the "
                        "server restarting?"
                    ) from None
                self._wait(attempt, None, f"the connection dropped ({exc})")
                continue
            if reply.status in accept:
                return reply
            if reply.status in RETRY_STATUSES and attempt < MAX_ATTEMPTS:
                self._wait(attempt, retry_after, f"HTTP {reply.status}")
                continue
            raise self._status_error(path, reply, attempt, time.monotonic() - started)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _wait(self, attempt: int, retry_after: float | None, why: str) -> None:
        delay = (
            min(BACKOFF_FIRST * 2 ** (attempt - 1), BACKOFF_CAP)
            if retry_after is None
            else min(max(retry_after, 0.0), RETRY_AFTER_CAP)
        )
        self.notify(
            f"{self.endpoint.url}: {why}, retrying in {delay:.1f} s (attempt {attempt + 1} of {MAX_ATTEMPTS})"
        )
        self.sleep(delay)

    def _status_error(self, path: str, reply: Reply, attempts: int, elapsed: float) -> EngineError:
        said = self._server_message(reply)
        where = self.where(path)
        if reply.status in (401, 403):
            hint = (
                "the key given was refused"
                if self._api_key
                else f"the server wants an API key: give it with --api-key or the {API_KEY_ENV} environment variable"
            )
            return EngineError(f"{where} answered HTTP {reply.status} ({hint}){said}")
        if reply.status in RETRY_STATUSES:
            return EngineError(
                f"{where} answered HTTP {reply.status} to {attempts} attempts over {elapsed:.0f} s: the "
                f"server is overloaded or still starting; try again when its /health answers 200{said}"
            )
        return EngineError(f"{where} answered HTTP {reply.status}{said}")

    def _server_message(self, reply: Reply) -> str:
        """The server's own error text (an OpenAI-style {"error": {"message"}}, {"error": "..."}, {"detail"} or
        plain text), scrubbed and shortened; empty when there is none."""
        text = reply.body[:4096].decode("utf-8", errors="replace")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            err = doc.get("error", doc.get("detail", doc.get("message")))
            if isinstance(err, dict):
                err = err.get("message", err)
            text = err if isinstance(err, str) else json.dumps(err)[:MESSAGE_CHARS] if err is not None else ""
        elif "html" in reply.content_type:
            text = "(an HTML page: a proxy or another web server answers at this address)"
        text = self.scrub(text)[:MESSAGE_CHARS]
        return f": {text}" if text else ""

    def decode(self, reply: Reply, kind: type[Any], what: str) -> Any:
        """The reply body as `kind`; EngineError naming `what` for anything that is not JSON of that shape."""
        try:
            return msgspec.json.decode(reply.body, type=kind)
        except msgspec.ValidationError as exc:
            raise EngineError(
                f"{what} is not what the engine's release returns: {self.scrub(str(exc))}"
            ) from None
        except (msgspec.DecodeError, RecursionError):
            start = self.scrub(reply.body[:80].decode("utf-8", errors="replace"))
            raise EngineError(f"{what} is not JSON (it starts {start!r})") from None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        e = self.endpoint
        if e.scheme == "https":
            return http.client.HTTPSConnection(
                e.host, e.port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(e.host, e.port, timeout=timeout)

    def _once(self, method: str, path: str, body: bytes | None, limit: int) -> tuple[Reply, float | None]:
        deadline = time.monotonic() + self.timeout
        headers = {
            "Accept": "application/json, text/plain;q=0.9",
            "User-Agent": f"lilicorr-ckpt/{__version__} smoke",
            "Connection": "close",
        }
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        conn = self._connection(min(self.timeout, 30.0))
        where = self.where(path)
        try:
            try:
                conn.connect()
            except (ConnectionRefusedError, socket.gaierror, TimeoutError, OSError) as exc:
                raise EngineUnreachable(
                    f"nothing answers at {self.endpoint.url} ({self._reason(exc)})"
                ) from None
            try:
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                conn.request(method, self.endpoint.base_path + path, body=body, headers=headers)
                response = conn.getresponse()
                length = response.getheader("Content-Length")
                if length is not None and length.strip().isdigit() and int(length) > limit:
                    raise EngineError(
                        f"{where} sent a reply of {int(length)} bytes; more than {limit} bytes is not "
                        "what this endpoint returns, so it was not read"
                    )
                data = bytearray()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    conn.sock.settimeout(left)
                    chunk = response.read1(CHUNK) if hasattr(response, "read1") else response.read(CHUNK)
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > limit:
                        raise EngineError(
                            f"{where} sent more than {limit} bytes; more than that is not what this "
                            "endpoint returns, so the rest was not read"
                        )
            except TimeoutError:
                raise EngineError(f"{where} did not answer within {self.timeout:g} s (--timeout)") from None
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                http.client.IncompleteRead,
            ) as exc:
                raise _Dropped(self._reason(exc)) from None
            except (http.client.HTTPException, OSError) as exc:
                raise EngineError(
                    f"{where}: the reply is not HTTP this client can read ({self._reason(exc)})"
                ) from None
            retry_after = _seconds(response.getheader("Retry-After"))
            content_type = (response.getheader("Content-Type") or "").lower()
            return Reply(response.status, bytes(data), content_type), retry_after
        finally:
            conn.close()

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, socket.gaierror):
            return f"the host name does not resolve: {exc.strerror or exc}"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused: no server listens on that port"
        if isinstance(exc, TimeoutError):
            return "the connection timed out"
        return self.scrub(str(exc) or type(exc).__name__)


class _Dropped(Exception):
    """The connection ended before a whole reply came."""


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value.strip())
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
