"""Serving infrastructure the SGLang loader code reaches while building and loading a draft, written for one CPU
process at tensor-parallel size 1.

Each stub stands for something that runs a model (collectives, attention backends, rotary caches, CUDA
kernels, process-wide server state), never for a check that decides whether a checkpoint loads. Where a stub
must return a value, the value is the one a single-GPU deployment of the default server arguments has.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .wheel import Partial, Poison, extract


class Parallel:
    """get_parallel(): one rank, no data-parallel attention."""

    tp_size = 1
    tp_rank = 0
    attn_tp_size = 1
    attn_tp_rank = 0
    attn_dp_enabled = False
    tp_group = None
    attn_tp_group = None
    shared_experts_tp_group = None


class Spec:
    """get_spec(): the server arguments the DFLASH draft path reads, at their defaults."""

    speculative_draft_attention_backend = None
    speculative_num_draft_tokens = None
    speculative_draft_window_size = None
    speculative_domino_candidate_pool_size = 0
    speculative_use_block_verification = False


class Platform:
    """get_platform(): a pre-Blackwell GPU (the Marlin NVFP4 path every SGLang 0.5.23 GPU can take)."""

    is_sm120 = False
    is_sm100 = False
    is_blackwell = False


class FP4Backend:
    """get_fp4_gemm_runner_backend(): --fp4-gemm-backend's default below SM100 is Marlin."""

    def is_marlin(self) -> bool:
        return True

    def is_flashinfer_cutedsl(self) -> bool:
        return False

    def is_flashinfer_trtllm(self) -> bool:
        return False


class RMSNorm(nn.Module):
    """layers/layernorm.py RMSNorm: one `weight` parameter of ones (its kernels are not modelled)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, **_: Any):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps


class GemmaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, **_: Any):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps


class RadixAttention(nn.Module):
    """The attention backend: records what the draft asked it to compute (its causality and window)."""

    def __init__(
        self,
        num_heads,
        head_dim,
        scaling,
        num_kv_heads,
        layer_id,
        sliding_window_size=-1,
        attn_type=None,
        quant_config=None,
        **_: Any,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.sliding_window_size = sliding_window_size
        self.attn_type = attn_type


class AttentionType:
    """layers/radix_attention.py AttentionType's members the draft uses."""

    DECODER = "decoder"
    ENCODER_ONLY = "encoder_only"


class Rotary(nn.Module):
    """get_rope(): the rotary embedding keeps its cos/sin cache as a buffer, never a parameter. `rotary_dim` is
    the width it turns, as layers/rotary_embedding/factory.py get_rope computes it (`rotary_dim *
    partial_rotary_factor` below 1)."""

    def __init__(self, head_size, rotary_dim, max_position, base, partial_rotary_factor=1.0, **kwargs: Any):
        super().__init__()
        if partial_rotary_factor < 1.0:
            rotary_dim = int(rotary_dim * partial_rotary_factor)
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.base = base
        self.rope_scaling = kwargs.get("rope_scaling")


def get_rope(head_size, rotary_dim, max_position, base, **kwargs):
    return Rotary(head_size, rotary_dim, max_position, base, **kwargs)


class SiluAndMul(nn.Module):
    pass


class VocabParallelEmbedding(nn.Module):
    """Unsharded embedding (tensor-parallel size 1)."""

    def __init__(self, num_embeddings, embedding_dim, **_: Any):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))


class DraftParallelSpec:
    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)


class LogitsProcessorOutput:
    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)


class Envs:
    """A no-op for environment-variable helpers outside sglang/srt/environ.py."""


def _no_op(*_: Any, **__: Any) -> None:
    return None


def _false(*_: Any, **__: Any) -> bool:
    return False


def _identity_decorator(*_: Any, **__: Any):
    return lambda fn: fn


def stubs(root: Path) -> dict[str, dict[str, Any]]:
    """The stub table: module -> the names it provides (real wheel helpers extracted where they are pure)."""
    srt = root / "sglang" / "srt"
    common = extract(
        srt / "utils" / "common.py",
        ["set_weight_attrs", "add_prefix", "get_bool_env_var"],
        {
            "os": __import__("os"),
            "logger": __import__("logging").getLogger("sglang.srt.utils"),
            "_warned_bool_env_var_keys": set(),
            "Optional": Any,
            "Dict": dict,
            "Any": Any,
            "torch": torch,
        },
    )
    utils = {name: common[name] for name in ("set_weight_attrs", "add_prefix", "get_bool_env_var")}
    platform_probes = {
        name: _false
        for name in (
            "is_cuda",
            "is_hip",
            "is_npu",
            "is_cpu",
            "is_xpu",
            "is_mps",
            "is_cuda_alike",
            "is_gfx95_supported",
            "cpu_has_amx_support",
            "use_intel_amx_backend",
            "is_sm100_supported",
            "is_sm90_supported",
            "is_flashinfer_available",
            "is_blackwell",
            "is_musa",
            "is_hpu",
            "is_sail",
        )
    }
    utils.update(platform_probes)
    utils["get_compiler_backend"] = lambda mode=None: "eager"
    layers_utils = extract(
        srt / "layers" / "utils" / "common.py",
        ["pad_or_narrow_weight", "copy_or_rebind_param", "alias_or_bind_derived_param"],
        {"torch": torch, "Optional": Any, "nn": nn, "Parameter": nn.Parameter},
    )
    rope = extract(srt / "utils" / "hf_transformers" / "common.py", ["get_rope_config"], {})
    return {
        "sglang.srt.utils.hf_transformers_utils": {"get_rope_config": rope["get_rope_config"]},
        "sglang.srt.utils": utils,
        "sglang.srt.utils.common": utils,
        "sglang.srt.layers.utils": {
            k: layers_utils[k]
            for k in ("pad_or_narrow_weight", "copy_or_rebind_param", "alias_or_bind_derived_param")
        },
        "sglang.srt.runtime_context": {
            "get_parallel": lambda: Parallel,
            "get_spec": lambda: Spec,
            "get_platform": lambda: Platform,
            "get_exec": lambda: types.SimpleNamespace(
                comm=types.SimpleNamespace(enable_quant_communications=False)
            ),
            "get_forward": lambda: types.SimpleNamespace(sp_active=False),
        },
        "sglang.srt.distributed": {"divide": lambda a, b: _divide(a, b)},
        "sglang.srt.distributed.utils": {
            "get_group_rank_size": lambda group: (
                (0, 1) if group is None else _poison("get_group_rank_size with a group")
            )
        },
        "sglang.srt.layers.dp_attention": {"is_allocation_symmetric": _false},
        "sglang.srt.layers.moe.utils": {"should_skip_mlp_all_reduce": _false},
        "sglang.kernels.kernel_api_logging": {"wrap_method_with_debug_kernel_once": _no_op},
        "sglang.srt.layers.layernorm": {"RMSNorm": RMSNorm, "GemmaRMSNorm": GemmaRMSNorm},
        # configs/model_config.py _config_draft_model tests isinstance(hf_text_config, Dots3Config): no config the
        # harness reads is one (transformers' AutoConfig does not know SGLang's dots3_note model_type)
        "sglang.srt.configs.dots3": {"Dots3Config": type("Dots3Config", (), {})},
        "sglang.srt.layers.radix_attention": {
            "RadixAttention": RadixAttention,
            "AttentionType": AttentionType,
        },
        "sglang.srt.layers.rotary_embedding": {"get_rope": get_rope},
        "sglang.srt.layers.activation": {"SiluAndMul": SiluAndMul},
        "sglang.srt.layers.vocab_parallel_embedding": {
            "VocabParallelEmbedding": VocabParallelEmbedding,
            "ParallelLMHead": type("ParallelLMHead", (nn.Module,), {}),
        },
        "sglang.srt.layers.logits_processor": {"LogitsProcessorOutput": LogitsProcessorOutput},
        "sglang.srt.configs.draft_parallel": {
            "DraftParallelSpec": DraftParallelSpec,
            "DraftTPExecution": types.SimpleNamespace(SINGLE_GROUP="single_group"),
        },
        "sglang.srt.layers.quantization.fp4_utils": {"get_fp4_gemm_runner_backend": lambda: FP4Backend()},
        "sglang.srt.utils.custom_op": {"register_custom_op": _identity_decorator},
        "sglang.srt.utils.patch_torch": {"register_fake_if_exists": _identity_decorator},
        # CUDA repacking of NVFP4 weights for the Marlin kernel: layout work after every check has run
        "sglang.srt.layers.quantization.marlin_utils_fp4": {"prepare_nvfp4_layer_for_marlin": _no_op},
        "sglang.srt.layers.moe.fused_moe_triton": {"FusedMoE": type("FusedMoE", (nn.Module,), {})},
        # which FP8 GEMM kernels the GPU has: read by the linear method's constructor, used only by its forward
        "sglang.srt.layers.quantization.fp8_utils": {
            "cutlass_fp8_supported": _false,
            "flashinfer_per_tensor_fp8_supported": _false,
            "can_auto_enable_marlin_fp8": _false,
        },
    }


def _divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def _poison(what: str):
    return Poison(what)()


WHOLE = {
    "sglang.srt.environ",
    "sglang.srt.layers.parameter",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.modelopt_utils",
    "sglang.srt.layers.quantization.base_config",
    "sglang.srt.layers.quantization.utils",
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.aux_hidden_states",
    "sglang.srt.model_loader.checkpoint_quantization",
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.speculative.lilicorr_utils",
    "sglang.srt.models.dflash",
    "sglang.srt.models.lilicorr",
    "sglang.srt.models.dspark",
    "sglang.srt.speculative.dspark_components.dspark_config",
    "sglang.srt.speculative.ragged_verify",
    "sglang.srt.utils.invariants",
}

PARTIAL = {
    "sglang.srt.layers.quantization.unquant": Partial(["UnquantizedLinearMethod"]),
    "sglang.kernels.ops.speculative.lilicorr": Partial(["MAX_FUSED_CANDIDATE_TOPK"]),
    "sglang.srt.model_loader.weight_utils": Partial(
        [
            "default_weight_loader",
            "sharded_weight_loader",
            "get_quant_config",
            "_resolve_explicit_draft_quant_config",
            "_quark_draft_online_quant_config",
            "_modelopt_quant_section",
            "replace_prefix",
        ]
    ),
    "sglang.srt.configs.model_config": Partial(
        [
            "logger",
            "_quant_config_to_dict",
            "unwrap_modelopt_quantization_config",
            "REQUANTIZATION_METHODS",
            "_get_and_verify_dtype",
            "_STR_DTYPE_TO_TORCH_DTYPE",
            "ModelImpl",
            "MIMO_V2_MODEL_ARCHS",
        ],
        methods={
            "ModelConfig": [
                "_config_draft_model",
                "_parse_quant_hf_config",
                "_find_quant_modelslim_config",
                "_parse_modelopt_quant_config",
                "_verify_quantization",
            ]
        },
    ),
    "sglang.srt.models.qwen3": Partial(
        methods={"Qwen3Model": ["forward"], "Qwen3ForCausalLM": ["set_dflash_layers_to_capture"]}
    ),
    "sglang.srt.speculative.dflash_worker_v2": Partial(
        methods={"DFlashWorkerV2": ["_resolve_mask_token_id"]}
    ),
    # the worker's block-position buffer (DFlashWorkerV2.__init__) and the draft's decode-graph logits buffer
    # (decode_cuda_graph_runner.py): what a block size or vocabulary no accelerator holds fails at boot
    "sglang.srt.speculative.draft_worker_common": Partial(["build_block_pos_offsets"]),
    "sglang.srt.model_executor.graph_shared_output": Partial(["GraphSharedOutput"]),
    "sglang.srt.models.registry": Partial(
        methods={
            "_ModelRegistry": [
                "_normalize_archs",
                "resolve_model_cls",
                "_try_load_model_cls",
                "_raise_for_unsupported",
                "get_supported_archs",
                "is_arch_supported",
            ]
        }
    ),
    # the routing of the declared architecture to a model class (the Transformers-backend fallback included)
    "sglang.srt.model_loader.utils": Partial(
        [
            "get_model_architecture",
            "resolve_transformers_arch",
            "_get_transformers_backend_arch",
            "_is_moe_model",
            "_is_sequence_classification_model",
            "_model_impl_from_architecture",
        ]
    ),
}
