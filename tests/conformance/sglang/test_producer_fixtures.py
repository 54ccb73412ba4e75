"""The producers' own drafters (tests/conformance/producer_fixtures.py) in every supported SGLang release:
validate accepts exactly what the release loads, raw and after `convert`."""

from __future__ import annotations

import pytest

from ..producer_fixtures import FIXTURES, IDS, converted
from .releases import versions
from .support import describe, serve, validate_verdict


def _agrees(release, built, outcomes, name: str, build) -> None:
    path, outcome = serve(release, built, outcomes, name, build)
    if not (path / "config.json").is_file():
        pytest.skip("convert refuses this export (tests/convert/test_convert_producer_exports.py says why)")
    accepted, why = validate_verdict(path, release.version)
    assert outcome.verdict != "U", f"{name}: the harness cannot decide: {outcome.detail}"
    assert accepted == (outcome.verdict == "L"), describe(release.version, outcome, accepted, why, name)


@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_producer_fixture_gets_the_released_verdict(release, built, outcomes, fixture):
    _agrees(release, built, outcomes, f"producer-{fixture.parent.name}-{fixture.name}", lambda _: fixture)


@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_convert_output_gets_the_released_verdict(release, built, outcomes, fixture):
    if release.version != versions()[-1]:
        pytest.skip("convert writes for the newest release by default: its output is judged there")

    def build(folder):
        return converted(fixture, folder / "out") or folder

    _agrees(release, built, outcomes, f"converted-{fixture.parent.name}-{fixture.name}", build)
