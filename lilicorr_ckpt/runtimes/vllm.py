"""vLLM, as its released wheel loads a drafter: the profile, and how it matches quantization exclusions.

Exclusions: names are prefixed `model.` and draft layers renumbered after the target's
(`model.layers.{num_target_layers+i}`); q/k/v fuse to `qkv_proj` and gate/up to `gate_up_proj`. A pattern
ending in `*` is first split into `X` and `X.*`; then exact match (a fused module through its shards, all or
none), substring, then fnmatch.
"""

from __future__ import annotations

import fnmatch
import re

from lilicorr_ckpt.runtimes.base import HEAD_RAW_LINEARS, QKV, Exclusion, RuntimeProfile, fused_name

VERSION = "0.33.0"

PROFILE = RuntimeProfile(
    name="vllm",
    engine="vLLM",
    version=VERSION,
    released=True,
    source=f"the released wheel vllm=={VERSION} (PyPI)",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=None,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="refused",  # lilicorr.py named-MLP revision: no renaming, no Sequential parameters
    owned_lm_head="supported",
    float_forced=HEAD_RAW_LINEARS,
    # qkv_proj follows the quant config, but the fused-KV context path runs F.linear on raw slices of it.
    # feature_mlp follows the draft quant config in the newest revision; up_proj's
    # in_features 5 cannot be NVFP4, which LC305 reports.
    float_required=QKV,
    quant_unconfirmed=(),
    renumbers_draft_layers=True,
    nested_quant_method_algos=("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4"),
    mask_token_fallback="has no fallback",
    target_layer_ids_fallback="has no fallback",
    flat_exclusions_key="ignore",  # its flat-form parser reads `ignore` only
    flat_group_size_default=16,  # the flat form's top-level group_size, default 16
    reads_hf_quant_config=True,  # derives quant_method for the nested form
    nested_form_keys_required=True,
    causal="honours",  # qwen3_dflash.py _dflash_layer_causal: is_causal, then dflash_config.causal
    swa_window_size_read=True,  # qwen3_dflash.py _resolve_layer_attention reads swa_window_size first
    swa_window_zero="literal",
    integral_float_lilicorr="crashes",  # candidate_topk & (candidate_topk - 1), range(num_layers)
    integral_float_backbone="crashes",  # range(config.num_hidden_layers)
    embed_tokens_copy="used",  # includes_embed_tokens: the draft's own input table
    quant_config_read="config.json",  # get_quant_config: hf_config.quantization_config, else hf_quant_config.json
    # qwen3_dflash.py _resolve_layer_attention: sliding layers causal unless causal / is_causal says otherwise
    sliding_semantics="causally, over the last w tokens",
    rope_theta_default="1e6 (set_default_rope_theta)",
    lilicorr_disabled="refuses it (\"requires lilicorr_enabled=True\")",
    dflash2_conv_indexed=True,  # qwen3_dflash2 reads both conv keys with a plain index
    unknown_tensors="refused",  # AutoWeightsLoader raises on a name with no parameter
    legacy_duplicate="refuses",  # no parameter for the legacy name
    undeclared_lm_head="owned",  # includes_lm_head: any lm_head tensor
    sibling_routes=(
        ("dflash2", "DFlash2DraftModel", "unconfirmed", "vLLM's DFlash2DraftModel registry key is asserted only by "
         "registry-verification scripts (its registry file was not read)"),
        ("dspark", "Qwen3DSparkModel", "loads", "vLLM's registry maps Qwen3DSparkModel to qwen3_dspark"),
        ("dspark", "DSparkDraftModel", "refuses", "vLLM's registry routes DSparkDraftModel to its DeepSeek-V4 DSpark "
         "class, not the Qwen3 one"),
        ("dspark", "DFlashDraftModel", "refuses", "no vLLM loader reads the flat Model-Optimizer DSpark layout"),
        ("domino", "*", "unconfirmed", "vLLM's Domino model asserts projector_type domino; which registry key maps "
         "to it is UNCONFIRMED"),
    ),
    selector_check="range",  # qwen3_dflash2: selector_rank >= 1, 2 <= selector_top_k <= V
    markov_rank_top_level=True,  # qwen3_dspark reads config.markov_rank
    markov_head_types=("vanilla",),
    markov_head_types_unconfirmed=("gated", "rnn"),
    domino_dims_required=True,  # gru_hidden_dim / emb_dim from the merged config (KeyError when absent)
)


_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


def _prefix(name: str, num_target_layers: int | None) -> str:
    if name == "lm_head" or name.startswith("lm_head."):
        return name
    m = _LAYER.match(name)
    if m and num_target_layers is not None:
        name = f"layers.{num_target_layers + int(m.group(1))}.{m.group(2)}"
    return "model." + name


def _patterns(patterns: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for p in patterns:
        out += [p[:-1], p[:-1] + ".*"] if p.endswith("*") and len(p) > 1 else [p]
    return out


def _hit(prefix: str, patterns: list[str]) -> str | None:
    candidates = [prefix] + ([prefix[len("language_model."):]] if prefix.startswith("language_model.") else [])
    for c in candidates:
        for p in patterns:
            if p == c or p in c or fnmatch.fnmatchcase(c, p):
                return p
    return None


def match_exclusion(module: str, patterns: tuple[str, ...], num_target_layers: int | None) -> Exclusion:
    """Whether vLLM treats `module` (a canonical name) as excluded from quantization."""
    expanded = _patterns(patterns)
    fused = fused_name(module)
    if fused:
        name, shards = fused
        prefix = _prefix(name, num_target_layers)
        shard_prefixes = [_prefix(s, num_target_layers) for s in shards]
        exact = [s in expanded for s in shard_prefixes]
        if any(exact) and not all(exact):
            return Exclusion(True, prefix, None, f"the exclusions name some but not all shards of {prefix}, "
                             f"which {PROFILE.display} refuses")
        if all(exact):
            return Exclusion(True, prefix, shard_prefixes[0])
        hit = _hit(prefix, expanded)
        return Exclusion(hit is not None, prefix, hit)
    prefix = _prefix(module, num_target_layers)
    hit = _hit(prefix, expanded)
    return Exclusion(hit is not None, prefix, hit)
