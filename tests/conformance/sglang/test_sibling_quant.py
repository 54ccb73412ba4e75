"""Sibling-head linears and the SGLang Markov classes, served by every supported release: VanillaMarkov builds
markov_w2 as an nn.Linear (float whatever the config), Nemotron35VanillaMarkov (the Nemotron-3.5 layout,
families/dspark.py nemotron_35) as a ReplicatedLinear with the quant config; the convolutions' kernel_projection is
an nn.Linear. The loader does what the case pins, and validate refuses with the pinned rules and accepts exactly
what the release loads. Cases: tests/checks/_sibling_quant.py."""

from __future__ import annotations

import pytest
from checks._sibling_quant import CASES, PENDING, sibling_rules, verdict

from .support import serve


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_released_loader_does_what_the_case_pins(release, built, outcomes, case):
    _, outcome = serve(release, built, outcomes, f"sibling-quant-{case.name}", case.build)
    assert outcome.verdict == case.loader["sglang"], f"SGLang {release.version}: {outcome} ({case.why})"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validate_agrees_with_the_released_loader(request, release, built, outcomes, case):
    if (case.name, "sglang") in PENDING:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"PENDING: {PENDING[case.name, 'sglang']}"))
    path, outcome = serve(release, built, outcomes, f"sibling-quant-{case.name}", case.build)
    accepted, errors = verdict(path, f"sglang=={release.version}")
    assert sibling_rules(errors) == set(case.rules["sglang"]), errors
    assert accepted == (outcome.verdict == "L"), (
        f"{case.name}: validate {'accepts' if accepted else 'refuses'} for SGLang {release.version}, which "
        f"does {outcome} ({case.why})\n{errors}"
    )
