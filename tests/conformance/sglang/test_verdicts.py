"""validate's SGLang verdict against what each released SGLang loader does, checkpoint by checkpoint, release by
release.

The corpus is the loader audit's (tests/checks/test_loader_audit.py, one checkpoint per audited condition, its
SGLang rows at the end), the sibling heads' (tests/checks/test_sibling_heads.py) and the release differences'
(release_rows.py). Every supported release (engines.versions("sglang"), from lilicorr_ckpt.runtimes) runs over
all of it, one after another; each checkpoint is built once and served by each release. For each checkpoint the
release's own code routes, builds and loads the draft on CPU (engine.py); `validate --runtime sglang==VERSION`
must refuse exactly what that release refuses, crashes on, or loads into a function other than the trained one,
and accept what it loads. What each release does is recorded in executed.py (and checked here). The audit's rows
are compared here, the others in test_verdicts_heads.py (two test workers share the corpus).

PENDING lists the cases where validate and a release's loader disagree today: each is an expected failure
(strict), so the fix to validate turns it into an XPASS failure that removes the entry.
"""

from __future__ import annotations

import pytest

from ..engines import versions
from .executed import DIFFERENCES, NEWEST, RECORDED, recorded
from .support import CASES, Case, describe, mark_pending, serve, validate_verdict

# Checkpoints a release cannot take through SGLang's whole start-up without what the harness does not have (the
# U outcome), and why; validate must refuse them (its verdict is the documented one: docs/validate.md).
NOT_EXECUTED = {
    "audit-mask_token_absent": "without mask_token_id SGLang looks `<|MASK|>` up in the target's tokenizer and "
    "adds it when missing: which row of the target's embedding the draft then reads "
    "depends on that tokenizer, not on the checkpoint (validate refuses: LC115)",
}

# (case, release) -> what the release's loader does, and what validate says: the disagreements validate must fix
# (none open: the dspark_config rows, the last ones, are fixed in checks/config/siblings.py)
PENDING: dict[tuple[str, str], str] = {}

# The rows whose outcome transformers decides, not SGLang: AutoConfig.from_pretrained (utils/hf_transformers/
# config.py get_config) refuses the config, or Qwen3Config changes what SGLang then reads. Each release pins its
# own transformers (0.5.21 5.12.1, 0.5.22 / 0.5.23 5.19.0); these were executed under each pin and under the
# environment's, with the same outcomes (Qwen3Config and its validation are alike in 5.12.1 - 5.25.0).
TRANSFORMERS_DECIDES = {
    "audit-integral_float_num_layers_crashes_vllm": "Qwen3Config's strict int field num_hidden_layers refuses 2.0 "
    "(StrictDataclassFieldValidationError: C at config)",
    "audit-layer_types_short": "Qwen3Config validate_layer_type: one layer_types entry per layer (C at config)",
    "audit-layer_types_long_extra_entries_ignored": "Qwen3Config validate_layer_type (C at config)",
    "audit-sliding_layers_causal_in_sglang_vllm_symmetric_in_trt": "Qwen3Config sets sliding_window to None "
    "without use_sliding_window, so dflash.py refuses the sliding layers (R at model)",
    "audit-mixed_sliding_and_full_layers_runner_dependent": "Qwen3Config's sliding_window None (R at model)",
    "audit-rope_theta_absent_defaulted_by_the_config_class": "Qwen3Config's default rope_theta (L)",
    "release-speculators_format_dflash": "AutoConfig refuses a config without model_type (R at config)",
    "release-speculators_format_dflash2": "AutoConfig: no model_type (R at config)",
    "release-speculators_format_dspark": "AutoConfig: no model_type (R at config)",
}


# the corpus is split between this module (the loader audit's rows) and test_verdicts_heads.py (the sibling heads'
# and the release differences'), so that two test workers share it
AUDIT_CASES = [c for c in CASES if c.name.startswith("audit-")]
OTHER_CASES = [c for c in CASES if not c.name.startswith("audit-")]


def agrees(release, built, outcomes, request, case: Case) -> None:
    """validate --runtime sglang==VERSION accepts the case exactly when the release loads it (PENDING aside)."""
    path, outcome = serve(release, built, outcomes, case.name, case.build)
    accepted, why = validate_verdict(path, release.version)
    if outcome.verdict == "U":
        assert case.name in NOT_EXECUTED, f"{case.name} is not executed: {outcome.detail}"
        assert not accepted, why
        return
    mark_pending(request, PENDING, case.name, release.version)
    assert accepted == (outcome.verdict == "L"), describe(release.version, outcome, accepted, why, case.row)


def as_recorded(release, built, outcomes, cases: list[Case]) -> None:
    """executed.py's table: one failure listing every case whose outcome changed for this release."""
    changed = []
    for case in cases:
        _, outcome = serve(release, built, outcomes, case.name, case.build)
        now = outcome.verdict if outcome.verdict in ("L", "SW", "U") else f"{outcome.verdict} {outcome.step}"
        if now != recorded(release.version, case.name):
            changed.append(
                f"{case.name}: recorded {recorded(release.version, case.name)!r}, now {now!r} "
                f"({outcome.detail[:160]})"
            )
    assert not changed, f"SGLang {release.version}: " + "\n".join(changed)


@pytest.mark.parametrize("case", AUDIT_CASES, ids=[c.name for c in AUDIT_CASES])
def test_validate_agrees_with_the_release(release, built, outcomes, request, case: Case):
    agrees(release, built, outcomes, request, case)


def test_each_release_does_what_is_recorded(release, built, outcomes):
    as_recorded(release, built, outcomes, AUDIT_CASES)


def test_the_lists_name_real_cases():
    names = {c.name for c in CASES}
    assert len(names) == len(CASES)
    assert set(NOT_EXECUTED) <= names
    assert {name for name, _ in PENDING if not name.startswith(("convert-", "direct-"))} <= names
    assert set(TRANSFORMERS_DECIDES) <= names
    assert set(RECORDED) == names, sorted(set(RECORDED) ^ names)
    releases = versions("sglang")
    assert releases[-1] == NEWEST and set(DIFFERENCES) == set(releases[:-1])
    assert {version for _, version in PENDING} <= set(releases)


# ---------------------------------------------------------------- the differential fuzzer (tests/conformance/fuzz)


def test_fuzz_corpus_agrees_with_the_release(release, tmp_path):
    from ..fuzz import run, suite

    serve = run.sglang_serve(release)
    assert suite.corpus_disagreements("sglang", release.version, serve, tmp_path) == []


def test_fuzz_fixed_seed_budget_agrees_with_the_release(release, tmp_path):
    from ..fuzz import run, suite

    found = suite.fuzz_disagreements(
        "sglang", release.version, run.sglang_serve(release), release.root, tmp_path
    )
    assert found == [], (
        "new disagreements (add each to tests/conformance/fuzz/corpus.py once fixed):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("case", "step", "buffer"),
    [
        # DFlashWorkerV2.__init__: the block's position offsets, int64, block_size of them (8 TiB at 2**40)
        (("dflash", "dflash", "block_size", "huge"), "worker", "build_block_pos_offsets"),
        # init_cuda_graphs: the draft decode graph's float32 logits rows of the draft's vocab_size
        (("dflash", "top", "vocab_size", "huge"), "draft graphs", "GraphSharedOutput.get_logits_buffer"),
    ],
)
def test_a_size_no_accelerator_holds_is_refused_where_the_release_allocates_it(
    release, tmp_path, case, step, buffer
):
    from ..fuzz.cases import Case

    outcome = release.serve(Case(*case).build(tmp_path / "case"))
    assert (outcome.verdict, outcome.step) == ("R", step), outcome
    assert "BootOutOfMemory" in outcome.detail and buffer in outcome.detail, outcome.detail
    # the sizes themselves pass every earlier step: the release builds and loads the draft first
    assert release.built is not None
