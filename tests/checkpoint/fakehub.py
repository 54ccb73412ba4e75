"""A loopback fake of the Hugging Face Hub endpoints huggingface_hub uses to read a model repo.

Bound to 127.0.0.1 only. Serves, for repos added with `FakeHub.add`:
  GET  /api/models/{repo}[/revision/{rev}]   model info: sha, siblings (sizes and LFS info with ?blobs=true)
  GET  /api/models/{repo}/tree/{rev}          the recursive file listing (what snapshot_download reads)
  GET  /{repo}/resolve/{rev}/{file}          file bytes, with Range (206 + Content-Range), ETag, X-Repo-Commit
  HEAD /{repo}/resolve/{rev}/{file}          the same headers, no body (X-Linked-Size / X-Linked-Etag for LFS)
  GET  /cdn/{sha}/{file}                     where LFS files redirect to when `redirect_lfs` is set
Errors carry the X-Error-Code header huggingface_hub maps to its exceptions (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo). Every request is logged with the bytes of body it sent, so tests can assert
that no tensor data left the server.

Hostile behaviour, for the tests that a Hub cannot hang, flood or crash the tool:
  raw_info[repo_id] = Reply(...)        the model info reply, verbatim (a gzip bomb, wrong JSON types, ...)
  stall=fn(path, range) -> bool         matching requests are never answered (until the hub closes); `stalled`
                                        is set once one arrives
  drip=(REGEX, SECONDS)                 bodies of matching paths are sent one byte every SECONDS (slow loris)
  Sparse(prefix, size)                  a file of `size` bytes, `prefix` then zeros, never held in memory
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class Sparse:
    """A large file as `prefix` followed by zeros up to `size` bytes: only the parts asked for are built."""

    def __init__(self, prefix: bytes, size: int):
        self.prefix = prefix
        self.size = max(size, len(prefix))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.size)
        head = self.prefix[start:stop]
        return head + bytes(max(0, stop - max(start, len(self.prefix))))

    def digest(self) -> bytes:
        return hashlib.sha1(self.prefix + str(self.size).encode()).digest()


def _digest(data) -> str:
    return data.digest().hex() if isinstance(data, Sparse) else hashlib.sha1(data).hexdigest()


def _sha256(data) -> str:
    return hashlib.sha256(data.digest() if isinstance(data, Sparse) else data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes | Sparse]] = field(default_factory=dict)  # sha -> files
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> sha
    token: str | None = None  # private: this bearer token is required
    gated: bool = False


@dataclass
class Reply:
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200


@dataclass
class Hit:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


def _sha(files: dict[str, bytes | Sparse], salt: str) -> str:
    h = hashlib.sha1(salt.encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + bytes.fromhex(_digest(files[name])))
    return h.hexdigest()


class FakeHub:
    def __init__(
        self,
        *,
        ignore_range: bool = False,
        redirect_lfs: bool = False,
        list_sizes: bool = True,
        stall: Callable[[str, str | None], bool] | None = None,
        drip: tuple[str, float] | None = None,
    ):
        self.repos: dict[str, Repo] = {}
        self.raw_info: dict[str, Reply] = {}
        self.stall = stall
        self.drip = (re.compile(drip[0]), drip[1]) if drip else None
        self.stalled = threading.Event()
        self._closing = threading.Event()
        self.hits: list[Hit] = []
        self.ignore_range = ignore_range
        self.redirect_lfs = redirect_lfs
        self.list_sizes = list_sizes
        self.auth_seen: list[str | None] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._handle(self, "GET")

            def do_HEAD(self):
                hub._handle(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for serve_forever to look at its flag, every poll_interval: 0.5 s by default, which was
        # half a second of nothing at the end of every test that starts a hub
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # --- setup ---------------------------------------------------------------------------------------------

    def add(
        self,
        repo_id: str,
        files: dict[str, bytes | Sparse] | Path,
        *,
        ref: str = "main",
        token: str | None = None,
        gated: bool = False,
    ) -> str:
        """Add a commit (files, or every file of a directory) to repo_id and point ref at it; returns its sha."""
        if isinstance(files, Path):
            files = {p.name: p.read_bytes() for p in sorted(files.iterdir()) if p.is_file()}
        repo = self.repos.setdefault(repo_id, Repo())
        repo.token = token if token is not None else repo.token
        repo.gated = gated or repo.gated
        sha = _sha(files, f"{repo_id}@{ref}")
        repo.commits[sha] = dict(files)
        repo.refs[ref] = sha
        return sha

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()  # stalled and dripping handlers give up
        self.server.shutdown()
        self.server.server_close()

    def bytes_sent(self, filename: str) -> int:
        return sum(h.body_bytes for h in self.hits if h.method == "GET" and h.path.endswith("/" + filename))

    # --- serving -------------------------------------------------------------------------------------------

    def _send(
        self,
        req: BaseHTTPRequestHandler,
        method: str,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        req.send_response(status)
        for k, v in (headers or {}).items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(body)))  # for HEAD: the length GET would send
        req.end_headers()
        sent = 0
        path = urlsplit(req.path).path
        step, pause = (1, self.drip[1]) if self.drip and self.drip[0].search(path) else (4096, 0.0)
        if method == "GET" and body:
            try:
                for i in range(0, len(body), step):  # in chunks, so a client that hangs up stops the count
                    if pause:
                        if self._closing.wait(pause):
                            break
                        req.wfile.flush()
                    req.wfile.write(body[i : i + step])
                    sent += len(body[i : i + step])
                req.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
        with self._lock:
            self.hits.append(Hit(method, urlsplit(req.path).path, req.headers.get("Range"), status, sent))

    def _error(self, req, method, status: int, code: str, message: str = "") -> None:
        body = json.dumps({"error": message or code}).encode()
        self._send(
            req,
            method,
            status,
            body,
            {
                "Content-Type": "application/json",
                "X-Error-Code": code,
                **({"X-Error-Message": message} if message else {}),
            },
        )

    def _repo(self, req, method, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        auth = req.headers.get("Authorization")
        with self._lock:
            self.auth_seen.append(auth)
        if repo is None or (repo.token is not None and auth != f"Bearer {repo.token}"):
            self._error(req, method, 401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and auth is None:
            self._error(req, method, 403, "GatedRepo", "Access to this model is restricted")
            return None
        return repo

    def _commit(self, req, method, repo: Repo, rev: str) -> str | None:
        rev = unquote(rev)
        if rev in repo.refs:
            return repo.refs[rev]
        if rev in repo.commits:
            return rev
        self._error(req, method, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return None

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(req.path).path
        if self.stall is not None and self.stall(path, req.headers.get("Range")):
            self.stalled.set()
            self._closing.wait(120)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._model_info(req, method, m.group(1), m.group(2) or "main")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
        if m:
            return self._tree(req, method, m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(req, method, m.group(1), m.group(2), unquote(m.group(3)))
        m = re.fullmatch(r"/cdn/([0-9a-f]+)/(.+)", path)
        if m:
            for repo in self.repos.values():
                if m.group(1) in repo.commits:
                    data = repo.commits[m.group(1)].get(unquote(m.group(2)))
                    if data is not None:
                        return self._file(req, method, data, {})
        self._error(req, method, 404, "NotFound")

    def _model_info(self, req, method, repo_id: str, rev: str) -> None:
        if repo_id in self.raw_info:
            reply = self.raw_info[repo_id]
            return self._send(
                req, method, reply.status, reply.body, {"Content-Type": "application/json", **reply.headers}
            )
        repo = self._repo(req, method, repo_id)
        if repo is None:
            return
        sha = self._commit(req, method, repo, rev)
        if sha is None:
            return
        blobs = "blobs=true" in (urlsplit(req.path).query or "")
        siblings = []
        for name, data in sorted(repo.commits[sha].items()):
            sib: dict[str, object] = {"rfilename": name}
            if blobs and self.list_sizes:
                sib["size"] = len(data)
                sib["blobId"] = _digest(data)
                if name.endswith(LFS_SUFFIXES):
                    sib["lfs"] = {"size": len(data), "sha256": _sha256(data), "pointerSize": 134}
            siblings.append(sib)
        body = json.dumps(
            {
                "_id": sha[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": repo.token is not None,
                "gated": repo.gated,
                "disabled": False,
                "tags": [],
                "siblings": siblings,
                "lastModified": "2026-01-01T00:00:00.000Z",
            }
        ).encode()
        self._send(req, method, 200, body, {"Content-Type": "application/json"})

    def _tree(self, req, method, repo_id: str, rev: str) -> None:
        """The recursive file listing snapshot_download asks for (one page: no Link header)."""
        repo = self._repo(req, method, repo_id)
        if repo is None:
            return
        sha = self._commit(req, method, repo, rev)
        if sha is None:
            return
        entries = []
        for name, data in sorted(repo.commits[sha].items()):
            entry: dict[str, object] = {"type": "file", "path": name, "size": len(data), "oid": _digest(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": _sha256(data), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        self._send(req, method, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

    def _resolve(self, req, method, repo_id: str, rev: str, filename: str) -> None:
        repo = self._repo(req, method, repo_id)
        if repo is None:
            return
        sha = self._commit(req, method, repo, rev)
        if sha is None:
            return
        data = repo.commits[sha].get(filename)
        if data is None:
            return self._error(req, method, 404, "EntryNotFound", f"{filename} does not exist")
        headers = {"X-Repo-Commit": sha, "ETag": f'"{_digest(data)}"', "Accept-Ranges": "bytes"}
        if filename.endswith(LFS_SUFFIXES):
            headers["X-Linked-Etag"] = f'"{_sha256(data)}"'
            headers["X-Linked-Size"] = str(len(data))
            if self.redirect_lfs:
                headers["Location"] = f"{self.url}/cdn/{sha}/{filename}"
                return self._send(req, method, 302, b"", headers)
        self._file(req, method, data, headers)

    def _file(self, req, method, data: bytes, headers: dict[str, str]) -> None:
        rng = req.headers.get("Range")
        if rng and not self.ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m is None:
                return self._error(req, method, 416, "RangeNotSatisfiable")
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data) or end < start:
                return self._send(req, method, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
            part = data[start : end + 1]
            return self._send(
                req, method, 206, part, {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
            )
        self._send(req, method, 200, data, headers)
