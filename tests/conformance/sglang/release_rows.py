"""Checkpoints for what the SGLang releases do differently (the 0.5.21 / 0.5.22 / 0.5.23 audit, S1-S8, D1-D2, and
the speculators format) that the loader-audit corpus (tests/checks/test_loader_audit.py) has no row for.

Built with the corpus's own Row and build helpers. A row's `audit` names the audit's difference; its `expect`
(validate's verdicts at the newest releases) is not judged here: the conformance tests compare validate with
what each release's executed loader does (test_verdicts.py, RECORDED in executed.py).

Where a difference is LiLiCorr's own head naming (0.5.21 builds the head's MLPs as nn.Sequential and refuses the
named form, 0.5.22 on refuse the Sequential names), a row is written in the form the release it probes loads
(`naming="sequential"` for 0.5.21); where it is not, the row starts from plain DFlash, which every release loads,
so the row's own condition is the only difference.
"""

from __future__ import annotations

from typing import Any

from checks.test_loader_audit import (
    Row,
    attention_by_path,
    build,
    file_exclusions,
    inline_exclusions,
    top,
)

from lilicorr_ckpt import fixtures

__all__ = ["ROWS", "build"]

NOT_JUDGED = (None, None, None)
PLAIN = {"head": False}  # plain DFlash (DFlashDraftModel, no projector): loaded by every release
HEAD_DIM = 16  # fixtures.draft_config's head_dim


def sibling(layout: str):
    return lambda: fixtures.sibling_config(layout)


def move_to_nested(key: str):
    def apply(cfg: dict[str, Any]) -> None:
        cfg["dflash_config"][key] = cfg.pop(key)

    return apply


def drop_everywhere(key: str):
    def apply(cfg: dict[str, Any]) -> None:
        cfg.pop(key, None)
        cfg["dflash_config"].pop(key, None)

    return apply


def into_dspark_config(**values: Any):
    """A `dspark_config` block (read by every release's DSpark parser, before dflash_config and the top level):
    a key moved into it from the top level (value None), or set there."""

    def apply(cfg: dict[str, Any]) -> None:
        block = cfg.setdefault("dspark_config", {})
        for key, value in values.items():
            block[key] = cfg.pop(key) if value is None else value

    return apply


ROPE_HALF = {"rope_type": "default", "rope_theta": 10000.0, "rope_dim": HEAD_DIM // 2}


# the speculators 0.9.0 format (shared/docs/speculators.md): no top-level model_type and no top-level geometry
# (the backbone is a nested Qwen3 config in transformer_layer_config), taps + 1 in aux_hidden_state_layer_ids,
# mask token and block at the top level, no dflash_config; the tensors keep the z-lab names
_BACKBONE = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "layer_types",
    "sliding_window",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "attention_bias",
)
_DFLASH2_FLAT = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_DSPARK_FLAT = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


def speculators_format(kind: str, architecture: str):
    def apply(cfg: dict[str, Any]) -> None:
        d = cfg["dflash_config"]
        layer: dict[str, Any] = {k: cfg[k] for k in _BACKBONE if k in cfg}
        layer["model_type"] = "qwen3"
        layer["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
        out: dict[str, Any] = {
            "speculators_model_type": kind,
            "speculators_version": "0.9.0",
            "transformers_version": "5.12.1",
            "architectures": [architecture],
            "transformer_layer_config": layer,
            "aux_hidden_state_layer_ids": [i + 1 for i in d["target_layer_ids"]],
            "mask_token_id": d["mask_token_id"],
            "block_size": d.get("block_size", 8),
            "target_hidden_size": None,
            "draft_vocab_size": cfg["vocab_size"],
            "sliding_window_non_causal": kind == "dflash2",
            "sample_from_anchor": kind == "dspark",
            "speculators_config": {
                "algorithm": kind,
                "proposal_methods": [
                    {"proposal_type": "greedy", "speculative_tokens": d.get("block_size", 8) - 1}
                ],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]},
            },
        }
        out.update({k: d[k] for k in _DFLASH2_FLAT if k in d})
        out.update({k: cfg[k] for k in _DSPARK_FLAT if k in cfg})
        cfg.clear()
        cfg.update(out)

    return apply


BACKBONE_MLPS = {f"layers.{i}.mlp.{x}_proj" for i in (0, 1) for x in ("gate", "up", "down")}

ROWS = [
    # S3: use_gemma_norm (Gemma's x*(1+w)) is read from 0.5.23 on; before, every norm is RMSNorm (x*w)
    Row("use_gemma_norm_plain_dflash", "S3", NOT_JUDGED, config=PLAIN, edit=top(use_gemma_norm=True)),
    Row("use_gemma_norm_lilicorr", "S3", NOT_JUDGED, edit=top(use_gemma_norm=True)),
    Row(
        "use_gemma_norm_lilicorr_sequential_names",
        "S3/D1",
        NOT_JUDGED,
        write={"naming": "sequential"},
        edit=top(use_gemma_norm=True),
    ),
    # S4: rope_scaling.rope_dim (the partial rotary width the draft was trained with) is read from 0.5.23 on
    Row(
        "rope_dim_half_the_head_in_rope_scaling",
        "S4",
        NOT_JUDGED,
        config=PLAIN,
        edit=top(rope_scaling=ROPE_HALF),
    ),
    Row(
        "rope_dim_half_the_head_in_rope_parameters",
        "S4",
        NOT_JUDGED,
        config=PLAIN,
        edit=top(
            rope_scaling=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "rope_dim": HEAD_DIM // 2},
        ),
    ),
    Row(
        "rope_dim_beside_a_copied_target_partial_rotary_factor",
        "S4",
        NOT_JUDGED,
        config=PLAIN,
        edit=top(
            partial_rotary_factor=0.25,
            rope_scaling=ROPE_HALF,
        ),
    ),
    Row(
        "rope_dim_equal_to_the_head",
        "S4",
        NOT_JUDGED,
        config=PLAIN,
        edit=top(rope_scaling={"rope_type": "default", "rope_theta": 10000.0, "rope_dim": HEAD_DIM}),
    ),
    # S6: DSpark's markov_head_type inside dflash_config is read by the parser from 0.5.23 on
    Row(
        "dspark_markov_head_type_only_nested",
        "S6",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=move_to_nested("markov_head_type"),
    ),
    Row(
        "dspark_markov_head_type_absent",
        "S6/O1",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=drop_everywhere("markov_head_type"),
    ),
    Row(
        "dspark_markov_head_type_only_nested_gated",
        "S6",
        NOT_JUDGED,
        base=lambda: fixtures.sibling_config("dspark-deepspec", markov_head_type="gated"),
        edit=move_to_nested("markov_head_type"),
    ),
    # S7: a top-level mask_token_id other than dflash_config's: the DSpark parser takes the top level before 0.5.23
    Row(
        "dspark_top_level_mask_token_differs_from_nested",
        "S7",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=top(mask_token_id=7),
    ),
    Row(
        "dspark_top_level_mask_token_equal_to_nested",
        "S7",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=top(mask_token_id=511),
    ),
    Row(
        "lilicorr_top_level_mask_token_differs_from_nested",
        "S7",
        NOT_JUDGED,
        edit=top(mask_token_id=7),
    ),
    # S6 / S7 with a dspark_config block, which every release's parse_dspark_draft_config reads first, while
    # build_markov_head builds the top-level markov_head_type (default vanilla)
    Row(
        "dspark_markov_head_type_in_dspark_config",
        "S6",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=into_dspark_config(markov_head_type=None),
    ),
    Row(
        "dspark_markov_head_type_gated_in_dspark_config",
        "S6",
        NOT_JUDGED,
        base=lambda: fixtures.sibling_config("dspark-deepspec", markov_head_type="gated"),
        edit=into_dspark_config(markov_head_type=None),
    ),
    Row(
        "dspark_config_mask_token_differs_from_dflash_config",
        "S7",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=into_dspark_config(mask_token_id=7),
    ),
    # S3 / S4 in the sibling families (each builds its backbone through models/dflash.py)
    *(
        Row(f"use_gemma_norm_{layout}", "S3", NOT_JUDGED, base=sibling(layout), edit=top(use_gemma_norm=True))
        for layout in ("dflash2", "dspark-deepspec", "domino")
    ),
    *(
        Row(
            f"rope_dim_half_the_head_{layout}",
            "S4",
            NOT_JUDGED,
            base=sibling(layout),
            edit=top(rope_scaling=ROPE_HALF),
        )
        for layout in ("dflash2", "dspark-deepspec", "domino")
    ),
    # S5: the DFlash2 aliases are registered (models/dflash.py EntryClass) from 0.5.23 on
    Row(
        "dflash2_beam_draft_model",
        "S5",
        NOT_JUDGED,
        base=sibling("dflash2"),
        edit=top(architectures=["DFlash2BeamDraftModel"]),
    ),
    Row(
        "minimax_dflash2_draft_model",
        "S5",
        NOT_JUDGED,
        base=sibling("dflash2"),
        edit=top(architectures=["MiniMaxDFlash2DraftModel"]),
    ),
    # D2: 0.5.21 builds every LiLiCorr linear but the decoder layers as nn.Linear, and the decoder layers under
    # bare names; written with 0.5.21's head names (D1), so the quantization is what it meets
    Row(
        "lilicorr_fc_quantized_only",
        "D2",
        NOT_JUDGED,
        write={"quant": "NVFP4", "quantize": {"fc"}},
    ),
    Row(
        "lilicorr_fc_quantized_only_sequential_names",
        "D2/D1",
        NOT_JUDGED,
        write={"quant": "NVFP4", "quantize": {"fc"}, "naming": "sequential"},
    ),
    Row(
        "lilicorr_backbone_mlps_quantized_sequential_names",
        "D2/D1",
        NOT_JUDGED,
        write={"quant": "NVFP4", "quantize": BACKBONE_MLPS, "naming": "sequential"},
    ),
    Row(
        "lilicorr_servable_quantized_sequential_names",
        "D2/D1",
        NOT_JUDGED,
        write={"quant": "NVFP4", "naming": "sequential"},
    ),
    Row(
        "lilicorr_fp8_head_quantized_sequential_names",
        "D2/D1",
        NOT_JUDGED,
        write={"quant": "FP8", "naming": "sequential"},
    ),
    Row(
        "exclusion_naming_a_layer_path_sequential_names",
        "D2/D1",
        NOT_JUDGED,
        write={"quant": "NVFP4", "quantize": BACKBONE_MLPS, "naming": "sequential"},
        edit=inline_exclusions(attention_by_path),
        edit_hf=file_exclusions(attention_by_path),
    ),
    Row(
        "exclusion_naming_a_layer_path_backbone_only",
        "D2",
        NOT_JUDGED,
        write={"quant": "NVFP4", "quantize": BACKBONE_MLPS},
        edit=inline_exclusions(attention_by_path),
        edit_hf=file_exclusions(attention_by_path),
    ),
    # the speculators format: transformers' AutoConfig refuses a config without model_type, in every release
    Row(
        "speculators_format_dflash",
        "SP",
        NOT_JUDGED,
        config=PLAIN,
        edit=speculators_format("dflash", "DFlashDraftModel"),
    ),
    Row(
        "speculators_format_dflash2",
        "SP",
        NOT_JUDGED,
        base=sibling("dflash2"),
        edit=speculators_format("dflash2", "DFlash2DraftModel"),
    ),
    Row(
        "speculators_format_dspark",
        "SP",
        NOT_JUDGED,
        base=sibling("dspark-deepspec"),
        edit=speculators_format("dspark", "DSparkDraftModel"),
    ),
    # S1 (swigluoai) is the corpus's C42 / C43; S2 (flat NVFP4 exclusions) its E4 / Q16; D1 its T4 and every
    # named-form LiLiCorr row
]
