"""Hostile GGUF targets, the torch-free half (issue 40): validate's `--target` reader and smoke's pre-load check
(smoke.target_files.check_target_files) share one header check (checkpoint/gguf_header.py), so each refuses what
the other refuses, with the same message, before any tensor is read: a file without weights, a block count or
shapes its tensors do not have, tensors sharing bytes, names a lenient reader would take for another tensor,
metadata of the wrong GGUF type, headers over the limits. The runtime half (the direct reader, the chat template,
the time and memory budgets with torch loaded) is tests/runtime/test_gguf_hostile.py."""

from __future__ import annotations

import struct
import subprocess
import sys
import time

import pytest
from gguf_bytes import ARR, F32, I32, STR, U8, U32, U64, Tensor, tiny_model

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.target import read_target, resolve_target_spec
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.smoke.target_files import check_target_files

from helpers import REPO, run_cli


def refused_alike(path, problem: str) -> str:
    """validate's reader and smoke's pre-load check refuse the file, naming it and `problem`, with one message."""
    with pytest.raises(InputError, match=problem) as by_validate:
        read_target(str(path))
    with pytest.raises(InputError, match=problem) as by_smoke:
        check_target_files(resolve_target_spec(str(path)), str(path))
    message = str(by_validate.value)
    assert message == str(by_smoke.value) and message.startswith(f"{path}: ")
    assert "Traceback" not in message and "Error:" not in message
    return message


def test_the_tiny_model_is_read_as_it_declares_itself(tmp_path):
    info = read_target(str(tiny_model(vocab=300).write(tmp_path / "ok.gguf")))
    assert (info.architecture, info.hidden_size, info.num_layers, info.vocab_size) == ("llama", 16, 2, 300)
    assert (info.embedding_rows, info.embedding_width, info.special_ids) == (
        300,
        16,
        {"bos": 262, "eos": 263},
    )
    check_target_files(resolve_target_spec(str(tmp_path / "ok.gguf")), "ok")


# ------------------------------------------------------------------------------------------ no weights


def test_a_vocabulary_only_gguf_is_refused_by_validate_and_smoke(tmp_path):
    path = tiny_model(weights=False).write(tmp_path / "vocab.gguf")
    message = refused_alike(path, "holds no weights")
    assert "vocabulary-only GGUF" in message and "--target takes the model itself" in message


def test_a_lora_adapter_is_refused_by_validate_and_smoke(tmp_path):
    g = tiny_model(weights=False).set("general.type", STR, "adapter").set("adapter.type", STR, "lora")
    g.tensors = [Tensor("blk.0.attn_q.weight.lora_a", (4, 16)), Tensor("blk.0.attn_q.weight.lora_b", (16, 4))]
    message = refused_alike(g.write(tmp_path / "adapter.gguf"), "is a LoRA adapter")
    assert "--target takes the base model's GGUF" in message


def test_validate_on_the_command_line_exits_2_on_a_weightless_target(tmp_path):
    drafter = fixtures.write_checkpoint(tmp_path / "drafter", fixtures.draft_config())
    target = tiny_model(weights=False, hidden=64, layers=4, vocab=512).write(tmp_path / "vocab.gguf")
    result = run_cli("validate", str(drafter), "--target", str(target))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "holds no weights" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------ counts and shapes


def test_a_block_count_the_tensors_do_not_have_is_refused(tmp_path):
    g = tiny_model().set("llama.block_count", U32, 200000)
    started = time.perf_counter()
    message = refused_alike(
        g.write(tmp_path / "deep.gguf"), "llama.block_count is 200000, but the file holds"
    )
    assert time.perf_counter() - started < 1.0
    assert "tensors for 2 blocks (none for blk.2, blk.3, blk.4 and 199995 more)" in message


def test_a_tensor_beyond_the_block_count_is_refused(tmp_path):
    g = tiny_model()
    g.tensors.append(Tensor("blk.7.attn_norm.weight", (16,)))
    refused_alike(g.write(tmp_path / "extra.gguf"), "has tensors for blocks 7 but llama.block_count is 2")


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda g: g.set("llama.embedding_length", U32, 32),
            r"token_embd\.weight has shape \[300, 16\], but llama\.embedding_length is 32",
        ),
        (
            lambda g: g.set("llama.feed_forward_length", U32, 64),
            r"tensor 'blk\.0\.ffn_gate\.weight' has shape \[32, 16\], but its metadata makes it \[64, 16\]",
        ),
        (
            lambda g: g.set("llama.attention.head_count_kv", U32, 2),
            r"tensor 'blk\.0\.attn_k\.weight' has shape \[8, 16\], but its metadata makes it \[16, 16\]",
        ),
        (
            lambda g: g.set("llama.vocab_size", U32, 1 << 30),
            r"llama\.vocab_size is 1073741824, but token_embd\.weight has 300 rows",
        ),
        (
            lambda g: g.tensors.pop(3),
            r"lacks 1 of the tensors a llama of 2 blocks has: blk\.0\.attn_k\.weight",
        ),
        (
            lambda g: setattr(g.tensor("blk.1.ffn_up.weight"), "kind", 9),
            r"tensor 'blk\.1\.ffn_up\.weight' is of ggml type Q8_1, which gguf cannot dequantize",
        ),
        (
            lambda g: g.set("tokenizer.ggml.eos_token_id", U32, 300),
            r"tokenizer\.ggml\.eos_token_id is 300, outside its vocabulary of 300 tokens",
        ),
    ],
)
def test_counts_and_shapes_are_checked_against_the_declared_architecture(tmp_path, change, problem):
    g = tiny_model(vocab=300)
    change(g)
    refused_alike(g.write(tmp_path / "bad.gguf"), problem)


def test_a_generic_architecture_may_not_describe_a_model_far_larger_than_its_tensors(tmp_path):
    g = tiny_model(arch="gemma2", vocab=300)
    g.write(tmp_path / "ok.gguf")
    read_target(str(tmp_path / "ok.gguf"))  # transformers' architecture, of the size its tensors are
    g.set("gemma2.feed_forward_length", U32, 1 << 24)
    refused_alike(g.write(tmp_path / "wide.gguf"), "its metadata describes a gemma2 of about")


# ------------------------------------------------------------------------------------------ data ranges


def test_tensors_sharing_bytes_are_refused(tmp_path):
    """3,000 tensors viewing one 4 MB block (a 12 GB allocation once each is dequantized): refused from the
    header, in well under a second."""
    g = tiny_model(vocab=300)
    g.tensors.append(Tensor("big.0", (1024, 1024)))
    g.tensors += [Tensor(f"big.{i}", (1024, 1024), offset="big.0") for i in range(1, 3000)]
    path = g.write(tmp_path / "alias.gguf")
    started = time.perf_counter()
    refused_alike(path, "share bytes")
    assert time.perf_counter() - started < 1.0


def test_a_tensor_overlapping_its_neighbour_or_misaligned_is_refused(tmp_path):
    g = tiny_model(vocab=300)
    g.tensors[-1].offset = 64
    refused_alike(g.write(tmp_path / "overlap.gguf"), r"share bytes \(their data overlaps at byte")
    g = tiny_model(vocab=300)
    g.tensors[-1].offset = 100000 + 4
    refused_alike(g.write(tmp_path / "misaligned.gguf"), "not a multiple of the alignment 32")


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name, problem",
    [
        ("blk.03.attn_q.weight", "writes the number '03' with a leading zero"),
        ("blk.\u0663.attn_q.weight", "is not printable ASCII"),
        ("blk.1 .attn_q.weight", "is not printable ASCII"),
        ("blk.x.attn_q.weight", "has no block number and tensor after 'blk.'"),
        ("blk.1.", "has no block number and tensor after 'blk.'"),
        ("a" * 64, "is longer than 63 bytes"),
    ],
)
def test_tensor_names_are_read_strictly(tmp_path, name, problem):
    """A lenient reader maps `blk.03` and `blk.٣` to block 3, so a later tensor silently replaces the real one."""
    g = tiny_model(layers=4)
    g.tensors.append(Tensor(name, (16, 16)))
    refused_alike(g.write(tmp_path / "names.gguf"), problem)


# ------------------------------------------------------------------------------------------ types


@pytest.mark.parametrize(
    "key, kind, value, item, expected",
    [
        ("llama.block_count", STR, "2", None, "an unsigned integer"),
        ("llama.embedding_length", F32, 16.0, None, "an unsigned integer"),
        ("llama.rope.freq_base", STR, "10000", None, "a float32"),
        ("general.architecture", U32, 7, None, "a string"),
        ("tokenizer.ggml.eos_token_id", STR, "2", None, "an unsigned integer"),
        ("tokenizer.ggml.add_bos_token", U8, 1, None, "a bool"),
        ("tokenizer.chat_template", ARR, ["x"], STR, "a string"),
        ("tokenizer.ggml.tokens", ARR, list(range(300)), I32, "an array of strings"),
        ("tokenizer.ggml.token_type", ARR, ["1"] * 300, STR, "an array of int32"),
        ("tokenizer.ggml.merges", STR, "h e", None, "an array of strings"),
    ],
)
def test_metadata_of_the_wrong_type_is_refused_naming_the_key(tmp_path, key, kind, value, item, expected):
    """token_type stored as strings used to be accepted silently, which turned control tokens off."""
    g = tiny_model(vocab=300).set(key, kind, value, item)
    message = refused_alike(g.write(tmp_path / "typed.gguf"), f"metadata '{key}' is a")
    assert f"the GGUF spec gives {expected}" in message


@pytest.mark.parametrize(
    "types, problem",
    [
        ([1] * 299, "tokenizer.ggml.token_type has 299 entries for 300 tokens"),
        ([1] * 299 + [99], "tokenizer.ggml.token_type holds 99, not a llama.cpp token type"),
    ],
)
def test_token_types_are_one_known_type_per_token(tmp_path, types, problem):
    refused_alike(
        tiny_model(vocab=300).set("tokenizer.ggml.token_type", ARR, types, I32).write(tmp_path / "t.gguf"),
        problem,
    )


# ------------------------------------------------------------------------------------------ header limits


def _raw(n_tensors: int, n_kv: int, body: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def _key(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.parametrize(
    "make, problem",
    [
        # two million metadata entries of one byte each (42 MB)
        (
            lambda: _raw(0, 2_000_000, (_key("k") + struct.pack("<IB", U8, 1)) * 2_000_000),
            "over the limits of 65536 tensors and 4096 entries",
        ),
        # five million merges (55 MB): transformers' converter took 3.5 GB and more than 600 s on it
        (
            lambda: _raw(
                0,
                1,
                _key("tokenizer.ggml.merges")
                + struct.pack("<IIQ", ARR, STR, 5_000_000)
                + _key("a") * 5_000_000,
            ),
            "is an array of 5000000 items, over the limit of 1048576",
        ),
        # a 60 MB string
        (
            lambda: _raw(0, 1, _key("general.name") + struct.pack("<IQ", STR, 60 << 20) + bytes(60 << 20)),
            "is 62914560 bytes long, over the limit of 1048576",
        ),
        # arrays of a million strings each, two million in all (under 50 MB)
        (
            lambda: _raw(
                0,
                3,
                b"".join(
                    _key(f"a{i}") + struct.pack("<IIQ", ARR, STR, 1_000_000) + _key("") * 1_000_000
                    for i in range(3)
                ),
            ),
            "its arrays hold more than 2097152 strings",
        ),
        # a million-entry numeric array per key until the header passes 64 MiB
        (
            lambda: _raw(
                0,
                9,
                b"".join(
                    _key(f"n{i}") + struct.pack("<IIQ", ARR, U64, 1 << 20) + bytes(8 << 20) for i in range(9)
                ),
            ),
            "its header runs past 64 MiB",
        ),
        # a tensor name of a megabyte
        (
            lambda: _raw(1, 0, struct.pack("<Q", 1 << 20) + b"a" * (1 << 20) + bytes(64)),
            "is 1048576 bytes long",
        ),
        # a vocabulary of 600,000 tokens
        (
            lambda: tiny_model().set("tokenizer.ggml.tokens", ARR, ["t"] * 600_000, STR).to_bytes(),
            "lists 600000 tokens, over the limit of 524288",
        ),
    ],
)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak memory from /proc")
def test_headers_over_the_limits_are_refused_in_a_second_and_little_memory(tmp_path, make, problem):
    path = tmp_path / "huge.gguf"
    path.write_bytes(make())
    assert path.stat().st_size < 100 << 20
    probe = (
        "import sys, time\n"
        "from lilicorr_ckpt.checkpoint.target import read_target\n"
        "from lilicorr_ckpt.errors import InputError\n"
        "before = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
        "started = time.perf_counter()\n"
        "try:\n"
        "    read_target(sys.argv[1])\n"
        "    print('READ')\n"
        "except InputError as exc:\n"
        "    print('REFUSED', exc)\n"
        "peak = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
        "print(time.perf_counter() - started, peak - before)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-2000:]
    verdict, numbers = result.stdout.strip().rsplit("\n", 1)
    seconds, grown_kb = float(numbers.split()[0]), int(numbers.split()[1])
    assert verdict.startswith("REFUSED") and problem in verdict, verdict[:500]
    assert seconds < 3.0 and grown_kb < 256 << 10, (seconds, grown_kb)


def test_the_header_limits_leave_real_sizes_readable(tmp_path):
    """A 262,144-token vocabulary with twice as many merges (Gemma's and Llama 3's sizes) is read in a second."""
    tokens = [f"t{i}" for i in range(262_144)]
    g = tiny_model(vocab=300)
    g.set("tokenizer.ggml.tokens", ARR, tokens, STR).set(
        "tokenizer.ggml.token_type", ARR, [1] * len(tokens), I32
    )
    g.set("tokenizer.ggml.merges", ARR, [f"t{i} t{i + 1}" for i in range(524_288)], STR)
    g.set("llama.vocab_size", U32, len(tokens)).set("tokenizer.ggml.scores", ARR, [0.0] * len(tokens), F32)
    g.tensor("token_embd.weight").shape = (len(tokens), 16)
    g.tensor("output.weight").shape = (len(tokens), 16)
    path = g.write(tmp_path / "wide-vocab.gguf")
    started = time.perf_counter()
    assert read_target(str(path)).vocab_size == 262_144
    assert time.perf_counter() - started < 5.0


def test_a_gguf_of_another_version_is_refused_naming_it(tmp_path):
    g = tiny_model()
    g.version = 1
    refused_alike(g.write(tmp_path / "v1.gguf"), "GGUF version 1 .this reader knows versions 2 and 3.")
