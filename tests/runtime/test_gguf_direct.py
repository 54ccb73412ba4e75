"""The direct GGUF route (lilicorr_runtime/target/gguf_direct.py): every weight format it reads dequantizes to
exactly gguf's own values, Llama / Qwen2 / Qwen3 files load to exactly transformers' model and tokenizer, a file
it does not map goes to transformers (saying why), and a malformed file is refused with a GGUFError naming it,
never another exception."""

from __future__ import annotations

import os
import struct

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF targets need the gguf package (the runtime extra)")

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from runtime_helpers import assert_same_tokenizer, assert_same_weights, write_tiny_gguf  # noqa: E402

from lilicorr_runtime import load_target  # noqa: E402
from lilicorr_runtime.target import gguf_direct  # noqa: E402

Q = gguf.GGMLQuantizationType


def both_routes(path, monkeypatch):
    """(direct, transformers) loads of one file."""
    monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)
    direct = load_target(path, fast=False)
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")
    reference = load_target(path, fast=False)
    monkeypatch.delenv("LILICORR_GGUF_LOADER")
    return direct, reference


def assert_same_model(direct, reference, path):
    assert_same_weights(direct, reference)
    tied = direct.model.config.tie_word_embeddings
    assert (direct.model.lm_head.weight is direct.model.model.embed_tokens.weight) == tied
    text = "<|im_start|>user\nhello  world\t ünï 漢字<|im_end|>"
    assert_same_tokenizer(
        direct.tokenizer,
        reference.tokenizer,
        [text, " leading", "a\n\nb", "x 12345 y's"],
        gguf_path=path,
        every_token=True,
    )
    assert direct.eos_token_ids == reference.eos_token_ids


@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0])
def test_each_format_dequantizes_to_ggufs_own_values(tmp_path, kind):
    """Q4_0 / Q4_1 / Q8_0 in torch, F16 / BF16 / F32 as stored, others (Q5_0 here) through gguf itself."""
    name = "blk.0.ffn_up.weight"
    path = write_tiny_gguf(tmp_path / "one.gguf", tensor_types={name: kind})
    reader = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    expected = torch.from_numpy(np.array(gguf.quants.dequantize(reader.data, reader.tensor_type), np.float32))
    with gguf_direct.GGUFFile(path) as file:
        got = file.tensor(name)
    assert got.dtype == torch.float32 and got.shape == (128, 64)
    assert torch.equal(got, expected.reshape(128, 64))


@pytest.mark.parametrize(
    "arch, options",
    [
        ("llama", {"tensor_types": {"blk.0.attn_q.weight": Q.Q4_1, "blk.1.attn_k.weight": Q.Q4_0}}),
        # q/k/v biases, the embedding as the output; Qwen2's pre-tokenizer (every digit apart)
        ("qwen2", {"tied": True, "pre": "qwen2"}),
        # q/k norms
        ("qwen3", {"hidden": 256, "heads": 2, "pre": "qwen2", "extra": {"qwen3.attention.key_length": 128}}),
    ],
)
def test_llama_qwen2_and_qwen3_load_as_transformers_loads_them(tmp_path, monkeypatch, arch, options):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch, **options)
    direct, reference = both_routes(path, monkeypatch)
    assert direct.load_note == "read directly from the GGUF"
    assert_same_model(direct, reference, path)


def test_bf16_loads_cast_after_dequantizing_as_transformers_does(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tensor_types={"blk.0.attn_q.weight": Q.Q4_1})
    monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)
    direct = load_target(path, dtype=torch.bfloat16, fast=False)
    monkeypatch.setenv("LILICORR_GGUF_LOADER", "transformers")
    reference = load_target(path, dtype=torch.bfloat16, fast=False)
    ours, theirs = direct.model.state_dict(), reference.model.state_dict()
    assert all(ours[n].dtype == torch.bfloat16 and torch.equal(ours[n], t) for n, t in theirs.items())


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"extra": {"llama.rope.scaling.type": "linear"}}, "metadata key 'llama.rope.scaling.type'"),
        ({"pre": "llama-bpe"}, "pre-tokenizer 'llama-bpe'"),
        ({"add_bos": True}, "tokenizer.ggml.add_bos_token is set"),
        (
            {"extra": {"llama.rope.dimension_count": 8}},
            "llama.rope.dimension_count 8 differs from the head width 16",
        ),
    ],
)
def test_a_file_the_direct_route_does_not_map_goes_to_transformers_saying_why(
    tmp_path, options, reason, monkeypatch
):
    monkeypatch.delenv("LILICORR_GGUF_LOADER", raising=False)
    path = (
        write_tiny_gguf(tmp_path / "other.gguf", **options)
        if "rope.dimension_count" not in str(options)
        else None
    )
    if path is None:  # the writer states the rotary width itself: write the file without it, then add ours
        path = write_tiny_gguf(tmp_path / "other.gguf")
        with gguf_direct.GGUFFile(path) as file:
            assert file.metadata["llama.rope.dimension_count"] == 16
        path = _rewrite_u32(path, "llama.rope.dimension_count", 8)
    with pytest.raises(gguf_direct.Unsupported, match=f"^{reason}"):
        gguf_direct.read_target(path, torch.float32)
    try:
        target = load_target(path, fast=False)
    except ValueError:  # transformers may refuse it on its own terms; the route taken is what is under test
        return
    assert target.load_note == f"transformers' GGUF loader ({reason})"


def _rewrite_u32(path, key, value):
    """The file with the uint32 metadata value of `key` replaced (same length, so every offset stays)."""
    data = bytearray(path.read_bytes())
    raw = key.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    assert struct.unpack_from("<I", data, at)[0] == 4  # uint32
    struct.pack_into("<I", data, at + 4, value)
    path.write_bytes(bytes(data))
    return path


def _header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"GGML" + bytes(40), "not a GGUF file: it starts with b'GGML'"),
        (_header(2**40, 2**40) + bytes(64), "the header claims 1099511627776 tensors"),
        (_header(0, 1) + struct.pack("<Q", 100) + bytes(16), "metadata key 0 at byte 32 runs past its end"),
        (
            _header(0, 1) + struct.pack("<Q", 2**62) + bytes(16),
            "metadata key 0 is 4611686018427387904 bytes long, over the limit of 256",
        ),
        (
            _header(0, 1) + _string("k") + struct.pack("<I", 99) + bytes(16),
            "'k' has an unknown value type 99",
        ),
        (
            _header(0, 1) + _string("k") + struct.pack("<IIQ", 9, 8, 1000) + bytes(16),
            "metadata 'k' at byte 49 runs past its end",
        ),
        (
            _header(0, 1) + _string("k") + struct.pack("<IIQ", 9, 8, 2**40) + bytes(16),
            "metadata 'k' is an array of 1099511627776 items, over the limit of 1048576",
        ),
        (
            _header(0, 1) + _string("k") + struct.pack("<IQ", 8, 2) + b"\xff\xfe" + bytes(8),
            "'k' is not UTF-8",
        ),
        (
            _header(0, 1) + _string("general.alignment") + struct.pack("<II", 4, 48) + bytes(16),
            "general.alignment 48 is not a power of two",
        ),
        (
            _header(1, 0) + _string("t") + struct.pack("<I", 9) + bytes(64),
            "tensor 't' has 9 dimensions",
        ),
        (
            _header(1, 0) + _string("t") + struct.pack("<IQIQ", 1, 2**20, 0, 0) + bytes(64),
            "tensor 't' ends past the file's end",
        ),
        (
            _header(1, 0) + _string("t") + struct.pack("<IQIQ", 1, 33, 8, 0) + bytes(64),
            "tensor 't' rows of 33 do not fill its Q8_0 blocks of 32",
        ),
        (
            _header(2, 0) + (_string("t") + struct.pack("<IQIQ", 1, 4, 0, 0)) * 2 + bytes(64),
            "tensor 't' is listed twice",
        ),
    ],
)
def test_a_malformed_header_is_a_gguf_error_naming_the_file(tmp_path, payload, problem):
    path = tmp_path / "bad.gguf"
    path.write_bytes(payload)
    with pytest.raises(gguf_direct.GGUFError, match=problem) as refused:
        gguf_direct.GGUFFile(path)
    assert str(refused.value).startswith(f"{path}: ")


def test_an_old_gguf_version_goes_to_transformers(tmp_path):
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<III", 1, 0, 0) + bytes(32))
    with pytest.raises(gguf_direct.Unsupported, match="GGUF version 1"):
        gguf_direct.GGUFFile(path)


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("fuzz") / "tiny.gguf", layers=1, hidden=32).read_bytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_file_is_read_or_refused_never_crashes(tiny_bytes, tmp_path, data):
    """Flipped bytes anywhere in the header, or a cut anywhere: GGUFError or Unsupported, or a file that reads
    (whose every tensor then dequantizes or is refused the same way)."""
    raw = bytearray(tiny_bytes)
    header_end = raw.index(b"blk.0") + 2048  # the metadata and most of the tensor table
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, min(header_end, len(raw)) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.just(len(raw)), st.integers(0, len(raw))))
    path = tmp_path / f"damaged-{os.getpid()}.gguf"
    path.write_bytes(bytes(raw[:cut]))
    try:
        with gguf_direct.GGUFFile(path) as file:
            for name in file.tensors:
                file.tensor(name)
    except (gguf_direct.GGUFError, gguf_direct.Unsupported):
        pass
