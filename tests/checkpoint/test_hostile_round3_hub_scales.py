"""The NVFP4 global scales read from a Hub (remote.py scale_spans / _read_scales) against a server that answers the
scale ranges wrongly: the drafter is judged without the scales (hub.scales_read false), promptly, and no tensor
data is streamed. Served by the loopback fake Hub."""

from __future__ import annotations

import json
import re
import struct
import time

import pytest
from fakehub import FakeHub, Sparse
from test_remote import TINY

from lilicorr_ckpt.checks.run import validate_spec

DATA = 32 << 20  # the packed weight in front of the scale: 32 MiB of tensor data that must never be sent


def shard() -> Sparse:
    """A safetensors file whose one global scale lies past DATA bytes of weight (a sparse file of zeros)."""
    header = {
        "a.weight": {"dtype": "U8", "shape": [DATA], "data_offsets": [0, DATA]},
        "a.weight_scale_2": {"dtype": "F32", "shape": [], "data_offsets": [DATA, DATA + 4]},
    }
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return Sparse(struct.pack("<Q", len(body)) + body, 8 + len(body) + DATA + 4)


class ScaleHub(FakeHub):
    """Answers the length prefix and the header as a Hub does, and every range past them as `mode` says."""

    mode = ""

    def _file(self, req, method, data, headers):
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", (req.headers.get("Range") or "").strip())
        if m is None or int(m.group(1)) < DATA:
            return super()._file(req, method, data, headers)
        start, end = int(m.group(1)), int(m.group(2))
        if self.mode == "whole file":  # a Range answered 200: the whole file from byte 0
            return self._send(req, method, 200, data[0 : len(data)], headers)
        if self.mode == "short body":
            part = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
            return self._send(req, method, 206, data[start : end - 1], part)
        if self.mode == "another range":
            part = {**headers, "Content-Range": f"bytes 0-3/{len(data)}"}
            return self._send(req, method, 206, data[0:4], part)
        return self._error(req, method, 503, "Unavailable", "try later")


def _judge(hub: ScaleHub, monkeypatch, tmp_path):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    files: dict[str, bytes | Sparse] = {"config.json": (TINY / "config.json").read_bytes()}
    files["model.safetensors"] = shard()
    hub.add("acme/scales", files)
    began = time.monotonic()
    report = validate_spec("acme/scales", timeout=20)
    return report, time.monotonic() - began


def _scale_reads(hub: ScaleHub) -> list[int]:
    """The body bytes the server sent for each scale range (waiting for a hung-up handler to log itself)."""
    for _ in range(100):
        reads = [h.body_bytes for h in hub.hits if h.range and int(h.range[6:].split("-")[0]) >= DATA]
        if reads:
            return reads
        time.sleep(0.01)
    return []


def test_a_scale_range_answered_with_the_whole_file_is_hung_up_on_not_streamed(monkeypatch, tmp_path):
    # the reply was read from byte 0 up to the scale, every byte kept in memory: 32 MiB here, GBs for a scale
    # behind a large weight, for 4 bytes
    with ScaleHub() as hub:
        hub.mode = "whole file"
        report, seconds = _judge(hub, monkeypatch, tmp_path)
        sent = _scale_reads(hub)
    assert report.hub is not None and report.hub.scales_read is False and report.hub.scale_bytes == 0
    # hung up on: what the socket buffers held at most, not the file
    assert len(sent) == 1 and sent[0] < DATA // 2, sent
    assert seconds < 2


@pytest.mark.parametrize("mode", ["short body", "another range", "503"])
def test_a_scale_range_answered_wrongly_is_judged_without_the_scales(monkeypatch, tmp_path, mode):
    with ScaleHub() as hub:
        hub.mode = mode
        report, seconds = _judge(hub, monkeypatch, tmp_path)
    assert report.hub is not None and report.hub.scales_read is False and report.hub.scale_bytes == 0
    assert seconds < 2
