"""Kernel variants compiled ahead (ops/warm.py): what one run compiled, the next fresh Triton cache compiles in
parallel before the first launch; a damaged, stale or planted table costs compile time, never a wrong kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

pytest.importorskip("triton")

from lilicorr_runtime.ops import step_triton, warm  # noqa: E402

DEVICE = "NVIDIA H200 sm90 triton 3.6.0"
NAME = "lilicorr_runtime.ops.step_triton._step_linear"
SRC1 = warm.source_hash(types.SimpleNamespace(src="def k(): pass"))


def _entry(spec: str = '{"name": "x"}', name: str = NAME, source: str = "abc") -> dict[str, str]:
    return {"name": name, "source": source, "spec": spec}


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "kernels.json"
    monkeypatch.setenv(warm.ENV, str(path))
    monkeypatch.setattr(warm, "BUNDLED", tmp_path / "bundled.json")
    monkeypatch.setattr(warm, "_recorded", {})
    monkeypatch.setattr(warm, "_warned", set())
    return path


def _record(monkeypatch, spec: str, module: str = "lilicorr_runtime.ops.step_triton", device: int = 0):
    monkeypatch.setattr(warm, "device_key", lambda d: f"gpu{d.index}")
    fn = types.SimpleNamespace(
        module=module, name="_step_linear", jit_function=types.SimpleNamespace(src="def k(): pass")
    )
    warm._hook(key="k", repr="r", fn=fn, compile={"specialization_data": spec, "device": device})


def test_recorded_variants_are_saved_and_merged_with_the_file(table, monkeypatch):
    _record(monkeypatch, '{"a": 1}')
    _record(monkeypatch, '{"a": 1}')  # the same variant twice: one entry
    _record(monkeypatch, '{"b": 2}', device=1)
    warm.save()
    data = json.loads(table.read_text())
    assert data["format"] == warm.FORMAT
    assert data["devices"]["gpu0"] == [_entry('{"a": 1}', source=SRC1)]
    assert data["devices"]["gpu1"] == [_entry('{"b": 2}', source=SRC1)]
    monkeypatch.setattr(warm, "_recorded", {})  # another process adds a variant
    _record(monkeypatch, '{"c": 3}')
    warm.save()
    assert [e["spec"] for e in json.loads(table.read_text())["devices"]["gpu0"]] == ['{"a": 1}', '{"c": 3}']
    assert not list(table.parent.glob(".kernels.*"))  # no temporary left behind


def test_what_a_warm_up_compiles_is_not_recorded(table, monkeypatch):
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(warm, "device_key", lambda d: "gpu")
    twin = warm.shadow(JITFunction(_add_one))
    fn = types.SimpleNamespace(module="lilicorr_runtime.ops.x", name="_add_one", jit_function=twin)
    warm._hook(key="k", repr="r", fn=fn, compile={"specialization_data": "s", "device": 0})
    assert warm.recorded() == {}


def test_only_this_packages_kernels_are_recorded(table, monkeypatch):
    _record(monkeypatch, '{"a": 1}', module="someone_else.kernels")
    assert warm.recorded() == {}
    warm.save()
    assert not table.exists()


def test_stored_reads_the_bundled_table_then_the_users(table, monkeypatch):
    warm.BUNDLED.write_text(json.dumps({"format": 1, "devices": {DEVICE: [_entry("s1"), _entry("s2")]}}))
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"format": 1, "devices": {DEVICE: [_entry("s2"), _entry("s3")]}}))
    assert [e["spec"] for e in warm.stored(DEVICE)] == ["s1", "s2", "s3"]
    assert warm.stored("another GPU") == []
    monkeypatch.setenv(warm.ENV, "off")
    assert warm.user_path() is None
    assert warm.stored(DEVICE) == []


def test_a_gpu_without_variants_of_its_own_takes_those_of_its_capability_and_triton(table):
    h100 = "NVIDIA H100 80GB HBM3 sm90 triton 3.6.0"
    warm.BUNDLED.write_text(
        json.dumps(
            {
                "format": 1,
                "devices": {
                    DEVICE: [_entry("h200-only"), _entry("shared")],
                    h100: [_entry("shared"), _entry("h100-only")],
                    "NVIDIA A100-SXM4-80GB sm80 triton 3.6.0": [_entry("ampere")],
                    "NVIDIA H200 sm90 triton 3.5.1": [_entry("older triton")],
                    "a key of no known form": [_entry("odd")],
                },
            }
        )
    )
    assert [e["spec"] for e in warm.stored(h100)] == ["shared", "h100-only"]  # its own only
    assert [e["spec"] for e in warm.stored("NVIDIA GH200 480GB sm90 triton 3.6.0")] == [
        "h200-only",
        "shared",
        "h100-only",
    ]
    assert [e["spec"] for e in warm.stored("NVIDIA A100-SXM4-40GB sm80 triton 3.6.0")] == ["ampere"]
    assert warm.stored("NVIDIA H100 sm90 triton 3.9.0") == []
    assert [e["spec"] for e in warm.stored("a key of no known form")] == ["odd"]


@pytest.mark.parametrize(
    "entry",
    [
        _entry(name="os.system"),  # not this package's
        {**_entry(), "extra": "x"},
        {"name": NAME, "source": "abc", "spec": {"not": "a string"}},
        "a string",
    ],
)
def test_malformed_entries_are_dropped(table, entry):
    warm.BUNDLED.write_text(json.dumps({"format": 1, "devices": {DEVICE: [entry, _entry("good")]}}))
    assert [e["spec"] for e in warm.stored(DEVICE)] == ["good"]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99, "devices": {}}), json.dumps([1])])
def test_a_damaged_table_is_ignored_with_one_warning(table, content):
    table.parent.mkdir(parents=True)
    table.write_text(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warm.read(table) == {}
        assert warm.read(table) == {}
    assert len(caught) == 1 and "kernel table" in str(caught[0].message)


def test_a_table_keeps_at_most_max_entries_per_device(table, monkeypatch):
    monkeypatch.setattr(warm, "MAX_ENTRIES", 3)
    for i in range(5):
        _record(monkeypatch, f"spec{i}")
    warm.save()
    assert [e["spec"] for e in warm.read(table)["gpu0"]] == ["spec2", "spec3", "spec4"]  # the newest


def test_an_unwritable_table_costs_a_warning_not_the_run(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(warm.ENV, str(blocker / "kernels.json"))  # its parent is a file
    monkeypatch.setattr(warm, "_recorded", {})
    monkeypatch.setattr(warm, "_warned", set())
    _record(monkeypatch, "s")
    with pytest.warns(RuntimeWarning, match="could not write the kernel table"):
        warm.save()


def test_only_this_packages_kernels_resolve():
    if step_triton._interpreted():  # TRITON_INTERPRET: nothing is compiled, so nothing resolves to warm
        assert warm._kernel(NAME) is None
    else:
        assert warm._kernel(NAME) is step_triton._step_linear
    assert warm._kernel("os.system") is None
    assert warm._kernel("lilicorr_runtime.ops.step_triton.torch") is None  # not a kernel
    assert warm._kernel("lilicorr_runtime.ops.no_such_module._k") is None
    assert warm._kernel("lilicorr_runtime.ops.step_triton.a b") is None


def _add_one(x_ptr, n):
    pass


def test_the_source_hash_ignores_where_the_kernel_starts_but_not_its_text(tmp_path, monkeypatch):
    import importlib

    from triton.runtime.jit import JITFunction

    body = "def kernel(x_ptr, n):\n    pass\n"
    (tmp_path / "k_top.py").write_text(body)
    (tmp_path / "k_low.py").write_text("\n" * 40 + body)  # an edit above the kernel moved it down
    (tmp_path / "k_new.py").write_text(body.replace("pass", "n = n + 1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    top, low, new = (JITFunction(importlib.import_module(m).kernel) for m in ("k_top", "k_low", "k_new"))
    assert top.cache_key != low.cache_key  # Triton's key moves with the line
    assert warm.source_hash(top) == warm.source_hash(low)
    assert warm.source_hash(top) != warm.source_hash(new)
    assert warm.source_hash(types.SimpleNamespace()) is None


def test_a_shadow_compiles_into_its_own_kernel_tables():
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_add_one)  # compiled, whatever TRITON_INTERPRET says
    twin = warm.shadow(kernel)
    assert twin.device_caches is not kernel.device_caches
    assert twin._fn_name == kernel._fn_name  # preload accepts the kernel's own records
    assert twin.cache_key == kernel.cache_key  # so its disk entries are the kernel's
    twin.device_caches["somewhere"] = ("a table",)
    assert "somewhere" not in kernel.device_caches


def test_start_does_nothing_without_cuda(table, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert warm.start("cuda", entries=[_entry()]) is None
    assert warm.start("cpu", entries=[_entry()]) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_recorded_variants_compile_ahead_into_a_fresh_cache(table, tmp_path, monkeypatch):
    import triton

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-a"))
    monkeypatch.setattr(step_triton, "TUNED", {})
    for caches in step_triton._step_linear.device_caches.values():
        caches[0].clear()  # this process's kernels, as a fresh process has none
    assert warm.record()
    x = torch.randn(3, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(960, 576, device="cuda", dtype=torch.bfloat16)
    config = step_triton.linear_config(960, 576)
    want = step_triton.step_linear_triton(x, w, config=config)
    entries = [e for es in warm.recorded().values() for e in es if e["name"].endswith("_step_linear")]
    assert entries
    bad = {**entries[0], "spec": entries[0]["spec"].replace('"BLOCK_K"', '"NOT_A_PARAM"')}
    stale = {**entries[0], "source": "another source"}
    assert entries[0]["source"] == warm.source_hash(step_triton._step_linear)

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-b"))  # a fresh Triton cache
    for caches in step_triton._step_linear.device_caches.values():
        caches[0].clear()
    job = warm.start("cuda", entries=[*entries, bad, stale])
    assert job is not None and len(job.jobs) == len(entries) + 1  # the stale one is not even tried
    job.join()
    assert (job.compiled, job.failed) == (len(entries), 1)
    assert all(not caches[0] for caches in step_triton._step_linear.device_caches.values())

    hits = []
    triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    try:
        got = step_triton.step_linear_triton(x, w, config=config)
    finally:
        triton.knobs.compilation.listener = None
    assert hits and all(hits)  # found on disk, not compiled again
    assert torch.equal(got, want)

    # a table recorded on another machine names its Triton's libdevice at a path that does not exist here (every
    # record before `portable` did): read from the user's table, it still compiles ahead and serves the launch
    def moved(entry):
        spec = json.loads(entry["spec"])
        spec["options"]["extern_libs"] = [["libdevice", "/elsewhere/triton/libdevice.10.bc"]]
        return {**entry, "spec": json.dumps(spec)}

    table.parent.mkdir(parents=True, exist_ok=True)
    key = warm.device_key(torch.device("cuda"))
    table.write_text(json.dumps({"format": warm.FORMAT, "devices": {key: [moved(e) for e in entries]}}))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-c"))
    for caches in step_triton._step_linear.device_caches.values():
        caches[0].clear()
    job = warm.start("cuda")
    assert job is not None
    job.join()
    assert (job.compiled, job.failed) == (len(entries), 0)
    hits.clear()
    triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    try:
        got = step_triton.step_linear_triton(x, w, config=config)
    finally:
        triton.knobs.compilation.listener = None
    assert hits and all(hits)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_table_notes_the_tile_a_tuned_shape_runs_not_the_candidates(table, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("LILICORR_TILE_CACHE", "off")
    monkeypatch.setattr(step_triton, "TUNED", {})
    for kernel in (step_triton._step_linear, step_triton._step_linear_stream):
        for caches in kernel.device_caches.values():
            caches[0].clear()
    assert warm.record()
    before = {e["spec"] for es in warm.recorded().values() for e in es}
    x = torch.randn(1, 704, device="cuda", dtype=torch.bfloat16)  # a shape no other test tunes
    w = torch.randn(1408, 704, device="cuda", dtype=torch.bfloat16)
    got = step_triton.step_linear_triton(x, w)  # tunes: every candidate compiled and timed, then one runs
    chosen = step_triton.TUNED[next(iter(step_triton.TUNED))]
    torch.testing.assert_close(got, step_triton.step_linear_triton(x, w, config=chosen))
    new = [
        e
        for es in warm.recorded().values()
        for e in es
        if e["spec"] not in before and e["name"].startswith("lilicorr_runtime.ops.step_triton.")
    ]
    assert len(new) == 1  # the tile that runs (a split or a stream tile is one variant whatever its count)
    kernel = "_step_linear_stream" if "STREAM" in chosen else "_step_linear"
    assert new[0]["name"].endswith("." + kernel)


def test_the_bundled_table_is_well_formed():
    import importlib

    data = json.loads(warm.BUNDLED.read_text())
    assert data["format"] == warm.FORMAT
    for entries in data["devices"].values():
        assert 0 < len(entries) <= warm.MAX_ENTRIES
        for entry in entries:
            assert warm._entry_ok(entry), entry
            module, _, attr = entry["name"].rpartition(".")
            assert getattr(importlib.import_module(module), attr, None) is not None, entry["name"]
            assert json.loads(entry["spec"])["name"] == entry["name"]


def test_every_bundled_variant_names_the_kernel_source_it_was_compiled_from():
    """An edit to a kernel's own text (formatting included) leaves its bundled variants stale: a fresh machine
    then compiles them at first launch instead of ahead. Regenerate the table on the GPU it names (the per-user
    table of a smoke run there) when this fails."""
    # in a fresh interpreter without TRITON_INTERPRET: under the interpreter the kernels are not JITFunctions
    script = (
        "import json\n"
        "from lilicorr_runtime.ops import warm\n"
        "data = json.loads(warm.BUNDLED.read_text())\n"
        "print(json.dumps(sorted({e['name'] for es in data['devices'].values() for e in es\n"
        "    if warm.source_hash(warm._kernel(e['name'])) != e['source']})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    stale = json.loads(done.stdout)
    assert not stale, f"bundled kernel variants of edited kernels: {stale}"


def _launch(
    monkeypatch,
    *,
    spec: str = '{"a": 1}',
    shadow: bool = False,
    module: str = "lilicorr_runtime.ops.step_triton",
    seconds=0.25,
):
    """One launch's compile as Triton reports it: the cache hook before, the post-compile hook after."""
    monkeypatch.setattr(warm, "device_key", lambda d: "gpu0")
    jit = types.SimpleNamespace(src="def k(): pass", _lilicorr_shadow=shadow)
    fn = types.SimpleNamespace(module=module, name="_step_linear", jit_function=jit)
    clock = iter([100.0, 100.0 + seconds])
    monkeypatch.setattr(warm, "_clock", lambda: next(clock))
    warm._pre_hook(key="k", fn=fn)
    warm._hook(key="k", repr="r", fn=fn, compile={"specialization_data": spec, "device": 0})


def test_launch_waits_are_the_launches_per_variant_not_the_warm_ups_or_others(table, monkeypatch):
    monkeypatch.setattr(warm, "_waits", {})
    _launch(monkeypatch, seconds=0.25)
    _launch(monkeypatch, spec='{"b": 2}', seconds=1.5)
    assert warm.launch_waits() == {"gpu0": {'{"a": 1}': 0.25, '{"b": 2}': 1.5}}
    _launch(monkeypatch, spec='{"c": 3}', shadow=True, seconds=9.0)  # a compile ahead: no launch waited
    _launch(monkeypatch, spec='{"d": 4}', module="someone_else.kernels", seconds=9.0)  # not this package's
    assert warm.launch_waits() == {"gpu0": {'{"a": 1}': 0.25, '{"b": 2}': 1.5}}
    # a post-compile call without its cache hook (a Triton without one): recorded, not timed
    _record(monkeypatch, '{"e": 5}')
    assert set(warm.launch_waits()["gpu0"]) == {'{"a": 1}', '{"b": 2}'}
    assert {e["spec"] for e in warm.recorded()["gpu0"]} == {'{"a": 1}', '{"b": 2}', '{"e": 5}'}
    # what launch_waits hands out is a copy: the caller cannot change the runtime's record
    warm.launch_waits()["gpu0"].clear()
    assert len(warm.launch_waits()["gpu0"]) == 2


def test_record_chains_the_cache_hook_and_keeps_its_answer(monkeypatch):
    import triton

    calls = []
    runtime = types.SimpleNamespace(
        jit_post_compile_hook=lambda **kw: calls.append("post"), jit_cache_hook=lambda **kw: "skip"
    )
    monkeypatch.setattr(triton, "knobs", types.SimpleNamespace(runtime=runtime), raising=False)
    monkeypatch.setattr(warm, "_hooked", False)
    monkeypatch.setattr(warm, "_waits", {})
    monkeypatch.setattr(warm, "_recorded", {})
    monkeypatch.setattr(warm, "device_key", lambda d: "gpu0")
    assert warm.record()
    fn = types.SimpleNamespace(
        module="lilicorr_runtime.ops.step_triton",
        name="_step_linear",
        jit_function=types.SimpleNamespace(src="def k(): pass"),
    )
    # the hook set before ours decides whether Triton compiles: its answer comes back unchanged
    assert runtime.jit_cache_hook(key="k", fn=fn) == "skip"
    assert warm._started.at is not None
    # and the post-compile hook set before ours still runs after ours
    runtime.jit_post_compile_hook(key="k", fn=fn, compile={"specialization_data": "{}", "device": 0})
    assert calls == ["post"] and list(warm.launch_waits()["gpu0"]) == ["{}"] and warm._started.at is None


def test_a_record_is_portable_without_the_recording_machines_library_path(table, monkeypatch):
    """Triton writes its libdevice's path into a variant's options; compiling from a record whose path does not
    exist fails (Triton hashes the file), so the path is dropped and each machine's Triton fills in its own."""
    here = json.dumps(
        {"name": NAME, "options": {"num_warps": 4, "extern_libs": [["libdevice", "/opt/x.bc"]]}}
    )
    moved = json.dumps(
        {"name": NAME, "options": {"num_warps": 4, "extern_libs": [["libdevice", "/home/y.bc"]]}}
    )
    plain = json.dumps({"name": NAME, "options": {"num_warps": 4}})
    assert warm.portable(here) == warm.portable(moved) == plain
    assert warm.portable("not json") == "not json" and warm.portable("[1, 2]") == "[1, 2]"
    assert warm.portable(plain) == plain
    # launches record the portable form, and tables recorded before are read in it: one entry for both machines
    _record(monkeypatch, here)
    assert [e["spec"] for e in warm.recorded()["gpu0"]] == [plain]
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"format": warm.FORMAT, "devices": {"gpu0": [_entry(moved, source=SRC1)]}}))
    assert warm.stored("gpu0") == [_entry(plain, source=SRC1)]


def test_the_bundled_records_name_no_machines_library_path():
    for entries in json.loads(warm.BUNDLED.read_text())["devices"].values():
        for entry in entries:
            assert "extern_libs" not in json.loads(entry["spec"])["options"], entry["name"]
