"""What loading cannot show, observed directly in each release: the kind of norm it builds for `use_gemma_norm`,
the rotary width it builds for `rope_scaling.rope_dim`, which mask token and markov head type its DSpark parser
reads, and where its routing sends an architecture. Each is compared with the field of validate's release profile
(lilicorr_ckpt/runtimes/sglang.py) that claims it.

The same observations judge SW in engine.py (direct_checks) for every checkpoint; here they are pinned to the
release differences' rows (release_rows.py), one per profile field.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lilicorr_ckpt.runtimes import release_of

from . import release_rows
from .engine import _BACKBONE_NORM
from .infra import GemmaRMSNorm, RMSNorm, Rotary
from .support import mark_pending
from .test_verdicts import PENDING

ROWS = {r.name: r for r in release_rows.ROWS}


def built_model(release, built, row: str):
    path = built.get(f"release-{row}", lambda tmp: release_rows.build(tmp, ROWS[row]))
    outcome = release.serve(path)
    assert release.built is not None, f"SGLang {release.version} built no model for {row}: {outcome}"
    return release.built


def hf_config(built, row: str):
    from transformers import AutoConfig

    path = built.get(f"release-{row}", lambda tmp: release_rows.build(tmp, ROWS[row]))
    return AutoConfig.from_pretrained(str(path))


def check_gemma_norm(release, built, profile) -> tuple[object, object]:
    model = built_model(release, built, "use_gemma_norm_plain_dflash")
    kinds = {
        type(m).__name__
        for name, m in model.named_modules()
        if isinstance(m, (RMSNorm, GemmaRMSNorm)) and _BACKBONE_NORM.fullmatch(name)
    }
    return kinds, {"GemmaRMSNorm" if profile.gemma_norm_read else "RMSNorm"}


def check_rope_dim(release, built, profile) -> tuple[object, object]:
    model = built_model(release, built, "rope_dim_half_the_head_in_rope_scaling")
    widths = {m.rotary_dim for m in model.modules() if isinstance(m, Rotary)}
    return widths, {release_rows.HEAD_DIM // 2 if profile.rope_dim_read else release_rows.HEAD_DIM}


def check_dspark_mask_token(release, built, profile) -> tuple[object, object]:
    parsed = release.dspark_config.parse_dspark_draft_config(
        draft_hf_config=hf_config(built, "dspark_top_level_mask_token_differs_from_nested")
    )
    return parsed.mask_token_id, 511 if profile.dspark_mask_token_first == "dflash_config" else 7


def check_markov_head_type_nested(release, built, profile) -> tuple[object, object]:
    try:
        parsed = release.dspark_config.parse_dspark_draft_config(
            draft_hf_config=hf_config(built, "dspark_markov_head_type_only_nested")
        )
        read = parsed.markov_head_type
    except ValueError:
        read = None
    return read, "vanilla" if profile.markov_head_type_nested_read else None


def check_dflash2_aliases(release, built, profile) -> tuple[object, object]:
    registered = {
        arch: arch in release.registry.models
        for arch in ("DFlash2BeamDraftModel", "MiniMaxDFlash2DraftModel")
    }
    refused = {arch for _, arch, verdict, _ in profile.routes if verdict == "refuses"}
    return registered, {arch: arch not in refused for arch in registered}


CHECKS: dict[str, Callable] = {
    "gemma_norm_read": check_gemma_norm,
    "rope_dim_read": check_rope_dim,
    "dspark_mask_token_first": check_dspark_mask_token,
    "markov_head_type_nested_read": check_markov_head_type_nested,
    "dflash2_aliases_registered": check_dflash2_aliases,
}


@pytest.mark.parametrize("field", sorted(CHECKS))
def test_the_release_builds_what_its_profile_says(release, built, request, field: str):
    profile = release_of(f"sglang=={release.version}")
    mark_pending(request, PENDING, f"direct-{field}", release.version)
    observed, claimed = CHECKS[field](release, built, profile)
    assert observed == claimed, (
        f"SGLang {release.version} {field}: the release builds/reads {observed}, its profile says {claimed}"
    )
