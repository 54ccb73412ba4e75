"""HTTP to the user's engine server with the standard library only: every request bounded in time and in reply
size, 429 / 503 retried with a bounded backoff, and the credential never in a message.

A server is a stranger here: it may be down, starting, overloaded, behind a proxy that answers HTML, or hostile
(a reply that never ends, a body of gigabytes, headers sent a byte a second, a header that echoes the key back).
Each of those ends the run with exit 2 and one sentence saying which, never a traceback or a hung process.

Bounds, per attempt: one deadline (--timeout) over the name lookup, the connection, the TLS handshake, sending,
the status line and headers, and the body; the body read as its framing says (Content-Length, chunked, or until
the server closes the connection, as an HTTP/1.0 reply without a length ends), never past the endpoint's size
limit. Retries: 429 and 503 (and a dropped GET) at most MAX_ATTEMPTS times, waiting the doubling backoff or the
server's Retry-After held to [0, RETRY_AFTER_CAP] seconds (retry_delay).
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import io
import json
import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import timezone
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
RETRY_AFTER_CAP = 30.0  # a Retry-After header is honoured up to this (retry_delay)
CONNECT_TIMEOUT = 30.0  # seconds per address tried, within the attempt's deadline
CHUNK = 1 << 16
MESSAGE_CHARS = 300  # of a server's own error text, in our message
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes superscripts, which int() refuses
_DELAY_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


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
                        f"{self.where(path)} closed the connection before a whole answer ({exc}); is the "
                        "server restarting, or a proxy in front of it cutting replies short?"
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
            if retry_after is None or not math.isfinite(retry_after)
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

    def _once(self, method: str, path: str, body: bytes | None, limit: int) -> tuple[Reply, float | None]:
        """One attempt under one deadline, self.timeout seconds from now: resolving the name, connecting (each
        address at most CONNECT_TIMEOUT of it), the TLS handshake, sending the request, the status line and headers,
        and the body all share it. http.client bounds each socket read by the socket's timeout, not the whole reply,
        so every read here is given what is left of the deadline: a server that trickles its headers a byte at a time
        ends the attempt when the deadline passes, as one that never answers does."""
        deadline = _Deadline(self.timeout)
        headers = {
            "Accept": "application/json, text/plain;q=0.9",
            "User-Agent": f"lilicorr-ckpt/{__version__} smoke",
            "Connection": "close",
        }
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        conn = _Connection(self.endpoint, deadline)
        where = self.where(path)
        try:
            try:
                conn.connect()
            except _Expired:
                raise EngineUnreachable(
                    f"nothing answers at {self.endpoint.url} (no connection within {self.timeout:g} s, --timeout)"
                ) from None
            except OSError as exc:
                raise EngineUnreachable(
                    f"nothing answers at {self.endpoint.url} ({self._reason(exc)})"
                ) from None
            stage = "while the request was being sent"
            data = bytearray()
            try:
                conn.request(method, self.endpoint.base_path + path, body=body, headers=headers)
                stage = "headers"
                response = conn.getresponse()
                stage = "body"
                length = response.getheader("Content-Length")
                if length is not None and _DIGITS.fullmatch(length.strip()) and int(length) > limit:
                    raise EngineError(
                        f"{where} sent a reply of {int(length)} bytes; more than {limit} bytes is not "
                        "what this endpoint returns, so it was not read"
                    )
                # the body as its framing says: Content-Length bytes, chunks, or (HTTP/1.0, or no length and no
                # chunking) everything until the server closes the connection; each bounded by `limit`
                while chunk := response.read1(CHUNK):
                    data += chunk
                    if len(data) > limit:
                        raise EngineError(
                            f"{where} sent more than {limit} bytes; more than that is not what this "
                            "endpoint returns, so the rest was not read"
                        )
                if response.length:  # the connection closed before the announced length came
                    raise _Dropped(
                        f"the reply ended after {len(data)} of the {len(data) + response.length} bytes its "
                        "Content-Length announced"
                    )
            except (_Expired, TimeoutError):
                raise EngineError(self._late(where, stage, conn.received, len(data))) from None
            except (
                http.client.RemoteDisconnected,
                ConnectionResetError,
                BrokenPipeError,
                http.client.IncompleteRead,
            ) as exc:
                raise _Dropped(self._reason(exc)) from None
            except (http.client.HTTPException, OSError, ValueError) as exc:
                raise EngineError(
                    f"{where}: the reply is not HTTP this client can read ({self._reason(exc)})"
                ) from None
            retry_after = retry_delay(response.getheader("Retry-After"))
            content_type = (response.getheader("Content-Type") or "").lower()
            return Reply(response.status, bytes(data), content_type), retry_after
        finally:
            conn.shut()

    def _late(self, where: str, stage: str, received: int, body: int) -> str:
        """The message of an attempt the deadline ended: where in the exchange it was."""
        if stage == "headers":
            stage = (
                f"while its status line and headers were still arriving ({received} bytes of them so far)"
                if received
                else "before its reply began"
            )
        elif stage == "body":
            stage = f"while its body was still arriving ({body} bytes so far)"
        return (
            f"{where} did not answer within {self.timeout:g} s (--timeout): the time ran out {stage}; raise "
            "--timeout if the server is only slow (a long generation on a large target), otherwise the server "
            "or a proxy in front of it is stuck"
        )

    def _reason(self, exc: BaseException) -> str:
        """What went wrong, in words: never an exception's class name."""
        if isinstance(exc, socket.gaierror):
            return f"the host name does not resolve: {exc.strerror or 'no address'}"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused: no server listens on that port"
        if isinstance(exc, TimeoutError):
            return "the connection timed out"
        if isinstance(exc, ssl.SSLCertVerificationError):
            return f"its TLS certificate is not trusted: {self.scrub(exc.verify_message or exc.reason or '')}"
        if isinstance(exc, ssl.SSLError):
            if exc.reason == "WRONG_VERSION_NUMBER":
                return "the server does not speak TLS on that port (an http:// URL?)"
            return f"the TLS exchange failed: {self.scrub(exc.reason or exc.strerror or 'no reason given')}"
        if isinstance(exc, http.client.RemoteDisconnected):
            return "the server closed the connection without a reply"
        if isinstance(exc, ConnectionResetError):
            return "the server reset the connection"
        if isinstance(exc, BrokenPipeError):
            return "the server closed the connection while the request was being sent"
        if isinstance(exc, http.client.IncompleteRead):
            if exc.expected:
                return f"the reply ended after {len(exc.partial)} bytes, {exc.expected} more expected"
            return "the reply ended in the middle of a chunk"
        if isinstance(exc, http.client.LineTooLong):
            return "a header line longer than 64 KiB"
        if isinstance(exc, http.client.BadStatusLine):
            return f"its status line is {self.scrub(str(exc.args[0] if exc.args else ''))[:80]!r}"
        if isinstance(exc, http.client.UnknownProtocol):
            return f"the protocol {self.scrub(str(exc.args[0] if exc.args else ''))[:40]!r} is not HTTP/1.x"
        if isinstance(exc, OSError) and exc.strerror:
            return self.scrub(exc.strerror)
        text = (
            self.scrub(str(exc)) if isinstance(exc, (OSError, http.client.HTTPException, ValueError)) else ""
        )
        return text[:MESSAGE_CHARS] or "no reason given"


class _Dropped(Exception):
    """The connection ended before a whole reply came."""


def retry_delay(value: str | None, now: float | None = None) -> float | None:
    """The wait a Retry-After header asks for, in [0, RETRY_AFTER_CAP] seconds; None (our own backoff) without one.

    delay-seconds (digits; a decimal fraction is tolerated) is held to RETRY_AFTER_CAP however large; an HTTP-date
    (RFC 9110 section 10.2.3) is the time until it, held to [0, RETRY_AFTER_CAP] (a date already past: at once).
    Anything else (negative, nan, inf, 1e9, a word) is not a delay the header can carry, so the usual doubling
    backoff applies."""
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):  # digits: float() of any length is at most inf, which the cap holds
        return min(float(text), RETRY_AFTER_CAP)
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:  # "-0000": UTC, by RFC 5322
            when = when.replace(tzinfo=timezone.utc)
        delta = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
    return min(max(delta, 0.0), RETRY_AFTER_CAP)


class _Expired(Exception):
    """The attempt's deadline passed."""


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        """The seconds left (at most `cap`); _Expired when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise _Expired
        return left if cap is None else min(left, cap)


def _resolve(host: str, port: int, deadline: _Deadline) -> list[Any]:
    """getaddrinfo's addresses within the deadline. A numeric address needs no lookup; a name is looked up in a
    daemon thread, since getaddrinfo takes no timeout (a resolver that hangs is left behind, and the run ends)."""
    with contextlib.suppress(socket.gaierror, UnicodeError):
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except UnicodeError:  # a label longer than 63 characters and the like: idna refuses it
            found.append(socket.gaierror(socket.EAI_NONAME, "not a valid host name"))
        except OSError as exc:
            found.append(exc)

    worker = threading.Thread(target=lookup, name="smoke-engine-resolve", daemon=True)
    worker.start()
    worker.join(deadline.left())
    if not found:
        raise _Expired
    if isinstance(found[0], OSError):
        raise found[0]
    return list(found[0])


def _open(host: str, port: int, deadline: _Deadline) -> socket.socket:
    """A TCP connection within the deadline: each address in turn, at most CONNECT_TIMEOUT each."""
    failure: OSError = socket.gaierror(socket.EAI_NONAME, "no address")
    for family, kind, proto, _, address in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left(CONNECT_TIMEOUT))
            sock.connect(address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise failure


class _DeadlineSocket:
    """A connected socket as http.client uses it (sendall, makefile("rb"), close), each send and receive given what
    is left of the deadline, so no number of slow reads outlasts it. close() leaves the socket open: http.client
    closes its connection as soon as it has the headers of a reply that ends with the connection (HTTP/1.0, or no
    Content-Length and no chunking), whose body is still to be read; the attempt closes it (_Connection.shut)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock = sock
        self.deadline = deadline
        self.received = 0

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(self.deadline.left())
            view = view[self.sock.send(view) :]

    def recv_into(self, buffer: Any) -> int:
        self.sock.settimeout(self.deadline.left())
        got = self.sock.recv_into(buffer)
        self.received += got
        return got

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self), CHUNK)

    def close(self) -> None:
        pass


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)


class _Connection(http.client.HTTPConnection):
    """http.client's connection over _open and _DeadlineSocket (TLS for https, verified against the system's
    certificates)."""

    def __init__(self, endpoint: Endpoint, deadline: _Deadline) -> None:
        super().__init__(endpoint.host, endpoint.port)
        self.default_port = 443 if endpoint.scheme == "https" else 80  # the Host header names other ports
        self._deadline = deadline
        self._tls = ssl.create_default_context() if endpoint.scheme == "https" else None
        self._raw: socket.socket | None = None
        self._wrapped: _DeadlineSocket | None = None

    @property
    def received(self) -> int:
        return self._wrapped.received if self._wrapped is not None else 0

    def connect(self) -> None:
        self._raw = _open(self.host, self.port, self._deadline)
        if self._tls is not None:
            self._raw.settimeout(self._deadline.left())  # the handshake as a whole: ssl bounds it by this
            self._raw = self._tls.wrap_socket(self._raw, server_hostname=self.host)
        self._wrapped = _DeadlineSocket(self._raw, self._deadline)
        self.sock = self._wrapped  # what http.client calls of a socket, no more

    def shut(self) -> None:
        self.sock = None
        if self._raw is not None:
            self._raw.close()
