"""What each serving stack accepts, as data (shared/docs/format.md §1-3, modelopt_nvfp4.md §2.4, §5).

Rules consult these records; nothing else in the code branches on a runtime's name.
Patterns are fnmatch patterns over canonical module names (checkpoint names without `model.`).
"""

from __future__ import annotations

import fnmatch

import msgspec

QKV = ("layers.*.self_attn.q_proj", "layers.*.self_attn.k_proj", "layers.*.self_attn.v_proj")
HEAD_RAW_LINEARS = ("lilicorr.factor_input_proj", "lilicorr.out_head", "lilicorr.in_head")
FEATURE_MLP = ("lilicorr.feature_mlp.*",)


class RuntimeProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    display: str
    # lilicorr_candidate_topk: power of two and <= this, or None for "any K >= 1"
    topk_power_of_two_max: int | None
    hidden_size_zero_ok: bool  # lilicorr_hidden_size 0 means "use the draft width"
    vector_eps_below_half: bool  # vector_eps must lie in (0, 0.5)
    block_size_default: int | None  # used when block_size is absent everywhere; None = refused
    conv_keys_both_or_neither: bool
    conv_kernel_within_block: bool  # refuses conv_kernel_size > block_size
    legacy_mlp_names: str  # "renamed" | "unconfirmed"
    owned_lm_head: str  # "supported" | "unconfirmed"
    # linear modules this runtime builds unquantized whatever the quant config says
    float_forced: tuple[str, ...]
    # linear modules that must be float and excluded, because the runtime follows the config for them
    float_required: tuple[str, ...]
    # linear modules whose quantized loading is not confirmed for this runtime
    quant_unconfirmed: tuple[str, ...]
    exclusion_matcher: str  # vllm | sglang | trtllm (see quant.py)
    nested_quant_method_algos: tuple[str, ...] | None  # algos it derives quant_method for in the nested form
    mask_token_fallback: str  # what it does when mask_token_id is missing
    target_layer_ids_fallback: str

    def must_stay_float(self, module: str) -> bool:
        """The linear `module` (canonical name) must be stored in float for this runtime."""
        return matches_any(module, self.float_forced + self.float_required)

    def may_quantize(self, module: str) -> bool:
        """The runtime is known to load `module` quantized (when its config quantizes it)."""
        return not self.must_stay_float(module) and not matches_any(module, self.quant_unconfirmed)


def matches_any(module: str, patterns: tuple[str, ...]) -> bool:
    """`module` (a canonical name) matches one of these fnmatch patterns."""
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


SGLANG = RuntimeProfile(
    name="sglang",
    display="SGLang",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=16,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="renamed",
    owned_lm_head="unconfirmed",
    float_forced=QKV + HEAD_RAW_LINEARS + FEATURE_MLP,
    float_required=(),
    quant_unconfirmed=("layers.*.attention_conv.kernel_projection", "layers.*.mlp_conv.kernel_projection",
                       "lm_head"),
    exclusion_matcher="sglang",
    nested_quant_method_algos=None,
    mask_token_fallback="resolves the `<|MASK|>` token through the tokenizer",
    target_layer_ids_fallback="guesses them with build_target_layer_ids (wrong for 14 of 20 published "
    "checkpoints, sglang#37475)",
)

VLLM = RuntimeProfile(
    name="vllm",
    display="vLLM",
    topk_power_of_two_max=16,
    hidden_size_zero_ok=True,
    vector_eps_below_half=False,
    block_size_default=None,
    conv_keys_both_or_neither=True,
    conv_kernel_within_block=False,
    legacy_mlp_names="unconfirmed",
    owned_lm_head="supported",
    float_forced=HEAD_RAW_LINEARS,
    # qkv_proj follows the quant config, but the fused-KV context path runs F.linear on raw slices of it
    float_required=QKV + FEATURE_MLP,
    quant_unconfirmed=(),
    exclusion_matcher="vllm",
    nested_quant_method_algos=("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4"),
    mask_token_fallback="has no fallback",
    target_layer_ids_fallback="has no fallback",
)

TRTLLM = RuntimeProfile(
    name="trtllm",
    display="TensorRT-LLM",
    topk_power_of_two_max=None,
    hidden_size_zero_ok=False,
    vector_eps_below_half=True,
    block_size_default=None,
    conv_keys_both_or_neither=False,
    conv_kernel_within_block=True,
    legacy_mlp_names="renamed",
    owned_lm_head="supported",
    float_forced=(),
    float_required=(),
    quant_unconfirmed=(),
    exclusion_matcher="trtllm",
    nested_quant_method_algos=None,
    mask_token_fallback="falls back to vocab_size, an id outside the embedding",
    target_layer_ids_fallback="takes fc's input width from the checkpoint",
)

PROFILES = {p.name: p for p in (SGLANG, VLLM, TRTLLM)}
RUNTIME_CHOICES = (*PROFILES, "all")


def select_profiles(choice: str) -> list[RuntimeProfile]:
    return list(PROFILES.values()) if choice == "all" else [PROFILES[choice]]
