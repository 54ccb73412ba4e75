"""scripts/bundle_kernels.py: a GPU's recorded kernel variants replace its section of the bundled table, and stale
entries (a kernel edited since they were recorded) are dropped and named."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

SCRIPT = REPO / "scripts" / "bundle_kernels.py"
spec = importlib.util.spec_from_file_location("bundle_kernels", SCRIPT)
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)

H100 = "NVIDIA H100 80GB HBM3 sm90 triton 3.6.0"
H200 = "NVIDIA H200 sm90 triton 3.6.0"
NAME = "lilicorr_runtime.ops.step_triton._step_linear"


def _entry(spec: str, source: str = "now", name: str = NAME) -> dict[str, str]:
    return {"name": name, "source": source, "spec": spec}


def test_a_recorded_section_replaces_the_gpus_own_whole_and_stale_entries_go():
    bundled = {H100: [_entry("old-a"), _entry("old-b")], H200: [_entry("h200"), _entry("edited", "before")]}
    recorded = {H100: [_entry("new-a"), _entry("new-a"), _entry("new-b", "before")]}
    merged, dropped = bundle.merge(bundled, recorded, lambda name: "now")
    assert [e["spec"] for e in merged[H100]] == ["new-a"]  # whole section replaced, the repeat once
    assert [e["spec"] for e in merged[H200]] == ["h200"]  # another GPU's kept, its stale entry dropped
    assert dropped == [f"{H100}: _step_linear", f"{H200}: _step_linear"]
    assert bundled[H200][1]["spec"] == "edited"  # the input is not changed


def test_two_recordings_of_one_gpu_both_count():
    first = {H100: [_entry("a"), _entry("b")]}
    second = {H100: [_entry("b"), _entry("c")], H200: [_entry("d")]}
    merged, dropped = bundle.merge(
        {H100: [_entry("old")]}, bundle.combine([first, second]), lambda name: "now"
    )
    assert [e["spec"] for e in merged[H100]] == ["a", "b", "c"]
    assert [e["spec"] for e in merged[H200]] == ["d"] and dropped == []


def test_a_section_left_empty_is_removed_and_unknown_kernels_are_stale():
    bundled = {H200: [_entry("gone", name="lilicorr_runtime.ops.step_triton._no_such_kernel")]}
    merged, dropped = bundle.merge(bundled, {}, lambda name: None if "_no_such" in name else "now")
    assert merged == {} and dropped == [f"{H200}: _no_such_kernel"]


def test_the_script_refuses_the_interpreter_and_a_call_without_work(capsys):
    assert os.environ.get("TRITON_INTERPRET") == "1"  # tests/conftest.py
    for argv in (["--check"], [], ["--prune", "x.json"]):
        with pytest.raises(SystemExit) as exc:
            bundle.main(argv)
        assert exc.value.code == 2
    assert "TRITON_INTERPRET" in capsys.readouterr().err


def test_bundling_a_recorded_table_into_a_copy_of_the_real_one(tmp_path):
    """The script run as a contributor runs it (no interpreter): a recorded H100 section with one entry whose
    kernel was edited since replaces the copy's H100 section less that entry; the H200 section stays."""
    real = json.loads((REPO / "lilicorr_runtime" / "ops" / "tuning" / "kernels.json").read_text())
    table = tmp_path / "kernels.json"
    table.write_text(json.dumps(real))
    h100 = real["devices"][H100]
    recorded = [*h100[:5], {**h100[5], "source": "0" * 16}]
    (tmp_path / "recorded.json").write_text(json.dumps({"format": 1, "devices": {H100: recorded}}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "recorded.json"), "--table", str(table)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert f"stale: {H100}: {h100[5]['name'].rsplit('.', 1)[-1]}" in done.stdout
    written = json.loads(table.read_text())["devices"]
    assert written[H100] == h100[:5]
    assert written[H200] == real["devices"][H200]
