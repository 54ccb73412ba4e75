"""Sizes a Hub states in its headers (Content-Range's total, for the length prefix and for the NVFP4 scale ranges)
that are not plain ASCII decimal numbers: `²` passes str.isdigit, and so does a 5,000-digit total, but int()
refuses both (and reads `٣`, which a header written in Latin-1 cannot carry, as 3). Each was an internal error ("HubReadBug: ValueError"), with no JSON report; now the total
counts as not stated. Served by the loopback fake Hub."""

from __future__ import annotations

import json
import re
import struct

import pytest
from fakehub import FakeHub, Sparse
from test_remote import NVFP4

from lilicorr_ckpt.checkpoint.remote import _int_header
from lilicorr_ckpt.checks.run import validate_spec

DATA = 1 << 20  # the weight in front of the scale


def shard() -> Sparse:
    header = {
        "a.weight": {"dtype": "U8", "shape": [DATA], "data_offsets": [0, DATA]},
        "a.weight_scale_2": {"dtype": "F32", "shape": [], "data_offsets": [DATA, DATA + 4]},
    }
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return Sparse(struct.pack("<Q", len(body)) + body, 8 + len(body) + DATA + 4)


class TotalHub(FakeHub):
    """Answers every range as a Hub does, but with `total` as Content-Range's total for the ranges `where` says."""

    total = ""
    where = "scale"  # "scale": the ranges past the header; "prefix": the first 8 bytes

    def _file(self, req, method, data, headers):
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", (req.headers.get("Range") or "").strip())
        if m is None:
            return super()._file(req, method, data, headers)
        start, end = int(m.group(1)), int(m.group(2))
        if (self.where == "scale" and start >= DATA) or (self.where == "prefix" and start == 0):
            part = {**headers, "Content-Range": f"bytes {start}-{end}/{self.total}"}
            return self._send(req, method, 206, data[start : end + 1], part)
        return super()._file(req, method, data, headers)


@pytest.mark.parametrize("where", ["scale", "prefix"])
@pytest.mark.parametrize(
    "total", ["\u00b2", "9" * 5000, "1\u00b3"], ids=["superscript", "5000 digits", "digit and superscript"]
)
def test_a_size_that_is_no_ascii_number_is_not_stated_never_an_internal_error(
    monkeypatch, tmp_path, where, total
):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with TotalHub() as hub:
        hub.total, hub.where = total, where
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        files: dict[str, bytes | Sparse] = {
            n: (NVFP4 / n).read_bytes() for n in ("config.json", "hf_quant_config.json")
        }
        files["model.safetensors"] = shard()
        hub.add("acme/sizes", files)
        report = validate_spec("acme/sizes", timeout=20)  # raised HubReadBug before
    assert report.hub is not None
    # the listing states the file's size, so the header and the scale are still read
    assert report.hub.scales_read is True and report.hub.scale_bytes == 4


def test_header_numbers_are_ascii_decimals_of_at_most_20_digits():
    assert _int_header(" 123 ") == 123 and _int_header("0") == 0
    for junk in (None, "", "\u00b2", "\u0663", "-1", "+1", "1e3", "0x10", "1 2", "9" * 21):
        assert _int_header(junk) is None, junk
