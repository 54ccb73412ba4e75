"""SGLang, as its released wheel loads a drafter: the profile, and how it matches quantization exclusions.

Exclusions: a fused module (q/k/v -> qkv_proj, gate/up -> gate_up_proj) counts as excluded when every shard is
named exactly; otherwise each pattern becomes a regex (`.` literal, `*` -> `.*`) fullmatched against the whole
module name or any one of its dotted components. Names carry no `model.` prefix and no renumbering.
"""

from __future__ import annotations

import re

from lilicorr_ckpt.runtimes.base import (
    FEATURE_MLP,
    HEAD_RAW_LINEARS,
    QKV,
    Exclusion,
    RuntimeProfile,
    fused_name,
)

VERSION = "0.5.23"

PROFILE = RuntimeProfile(
    name="sglang",
    engine="SGLang",
    version=VERSION,
    released=True,
    source=f"the released wheel sglang=={VERSION} (PyPI)",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=16,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="renamed",
    owned_lm_head="dropped",  # dflash.py DFlashDraftModel has no lm_head parameter; load_weights drops it
    float_forced=QKV + HEAD_RAW_LINEARS + FEATURE_MLP,
    float_required=(),
    quant_unconfirmed=("layers.*.attention_conv.kernel_projection", "layers.*.mlp_conv.kernel_projection",
                       "lm_head"),
    nested_quant_method_algos=None,
    output_multiplier_nested_positive=True,  # parse_dflash_draft_config reads dflash_config only
    # ModelOptFp4Config.from_config, flat form: exclusions from `ignore` only (default none); group_size from the
    # top level or the first config group's weights, else "NVFP4 quantization requires group_size"
    flat_exclusions_key="ignore",
    flat_group_size_required=True,
    causal="ignores",  # full layers run ENCODER_ONLY; dflash_config.causal is never read
    taps_checked_against_draft_layers=True,  # DFlashDraftModel.__init__ falls back to num_hidden_layers
    num_target_layers_positive=True,
    use_swa="ignored",  # read only for the Nemotron-3.5 layout
    swa_window_zero="ignored",
    integral_float_mask_token="refuses",  # parse_dflash_draft_config: "mask_token_id must be an integer"
    # weight_utils.get_quant_config: hf_config.quantization_config first, the config files only without it
    quant_config_read="config.json",
    sliding_semantics="causally, over the last w tokens",  # dflash.py: sliding layers DECODER, window_left w-1
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    lilicorr_disabled="parses the config as plain DFlash and then raises (\"requires the lilicorr_* geometry fields\")",
    unknown_tensors="dropped",  # DFlashDraftModel.load_weights: "Ignore unexpected weights"
    legacy_duplicate="overwrites",  # the renaming maps both to one parameter; the second loaded wins
    undeclared_lm_head="dropped",  # no lm_head parameter
    sibling_routes=(
        ("dflash2", "DFlash2DraftModel", "unconfirmed", "SGLang main dispatches on DFlash2DraftModel, but no tagged "
         "release is known to register it, and whether its loader refuses missing selector or conv tensors is "
         "UNCONFIRMED"),
        ("dflash2", "DFlashDraftModel", "unconfirmed", "SGLang switches the convolution and selector on from the "
         "dflash_config keys; Model-Optimizer warns a DFlash2 head declared as DFlashDraftModel loads as plain "
         "DFlash, which loader it means is UNCONFIRMED"),
        ("dspark", "Qwen3DSparkModel", "loads", "the entry class of SGLang's dspark model"),
        ("dspark", "DSparkDraftModel", "unconfirmed", "SGLang's DSpark entry class is Qwen3DSparkModel (SpecForge "
         "rewrites DSparkDraftModel to it before SGLang loads it); loading DSparkDraftModel directly is UNCONFIRMED"),
        ("dspark", "DFlashDraftModel", "refuses", "SGLang routes DFlashDraftModel as plain DFlash and drops the flat "
         "Model-Optimizer Markov names, leaving the Markov head at its initialisation"),
        ("domino", "DFlashDraftModel", "loads", "SGLang loads Domino as DFlashDraftModel with projector_type domino"),
        ("domino", "DominoDraftModel", "refuses", "SGLang loads Domino only as DFlashDraftModel with "
         "dflash_config.projector_type \"domino\""),
    ),
    selector_check="pair",  # parse_dflash_draft_config: "selector needs rank and top_k together"
    markov_rank_top_level=True,  # build_markov_head: "DSpark requires markov_rank > 0"
    markov_head_types=("vanilla", "gated", "rnn"),
    domino_checks=True,  # parse_dflash_draft_config and the Domino model tests
    domino_dims_required=True,
    mask_token_fallback="resolves the `<|MASK|>` token through the tokenizer",
    target_layer_ids_fallback="guesses them with build_target_layer_ids (wrong for 14 of 20 published "
    "checkpoints, sglang#37475)",
)


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _hit(prefix: str, patterns: tuple[str, ...]) -> str | None:
    candidates = [prefix] + ([prefix[len("language_model."):]] if prefix.startswith("language_model.") else [])
    for p in patterns:
        rx = _regex(p)
        for c in candidates:
            if rx.fullmatch(c) or any(rx.fullmatch(part) for part in c.split(".")):
                return p
    return None


def match_exclusion(module: str, patterns: tuple[str, ...], num_target_layers: int | None) -> Exclusion:
    """Whether SGLang treats `module` (a canonical name) as excluded from quantization."""
    fused = fused_name(module)
    name = fused[0] if fused else module
    if (fused and all(s in patterns for s in fused[1])) or (not fused and module in patterns):
        return Exclusion(True, name, module)
    hit = _hit(name, patterns)
    return Exclusion(hit is not None, name, hit)
