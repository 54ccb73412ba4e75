"""The producers' own drafters (tests/conformance/producer_fixtures.py) in every supported SGLang release:
validate accepts exactly what the release loads, raw and after `convert` (each CONVERSIONS output, whichever
releases it was converted for), and an output converted for a release loads there."""

from __future__ import annotations

import pytest

from ..producer_fixtures import CONVERSION_IDS, CONVERSIONS, FIXTURES, IDS
from .support import describe, serve, validate_verdict


@pytest.mark.parametrize("fixture", FIXTURES, ids=IDS)
def test_each_producer_fixture_gets_the_released_verdict(release, built, outcomes, fixture):
    name = f"producer-{fixture.parent.name}-{fixture.name}"
    path, outcome = serve(release, built, outcomes, name, lambda _: fixture)
    accepted, why = validate_verdict(path, release.version)
    assert outcome.verdict != "U", f"{name}: the harness cannot decide: {outcome.detail}"
    assert accepted == (outcome.verdict == "L"), describe(release.version, outcome, accepted, why, name)


@pytest.mark.parametrize("conversion", CONVERSIONS, ids=CONVERSION_IDS)
def test_each_convert_output_gets_the_released_verdict(release, built, outcomes, conversion):
    name = f"converted-{conversion.name}"
    path, outcome = serve(release, built, outcomes, name, lambda folder: conversion.write(folder / "out"))
    accepted, why = validate_verdict(path, release.version)
    assert outcome.verdict != "U", f"{name}: the harness cannot decide: {outcome.detail}"
    assert accepted == (outcome.verdict == "L"), describe(release.version, outcome, accepted, why, name)
    if conversion.converted_for("sglang", release.version):
        assert outcome.verdict == "L", describe(release.version, outcome, accepted, why, name)
