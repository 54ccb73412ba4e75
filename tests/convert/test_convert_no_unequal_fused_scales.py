"""No NVFP4 output of convert keeps unequal fused scales (issue 39, "Done when"): every convert output of every
producer fixture (tests/conformance/producer_fixtures.py CONVERSIONS: the default, the refusals' fixes, --to
speculators, --to zlab), for several runtime selections, gives each fused group (q/k/v, gate/up) one
weight_scale_2 and one input_scale, read from the written safetensors; and validate --deep finds no LC327."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from conformance.producer_fixtures import CONVERSIONS
from convert_helpers import tensors_of

from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.runtimes import fused_name

NVFP4 = [c for c in CONVERSIONS if "nvfp4" in c.fixture.name]
# beside each conversion's own selection: every engine's newest (TensorRT-LLM's q/k/v in float), every vLLM
# release, and SGLang's oldest (its nn.Sequential head names)
RUNTIMES = ("", "all", "vllm>=0.31", "sglang==0.5.21")


def _cases():
    for conversion in NVFP4:
        for runtime in RUNTIMES:
            if runtime and (conversion.options.get("to") == "speculators" or "runtime" in conversion.options):
                continue  # the speculators layout is for vLLM alone: its own selection only
            if runtime.startswith("sglang") and "runtime" in conversion.options:
                continue
            yield pytest.param(conversion, runtime, id=f"{conversion.name}@{runtime or 'default'}")


def _groups(out: dict, suffix: str) -> dict[str, set[float]]:
    groups: dict[str, set[float]] = defaultdict(set)
    for name, (dtype, _, raw) in out.items():
        if not name.endswith("." + suffix) or dtype != "F32":
            continue
        fused = fused_name(name.removesuffix("." + suffix))
        if fused:
            groups[fused[0]].add(float(np.frombuffer(raw, np.float32)[0]))
    return groups


def test_the_fixtures_have_unequal_fused_scales_to_unify():
    out = tensors_of(next(c.fixture for c in NVFP4 if c.fixture.name == "dflash-nvfp4"))
    assert any(len(v) > 1 for v in _groups(out, "weight_scale_2").values())


@pytest.mark.parametrize(("conversion", "runtime"), list(_cases()))
def test_no_nvfp4_output_keeps_unequal_fused_scales(tmp_path, conversion, runtime):
    options = dict(conversion.options)
    if runtime:
        options["runtime"] = runtime
    dst = type(conversion)(conversion.name, conversion.fixture, options).write(tmp_path / "out")
    out = tensors_of(dst)
    weight_scales = _groups(out, "weight_scale_2")
    assert weight_scales, "no fused group stayed NVFP4: nothing was checked"
    for suffix in ("weight_scale_2", "input_scale"):
        unequal = {g: v for g, v in _groups(out, suffix).items() if len(v) > 1}
        assert not unequal, (suffix, unequal)
    report = validate(str(dst), runtime=options.get("runtime") or "sglang,vllm", deep=True)
    assert not [f for f in report.findings if f.rule == "LC327"]
