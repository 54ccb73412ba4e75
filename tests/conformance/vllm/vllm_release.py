"""The released vLLM (the pinned wheel), loaded once per test session: which of its modules run as released,
which definitions are extracted from their files, and which serving infrastructure is stubbed.

`load(root)` returns the Release; its attributes are the released objects the harness calls.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import vllm_stubs as S
from vllm_sandbox import Extract, Sandbox

ME = "vllm.model_executor"
LAYERS = f"{ME}.layers"
QUANT = f"{LAYERS}.quantization"
MODELS = f"{ME}.models"
SPEC = "vllm.v1.worker.gpu.spec_decode"

# executed from the wheel, unchanged
REAL = (
    "vllm.envs",
    "vllm.version",
    "vllm.tasks",
    "vllm.exceptions",
    "vllm._version",
    "vllm.transformers_utils.repo_utils",
    "vllm.transformers_utils.config",
    "vllm.transformers_utils.config_parser_base",
    "vllm.transformers_utils.utils",
    "vllm.scalar_type",
    "vllm.config.utils",
    "vllm.config.quantization",
    "vllm.utils.math_utils",
    "vllm.utils.collection_utils",
    "vllm.utils.func_utils",
    f"{ME}.utils",
    f"{ME}.parameter",
    f"{LAYERS}.linear",
    QUANT,  # the package: QuantizationMethods, get_quantization_config
    f"{QUANT}.base_config",
    f"{QUANT}.modelopt",
    f"{QUANT}.kv_cache",
    f"{QUANT}.utils.quant_utils",
    f"{QUANT}.utils.w8a8_utils",
    f"{QUANT}.utils.mxfp8_utils",
    f"{MODELS}.utils",
    f"{MODELS}.interfaces",
    f"{MODELS}.interfaces_base",
    f"{MODELS}.qwen3_dflash",
    f"{MODELS}.qwen3_dflash2",
    f"{MODELS}.qwen3_dspark",
    f"{MODELS}.lilicorr",
    "vllm.transformers_utils.configs.eagle",
    f"{SPEC}.eagle.eagle3_utils",
)

# selected definitions of a released file (the rest of the file is serving infrastructure)
EXTRACTED = {
    # without get_masked_input_and_mask, a torch.compile'd forward helper
    f"{LAYERS}.vocab_parallel_embedding": Extract(
        [
            "DEFAULT_VOCAB_PADDING_SIZE",
            "UnquantizedEmbeddingMethod",
            "pad_vocab_size",
            "vocab_range_from_per_partition_vocab_size",
            "vocab_range_from_global_vocab_size",
            "VocabParallelEmbeddingShardIndices",
            "VocabParallelEmbedding",
            "ParallelLMHead",
        ]
    ),
    f"{MODELS}.qwen2": Extract(["Qwen2MLP"]),
    f"{MODELS}.nemotron_h": Extract(["NemotronHMLP"]),
    # the drafters' base class: its interfaces and packed_modules_mapping (the target model it builds is not
    # used by a drafter, whose __init__ replaces it)
    f"{MODELS}.qwen3": Extract(["Qwen3ForCausalLM"], drop={"Qwen3ForCausalLM": ("hf_to_vllm_mapper",)}),
    f"{ME}.model_loader.weight_utils": Extract(
        [
            "default_weight_loader",
            "make_attention_sink",
            "load_attention_sink",
            "get_quant_config",
            "maybe_download_from_modelscope",
            "get_lock",
            "DisabledTqdm",
        ]
    ),
    f"{LAYERS}.attention.attention": Extract(
        ["set_default_quant_scales", "_init_kv_cache_quant", "should_load_quant_weights"]
    ),
    f"{QUANT}.utils.fp8_utils": Extract(
        [
            "FP8_SCALE_SENTINEL",
            "is_fp8",
            "process_fp8_weight_channel_strategy",
            "process_fp8_input_tensor_strategy_moe",
            "process_fp8_weight_tensor_strategy_moe",
        ]
    ),
    "vllm.transformers_utils.model_arch_config_convertor": Extract(
        [], methods={"ModelArchConfigConvertorBase": ("_normalize_quantization_config",)}
    ),
    "vllm.config.vllm": Extract(
        [], methods={"VllmConfig": ("_get_quantization_config", "get_quantization_config")}
    ),
    f"{SPEC}.utils": Extract(["get_parallel_drafting_token_id"]),
    # the speculators' constructors (their checks of the draft config); their drafting steps are kernels
    f"{SPEC}.dflash.speculator": Extract(["DFlashSpeculator"], only={"DFlashSpeculator": ("__init__",)}),
    f"{SPEC}.dflash2.speculator": Extract(
        ["DFlash2Speculator", "CandidateSampler"],
        only={"DFlash2Speculator": ("__init__",), "CandidateSampler": ("__init__",)},
    ),
    f"{SPEC}.lilicorr.speculator": Extract(
        ["LiLiCorrSpeculator"], only={"LiLiCorrSpeculator": ("__init__",)}
    ),
    f"{SPEC}.dspark.speculator": Extract(["DSparkSpeculator"], only={"DSparkSpeculator": ("__init__",)}),
    "vllm.config.model": Extract([], methods={"ModelConfig": ("_verify_quantization",)}),
}

STUBS = {
    "vllm.logger": S.logger,
    "vllm.platforms": S.platforms,
    "vllm.config": S.config_package,
    "vllm.distributed": S.distributed,
    "vllm.distributed.parallel_state": S.parallel_state,
    "vllm._custom_ops": S.custom_ops,
    "vllm.compilation.decorators": S.compilation_decorators,
    "vllm.compilation.backends": S.compilation_backends,
    "vllm.utils.torch_utils": S.torch_utils,
    "vllm.utils.b12x": S.b12x,
    "vllm.triton_utils": S.triton_utils,
    "vllm.multimodal": S.multimodal,
    "vllm.multimodal.inputs": S.multimodal,
    "vllm.sequence": S.sequence,
    f"{ME}.custom_op": S.custom_op,
    f"{ME}.determinism.batch_invariant": S.batch_invariant,
    f"{ME}.kernels.linear": S.linear_kernels,
    f"{ME}.model_loader.reload": S.reload,
    f"{LAYERS}.attention": None,  # set in load(): Attention needs the extracted kv-cache helpers
    f"{LAYERS}.layernorm": S.layernorm,
    f"{LAYERS}.rotary_embedding": S.rotary,
    f"{LAYERS}.logits_processor": S.logits_processor,
    f"{LAYERS}.activation": S.activation,
    f"{LAYERS}.utils": S.layers_utils,
    f"{LAYERS}.fusion.quant_activation": S.quant_activation,
    f"{LAYERS}.fusion.fused_act_quant": S.fused_act_quant,
    f"{LAYERS}.fused_moe": S.moe,
    f"{LAYERS}.fused_moe.moe_output": S.moe,
    f"{LAYERS}.fused_moe.oracle.fp8": S.moe_functions,
    f"{LAYERS}.fused_moe.oracle.mxfp8": S.moe_functions,
    f"{LAYERS}.fused_moe.oracle.nvfp4": S.moe_functions,
    f"{QUANT}.fp8": S.moe_functions,
    f"{QUANT}.online.base": S.online_quant,
    f"{QUANT}.online.fp8": S.online_quant,
    f"{QUANT}.online.moe_base": S.online_quant,
    f"{LAYERS}.fused_moe.unquantized_fused_moe_method": S.moe,
    f"{QUANT}.utils.flashinfer_utils": S.moe_functions,
    f"{QUANT}.utils.marlin_utils": S.moe_functions,
    f"{QUANT}.utils.nvfp4_emulation_utils": S.moe_functions,
    "vllm.v1.attention.backend": S.attention_type,
    "vllm.v1.kv_cache_interface": S.kv_cache_interface,
    "vllm.config.compilation": S.compilation_config,
    f"{SPEC}.speculator": S.draft_model_speculator,
}


def attention_stub(module) -> None:
    """vLLM's Attention as far as a checkpoint is concerned: the kv-cache scales it registers through the quant
    config (attention.py `_init_kv_cache_quant`, run as released); the backend itself is not built."""
    import torch.nn as nn
    from vllm.model_executor.layers.attention.attention import _init_kv_cache_quant

    class Attention(nn.Module):
        def __init__(
            self,
            num_heads,
            head_size,
            scale,
            num_kv_heads=None,
            cache_config=None,
            quant_config=None,
            prefix="",
            attn_type="decoder",
            per_layer_sliding_window=None,
            sinks=None,
            **kwargs,
        ):
            super().__init__()
            self.num_heads = num_heads
            self.head_size = head_size
            self.num_kv_heads = num_kv_heads or num_heads
            self.layer_name = prefix
            self.attn_type = attn_type
            self.sliding_window = per_layer_sliding_window
            self.kv_cache_dtype = "auto"
            self.impl = None
            _init_kv_cache_quant(self, quant_config, prefix)

    module.Attention = Attention
    module.MLAAttention = type("MLAAttention", (nn.Module,), {})


class Release:
    """The released objects the harness calls, by role."""

    def __init__(self, root: Path, sandbox: Sandbox):
        self.root = root
        self.version = wheel_version(root)
        self.sandbox = sandbox
        m = sandbox.module
        self.models = {
            name: m(f"{MODELS}.{name}")
            for name in ("qwen3_dflash", "qwen3_dflash2", "qwen3_dspark", "lilicorr")
        }
        self.utils = m(f"{MODELS}.utils")
        self.modelopt = m(f"{QUANT}.modelopt")
        self.quantization = m(QUANT)
        self.linear = m(f"{LAYERS}.linear")
        self.eagle = m("vllm.transformers_utils.configs.eagle")
        self.eagle3_utils = m(f"{SPEC}.eagle.eagle3_utils")
        self.interfaces = m(f"{MODELS}.interfaces")
        self.weight_utils = m(f"{ME}.model_loader.weight_utils")
        self.spec_utils = m(f"{SPEC}.utils")
        self.convertor = m("vllm.transformers_utils.model_arch_config_convertor")
        self.vllm_config = m("vllm.config.vllm")
        self.speculators = {
            "dflash": m(f"{SPEC}.dflash.speculator").DFlashSpeculator,
            "dflash2": m(f"{SPEC}.dflash2.speculator").DFlash2Speculator,
            "lilicorr": m(f"{SPEC}.lilicorr.speculator").LiLiCorrSpeculator,
            "dspark": m(f"{SPEC}.dspark.speculator").DSparkSpeculator,
        }
        self.model_config = m("vllm.config.model")
        self.transformers_config = m("vllm.transformers_utils.config")
        # get_config parses through repo_utils.with_retry, which waits 2 s and parses again after a failure (a Hub
        # cache refresh can hide config.json for a moment). A local checkpoint's parse fails the same way twice, so
        # the wait only cost each refused config 2 s: the second parse still runs, without the wait
        m("vllm.transformers_utils.repo_utils").time = S.Holder(sleep=lambda seconds: None)
        self.registry = speculative_registry(root / "vllm" / "model_executor" / "models" / "registry.py")
        # quantization/__init__.py `get_quantization_config` imports every method's config class (GPTQ, AWQ, Quark,
        # ...); the ModelOpt family is what a ModelOpt checkpoint can resolve to
        registry = modelopt_registry(self)
        self.model_config.me_quant = registry
        self.weight_utils.get_quantization_config = registry.get_quantization_config
        # VllmConfig.get_quantization_config is a staticmethod of the released class: attach it to the stand-in
        self.vllm_config.VllmConfig = S.VllmConfig
        S.VllmConfig._get_quantization_config = staticmethod(self.vllm_config._get_quantization_config)
        S.VllmConfig.get_quantization_config = staticmethod(self.vllm_config.get_quantization_config)


def wheel_version(root: Path) -> str:
    """The wheel's own version string (vllm/_version.py)."""
    tree = ast.parse((root / "vllm" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"{root}: no __version__ in vllm/_version.py")


def modelopt_registry(release: Release) -> Any:
    """quantization/__init__.py's registry narrowed to the ModelOpt family. `_verify_quantization` asks every
    method whether it claims the checkpoint; the others (GPTQ, AWQ, ...) claim only their own quant_method, so
    they answer with QuantizationConfig's default (no claim)."""
    mo = release.modelopt
    quantization = release.quantization
    classes = {
        "modelopt": mo.ModelOptFp8Config,
        "modelopt_fp4": mo.ModelOptNvFp4Config,
        "modelopt_mxfp8": mo.ModelOptMxFp8Config,
        "modelopt_mixed": mo.ModelOptMixedPrecisionConfig,
    }

    class Registry:
        QUANTIZATION_METHODS = quantization.QUANTIZATION_METHODS
        DEPRECATED_QUANTIZATION_METHODS = quantization.DEPRECATED_QUANTIZATION_METHODS
        QuantizationMethods = quantization.QuantizationMethods

        @staticmethod
        def get_quantization_config(name: str) -> Any:
            if name not in quantization.QUANTIZATION_METHODS:
                raise ValueError(f"Invalid quantization method: {name}")
            return classes.get(name, quantization.QuantizationConfig)

    return Registry


def speculative_registry(path: Path) -> dict[str, tuple[str, str]]:
    """registry.py `_SPECULATIVE_DECODING_MODELS`: architecture -> (module, class), read from the release."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id == "_SPECULATIVE_DECODING_MODELS":
            return ast.literal_eval(node.value)
    raise LookupError(f"{path}: no _SPECULATIVE_DECODING_MODELS")


def load(root: Path) -> Release:
    stubs: dict[str, Any] = dict(STUBS)
    stubs[f"{LAYERS}.attention"] = attention_stub
    sandbox = Sandbox(root, REAL, EXTRACTED, stubs)
    sandbox.install()
    try:
        return Release(root, sandbox)
    except BaseException:
        sandbox.uninstall()
        raise
