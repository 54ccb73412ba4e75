"""validate's vLLM verdict, judged by every supported vLLM release's loader itself.

Every checkpoint of the loader-audit corpus (tests/checks/test_loader_audit.py, one per audited condition), the
sibling-head cases (tests/checks/test_sibling_heads.py) and the rows of what changed between releases
(release_rows.py) is served with each release's own start-up and loading code (vllm_harness.py), one release at
a time (conftest.py). vLLM either refuses it (R), crashes on it (C), loads it but serves another function (SW: a
trained tensor dropped, a parameter left at its initialisation, the wrong target layers feeding fc, another model
class than the checkpoint's architecture names), or loads it (L). validate(path, runtime="vllm==<release>") must
accept exactly the checkpoints that release loads.

Each case also pins what each release does: RELEASED is vLLM 0.33.0's table, CHANGES each other release's
differences from it (release_rows.py pins its rows per release). Adding a release to lilicorr_ckpt/runtimes and
rerunning this file lists every condition whose behaviour changed (docs/validate.md, "Bumping an engine").

Where validate and a release's executed loader disagree, PENDING names the case: it is xfail(strict=True), so a
fixed validate makes it XPASS and forces its removal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import release_rows
import vllm_harness
import vllm_release
from checks import test_sibling_heads as siblings
from checks.test_loader_audit import ROWS, build

from lilicorr_ckpt.checks.run import validate

REPO = Path(__file__).resolve().parents[3]
VERSIONS = vllm_release.versions()
BASE = "0.33.0"  # the release RELEASED pins; CHANGES holds the others' differences from it

# what vLLM 0.33.0 does with each corpus checkpoint (docs/validate.md, the vLLM 0.33.0 table)
RELEASED = {
    "fused_qkv_split_by_qkvparallellinear": "L",
    "nested_output_multiplier_zero_refused_by_sglang": "L",
    "top_level_output_multiplier_ignored_by_sglang": "L",
    "num_target_layers_absent_taken_from_the_taps_by_sglang": "L",
    "trt_slices_raw_qkv": "L",
    "hidden_act_gelu_refused_by_dflash_mlp": "R",
    "trt_routes_qwen3_with_projector_type": "R",
    "trt_routes_qwen3_with_lilicorr_enabled": "R",
    "vllm_honours_causal_sglang_runs_bidirectionally": "L",
    "swa_window_zero_refused_by_trt_literal_in_vllm": "L",
    "sglang_drops_owned_lm_head": "L",
    "lilicorr_key_missing_refused": "C",
    "lilicorr_disabled_refused": "R",
    "topk_not_power_of_two_refused_by_fused_topk": "R",
    "head_width_zero_means_draft_width_except_trt": "L",
    "heads_do_not_divide_width": "R",
    "vector_eps_half_refused_by_trt": "L",
    "logit_scale_nonpositive": "L",
    "integral_float_topk_cast_by_sglang_only": "C",
    "integral_float_num_layers_crashes_vllm": "R",
    "integral_float_mask_token_refused_by_sglang": "L",
    "target_layer_ids_not_a_list": "C",
    "target_layer_ids_out_of_range": "R",
    "num_target_layers_zero_refused_by_sglang": "L",
    "block_size_absent_defaulted_by_sglang": "R",
    "block_size_conflict_nested_wins": "L",
    "block_size_one_refused": "R",
    "mask_token_absent": "R",
    "mask_token_negative": "SW",
    "vllm_asserts_no_mask_hidden": "C",
    "conv_half_declared": "R",
    "conv_kernel_exceeds_block_refused_by_trt": "L",
    "conv_group_not_dividing_width": "R",
    "layer_types_short": "R",
    "layer_types_long_extra_entries_ignored": "R",
    "unknown_layer_type": "SW",
    "sliding_without_window_vllm_reads_swa_window_size": "L",
    "use_swa_ignored_by_sglang": "L",
    "attention_sink_bias_not_bool": "SW",
    "reduced_vocab_refused": "R",
    "qwen3_architecture_without_projector_refused": "R",
    "dflash_architecture_with_head_tensors_drops_them": "R",
    "laguna_backbone_refused_by_trt_generic_gqa": "U",
    "head_tensor_missing": "R",
    "head_tensor_surplus": "R",
    "identity_token_proj_surplus": "R",
    "legacy_sequential_names_refused_by_vllm_named_mlp": "R",
    "legacy_and_named_duplicate": "R",
    "conv_tensors_without_keys_dropped": "R",
    "conv_keys_without_tensors_random_kernels": "R",
    "fc_width_mismatch": "C",
    "embed_tokens_copy_dropped_used_or_replaced": "L",
    "undeclared_lm_head": "L",
    "own_head_flag_without_tensor": "R",
    "training_prefix_not_stripped": "R",
    "model_prefix_stripped": "L",
    "fp16_dtype_overflows": "L",
    "packed_without_metadata": "R",
    "feature_mlp_down_proj_quantized_forced_float_by_sglang": "L",
    "factor_heads_fp8_raw_linear_except_trt": "R",
    "in_proj_quantized_bare_parameter": "C",
    "flat_quant_exclusions_under_exclude_modules": "L",
    "w4a16_without_input_scale_loads": "L",
    "nvfp4_missing_weight_scale_2": "R",
    "trt_reads_hf_quant_config_sglang_vllm_the_inline_copy": "R",
    "inline_copy_right_file_wrong_refused_by_trt": "L",
    "no_lilicorr_geometry_at_all": "C",
    "target_layer_ids_whole_number_floats_cast": "L",
    "target_layer_ids_empty": "SW",
    "target_layer_ids_absent_guessed_or_width_from_checkpoint": "SW",
    "dflash2_selector_top_k_alone_refused": "C",
    "sliding_layers_causal_in_sglang_vllm_symmetric_in_trt": "R",
    "mixed_sliding_and_full_layers_runner_dependent": "R",
    "rope_theta_absent_defaulted_by_the_config_class": "L",
    "max_position_embeddings_absent_defaulted": "L",
    "servable_modules_quantized_load": "L",
    "unsupported_head_quant_algo_refused": "R",
    "layer_index_exclusion_renumbered_by_vllm": "L",
    # modelopt.py KNvfp4Static.process serves the fused gate_up with the larger weight_scale_2 (a warning)
    "gate_and_up_calibrated_independently_load": "SW",
    "slot_embedding_4d_loaded_by_trt_only": "C",
    "conv_partial": "R",
    "t2d_tensor_not_read": "L",
    "rotary_buffer_not_read": "L",
    "vllm_captures_taps_in_layer_order": "SW",
    "vllm_reads_eagle_aux_layer_ids_first": "SW",
    "eagle_aux_layer_ids_equal_to_the_taps": "L",
    "vllm_refuses_sample_from_anchor": "R",
    "vllm_drops_fc_without_aux_hidden_state": "SW",
    "sliding_window_kept_with_use_sliding_window": "L",
    "target_layer_ids_duplicated": "R",
    "mask_token_id_at_the_top_level_only": "L",
    "vllm_renames_midlayer": "L",
    "vllm_renames_encoder_aliases": "L",
    "backbone_tensor_missing_served_uninitialised": "SW",
    "surplus_bias_dropped_by_ignore_suffix": "SW",
    "tensor_of_a_layer_not_built": "R",
    "qkv_shards_named_exactly_do_not_exclude_fused_qkv": "C",
    "draft_layer_index_exclusion_renumbered_by_vllm": "L",
    "backbone_weight_scale_2_missing_served_from_garbage": "SW",
    "nested_w4a16_in_hf_quant_config_only": "R",
    "nested_inline_nvfp4_without_group_size": "R",
    "flat_w4a16_loads": "L",
    # SGLang's corpus rows, as vLLM 0.33.0 serves them
    "top_level_is_causal_honoured_by_sglang": "L",
    "flat_nvfp4_without_group_size_defaults_to_16": "L",
    "swigluoai_activation_loaded_by_sglang": "R",
    "swigluoai_without_its_constants_crashes_sglang": "R",
    "taps_not_ascending_captured_in_layer_order": "SW",
    "taps_repeated_captured_once": "R",
    "tap_on_the_last_target_layer_never_captured": "L",
    "mask_token_beyond_the_vocabulary": "SW",
    "sliding_layers_with_use_sliding_window_loaded_by_sglang": "L",
    "encoder_aliases_read_by_sglang": "L",
    "w4a16_group_32_refused_by_marlin": "L",
    "nvfp4_group_32_refused_by_marlin": "L",
    "nested_quantization_config_in_config_json_flattened_by_sglang": "L",
    "fp8_flat_exclusions_under_exclude_modules_not_read": "L",
    "nvfp4_flat_exclusions_under_modules_to_not_convert_read_by_sglang": "R",
    "exclusion_naming_an_ancestor_module_path": "L",
    "exclusions_naming_some_qkv_shards_refused_by_sglang": "C",
    "plain_dflash_fc_quantized_is_an_nn_linear_in_sglang": "L",
    "fp8_per_channel_per_token_refused_by_sglang": "L",
    "hf_quant_config_only": "L",
    "fp8_input_scale_missing_on_fc": "SW",  # fc.input_scale keeps vLLM's FP8 scale sentinel (float32 min)
}

# the sibling-head cases (tests/checks/test_sibling_heads.py)
RELEASED_SIBLINGS = {
    "dflash2_published_layout_loads_unconfirmed_everywhere": "L",
    "dspark_deepspec_qwen3dsparkmodel_served_by_sglang_and_vllm": "L",
    "dspark_specforge_draftmodel_rewritten_to_qwen3_by_vllm": "L",
    "dspark_modelopt_flat_layout_loaded_by_no_serving_stack": "R",
    "domino_as_dflash_with_projector_served_by_sglang": "R",
    "domino_draftmodel_refused_by_sglang": "R",
    "dflash2_tensors_under_plain_dflash_are_dropped": "R",
    "markov_head_under_lilicorr_is_dropped": "C",
    "dflash2_selector_projection_missing": "SW",
    "dspark_markov_w1_missing": "SW",
    "domino_gru_missing": "R",
    "dflash2_selector_surplus": "SW",
    "dspark_gated_projection_surplus_on_vanilla": "R",
    "domino_gru_bias_surplus": "R",
    "dflash2_codebook_misshaped": "C",
    "dspark_markov_w2_misshaped": "R",
    "domino_embed_proj_misshaped": "R",
    "dflash2_selector_quantized_must_be_float": "C",
    "dspark_markov_table_quantized_must_be_float": "C",
    "domino_gru_quantized_must_be_float": "R",
    "dflash2_conv_tensors_missing": "SW",
    "dspark_deepspec_frozen_lm_head_copy_warns": "L",
    "dspark_deepspec_frozen_embed_tokens_copy_warns": "L",
    "dflash2_selector_top_k_dropped": "C",
    "dflash2_selector_top_k_one_loaded_by_vllm": "L",
    "dflash2_selector_top_k_above_vocab_refused": "R",
    "dflash2_without_conv_keys": "C",
    "dspark_markov_rank_zero": "C",
    "dspark_rnn_head_refused_by_vllm": "R",
    "dspark_gated_head_refused_by_vllm": "R",
    "dspark_unknown_head_type_refused": "SW",
    "domino_shift_label_not_bool": "R",
    "domino_prefix_len_two": "R",
    "domino_emb_dim_conflict": "R",
    "domino_missing_gru_dim": "R",
    "domino_block_size_one": "R",
    # the confidence head vLLM builds for a truthy enable_confidence_head (too narrow: a crash at load) and
    # skips when the flag is falsy or its tensors are absent (loaded; read only under adaptive verification)
    "dspark_confidence_head_narrower_unbuilt_by_sglang_refused_by_vllm": "C",
    "dspark_confidence_head_missing_loads_where_unread": "L",
    "dspark_confidence_flag_zero_skips_the_head": "L",
    # SGLang's sibling cases, as vLLM 0.33.0 serves them
    "dflash2_without_selector_keys_refused_by_sglang": "C",
    "dflash2_declared_as_dflash_drops_the_selector_in_sglang": "R",
    "dspark_gated_markov_head_loaded_by_sglang": "R",
    "domino_quantized_fc_is_an_nn_linear_in_sglang": "R",
    "domino_quantized_backbone_loaded_by_sglang": "R",
}

# what each other release does differently from vLLM 0.33.0 (executed; the audits explain each)
_BEFORE_033 = {
    # D1 modelopt.py ModelOptQuantConfigBase.from_config reads a flat config's `ignore` only: the NVFP4 modules
    # its exclude_modules protected are built quantized ("in features size is not multiple of 16")
    "flat_quant_exclusions_under_exclude_modules": "R",
    # ... and the FP8 ones keep the scale sentinel (float32 min) for the scales a float module has none of
    "fp8_flat_exclusions_under_exclude_modules_not_read": "SW",
    # D2 qwen3_dflash.py _add_global_draft_layer_exclusions: `layers.0.mlp.down_proj` also excludes the head's
    # lilicorr.layers.0.mlp.down_proj, whose NVFP4 tensors then have no parameter
    "draft_layer_index_exclusion_renumbered_by_vllm": "R",
}
CHANGES: dict[str, dict[str, str]] = {
    "0.31.0": _BEFORE_033,
    "0.32.0": _BEFORE_033,  # no drafter verdict changed from 0.31.0
    "0.34.0": {
        # B1 lilicorr.py load_weights: the coverage check is gone, the missing tensors serve at initialisation
        "head_tensor_missing": "SW",
        "conv_keys_without_tensors_random_kernels": "SW",
        "own_head_flag_without_tensor": "SW",
        "nvfp4_missing_weight_scale_2": "SW",
        "conv_partial": "SW",
    },
}


def pinned(name: str, version: str) -> str | None:
    """What vLLM `version` does with corpus case `name` (RELEASED, then the release's CHANGES)."""
    changes = CHANGES.get(version, {})
    if name in changes:
        return changes[name]
    return RELEASED.get(name, RELEASED_SIBLINGS.get(name))


# routed to model code the harness does not execute: (what reading it says vLLM does, why not executed); the same
# in every release that routes it there
READ_NOT_EXECUTED = {
    "laguna_backbone_refused_by_trt_generic_gqa": (
        "C",
        "EAGLEConfig rewrites LagunaForCausalLM to DFlashLagunaForCausalLM, which the registry maps to "
        "laguna_dflash.py; its DFlashLagunaModel.load_weights indexes params_dict by name, a KeyError for the "
        "lilicorr.* tensors (the Laguna decoder layers are MoE serving code the harness does not build)",
    ),
}

# (case, release): validate and the release's executed loader disagree; what the loader does, what validate says.
# Each is xfail(strict=True) (conftest.py): fixing validate makes it XPASS, and its entry must go.
PENDING: dict[tuple[str, str], str] = {}


def verdict_of(report) -> bool:
    (vllm,) = [v for v in report.runtimes if v.runtime == "vllm"]
    return vllm.accepted


def judge(release, path: Path, pinned: str | None, row: str) -> None:
    """The released loader's verdict equals the pinned one, and validate accepts exactly what it loads."""
    outcome = vllm_harness.serve(release, path)
    if pinned is not None:
        assert outcome.verdict == pinned, (
            f"vLLM {release.version} now does {outcome} where the audit ({row}) says {pinned}"
        )
    released = outcome.verdict
    if released == "U":
        released, _why = READ_NOT_EXECUTED[path.name]
    report = validate(str(path), runtime=f"vllm=={release.version}")
    findings = [f"{f.rule} {f.severity}: {f.message}" for f in report.findings if f.severity != "info"]
    assert verdict_of(report) == (released == "L"), (
        f"{row}: validate {'accepts' if verdict_of(report) else 'refuses'} for vLLM {release.version}, but vLLM "
        f"{release.version} does {outcome}\n" + "\n".join(findings)
    )


def _release_param(function):
    """Parametrize a test by every supported release (the module-scoped `released_vllm`, conftest.py)."""
    return pytest.mark.parametrize("released_vllm", VERSIONS, indirect=True, scope="module")(function)


@_release_param
@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_validate_agrees_with_released_vllm(built, released_vllm, row):
    path = built.get(row.name, lambda where: build(where.parent, row))
    judge(released_vllm, path, pinned(row.name, released_vllm.version), f"row {row.audit}")


def test_every_corpus_case_has_a_pinned_vllm_verdict():
    assert sorted({r.name for r in ROWS} - set(RELEASED)) == []
    assert sorted(set(RELEASED) - {r.name for r in ROWS}) == []
    assert sorted({c.name for c in siblings.CASES} ^ set(RELEASED_SIBLINGS)) == []
    corpus = set(RELEASED) | set(RELEASED_SIBLINGS)
    for version, changes in CHANGES.items():
        assert version in VERSIONS, f"CHANGES names {version}, not a supported release"
        assert set(changes) <= corpus, sorted(set(changes) - corpus)
    for row in release_rows.ROWS:
        assert sorted(row.vllm) == sorted(VERSIONS), (row.row.name, sorted(row.vllm))
    names = corpus | {r.row.name for r in release_rows.ROWS}
    assert {name for name, _ in PENDING} <= names
    assert {version for _, version in PENDING} <= set(VERSIONS)


# ---------------------------------------------------------------- the differential fuzzer (tests/conformance/fuzz)


@_release_param
def test_fuzz_corpus_agrees_with_released_vllm(released_vllm, tmp_path):
    from conformance.fuzz import run as fuzz_run
    from conformance.fuzz import suite

    serve = fuzz_run.vllm_serve(released_vllm)
    assert suite.corpus_disagreements("vllm", released_vllm.version, serve, tmp_path) == []


@_release_param
def test_fuzz_fixed_seed_budget_agrees_with_released_vllm(released_vllm, tmp_path):
    from conformance.fuzz import run as fuzz_run
    from conformance.fuzz import suite

    serve = fuzz_run.vllm_serve(released_vllm)
    found = suite.fuzz_disagreements("vllm", released_vllm.version, serve, released_vllm.root, tmp_path)
    assert found == [], (
        "new disagreements (add each to tests/conformance/fuzz/corpus.py once fixed):\n" + "\n".join(found)
    )
