"""The tuned tile and kernel tables (LILICORR_TILE_CACHE, LILICORR_KERNEL_CACHE, ~/.cache/lilicorr) are read
under the guarded reader's checks (issue 40): a FIFO, device, directory, oversized or absurdly nested file is
ignored with one warning, within bounded time and memory (a FIFO there used to hang `smoke --gpu`), and a cache
file that is not a regular file is never replaced by one."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest

from lilicorr_runtime.ops import tiles, warm

from helpers import raised_within

DEVICE = "NVIDIA H200 sm90 triton 3.6.0 tiles abc"
TILE = {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3}


def _hostile(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "oversized":  # a hole: nothing may read it whole
        with path.open("wb") as f:
            f.truncate(warm.TABLE_LIMIT + 1)
    elif kind == "nested":  # past what json's recursion takes
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "symlink-loop":
        path.symlink_to(path)


KINDS = ["fifo", "directory", "dev-zero", "oversized", "nested", "symlink-loop"]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setattr(tiles, "BUNDLED", tmp_path / "bundled-tiles.json")
    monkeypatch.setattr(warm, "BUNDLED", tmp_path / "bundled-kernels.json")
    monkeypatch.setattr(tiles, "_warned", set())
    monkeypatch.setattr(warm, "_warned", set())
    tiles.reset()
    yield tmp_path
    tiles.reset()


def _quietly(fn, *args):
    """fn(*args) within 20 s (a blocked read fails the test), and the warnings it gave."""
    result: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raised = raised_within(20, lambda: result.append(fn(*args)))
    assert raised is None, raised
    return result[0], [str(w.message) for w in caught]


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_tile_cache_is_ignored_with_a_warning_never_a_hang(isolated, monkeypatch, kind):
    path = isolated / "cache" / "step_tiles.json"
    _hostile(path, kind)
    monkeypatch.setenv(tiles.ENV, str(path))
    found, said = _quietly(tiles.lookup, DEVICE, "shape", lambda tile: True)
    assert found is None
    assert len(said) == 1 and f"ignoring the tile cache {path}" in said[0], said
    assert "Error" not in said[0] and "Traceback" not in said[0], said


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_kernel_table_is_ignored_with_a_warning_never_a_hang(isolated, monkeypatch, kind):
    path = isolated / "cache" / "kernels.json"
    _hostile(path, kind)
    monkeypatch.setenv(warm.ENV, str(path))
    found, said = _quietly(warm.stored, DEVICE)
    assert found == []
    assert len(said) == 1 and f"ignoring the kernel table {path}" in said[0], said
    assert "Error" not in said[0], said


def test_the_default_cache_directory_is_read_under_the_same_checks(isolated, monkeypatch):
    monkeypatch.delenv(tiles.ENV, raising=False)
    monkeypatch.delenv(warm.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated / "xdg"))
    _hostile(isolated / "xdg" / "lilicorr" / "step_tiles.json", "fifo")
    _hostile(isolated / "xdg" / "lilicorr" / "kernels.json", "fifo")
    assert _quietly(tiles.lookup, DEVICE, "shape", lambda tile: True)[0] is None
    assert _quietly(warm.stored, DEVICE)[0] == []


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_cache_file_that_is_not_a_regular_file_is_never_replaced(isolated, monkeypatch, kind):
    path = isolated / "cache" / "step_tiles.json"
    _hostile(path, kind)
    monkeypatch.setenv(tiles.ENV, str(path))
    _, said = _quietly(tiles.remember, DEVICE, "shape", TILE)
    assert any("could not write the tile cache" in s for s in said), said
    mode = os.lstat(path).st_mode
    assert {"fifo": stat.S_ISFIFO, "dev-zero": stat.S_ISLNK, "directory": stat.S_ISDIR}[kind](mode)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".step_tiles")]  # no temporary left


def test_a_good_table_still_reads(isolated, monkeypatch):
    path = isolated / "cache" / "step_tiles.json"
    monkeypatch.setenv(tiles.ENV, str(path))
    tiles.remember(DEVICE, "shape", TILE)
    tiles.reset()
    assert tiles.lookup(DEVICE, "shape", lambda tile: True) == TILE


# A cache setting pointed at a model's own files (LILICORR_TILE_CACHE=ckpt/model.safetensors by mistake): the
# table writer used to read it as "not a table", warn, and replace the weights with a tile table
@pytest.mark.parametrize(
    "content",
    [
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(range(256)) * 4,
        b'{"architectures": ["LiLiCorrDraftModel"]}',
    ],
    ids=["weights", "config-json"],
)
def test_a_cache_setting_naming_a_model_file_never_replaces_it(isolated, monkeypatch, content):
    path = isolated / "ckpt" / "model.safetensors"
    path.parent.mkdir()
    path.write_bytes(content)
    monkeypatch.setenv(tiles.ENV, str(path))
    _, said = _quietly(tiles.remember, DEVICE, "shape", TILE)
    assert any("could not write the tile cache" in s and "other than a lilicorr table" in s for s in said), (
        said
    )
    assert path.read_bytes() == content
    monkeypatch.setenv(warm.ENV, str(path))
    monkeypatch.setattr(warm, "recorded", lambda: {DEVICE: [{"spec": "k"}]})
    _, said = _quietly(warm.save)
    assert any("could not write the kernel table" in s for s in said), said
    assert path.read_bytes() == content
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_older_table_of_ours_is_still_replaced(isolated, monkeypatch):
    path = isolated / "cache" / "step_tiles.json"
    path.parent.mkdir()
    path.write_text('{"format": 0, "devices": {}}')
    monkeypatch.setenv(tiles.ENV, str(path))
    tiles.remember(DEVICE, "shape", TILE)
    tiles.reset()
    assert tiles.lookup(DEVICE, "shape", lambda tile: True) == TILE


@pytest.mark.parametrize("env", ["LILICORR_TILE_CACHE", "LILICORR_KERNEL_CACHE"])
def test_smoke_gpu_refuses_a_cache_setting_that_names_an_input(tmp_path, monkeypatch, env):
    from lilicorr_ckpt.errors import UsageError
    from lilicorr_ckpt.smoke.options import SmokeOptions
    from lilicorr_ckpt.smoke.run import refuse_caches_over_inputs

    ckpt, target = tmp_path / "ckpt", tmp_path / "target"
    for d in (ckpt, target):
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"weights")
    opts = SmokeOptions(path=str(ckpt), target=str(target), gpu=True)
    monkeypatch.setenv(env, str(tmp_path / "elsewhere.json"))
    refuse_caches_over_inputs(opts)  # another file: fine
    monkeypatch.setenv(env, str(target / "sub" / ".." / "model.safetensors"))
    with pytest.raises(UsageError) as caught:
        refuse_caches_over_inputs(opts)
    message = str(caught.value)
    assert env in message and "model.safetensors of the target" in message and "set it to off" in message
    os.link(ckpt / "config.json", tmp_path / "linked.json")
    monkeypatch.setenv(env, str(tmp_path / "linked.json"))
    with pytest.raises(UsageError, match="hard link to config.json of the checkpoint"):
        refuse_caches_over_inputs(opts)
