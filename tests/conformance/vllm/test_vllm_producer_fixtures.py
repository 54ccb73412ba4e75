"""The producers' own drafters (tests/conformance/producer_fixtures.py) in every supported vLLM release: validate
accepts exactly what the release loads, raw and after `convert`."""

from __future__ import annotations

import pytest
from conformance.producer_fixtures import FIXTURES, IDS, converted
from test_vllm_conformance import VERSIONS, _release_param, judge


@_release_param
@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_producer_fixture_gets_the_released_verdict(released_vllm, fixture):
    judge(released_vllm, fixture, None, f"producer fixture {fixture.parent.name}/{fixture.name}")


@_release_param
@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_convert_output_gets_the_released_verdict(built, released_vllm, fixture):
    if released_vllm.version != VERSIONS[-1]:
        pytest.skip("convert writes for the newest release by default: its output is judged there")
    refused: list[str] = []

    def build(dst):
        out = converted(fixture, dst)
        if out is None:
            refused.append(fixture.name)
            return dst
        return out

    path = built.get(f"producer-{fixture.parent.name}-{fixture.name}", build)
    if not (path / "config.json").is_file():
        pytest.skip("convert refuses this export (tests/convert/test_convert_producer_exports.py says why)")
    judge(released_vllm, path, None, f"convert output of {fixture.parent.name}/{fixture.name}")
