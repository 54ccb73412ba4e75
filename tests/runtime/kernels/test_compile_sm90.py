"""Every runtime kernel compiles to a cubin for the GPUs the bundled table names (sm90), with the Triton installed
here, on a machine without a GPU.

The CPU tests run the kernels under Triton's interpreter, which never compiles them: a kernel that the interpreter
runs but Triton's compiler rejects (a type the MLIR passes refuse, a layout ptxas cannot place, a Triton release
that changed a rule) would otherwise first fail on a lent GPU. Triton compiles for a named target without a driver,
so each kernel's bundled variants (their argument types, alignments, constexprs, warps and stages, as a launch on
an H100 or H200 specialized them) go through the whole pipeline to ptxas here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from helpers import REPO


def test_every_kernel_compiles_for_sm90_with_the_installed_triton():
    # bench/compile_ahead.py: a fresh interpreter without TRITON_INTERPRET (under the interpreter the kernels are
    # not JITFunctions), a Triton cache of its own; per kernel its first bundled variant and its widest
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "compile_ahead.py"),
            "--threads",
            "2",
            "--pick",
            "first-widest",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    results = {r["label"]: r for r in report["results"]}
    failed = {label: r["error"] for label, r in results.items() if "error" in r}
    assert not failed, f"Triton {report['triton']} cannot compile for sm90: {failed}"
    kernels = {label.split()[0] for label in results}
    # every kernel the runtime launches on a GPU, the step GEMMs, attention, the norms and the head's walk
    assert {
        "_step_linear",
        "_step_linear_rows",
        "_step_linear_wide",
        "_attention",
        "_rms_norm",
        "_residual_norm",
        "_lattice_scores",
        "_greedy_walk",
    } <= kernels
    assert all(r["cubin"] > 1000 for r in results.values())  # a real cubin, not an empty stub
