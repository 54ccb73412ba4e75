"""The producers' own drafters (tests/conformance/producer_fixtures.py) in every supported vLLM release: validate
accepts exactly what the release loads, raw and after `convert` (each CONVERSIONS output, whichever releases it
was converted for), and an output converted for a release loads there."""

from __future__ import annotations

import pytest
import vllm_harness
from conformance.producer_fixtures import CONVERSION_IDS, CONVERSIONS, FIXTURES, IDS, Conversion
from test_vllm_conformance import _release_param, judge


@_release_param
@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_producer_fixture_gets_the_released_verdict(released_vllm, fixture):
    judge(released_vllm, fixture, None, f"producer fixture {fixture.parent.name}/{fixture.name}")


@_release_param
@pytest.mark.parametrize("conversion", CONVERSIONS, ids=CONVERSION_IDS)
def test_each_convert_output_gets_the_released_verdict(built, released_vllm, conversion):
    path = built.get(f"converted-{conversion.name.replace('/', '-')}", conversion.write)
    pinned = "L" if conversion.converted_for("vllm", released_vllm.version) else None
    judge(released_vllm, path, pinned, f"convert output {conversion.name}")


# what the release's loader reports about the drafter it built (vllm_harness Outcome.facts), less the release itself
def _served(release, path):
    outcome = vllm_harness.serve(release, path)
    return outcome.verdict, {k: v for k, v in outcome.facts.items() if k != "release"}


SPECULATORS_SAVES = [c for c in CONVERSIONS if c.fixture.parent.name.startswith("speculators")]
TO_SPECULATORS = [c for c in CONVERSIONS if c.options.get("to") == "speculators"]


@_release_param
@pytest.mark.parametrize("conversion", SPECULATORS_SAVES, ids=[c.name for c in SPECULATORS_SAVES])
def test_a_speculators_save_and_its_zlab_conversion_are_served_alike(built, released_vllm, conversion):
    """The raw speculators drafter and convert's z-lab output: the same model class, taps, mask, quantized modules,
    vocabulary and loaded weights, as the release builds them."""
    zlab = built.get(f"converted-{conversion.name.replace('/', '-')}", conversion.write)
    raw, out = _served(released_vllm, conversion.fixture), _served(released_vllm, zlab)
    assert raw[0] == out[0] == "L", (raw, out)
    assert raw[1] == out[1]


@_release_param
@pytest.mark.parametrize("conversion", TO_SPECULATORS, ids=[c.name for c in TO_SPECULATORS])
def test_a_speculators_output_is_served_as_its_zlab_twin(built, released_vllm, conversion):
    """`--to speculators` of a ModelOpt export against `--to zlab -r vllm` of it (the same repairs: both for vLLM)."""
    spec = built.get(f"converted-{conversion.name.replace('/', '-')}", conversion.write)
    twin_options = {**conversion.options, "to": "zlab", "runtime": "vllm"}
    twin = Conversion(f"{conversion.name}-zlab-twin", conversion.fixture, twin_options)
    zlab = built.get(f"converted-{twin.name.replace('/', '-')}", twin.write)
    a, b = _served(released_vllm, spec), _served(released_vllm, zlab)
    assert a[0] == b[0] == "L", (a, b)
    assert a[1] == b[1]
