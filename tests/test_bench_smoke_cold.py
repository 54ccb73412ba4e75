"""bench/smoke_cold.py's table: each run's wall time beside the phases its profile recorded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, load_script


def _bench():
    return load_script("bench/smoke_cold.py", "smoke_cold_bench")


def test_the_table_has_a_column_per_phase_and_a_dash_where_a_run_has_none():
    bench = _bench()
    cold = {
        "phase_seconds": {"start": 11.0, "target": 3.0, "kernels_ahead": 20.5},
        "kernel_variants": {
            "ahead": 60,
            "ahead_compiled": 60,
            "ahead_seconds": 21.0,
            "launched": 62,
            "at_launch": 2,
            "at_launch_seconds": 1.25,
            "read_seconds": 0.5,
        },
    }
    warm = {"phase_seconds": {"start": 9.0, "target": 2.0, "decode": 5.0}}
    lines = bench.table([("bundled tiles", 45.0, 0, cold), ("warm", 24.2, 0, warm), ("failed", 1.0, 2, {})])
    assert lines[0].split() == [
        "cache",
        "state",
        "wall",
        "s",
        "rc",
        "start",
        "target",
        "kernels_ahead",
        "decode",
    ]
    assert lines[1].split() == ["bundled", "tiles", "45.0", "0", "11.0", "3.0", "20.5", "-"]
    assert lines[2].split() == ["warm", "24.2", "0", "9.0", "2.0", "-", "5.0"]
    assert lines[3].split() == ["failed", "1.0", "2", "-", "-", "-", "-"]
    assert lines[4] == (
        "bundled tiles: 60 of 60 stored variants compiled ahead in 21.0 s; the launches waited 0.5 s to read them "
        "and 1.2 s for 2 not compiled ahead (62 in all); 0 GEMM shape(s) tuned in 0.0 s"
    )
    assert len(lines) == 5


@pytest.mark.parametrize(
    "given", [["--out", "x"], ["--output", "x"], ["--output=x"], ["--out=x"], ["-o", "x"], ["-ox"]]
)
def test_an_out_of_the_users_own_is_refused(given):
    # smoke's --output is the spelling its help shows: the bench's own --out would clash with it in every run
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "smoke_cold.py"), "--", "drafter", "-t", "target", *given],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "leave out --output" in done.stderr
