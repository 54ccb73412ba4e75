"""A time-boxed fuzz run per parser (config, safetensors header, index, probe file, GGUF header): mutated inputs
end in a result or an InputError (exit 2), never another exception. Seeded, and FUZZ_SECONDS each (2 s by
default; LILICORR_FUZZ_SECONDS raises it for a longer local run)."""

from __future__ import annotations

import json
import os
import random
import struct
import time
from pathlib import Path

import pytest
from gguf_bytes import tiny_model

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checkpoint.source import open_source
from lilicorr_ckpt.checkpoint.target import read_gguf_target
from lilicorr_ckpt.checkpoint.tensors import read_header, read_tensor_table
from lilicorr_ckpt.errors import InputError

FUZZ_SECONDS = float(os.environ.get("LILICORR_FUZZ_SECONDS", "2"))
pytestmark = pytest.mark.slow  # each test runs for FUZZ_SECONDS of wall time, however fast the machine
TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b"\\",
    b",",
    b":",
    b"0",
    b"-",
    b"1e999",
    b"NaN",
    b"Infinity",
    b"null",
    b"\\ud800",
    b"\xff",
    b"\x00",
    b"9" * 40,
    b"[" * 200,
    b'"data_offsets"',
    b'"shape"',
    b'"dtype"',
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(5)
        i = rng.randint(0, len(out))
        if op == 0 and out:
            out[min(i, len(out) - 1)] = rng.randrange(256)
        elif op == 1:
            out[i:i] = rng.choice(TOKENS)
        elif op == 2:
            del out[i : i + rng.randint(1, 16)]
        elif op == 3:
            out = out[:i]
        else:
            j = rng.randint(0, len(out))
            out[i:i] = out[j : j + rng.randint(1, 32)]
    return bytes(out)


def fuzz(seed: int, base: bytes, attempt) -> int:
    rng = random.Random(seed)
    deadline = time.monotonic() + FUZZ_SECONDS
    runs = 0
    while time.monotonic() < deadline:
        data = mutate(rng, base)
        try:
            attempt(data)
        except InputError:
            pass
        except Exception as exc:  # pragma: no cover - the failure being looked for
            raise AssertionError(f"{type(exc).__name__}: {exc} for input {data[:300]!r}") from exc
        runs += 1
    return runs


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return fixtures.write_checkpoint(
        tmp_path_factory.mktemp("fuzz") / "base", fixtures.draft_config(num_hidden_layers=1), shards=2
    )


def test_fuzz_config(base):
    assert fuzz(1, (base / "config.json").read_bytes(), parse_config) > 10


def test_fuzz_safetensors_header(base, tmp_path):
    shard = next(p for p in sorted(base.iterdir()) if p.suffix == ".safetensors")
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    target = tmp_path / "x.safetensors"

    def attempt(mutated: bytes) -> None:
        header = mutated[: 8 + n]
        target.write_bytes(header + data[8 + n :])
        read_header(target, target.name)

    assert fuzz(2, data[: 8 + n], attempt) > 10


def test_fuzz_index(base, tmp_path):
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for p in base.iterdir():
        os.link(p, copy / p.name)
    index = copy / "model.safetensors.index.json"
    original = index.read_bytes()
    index.unlink()

    def attempt(mutated: bytes) -> None:
        index.write_bytes(mutated)
        read_tensor_table(open_source(str(copy)))

    assert fuzz(3, original, attempt) > 10


def test_fuzz_probe_file(tmp_path):
    from lilicorr_ckpt.smoke.probes import read_jsonl

    lines = [
        json.dumps({"id": f"p{i}", "category": "c", "prompt": "Write a function.", "chat": i % 2 == 0})
        for i in range(3)
    ]
    path = tmp_path / "probes.jsonl"

    def attempt(mutated: bytes) -> None:
        path.write_bytes(mutated)
        read_jsonl(path)

    assert fuzz(4, "\n".join(lines).encode() + b"\n", attempt) > 10


def _gguf() -> bytes:
    """A whole small Llama GGUF (its header is checked against its tensor table, so the fuzz needs both)."""
    return tiny_model(layers=1, hidden=4, heads=1, kv_heads=1, ffn=4).to_bytes()


def test_fuzz_gguf_header(tmp_path):
    path = tmp_path / "t.gguf"
    path.write_bytes(_gguf())
    read_gguf_target(path)  # the unmutated header parses

    def attempt(mutated: bytes) -> None:
        path.write_bytes(mutated)
        read_gguf_target(path)

    assert fuzz(5, _gguf(), attempt) > 10


def test_a_gguf_array_count_that_overflows_the_seek_is_an_input_error(tmp_path):
    path = tmp_path / "t.gguf"
    key = struct.pack("<Q", 4) + b"junk"
    path.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key + struct.pack("<I", 9) + struct.pack("<IQ", 6, 2**62)
    )
    with pytest.raises(
        InputError, match="is an array of 4611686018427387904 items, over the limit of 1048576"
    ):
        read_gguf_target(path)
