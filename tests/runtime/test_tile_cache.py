"""The step GEMM's tile cache (ops/tiles.py): what one process tunes, the next one reuses; a damaged or planted
file can cost speed, never run a tile the kernel was not written for."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("triton")

from lilicorr_runtime.ops import step_triton, tiles  # noqa: E402

DEVICE = "NVIDIA H200 sm90 triton 3.6.0 tiles abc"
SHAPE = tiles.shape_key((960, 576, True, False, False, False, False, torch.bfloat16, torch.bfloat16, 0))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "step_tiles.json"
    monkeypatch.setenv(tiles.ENV, str(path))
    monkeypatch.setattr(tiles, "BUNDLED", tmp_path / "bundled.json")
    tiles.reset()
    yield path
    tiles.reset()


def _anything(tile):
    return True


def test_a_remembered_tile_is_found_by_the_next_process(cache):
    tile = {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "SPLIT": 3}
    tiles.remember(DEVICE, SHAPE, tile)
    assert json.loads(cache.read_text())["devices"][DEVICE][SHAPE] == tile
    tiles.reset()  # a new process reads the file
    assert tiles.lookup(DEVICE, SHAPE, _anything) == tile
    assert tiles.lookup(DEVICE, SHAPE + "x", _anything) is None  # another GEMM
    assert tiles.lookup("another GPU", SHAPE, _anything) is None
    assert not list(cache.parent.glob(".step_tiles.*"))  # no temporary left behind


def test_processes_writing_the_cache_merge_their_tiles(cache):
    first = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}
    tiles.remember(DEVICE, "a", first)
    tiles.reset()  # another process, which never read "a"
    tiles._loaded = {}
    second = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    tiles.remember(DEVICE, "b", second)
    assert json.loads(cache.read_text())["devices"][DEVICE] == {"a": first, "b": second}


def test_the_user_file_overrides_the_bundled_table(cache):
    bundled = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4}
    mine = {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    tiles.BUNDLED.write_text(
        json.dumps({"format": 1, "devices": {DEVICE: {SHAPE: bundled, "only": bundled}}})
    )
    tiles.remember(DEVICE, SHAPE, mine)
    tiles.reset()
    assert tiles.lookup(DEVICE, SHAPE, _anything) == mine
    assert tiles.lookup(DEVICE, "only", _anything) == bundled


def test_off_reads_and_writes_nothing(cache, monkeypatch):
    tiles.remember(DEVICE, SHAPE, {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4})
    monkeypatch.setenv(tiles.ENV, "off")
    tiles.reset()
    assert tiles.user_path() is None
    assert tiles.lookup(DEVICE, SHAPE, _anything) is None
    tiles.remember(DEVICE, "new", {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4})
    assert "new" not in cache.read_text()


@pytest.mark.parametrize(
    "planted",
    [
        {"BLOCK_N": 4096, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},  # not a candidate
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "SPLIT": 5},  # not a listed split
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "SPLIT": 1},
        {"BLOCK_N": "16", "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "evil": 1},
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4},
        {"BLOCK_N": True, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "STREAM": 2},  # too few units for 2
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "STREAM": 1.0},
        {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "STREAM": 64},
    ],
)
def test_a_planted_tile_the_tuner_could_not_choose_is_ignored(cache, planted):
    allowed = step_triton._allowed(960, 576, 132)
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"format": 1, "devices": {DEVICE: {SHAPE: planted}}}))
    tiles.reset()
    assert tiles.lookup(DEVICE, SHAPE, allowed) is None


def test_the_tiles_the_tuner_can_choose_are_allowed():
    allowed = step_triton._allowed(960, 576, 132)
    assert all(allowed(dict(c)) for c in step_triton.CANDIDATES)
    assert allowed(step_triton.linear_config(960, 576))
    splits = step_triton.split_candidates(960, 576, 132)
    assert splits and all(allowed(c) for c in splits)
    # a split the shape is too shallow for (K = 576 is 2 x 256: SPLIT 2 at most)
    assert not allowed({**step_triton.CANDIDATES[0], "SPLIT": 8})
    streams = step_triton.stream_candidates(960, 576, 132)
    assert streams and all(allowed(c) for c in streams)


def test_stream_tiles_are_stored_under_their_own_candidate_set(cache, monkeypatch):
    """With stream-K on, tiles are stored and read under a key of their own; with it off, under the key of the
    candidate set before stream-K, so the tables written then stay valid, and a stream tile is not a choice."""
    seen = []
    monkeypatch.setattr(
        tiles, "device_key", lambda device, candidates, splits, rows: seen.append(splits) or "k"
    )
    monkeypatch.setenv("LILICORR_STREAM_K", "on")
    step_triton.tile_key(torch.device("cpu"))
    monkeypatch.setenv("LILICORR_STREAM_K", "off")
    step_triton.tile_key(torch.device("cpu"))
    assert seen == [(step_triton.SPLITS, step_triton.STREAMS), step_triton.SPLITS]
    tile = {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "STREAM": 1}
    assert not step_triton._allowed(960, 576, 132)(tile)
    monkeypatch.setenv("LILICORR_STREAM_K", "on")
    allowed = step_triton._allowed(960, 576, 132)
    assert allowed(tile)
    tiles.remember(DEVICE, SHAPE, tile)
    tiles.reset()
    assert tiles.lookup(DEVICE, SHAPE, allowed) == tile


@pytest.mark.parametrize(
    "content", ["{not json", json.dumps({"format": 99, "devices": {}}), json.dumps([1, 2])]
)
def test_a_damaged_file_is_ignored_with_one_warning(cache, content):
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    tiles.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tiles.lookup(DEVICE, SHAPE, _anything) is None
        assert tiles.lookup(DEVICE, SHAPE, _anything) is None
    assert len([w for w in caught if "tile cache" in str(w.message)]) == 1
    tiles._warned.clear()


def test_an_unwritable_cache_costs_a_warning_not_the_run(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(tiles.ENV, str(blocker / "sub" / "step_tiles.json"))  # a file where a folder must be
    monkeypatch.setattr(tiles, "BUNDLED", tmp_path / "bundled.json")
    tiles.reset()
    with pytest.warns(RuntimeWarning, match="could not write the tile cache"):
        tiles.remember(DEVICE, SHAPE, {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4})
    tiles.reset()
    tiles._warned.clear()


def test_the_bundled_table_is_well_formed():
    data = json.loads(tiles.BUNDLED.read_text())
    assert data["format"] == tiles.FORMAT
    for shapes in data["devices"].values():
        for shape, tile in shapes.items():
            n, k = (int(part) for part in shape.split("|")[:2])
            assert step_triton._allowed(n, k, 132)(tile), (shape, tile)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_second_process_reuses_the_tuned_tile_without_timing(cache, monkeypatch):
    x = torch.randn(1, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(960, 576, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(step_triton, "TUNED", {})
    want = step_triton.step_linear_triton(x, w)
    ((key, tile),) = step_triton.TUNED.items()
    tiles.reset()
    monkeypatch.setattr(step_triton, "TUNED", {})  # a new process: nothing in memory

    def no_timing(*args, **kwargs):
        raise AssertionError("tuned again")

    monkeypatch.setattr(step_triton, "time_in_graph", no_timing)
    got = step_triton.step_linear_triton(x, w)
    assert step_triton.TUNED[key] == tile
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_prefill_first_call_is_tuned_at_one_row_tile(cache, monkeypatch):
    """The first call of a GEMM is usually a prompt's prefill; its tile must be timed as the decode steps run it,
    on one row tile, not on the prefill's rows."""
    rows = 3 * step_triton.BLOCK_M + 5
    x = torch.randn(rows, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(960, 576, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(rows, 960, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(step_triton, "TUNED", {})
    timed_rows = []

    def timer(launch, config, scratch, weight):
        scratch.fill_(float("nan"))
        launch(config, scratch, weight)
        written = ~torch.isnan(scratch).all(dim=1)
        timed_rows.append(int(written.sum()))
        assert written[: int(written.sum())].all()  # the first rows, not others
        return float(config["BLOCK_N"])  # any order will do

    monkeypatch.setattr(step_triton, "time_in_graph", timer)
    got = step_triton.step_linear_triton(x, w, residual=residual)
    assert timed_rows and set(timed_rows) == {step_triton.TUNE_ROWS}
    want = (x.float() @ w.float().T + residual.float()).to(torch.bfloat16)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)  # the call itself computed every row


def test_tuning_done_counts_each_tuned_shape_and_its_time(cache, monkeypatch):
    """smoke's profile reports the GEMM shapes a run tuned and how long that took (tuner.tuning_done): a shape with
    no stored tile is tuned once, and the tuning's wall time (compiles and timing) is counted."""
    from lilicorr_runtime.ops.tuning import tuner

    monkeypatch.setattr(tuner, "_TUNING", [0, 0.0])
    said = []
    monkeypatch.setattr(tuner, "announce", said.append)
    monkeypatch.setattr(tuner, "_announced", False)
    monkeypatch.setattr(tuner, "tile_key", lambda device: DEVICE)
    clock = iter([10.0, 12.5, 20.0, 21.0])
    monkeypatch.setattr(tuner, "_clock", lambda: next(clock))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    timed = []

    def timer(launch_rows, config, scratch, weight):
        timed.append(config)
        return float(config["BLOCK_K"])  # the smallest BLOCK_K wins

    weight, out = torch.zeros(8, 4), torch.zeros(2, 8)
    key = (960, 576, True, False, False, False, False, torch.bfloat16, torch.bfloat16, 0)
    best = tuner.tune(key, lambda *a, **k: None, out, weight, (), 132, timer=timer, tuned={})
    assert best["BLOCK_K"] == min(c["BLOCK_K"] for c in timed) and len(timed) > len(tuner.CANDIDATES)
    assert tuner.tuning_done() == (1, 2.5)
    tuner.tune(key, lambda *a, **k: None, out, weight, (), 132, timer=timer, tuned={})
    assert tuner.tuning_done() == (2, 3.5)
    # the first tuning of the process is said once (smoke shows it as a progress note), not once a shape
    assert len(said) == 1 and said[0].startswith("tuning the step GEMMs' tiles")
    # inside a graph capture the default serves, untimed and uncounted
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tuner.tune(key, lambda *a, **k: None, out, weight, (), 132, timer=timer, tuned={}) == (
        tuner.linear_config(960, 576)
    )
    assert tuner.tuning_done() == (2, 3.5)


def test_an_announcement_that_fails_never_fails_the_tuning(cache, monkeypatch):
    from lilicorr_runtime.ops.tuning import tuner

    def broken(text):
        raise OSError("the terminal is gone")

    monkeypatch.setattr(tuner, "announce", broken)
    monkeypatch.setattr(tuner, "_announced", False)
    monkeypatch.setattr(tuner, "tile_key", lambda device: DEVICE)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    key = (960, 576, True, False, False, False, False, torch.bfloat16, torch.bfloat16, 0)
    best = tuner.tune(
        key,
        lambda *a, **k: None,
        torch.zeros(2, 8),
        torch.zeros(8, 4),
        (),
        132,
        timer=lambda *a: 1.0,
        tuned={},
    )
    assert set(best) >= {"BLOCK_N", "BLOCK_K", "num_warps", "num_stages"}
