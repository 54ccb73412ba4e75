"""Unreadable or hostile input: a clear message and exit 2, never a traceback."""

import json
import os
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.errors import InputError

from helpers import run_cli


def _write_header(path, header: dict, data: bytes, length: int | None = None) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def _assert_exit_2(path, *needles):
    result = run_cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result


@pytest.fixture
def ckpt(make_ckpt):
    return make_ckpt()


def test_random_bytes_instead_of_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(os.urandom(64) + b"\xff" * 8)
    _assert_exit_2(ckpt, "model.safetensors")


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    _assert_exit_2(ckpt, "model.safetensors", "corrupt safetensors")


def test_file_shorter_than_the_length_prefix(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x01\x02")
    _assert_exit_2(ckpt, "truncated safetensors file")


def test_header_length_beyond_the_file(ckpt):
    _write_header(
        ckpt / "model.safetensors",
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
        b"\0" * 4,
        length=10_000,
    )
    _assert_exit_2(ckpt, "runs past the end of the file")


def test_absurd_header_length(ckpt):
    _write_header(ckpt / "model.safetensors", {}, b"", length=1 << 40)
    _assert_exit_2(ckpt, "header length", "absurd")


@pytest.mark.parametrize("offsets", [([0, 8], [4, 12]), ([0, 8], [8, 400])])
def test_overlapping_or_out_of_range_offsets(ckpt, offsets):
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": offsets[0]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": offsets[1]},
    }
    _write_header(ckpt / "model.safetensors", header, b"\0" * 16)
    _assert_exit_2(ckpt, "corrupt safetensors")


def test_unknown_dtype(ckpt):
    _write_header(
        ckpt / "model.safetensors", {"a": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0"
    )
    _assert_exit_2(ckpt, "Q4_K")


@pytest.mark.parametrize(
    "content, needle",
    [(b"[]", "must hold a JSON object"), (b"\xc3\x28{}", "not UTF-8"), (b"{", "not valid JSON")],
)
def test_bad_config_json(ckpt, content, needle):
    (ckpt / "config.json").write_bytes(content)
    _assert_exit_2(ckpt, "config.json", needle)


@pytest.mark.parametrize("shard", ["../escape.safetensors", "/etc/passwd"])
def test_index_pointing_outside_the_checkpoint(make_ckpt, shard):
    path = make_ckpt(shards=2)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_exit_2(path, "outside the checkpoint directory")


def test_symlink_leaving_the_checkpoint(ckpt, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (ckpt / "model.safetensors").rename(outside)
    (ckpt / "model.safetensors").symlink_to(outside)
    _assert_exit_2(ckpt, "symlink", "outside the checkpoint directory")


def test_symlink_inside_the_checkpoint_is_fine(ckpt):
    (ckpt / "weights").mkdir()
    (ckpt / "model.safetensors").rename(ckpt / "weights" / "real.safetensors")
    (ckpt / "model.safetensors").symlink_to(ckpt / "weights" / "real.safetensors")
    assert validate(str(ckpt)).summary.errors == 0


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_exit_2(tmp_path / "empty", "empty directory")


def test_file_instead_of_directory(ckpt):
    result = _assert_exit_2(ckpt / "config.json", "is a file", "pass its folder")
    assert str(ckpt) in result.stderr


def test_missing_path_and_missing_config(tmp_path, ckpt):
    _assert_exit_2(tmp_path / "nope", "does not exist")
    (ckpt / "config.json").unlink()
    _assert_exit_2(ckpt, "no config.json")


def test_unknown_repo_id_is_an_offline_miss(tmp_path):
    result = run_cli(
        "validate",
        "no-such-org/no-such-drafter",
        env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2 and "not in the Hugging Face cache" in result.stderr


def test_a_cached_repo_without_a_main_ref_names_its_snapshots(tmp_path, ckpt):
    snapshot = tmp_path / "hub" / "models--acme--drafter" / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    ckpt.rename(snapshot)  # no refs/main beside it
    result = run_cli(
        "validate", "acme/drafter", env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    )
    assert result.returncode == 2 and "has no refs/main" in result.stderr and str(snapshot) in result.stderr
    assert run_cli("validate", str(snapshot)).returncode == 0  # the way out it suggests


def test_usage_errors_exit_4(ckpt):
    result = run_cli("validate", str(ckpt), "--runtime", "tgi")
    assert result.returncode == 4 and "tgi" in result.stderr
    assert run_cli("validate").returncode == 4


# ---------------------------------------------------------------- property tests
# The strategies draw the sizes hostile configs state (layer counts of 2**62, vocabularies of 1e18, thousands of
# taps): each example must finish within the validate budget instead of building what the number says.

EXAMPLE_SECONDS = 2.0
EXAMPLE_PEAK_BYTES = 64 << 20


def _validate_within_budget(path) -> object | None:
    """validate(path) (None for an InputError), asserting the per-example time and allocation budget."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        return validate(str(path))
    except InputError:
        return None
    finally:
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < EXAMPLE_SECONDS, f"validate took {elapsed:.2f} s"
        assert peak < EXAMPLE_PEAK_BYTES, f"validate allocated {peak >> 20} MB at its peak"


_valid_bytes = {}


def _baseline(tmp_path_factory) -> bytes:
    if "st" not in _valid_bytes:
        d = fixtures.write_checkpoint(
            tmp_path_factory.mktemp("base"), fixtures.draft_config(num_hidden_layers=1)
        )
        _valid_bytes["st"] = (d / "model.safetensors").read_bytes()
        _valid_bytes["cfg"] = (d / "config.json").read_bytes()
    return _valid_bytes["st"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_exception_escapes_for_mutated_headers(tmp_path_factory, data):
    base = bytearray(_baseline(tmp_path_factory))
    n = struct.unpack("<Q", bytes(base[:8]))[0]
    kind = data.draw(st.sampled_from(["flip", "truncate", "length", "splice"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, 8 + n - 1))
            base[i] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        base = base[: data.draw(st.integers(0, len(base)))]
    elif kind == "length":
        base[:8] = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1)))
    else:
        junk = data.draw(st.binary(max_size=64))
        i = data.draw(st.integers(8, 8 + n))
        base[i:i] = junk
    d = tmp_path_factory.mktemp("mut")
    (d / "config.json").write_bytes(_valid_bytes["cfg"])
    (d / "model.safetensors").write_bytes(bytes(base))
    _validate_within_budget(d)


sizes = st.one_of(
    st.integers(-2, 64),
    st.integers(2**20, 2**70),
    st.sampled_from([10**7, 2**62, 2**63 - 1, 2**63]),
    st.sampled_from([1e9, 1e300, 1.5, -0.0]),
    st.lists(st.integers(0, 2**40), min_size=500, max_size=3000),
)  # many (duplicated) taps
json_values = st.recursive(
    st.none() | st.booleans() | sizes | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
config_keys = st.sampled_from(
    [
        "hidden_size",
        "num_hidden_layers",
        "block_size",
        "architectures",
        "vocab_size",
        "target_layer_ids",
        "has_own_lm_head",
        "quantization_config",
        "layer_types",
        "num_attention_heads",
        "head_dim",
        "rms_norm_eps",
        "torch_dtype",
    ]
)
dflash_keys = st.sampled_from(
    [
        "lilicorr_candidate_topk",
        "lilicorr_hidden_size",
        "lilicorr_num_layers",
        "lilicorr_num_heads",
        "lilicorr_mlp_ratio",
        "lilicorr_factor_dim",
        "lilicorr_vector_eps",
        "lilicorr_logit_scale",
        "conv_kernel_size",
        "conv_group_size",
        "block_size",
        "mask_token_id",
        "target_layer_ids",
        "causal",
        "lilicorr_enabled",
    ]
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    top=st.dictionaries(config_keys, json_values, max_size=4),
    nested=st.dictionaries(dflash_keys, json_values, max_size=5),
    drop=st.lists(dflash_keys, max_size=3),
)
def test_no_exception_escapes_for_arbitrary_config_values(tmp_path_factory, top, nested, drop):
    _baseline(tmp_path_factory)
    cfg = json.loads(_valid_bytes["cfg"])
    cfg.update(top)
    if isinstance(cfg.get("dflash_config"), dict):
        cfg["dflash_config"].update(nested)
        for key in drop:
            cfg["dflash_config"].pop(key, None)
    d = tmp_path_factory.mktemp("cfg")
    (d / "config.json").write_text(json.dumps(cfg, allow_nan=True))
    (d / "model.safetensors").write_bytes(_valid_bytes["st"])
    report = _validate_within_budget(d)
    if report is not None:
        assert report.exit_code in (0, 1)


def test_config_json_that_is_a_directory(ckpt):
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    _assert_exit_2(ckpt, "config.json is not a regular file")


def _duplicate_a_header_key(path):
    """Rewrite model.safetensors so that its header names the first tensor twice (both entries valid)."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    text = json.dumps(header)
    entry = json.dumps({name: header[name]})[1:-1]
    forged = text[:-1] + ", " + entry + "}"
    path.write_bytes(struct.pack("<Q", len(forged)) + forged.encode() + data[8 + n :])
    return name


def test_a_header_naming_a_tensor_twice_is_an_error_in_validate_and_convert(ckpt, tmp_path):
    name = _duplicate_a_header_key(ckpt / "model.safetensors")
    result = run_cli("validate", str(ckpt))
    assert result.returncode == 1 and "LC609" in result.stdout and name in result.stdout, result.stdout
    converted = run_cli("convert", str(ckpt), str(tmp_path / "out"))
    assert (
        converted.returncode == 1 and "names a tensor twice" in converted.stderr and name in converted.stderr
    )
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- smoke probe files
# `smoke --probes FILE` parses a user's JSONL before any model loads: every hostile line is a message naming the
# file and the line (exit 2), never an internal error from the parser or, later, from the tokenizer.
GOOD_PROBE = {"id": "p1", "category": "code", "prompt": "def f():", "chat": False}


def _probe_file(tmp_path, text: str | bytes):
    path = tmp_path / "probes.jsonl"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@pytest.mark.parametrize(
    "line, needle",
    [
        ("[" * 50_000 + "]" * 50_000, ":1: nested too deeply to be a probe"),
        (
            json.dumps(GOOD_PROBE)[:-1] + ', "n": 1' + "0" * 5000 + "}",
            ":1: not a usable JSON line (Exceeds the limit",
        ),
        (
            json.dumps({**GOOD_PROBE, "id": "\\ud800"}).replace("\\\\ud800", "\\ud800"),
            ":1: 'id' holds an unpaired UTF-16 surrogate",
        ),
        (
            json.dumps({**GOOD_PROBE, "prompt": "x\\udfffy"}).replace("\\\\udfff", "\\udfff"),
            ":1: 'prompt' holds an unpaired UTF-16 surrogate",
        ),
        (
            json.dumps({**GOOD_PROBE, "prompt": "e" * 300_000}),
            ":1: 'prompt' is 300000 characters; the limit is 262144",
        ),
        (
            json.dumps({**GOOD_PROBE, "category": "c" * 1000}),
            ":1: 'category' is 1000 characters; the limit is 256",
        ),
    ],
)
def test_a_hostile_probe_line_is_named_with_its_line(tmp_path, line, needle):
    from lilicorr_ckpt.smoke.probes import load_probes

    path = _probe_file(tmp_path, line + "\n")
    with pytest.raises(InputError) as refused:
        load_probes(str(path))
    assert f"{path}{needle}" in str(refused.value)


def test_a_probe_file_is_split_at_newlines_only_and_may_start_with_a_bom(tmp_path):
    from lilicorr_ckpt.smoke.probes import load_probes

    # U+2028 and U+0085 are legal raw in a JSON string; str.splitlines cut the line there
    prompt = "line one\u2028line two\x85three"
    text = "\ufeff" + json.dumps({**GOOD_PROBE, "prompt": prompt}, ensure_ascii=False) + "\r\n"
    probes = load_probes(str(_probe_file(tmp_path, text)))
    assert [p.prompt for p in probes] == [prompt]


@pytest.mark.parametrize(
    "make, needle",
    [
        (os.mkfifo, "is a FIFO (named pipe), not a regular file; refusing to open it"),
        (
            lambda p: p.symlink_to("/dev/zero"),
            "is a character device, not a regular file; refusing to open it",
        ),
        (lambda p: p.write_bytes(b'{"id": "\xff"}\n'), "is not UTF-8 text (byte 8: b'\\xff')"),
    ],
)
def test_a_probe_file_that_is_no_text_file_is_refused_by_name(tmp_path, make, needle):
    from lilicorr_ckpt.smoke.probes import load_probes

    from helpers import raised_within

    path = tmp_path / "probes.jsonl"
    make(path)
    raised = raised_within(10, load_probes, str(path))
    assert isinstance(raised, InputError) and str(raised) == f"probe file {str(path)!r} {needle}", raised
