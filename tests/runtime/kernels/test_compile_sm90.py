"""Every runtime kernel compiles to a cubin for the GPUs the bundled table names (sm90), with the Triton installed
here, on a machine without a GPU.

The CPU tests run the kernels under Triton's interpreter, which never compiles them: a kernel that the interpreter
runs but Triton's compiler rejects (a type the MLIR passes refuse, a layout ptxas cannot place, a Triton release
that changed a rule) would otherwise first fail on a lent GPU. Triton compiles for a named target without a driver,
so each kernel's bundled variants (their argument types, alignments, constexprs, warps and stages, as a launch on
an H100 or H200 specialized them) go through the whole pipeline to ptxas here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

# in a fresh interpreter without TRITON_INTERPRET (under the interpreter the kernels are not JITFunctions), into a
# Triton cache of its own; for each kernel, its first bundled variant and the one with the most warps
SCRIPT = r"""
import importlib, json, sys, time
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lilicorr_runtime.ops import warm

def tuple_of(value):
    return tuple(tuple_of(v) for v in value) if isinstance(value, list) else value

chosen = {}
for entries in json.loads(warm.BUNDLED.read_text())["devices"].values():
    for entry in entries:
        spec = json.loads(entry["spec"])
        name, warps = spec["name"], spec["options"]["num_warps"]
        chosen.setdefault((name, "first"), spec)
        if warps > chosen.setdefault((name, "warps"), spec)["options"]["num_warps"]:
            chosen[(name, "warps")] = spec
results = {}
for spec in {json.dumps(s, sort_keys=True): s for s in chosen.values()}.values():
    module, _, attr = spec["name"].rpartition(".")
    fn = getattr(importlib.import_module(module), attr)
    source = ASTSource(
        fn,
        {k: tuple_of(v) for k, v in spec["signature"].items()},
        {tuple(k): tuple_of(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"])},
        {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])},
    )
    options = {"num_warps": spec["options"]["num_warps"], "num_stages": spec["options"]["num_stages"]}
    label = f"{attr} warps={options['num_warps']} stages={options['num_stages']}"
    begin = time.perf_counter()
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        results[label] = {"cubin": len(kernel.asm["cubin"]), "seconds": time.perf_counter() - begin}
    except Exception as exc:
        results[label] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
print(json.dumps({"triton": triton.__version__, "results": results}))
"""


def test_every_kernel_compiles_for_sm90_with_the_installed_triton(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; the runtime's kernels fuse
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    results = report["results"]
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
