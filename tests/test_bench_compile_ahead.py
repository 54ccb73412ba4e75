"""bench/compile_ahead.py's options: what it hands its workers, and a --device that names no GPU of the table."""

from __future__ import annotations

import json
import subprocess
import sys
import types

from helpers import REPO, load_script


def test_a_device_that_matches_no_gpu_of_the_table_is_refused_not_timed_as_nothing():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "compile_ahead.py"), "--device", "h100", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--device 'h100' matches none of the bundled table's GPUs" in done.stderr
    assert "NVIDIA H100 80GB HBM3" in done.stderr


def test_a_device_that_starts_with_a_dash_reaches_the_worker_as_its_value(monkeypatch, capsys):
    bench = load_script("bench/compile_ahead.py", "compile_ahead_bench")
    seen: list[list[str]] = []

    def run(argv, **kwargs):
        seen.append(argv)
        row = {"triton": "3.9.0", "threads": 1, "wall": 1.0, "results": []}
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(row) + "\n", stderr="")

    monkeypatch.setattr(bench, "variants", lambda pick, device: [{"name": "x"}])
    monkeypatch.setattr(bench.subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["compile_ahead.py", "--device=-SXM4", "--threads", "1", "--json"])
    bench.main()
    argv = seen[0]
    assert argv[argv.index("--worker") :].count("--device=-SXM4") == 1 and "--device" not in argv
    assert json.loads(capsys.readouterr().out)["threads"] == 1
