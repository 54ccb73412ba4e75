"""`lilicorr_ckpt.smoke.smoke`, the Python entry point (docs/api.md): what it returns and what it refuses."""

from __future__ import annotations

import msgspec
import pytest

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.report.formats import render_smoke
from lilicorr_ckpt.smoke import SmokeOptions, SmokeReport, smoke


def test_smoke_returns_the_profile_the_command_line_writes(drafter, target):
    profile = smoke(str(drafter), target=str(target), limit=1, max_new_tokens=8, probes="code", warmup=False)
    assert isinstance(profile, SmokeReport) and profile.measured
    assert [r.category for r in profile.requests] == ["code"] and profile.draft_checkpoint.id.endswith(
        "/drafter"
    )
    assert set(profile.arms) == {"head", "control", "ar"} and profile.arms["ar"].tokens == 8
    assert profile.gates and profile.passed is all(g.status != "fail" for g in profile.gates)
    assert msgspec.json.decode(render_smoke(profile, "json"), type=SmokeReport) == profile
    assert (
        smoke(
            str(drafter),
            target=str(target),
            limit=1,
            max_new_tokens=8,
            probes="code",
            warmup=False,
            min_tau=99.0,
        ).passed
        is False
    )  # a gate it cannot meet: the verdict, not an exception


def test_smoke_refuses_unknown_and_out_of_range_options_before_loading_anything(drafter, target):
    with pytest.raises(UsageError, match="bogus"):
        smoke(str(drafter), target=str(target), bogus=1)
    with pytest.raises(UsageError, match="max-new-tokens"):
        smoke(str(drafter), target=str(target), max_new_tokens=1)
    assert SmokeOptions(path="a", target="b").limit == 8  # the documented default
