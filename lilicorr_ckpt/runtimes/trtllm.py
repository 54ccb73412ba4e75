"""TensorRT-LLM's LiLiCorr loader, which no release has yet: the profile, and how it matches exclusions.

The newest TensorRT-LLM on PyPI (1.2.1) predates LiLiCorr, so this profile models unreleased source, and every
verdict says so. Exclusions: fnmatch against the module name or `model.` + name (q/k/v also as the fused
`qkv_proj`).
"""

from __future__ import annotations

import fnmatch

from lilicorr_ckpt.runtimes.base import QKV, Exclusion, RuntimeProfile, fused_name

SOURCE = (
    "unreleased source of NVIDIA/TensorRT-LLM: _torch/models/modeling_lilicorr.py at commit 8d62b3e5, "
    "modeling_dflash.py at 7c7504c0 (no release on PyPI has LiLiCorr; the newest, 1.2.1, predates it)"
)

FIRST = RuntimeProfile(
    name="trtllm",
    engine_id="trtllm",
    engine="TensorRT-LLM",
    version="main@8d62b3e",
    released=False,
    source=SOURCE,
    topk_power_of_two_max=None,
    hidden_size_zero_ok=False,
    vector_eps_below_half=True,
    block_size_default=None,
    conv_keys_both_or_neither=False,
    conv_kernel_within_block=True,
    legacy_mlp_names="renamed",
    owned_lm_head="supported",
    # modeling_dflash.py _build_fused_kv_buffers slices the raw qkv_proj weight into its context-KV buffer
    float_forced=QKV,
    float_required=(),
    quant_unconfirmed=(),
    nested_quant_method_algos=None,
    mask_token_fallback="falls back to vocab_size, an id outside the embedding",
    target_layer_ids_fallback="takes fc's input width from the checkpoint",
    causal="refuses",  # "LiLiCorr requires non-causal draft attention"
    embedding_rows_equal_vocab=True,  # num_embeddings must equal V
    projector_type_routes=True,
    # its LiLiCorr test routes Qwen3ForCausalLM + projector_type / lilicorr_enabled to LiLiCorr (a Laguna backbone
    # is refused: "generic GQA DFlash backbone")
    projector_routed_architectures=("Qwen3ForCausalLM",),
    hidden_act="unconfirmed",  # GatedMLP activation from the HF backbone: not traced
    integral_float_lilicorr="crashes",  # LiLiCorrHead uses the raw values (torch.zeros, range)
    integral_float_backbone="unconfirmed",  # range(num_draft_layers) would crash; not traced
    embed_tokens_copy="replaced",  # load_weights_from_target_model swaps in the target's
    # _torch/model_config.py ModelConfig.from_pretrained: hf_quant_config.json first ("the file is authoritative"),
    # warn_if_inline_diverges only logs; config.json's copy is used when the file sets no global quant_algo
    quant_config_read="hf_quant_config.json",
    embeddings_4d=True,  # modeling_lilicorr.py: the parameters are 4-D; _normalize_lilicorr_weights squeezes 5-D
    # its LiLiCorr test: sliding layers non-causal with a symmetric window (w-1, w-1)
    sliding_semantics="non-causally, over w-1 tokens on each side (a symmetric window)",
    rope_theta_default="the transformers config class's default (10000 for Qwen3)",
    block_size_top_level_in_older=True,  # modeling_dflash.py 009d8fa4 reads the top-level block_size only
    legacy_duplicate="refuses",  # _normalize_lilicorr_weights: "Duplicate LiLiCorr parameter"
    undeclared_lm_head="ignored",  # load_weights_from_target_model uses the target's head unless has_own_lm_head
    speculators_format="unconfirmed",  # its drafter config reader was not read for this layout
)

# unreleased: one revision, no release chain
RELEASES = (FIRST,)


def _hit(name: str, patterns: tuple[str, ...]) -> str | None:
    return next((p for p in patterns for c in (name, "model." + name) if fnmatch.fnmatchcase(c, p)), None)


def match_exclusion(
    module: str,
    patterns: tuple[str, ...],
    num_target_layers: int | None,
    profile: RuntimeProfile | None = None,
) -> Exclusion:
    """Whether TensorRT-LLM treats `module` (a canonical name) as excluded from quantization."""
    fused = fused_name(module)
    names = [module] + (
        [fused[0]] if fused and module.split(".")[-1] in ("q_proj", "k_proj", "v_proj") else []
    )
    hit = next((h for n in names if (h := _hit(n, patterns)) is not None), None)
    return Exclusion(hit is not None, module, hit)
