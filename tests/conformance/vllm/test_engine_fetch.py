"""tests/conformance/engines.py's members-only fetch, against a local index and file server: only the wanted
members of a wheel travel (HTTP Range), each checked against the wheel's RECORD; a server that ignores Range gets
the whole wheel instead."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import random
import threading
import zipfile
from pathlib import Path

import pytest
import vllm_release

engines = vllm_release.engines()

NAME, VERSION = "toyengine", "1.2.3"
WHEEL = f"{NAME}-{VERSION}-py3-none-any.whl"
MEMBERS = {
    f"{NAME}/__init__.py": b"VALUE = 1\n",
    f"{NAME}/models/config.json": b'{"a": 1}\n',
    f"{NAME}/_C.abi3.so": random.Random(0).randbytes(1 << 20),  # 1 MiB the suite never reads
    f"{NAME}/models/model.py": b"class Model:\n    pass\n" * 50,
}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def toy_wheel(tamper: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        record = []
        for name, data in MEMBERS.items():
            z.writestr(name, data)
            record.append(f"{name},{_record_hash(b'x' if tamper else data)},{len(data)}")
        record.append(f"{NAME}-{VERSION}.dist-info/RECORD,,")
        z.writestr(f"{NAME}-{VERSION}.dist-info/RECORD", "\n".join(record) + "\n")
    return buffer.getvalue()


class Server:
    """A simple JSON index (`/simple/<name>/`) and a file server, with or without Range support."""

    def __init__(self, wheel: bytes, ranges: bool):
        self.wheel, self.ranges, self.requests = wheel, ranges, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.requests.append((self.path, self.headers.get("Range")))
                if self.path == f"/simple/{NAME}/":
                    body = json.dumps(
                        {
                            "meta": {"api-version": "1.1"},
                            "name": NAME,
                            "files": [
                                {
                                    "filename": WHEEL,
                                    "url": f"http://127.0.0.1:{outer.port}/files/{WHEEL}",
                                    "hashes": {"sha256": hashlib.sha256(outer.wheel).hexdigest()},
                                }
                            ],
                        }
                    ).encode()
                    self._send(200, body, {"Content-Type": "application/vnd.pypi.simple.v1+json"})
                elif self.path == f"/files/{WHEEL}":
                    spec = self.headers.get("Range")
                    if spec and outer.ranges:
                        first, last = self._span(spec[len("bytes=") :], len(outer.wheel))
                        self._send(
                            206,
                            outer.wheel[first : last + 1],
                            {"Content-Range": f"bytes {first}-{last}/{len(outer.wheel)}"},
                        )
                    else:
                        self._send(200, outer.wheel, {})
                else:
                    self._send(404, b"", {})

            @staticmethod
            def _span(spec: str, size: int) -> tuple[int, int]:
                start, _, end = spec.partition("-")
                if not start:
                    return max(0, size - int(end)), size - 1
                return int(start), min(size - 1, int(end)) if end else size - 1

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(engines, "CACHE", tmp_path / "engines")
    monkeypatch.delenv("LILICORR_ENGINE_FETCH", raising=False)
    return tmp_path / "engines"


def _index(monkeypatch, server: Server) -> None:
    monkeypatch.setattr(engines, "SIMPLE_INDEX", f"http://127.0.0.1:{server.port}/simple")


def _unpacked(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != ".complete"
    }


WANTED = {name: data for name, data in MEMBERS.items() if name.endswith((".py", ".json"))}


def test_only_the_wanted_members_travel(cache, monkeypatch):
    wheel = toy_wheel()
    with Server(wheel, ranges=True) as server:
        _index(monkeypatch, server)
        root = engines.sources(NAME, VERSION)
    assert _unpacked(root) == WANTED
    marker = (root / ".complete").read_text()
    assert marker.startswith(f"{WHEEL}\nmembers only:"), marker
    files = [r for path, r in server.requests if path.startswith("/files/")]
    assert files and all(r is not None for r in files)  # every request for the wheel is a Range request
    fetched = int(marker.split(" bytes")[0].rsplit(" ", 1)[-1])
    assert fetched < len(MEMBERS[f"{NAME}/_C.abi3.so"]) // 4 < len(wheel) // 4  # the .so never travelled
    assert not (cache / "wheels").exists()


def test_a_server_without_ranges_gets_the_whole_wheel(cache, monkeypatch):
    wheel = toy_wheel()
    with Server(wheel, ranges=False) as server:
        _index(monkeypatch, server)
        root = engines.sources(NAME, VERSION)
    assert _unpacked(root) == WANTED
    assert (root / ".complete").read_text() == f"{WHEEL}\n"
    assert (cache / "wheels" / WHEEL).read_bytes() == wheel


def test_a_member_unlike_its_record_is_refused(cache, monkeypatch, tmp_path):
    with Server(toy_wheel(tamper=True), ranges=True) as server:
        _index(monkeypatch, server)
        with pytest.raises(engines.FetchError, match="sha256"):
            engines.fetch_members(NAME, VERSION, tmp_path / "into")


def test_under_ci_a_failed_fetch_fails(cache, monkeypatch):
    monkeypatch.setenv("CI", "true")
    with Server(toy_wheel(tamper=True), ranges=True) as server:
        _index(monkeypatch, server)
        with pytest.raises(pytest.fail.Exception, match="could not fetch the sources"):
            engines.sources(NAME, VERSION)
    assert not (cache / f"{NAME}-{VERSION}").exists()


def test_the_manylinux_x86_64_wheel_is_picked(monkeypatch):
    files = [
        {"filename": f"{NAME}-{VERSION}-cp38-abi3-manylinux_2_28_aarch64.whl", "url": "a"},
        {"filename": f"{NAME}-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl", "url": "b"},
        {"filename": f"{NAME}-{VERSION}-cp38-abi3-macosx_11_0_arm64.whl", "url": "c"},
        {"filename": f"{NAME}-{VERSION}.tar.gz", "url": "d"},
        {"filename": f"{NAME}-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl", "url": "e", "yanked": True},
    ]

    class Response(io.BytesIO):
        headers = {"Content-Type": "application/vnd.pypi.simple.v1+json"}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(
        engines, "_get", lambda url, headers=None: Response(json.dumps({"files": files}).encode())
    )
    assert engines.find_wheel(NAME, VERSION)["url"] == "b"
