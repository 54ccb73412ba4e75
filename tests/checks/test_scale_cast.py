"""A quantization scale stored in another float dtype than its parameter's: SGLang and vLLM cast it on load
(RuntimeProfile scale_dtype_cast). Exact for values E4M3 holds (LC329, a warning: the module serves as stored),
rounded otherwise (LC304: a silent mis-load the conformance harnesses observe as SW)."""

from __future__ import annotations

import numpy as np
import pytest

from lilicorr_ckpt import fixtures
from lilicorr_ckpt.checkpoint.numerics import bf16_bits

from ._support import run


def _scale_as(dtype: str, value: float):
    def mutate(t: fixtures.Tensors) -> None:
        shape = t["fc.weight_scale"][1]
        values = np.full(shape, value, dtype=np.float32)
        data = (
            bf16_bits(values).astype("<u2").tobytes() if dtype == "BF16" else values.astype("<f4").tobytes()
        )
        t["fc.weight_scale"] = (dtype, shape, data)

    return mutate


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
def test_exact_values_are_cast_and_served_as_stored(tmp_path, dtype, runtime):
    path = fixtures.write_checkpoint(tmp_path, quant="NVFP4", mutate=_scale_as(dtype, 0.5))
    report = run(path, runtime=runtime)
    rules = {f.rule: f for f in report.findings}
    assert "LC329" in rules and "LC304" not in rules, [f.message for f in report.findings]
    assert report.runtimes[0].accepted


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
def test_values_e4m3_cannot_hold_are_a_silent_misload(tmp_path, runtime):
    path = fixtures.write_checkpoint(tmp_path, quant="NVFP4", mutate=_scale_as("BF16", 0.3))
    report = run(path, runtime=runtime)
    found = [f for f in report.findings if f.rule == "LC304"]
    assert found and "rounds" in found[0].message and found[0].silent_for, [
        f.message for f in report.findings
    ]
    assert not report.runtimes[0].accepted


def test_a_runtime_not_established_to_cast_still_refuses(tmp_path):
    path = fixtures.write_checkpoint(tmp_path, quant="NVFP4", mutate=_scale_as("BF16", 0.5))
    report = run(path, runtime="trtllm")
    assert "LC304" in {f.rule for f in report.findings}
