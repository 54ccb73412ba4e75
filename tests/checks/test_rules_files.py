"""File rules (LC6xx): sharded index <-> shards in both directions, stray pickles, no weights.

Spec: issue 2 §3 (tensor table) and §9; loaders that follow model.safetensors.index.json never see a tensor
the index omits, and a loader that globs *.safetensors loads files the index does not name.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.stwrite import write_file

from ._support import ALL, assert_clean, describe, edit_json, hits, one, problems, refused_by, run

INDEX = "model.safetensors.index.json"
SHARD = "model-{:05d}-of-00003.safetensors"


def weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / INDEX).read_text())["weight_map"]


def shard_of(path: Path, name: str) -> str:
    return weight_map(path)[name]


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="sharded"),
        pytest.param({"quant": "NVFP4"}, id="sharded-nvfp4"),
        pytest.param(
            {"config": fixtures.draft_config(conv=(4, 16)), "quant": "W4A16_NVFP4"}, id="sharded-conv-w4a16"
        ),
        pytest.param({"key_prefix": "model."}, id="sharded-model-prefix"),
    ],
)
def test_valid_sharded_checkpoints_pass(ckpt, kw):
    path = ckpt(shards=3, **kw)
    assert (path / INDEX).exists() and not (path / "model.safetensors").exists()
    assert_clean(run(path))


def test_missing_shard(ckpt):
    path = ckpt(shards=3)
    gone = SHARD.format(2)
    listed = sorted(n for n, s in weight_map(path).items() if s == gone)
    (path / gone).unlink()
    report = run(path)
    f = one(report, "LC602", "error")
    assert f.pointer == gone and f.subjects == listed and f.file == INDEX
    assert f"{len(listed)} tensors" in f.message and gone in f.message
    assert refused_by(report) == ALL


def test_index_lists_a_tensor_no_shard_holds(ckpt):
    path = ckpt(shards=3)
    edit_json(
        path / INDEX, lambda d: d["weight_map"].__setitem__("lilicorr.ghost_proj.weight", SHARD.format(1))
    )
    report = run(path)
    f = one(report, "LC603", "error")
    assert (
        f.subjects == ["lilicorr.ghost_proj.weight"]
        and f"`lilicorr.ghost_proj.weight` ({SHARD.format(1)})" in f.message
    )
    assert problems(report) == [("LC603", "error", ())], describe(report)


def test_index_places_a_tensor_in_the_wrong_shard(ckpt):
    path = ckpt(shards=3)
    real = shard_of(path, "fc.weight")
    wrong = SHARD.format(1) if real != SHARD.format(1) else SHARD.format(2)
    edit_json(path / INDEX, lambda d: d["weight_map"].__setitem__("fc.weight", wrong))
    f = one(run(path), "LC603", "error")
    assert f.pointer == "fc.weight" and wrong in f.message and real in f.message


def test_shard_holds_a_tensor_the_index_omits(ckpt):
    path = ckpt(shards=3)
    edit_json(path / INDEX, lambda d: d["weight_map"].pop("lilicorr.out_head.weight"))
    report = run(path)
    f = one(report, "LC604", "error")
    assert f.subjects == ["lilicorr.out_head.weight"] and "lilicorr.out_head.weight" in f.message
    assert problems(report) == [("LC604", "error", ())], describe(report)


def test_tensor_stored_in_two_shards(ckpt):
    config = fixtures.draft_config()
    path = ckpt(config, shards=3)
    tensors = fixtures.checkpoint_tensors(config)
    name = next(n for n, s in weight_map(path).items() if s == SHARD.format(2))
    first = {n: tensors[n] for n, s in weight_map(path).items() if s == SHARD.format(1)}
    write_file(path / SHARD.format(1), {**first, name: tensors[name]}, {"format": "pt"})
    report = run(path)
    f = one(report, "LC605", "error")
    assert f.subjects == [name] and SHARD.format(1) in f.message and SHARD.format(2) in f.message
    assert problems(report) == [("LC605", "error", ())], describe(report)


def test_index_total_size_mismatch(ckpt):
    path = ckpt(shards=3)
    declared = json.loads((path / INDEX).read_text())["metadata"]["total_size"]
    edit_json(path / INDEX, lambda d: d["metadata"].__setitem__("total_size", declared + 1024))
    f = one(run(path), "LC606")
    assert (f.expected, f.actual) == (str(declared), str(declared + 1024))
    assert str(declared) in f.message and f.pointer == "$.metadata.total_size"


def test_index_total_size_mismatch_is_a_warning(ckpt):
    path = ckpt(shards=3)
    edit_json(
        path / INDEX, lambda d: d["metadata"].__setitem__("total_size", d["metadata"]["total_size"] + 1024)
    )
    report = run(path)
    assert one(report, "LC606").severity == "warning"
    assert refused_by(report) == []


def test_leftover_single_file_next_to_sharded_index(ckpt):
    # an earlier single-file export left behind: loaders that glob *.safetensors load everything twice
    config = fixtures.draft_config()
    path = ckpt(config, shards=3)
    write_file(path / "model.safetensors", fixtures.checkpoint_tensors(config), {"format": "pt"})
    report = run(path)
    f = one(report, "LC607", "warning")
    assert f.file == "model.safetensors" and "model.safetensors" in f.message
    assert hits(report, "LC605")  # every tensor is now stored twice


def test_unreferenced_empty_shard(ckpt):
    path = ckpt(shards=3)
    write_file(path / "model-00004-of-00003.safetensors", {}, {"format": "pt"})
    report = run(path)
    assert one(report, "LC607", "warning").file == "model-00004-of-00003.safetensors"
    assert problems(report) == [("LC607", "warning", ())], describe(report)


class _WouldTouch:
    """Unpickling this creates `marker`: proof that validate unpickled the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_stray_pickles_are_reported_and_never_unpickled(ckpt, tmp_path):
    path = ckpt()
    marker = tmp_path / "unpickled"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_WouldTouch(marker)))
    (path / "training_state.pt").write_bytes(b"\x80\x05not a pickle at all\xff\x00")
    report = run(path)  # must not raise on the garbage file
    f = one(report, "LC601", "warning")
    assert sorted(f.subjects) == ["pytorch_model.bin", "training_state.pt"]
    assert not marker.exists()
    assert problems(report) == [("LC601", "warning", ())]
    assert refused_by(report) == []


def test_only_pickle_weights(ckpt):
    path = ckpt()
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 a torch zip archive")
    report = run(path)
    assert hits(report, "LC608", "error"), describe(report)
    assert one(report, "LC601").subjects == ["pytorch_model.bin"]
    assert refused_by(report) == ALL


def test_a_header_that_names_a_tensor_twice_is_lc609(tmp_path):
    import struct

    path = fixtures.write_checkpoint(tmp_path / "dup", fixtures.draft_config(num_hidden_layers=1))
    file = path / "model.safetensors"
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    forged = json.dumps(header)[:-1] + ", " + json.dumps({name: header[name]})[1:-1] + "}"
    file.write_bytes(struct.pack("<Q", len(forged)) + forged.encode() + data[8 + n :])
    finding = one(run(path), "LC609", "error")
    assert finding.subjects == [name] and finding.file == "model.safetensors"
