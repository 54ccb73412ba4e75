"""Sibling-head linears vLLM builds through the quant config (DSpark's markov_head.markov_w2, a ParallelLMHead;
DFlash2's kernel_projection, a ReplicatedLinear), served by every supported release: the loader does what the case
pins, and validate (checks/sibling_quant.py, quantization.py) refuses with the pinned rules and accepts exactly
what the release loads. Cases: tests/checks/_sibling_quant.py."""

from __future__ import annotations

import pytest
import vllm_harness
from checks._sibling_quant import CASES, PENDING, sibling_rules, verdict
from test_vllm_conformance import _release_param

SERVED: dict[tuple[str, str], object] = {}


def _served(built, release, case):
    path = built.get(f"sibling-quant-{case.name}", case.build)
    key = (release.version, case.name)
    if key not in SERVED:
        SERVED[key] = vllm_harness.serve(release, path)
    return path, SERVED[key]


@_release_param
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_released_loader_does_what_the_case_pins(built, released_vllm, case):
    _, outcome = _served(built, released_vllm, case)
    assert outcome.verdict == case.loader["vllm"], f"vLLM {released_vllm.version}: {outcome} ({case.why})"


@_release_param
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_agrees_with_the_released_loader(request, built, released_vllm, case):
    if (case.name, "vllm") in PENDING:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"PENDING: {PENDING[case.name, 'vllm']}"))
    path, outcome = _served(built, released_vllm, case)
    accepted, errors = verdict(path, f"vllm=={released_vllm.version}")
    assert sibling_rules(errors) == set(case.rules["vllm"]), errors
    assert accepted == (outcome.verdict == "L"), (
        f"{case.name}: validate {'accepts' if accepted else 'refuses'} for vLLM {released_vllm.version}, which "
        f"does {outcome} ({case.why})\n{errors}"
    )
