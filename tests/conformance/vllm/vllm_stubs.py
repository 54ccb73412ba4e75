"""Serving infrastructure the released vLLM loader runs on, as small CPU stand-ins.

Only what decides nothing about a checkpoint is stubbed here: tensor parallelism (one rank), the platform (a
CUDA device of compute capability 9.0, so no code path is skipped for lack of a GPU), CUDA kernels and custom
ops (never launched while loading), attention backends and rotary embeddings (no parameters a checkpoint
fills), logging, torch.compile decorators and the engine's config objects (plain holders of the values the
loader reads). Every stand-in that would compute raises if it is called, so a load that reaches a kernel
fails loudly instead of passing.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

LOG = logging.getLogger("conformance.vllm")


class InfrastructureCalled(RuntimeError):
    """The released code called serving infrastructure the harness does not provide."""


def _raiser(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise InfrastructureCalled(
            f"{name} is serving infrastructure, not available in the conformance harness"
        )

    call.__name__ = name.rsplit(".", 1)[-1]
    return call


def _identity_decorator(*args: Any, **kwargs: Any) -> Any:
    """`@dec` and `@dec(...)` both leave the decorated object unchanged."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


def _raising_module(module: types.ModuleType, names: tuple[str, ...]) -> None:
    for n in names:
        setattr(module, n, _raiser(f"{module.__name__}.{n}"))


def _placeholder_classes(module: types.ModuleType, names: tuple[str, ...]) -> None:
    """Classes that exist for isinstance checks and subclassing (MoE, LoRA): never instantiated on our path."""
    for n in names:

        def init(self: Any, *a: Any, _n: str = n, **k: Any) -> None:
            raise InfrastructureCalled(f"{module.__name__}.{_n} is not available in the conformance harness")

        setattr(module, n, type(n, (), {"__init__": init, "__module__": module.__name__}))


# ---------------------------------------------------------------- logging


class _Logger(logging.LoggerAdapter):
    """vLLM's logger API (`warning_once`, ...) over the standard library; warnings are kept for the report."""

    def __init__(self, name: str, sink: list[str]):
        super().__init__(logging.getLogger(f"conformance.vllm.{name}"), {})
        self.sink = sink

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("scope", None)
        self.sink.append(str(msg) % args if args else str(msg))
        super().warning(msg, *args, **kwargs)

    def warning_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args, **kwargs)

    def info_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("scope", None)
        self.info(msg, *args, **kwargs)

    def debug_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("scope", None)
        self.debug(msg, *args, **kwargs)


WARNINGS: list[str] = []


def logger(module: types.ModuleType) -> None:
    module.init_logger = lambda name: _Logger(name, WARNINGS)
    module.logger = _Logger("vllm", WARNINGS)


# ---------------------------------------------------------------- the engine's config objects


class DeviceCapability(tuple):
    def to_int(self) -> int:
        return self[0] * 10 + self[1]

    @property
    def major(self) -> int:
        return self[0]


class _Platform:
    """A CUDA device of compute capability 9.0 (Hopper)."""

    device_type = "cuda"
    simple_compile_backend = "inductor"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_fp8_fnuz(self) -> bool:
        return False

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability((9, 0))

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        value = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return value <= 90

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        value = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return value == 90

    def verify_quantization(self, quant: str) -> None:
        return None

    def use_sync_weight_loader(self) -> bool:
        return False  # platforms/interface.py: CUDA loads without the sync wrapper


PLATFORM = _Platform()


def platforms(module: types.ModuleType) -> None:
    module.current_platform = PLATFORM


_CURRENT: dict[str, Any] = {"config": None}


@contextlib.contextmanager
def current_vllm_config(config: Any):
    previous = _CURRENT["config"]
    _CURRENT["config"] = config
    try:
        yield config
    finally:
        _CURRENT["config"] = previous


def _get_current() -> Any:
    if _CURRENT["config"] is None:
        raise AssertionError("Current vLLM config is not set")
    return _CURRENT["config"]


class Holder:
    """A plain attribute holder standing in for one of vLLM's pydantic config classes."""

    def __init__(self, **values: Any):
        self.__dict__.update(values)


class VllmConfig(Holder):
    """The engine config; `get_quantization_config` is attached from the release (config/vllm.py)."""


def replace(obj: Any, **changes: Any) -> Any:
    """dataclasses.replace for the stand-in holders."""
    new = type(obj).__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


class CacheConfig(Holder):
    pass


class SpeculativeConfig(Holder):
    pass


def config_package(module: types.ModuleType) -> None:
    # a class of each release's own: the release's extracted methods are attached to it (vllm_release.Release)
    module.VllmConfig = type("VllmConfig", (VllmConfig,), {"__module__": module.__name__})
    module.CacheConfig = CacheConfig
    module.SpeculativeConfig = type(
        "SpeculativeConfig", (SpeculativeConfig,), {"__module__": module.__name__}
    )
    module.ModelConfig = Holder
    module.LoadConfig = Holder
    module.get_current_vllm_config = _get_current
    module.get_current_vllm_config_or_none = lambda: _CURRENT["config"]
    module.get_cached_compilation_config = _raiser("vllm.config.get_cached_compilation_config")
    module.set_current_vllm_config = current_vllm_config
    module.replace = replace


class CUDAGraphMode:
    """compilation.py's CUDAGraphMode as far as a speculator's constructor asks (no CUDA graphs here)."""

    def __init__(self, name: str):
        self.name = name

    def decode_mode(self) -> CUDAGraphMode:
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CUDAGraphMode) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


for _mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
    setattr(CUDAGraphMode, _mode, CUDAGraphMode(_mode))


def compilation_config(module: types.ModuleType) -> None:
    module.CUDAGraphMode = CUDAGraphMode


class BaseSpeculator:
    """speculator.py's abstract base (0.34 init_speculator checks a speculator class against it)."""


class DraftModelSpeculator(BaseSpeculator):
    """speculator.py's base: the attributes its constructor takes from the engine config (buffers omitted)."""

    def __init__(self, vllm_config: Any, device: Any):
        self.vllm_config = vllm_config
        self.device = device
        self.speculative_config = vllm_config.speculative_config
        self.method = self.speculative_config.method
        self.num_speculative_steps = self.speculative_config.num_speculative_tokens
        self.draft_model_config = self.speculative_config.draft_model_config
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.hidden_size = self.draft_model_config.get_hidden_size()
        self.vocab_size = self.draft_model_config.get_vocab_size()
        self.dtype = vllm_config.model_config.dtype
        self.draft_logits = None
        self.enable_adaptive_verification = False


def draft_model_speculator(module: types.ModuleType) -> None:
    module.BaseSpeculator = BaseSpeculator
    module.DraftModelSpeculator = DraftModelSpeculator


# ---------------------------------------------------------------- tensor parallelism: one rank


class _Group:
    world_size = 1
    rank_in_group = 0
    is_first_rank = True
    is_last_rank = True
    device_group = None

    def size(self) -> int:
        return 1


def distributed(module: types.ModuleType) -> None:
    def divide(numerator: int, denominator: int) -> int:
        assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
        return numerator // denominator

    module.divide = divide
    module.get_tensor_model_parallel_rank = lambda: 0
    module.get_tensor_model_parallel_world_size = lambda: 1
    module.tensor_model_parallel_all_gather = lambda x, dim=-1: x
    module.tensor_model_parallel_all_reduce = lambda x: x
    module.split_tensor_along_last_dim = _raiser("vllm.distributed.split_tensor_along_last_dim")
    module.GroupCoordinator = _Group
    module.get_pp_group = lambda: _Group()
    module.get_tp_group = lambda: _Group()


def parallel_state(module: types.ModuleType) -> None:
    module.get_pp_group = lambda: _Group()
    module.get_tp_group = lambda: _Group()
    module.get_ep_group = lambda: _Group()
    module.model_parallel_is_initialized = lambda: False


# ---------------------------------------------------------------- compilation, custom ops, kernels


def compilation_decorators(module: types.ModuleType) -> None:
    module.support_torch_compile = _identity_decorator


def compilation_backends(module: types.ModuleType) -> None:
    module.set_model_tag = lambda *a, **k: contextlib.nullcontext()


class PluggableLayer(nn.Module):
    """The out-of-tree layer replacement registry, without replacements."""

    @classmethod
    def register(cls, name: str) -> Callable[[type], type]:
        return lambda layer_cls: layer_cls


def custom_op(module: types.ModuleType) -> None:
    module.PluggableLayer = PluggableLayer
    module.CustomOp = PluggableLayer


def custom_ops(module: types.ModuleType) -> None:
    def kernel(name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        return _raiser(f"vllm._custom_ops.{name}")

    # capability queries a module asks at import time: a Hopper build has the CUTLASS kernels
    for query in (
        "cutlass_scaled_mm_supports_fp8",
        "cutlass_scaled_mm_supports_block_fp8",
        "cutlass_group_gemm_supported",
    ):
        setattr(module, query, lambda capability: True)
    module.__getattr__ = kernel

    def scaled_fp8_quant(x: torch.Tensor, scale: torch.Tensor | None = None, **kwargs: Any):
        # FP8 requantisation when fused shards carry different scales (w8a8_utils requantize_with_max_scale):
        # the CUDA kernel's arithmetic, on CPU
        if scale is None:
            scale = (x.abs().max().float() / 448.0).clamp(min=1e-12).reshape(1)
        q = (x.float() / scale.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q, scale

    module.scaled_fp8_quant = scaled_fp8_quant


def torch_utils(module: types.ModuleType) -> None:
    def direct_register_custom_op(
        op_name: str, op_func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        return None  # the op is only launched in forward passes

    def is_torch_equal_or_newer(target: str) -> bool:
        from packaging.version import Version

        return Version(torch.__version__.split("+")[0]) >= Version(target)

    module.direct_register_custom_op = direct_register_custom_op
    module.is_torch_equal_or_newer = is_torch_equal_or_newer
    module.common_broadcastable_dtype = _raiser("vllm.utils.torch_utils.common_broadcastable_dtype")
    module.is_quantized_kv_cache = lambda dtype: False  # 0.31/0.32 kv_cache.py imports it from here


def triton_utils(module: types.ModuleType) -> None:
    import triton
    import triton.language as tl

    module.triton = triton
    module.tl = tl


class _Kernel:
    """A GEMM kernel chosen by the quant method: its post-load repacking is device-specific."""

    supports_pre_processed_weights = False

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None

    def apply_weights(self, *args: Any, **kwargs: Any) -> Any:
        raise InfrastructureCalled("GEMM kernels are not available in the conformance harness")


def linear_kernels(module: types.ModuleType) -> None:
    for n in ("init_fp8_linear_kernel", "init_mxfp8_linear_kernel", "init_nvfp4_linear_kernel"):
        setattr(module, n, lambda *a, **k: _Kernel())


def quant_activation(module: types.ModuleType) -> None:
    module.expose_input_quant_key = lambda layer, kernel: None


def batch_invariant(module: types.ModuleType) -> None:
    _raising_module(module, ("linear_batch_invariant",))


def layers_utils(module: types.ModuleType) -> None:
    module.dispatch_unquantized_gemm = lambda backend="auto": _raiser("unquantized GEMM")
    _raising_module(module, ("maybe_pad_weight_avoid_cache_aliasing", "cuda_unquantized_gemm"))
    # 0.34 UnquantizedEmbeddingMethod.process_weights_after_loading: a skinny-GEMM repacking of the lm_head's
    # weight on CUDA (the values are unchanged)
    module.maybe_use_skinny_gemm = lambda *a, **k: None


def scaled_mm(module: types.ModuleType) -> None:
    # 0.34 modelopt.py: kernel classes it tests a chosen kernel against (isinstance); never chosen here
    _placeholder_classes(module, ("CutlassFP8ScaledMMLinearKernel", "CutlassFp8BlockScaledMMKernel"))


def model_loader_utils(module: types.ModuleType) -> None:
    @contextlib.contextmanager
    def device_loading_context(layer: nn.Module, target_device: Any):
        # model_loader/utils.py: moves CPU-offloaded parameters to the device around a post-load hook; the
        # harness loads on the CPU, where the released function moves nothing either
        if target_device is not None and getattr(target_device, "type", "cpu") != "cpu":
            raise InfrastructureCalled("device placement is not available in the conformance harness")
        yield layer

    module.device_loading_context = device_loading_context


def reload_direct(module: types.ModuleType) -> None:
    # 0.34 model_executor/utils.py replace_parameter: in-place weight reloads are off outside RL refits
    module.direct_reload_enabled = lambda: False


def activation(module: types.ModuleType) -> None:
    class SiluAndMul(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise InfrastructureCalled("activation kernels are not available in the conformance harness")

    module.SiluAndMul = SiluAndMul
    module.get_act_fn = lambda name: SiluAndMul()


def fused_act_quant(module: types.ModuleType) -> None:
    _raising_module(module, ("maybe_fused_act_quant",))


def moe(module: types.ModuleType) -> None:
    _placeholder_classes(
        module,
        (
            "FusedMoEConfig",
            "FusedMoEMethodBase",
            "FusedMoEQuantConfig",
            "FusedMoeWeightScaleSupported",
            "RoutedExperts",
            "SharedExperts",
            "UnfinalizedMoEOutput",
            "Fp8MoeBackend",
            "NvFp4MoeBackend",
            "UnquantizedFusedMoEMethod",
        ),
    )


def moe_functions(module: types.ModuleType) -> None:
    _raising_module(
        module,
        (
            "convert_to_fp8_moe_kernel_format",
            "make_fp8_moe_kernel",
            "make_fp8_moe_quant_config",
            "select_fp8_moe_backend",
            "select_mxfp8_moe_backend",
            "convert_to_nvfp4_moe_kernel_format",
            "is_global_sf_supported_for_nvfp4_backend",
            "make_nvfp4_moe_kernel",
            "make_nvfp4_moe_quant_config",
            "select_nvfp4_moe_backend",
            "trtllm_nvfp4_hidden_alignment",
            "get_marlin_input_dtype",
            "dequantize_nvfp4_moe_weights",
            "dequantize_to_dtype",
            "nvfp4_gathered_bias",
            "dequant_mxfp8_to_bf16",
            "process_fp8_input_tensor_strategy_moe",
            "process_fp8_weight_tensor_strategy_moe",
        ),
    )
    _placeholder_classes(module, ("Fp8MoeBackend", "NvFp4MoeBackend", "Fp8Config", "Fp8MoEMethod"))


def kv_cache_interface(module: types.ModuleType) -> None:
    module.is_quantized_kv_cache = lambda dtype: False
    module.kv_cache_uses_per_token_head_scales = lambda *a, **k: False


# ---------------------------------------------------------------- layers without checkpoint state


class RMSNorm(nn.Module):
    """vLLM's RMSNorm holds one `weight` of the hidden width (layernorm.py); the kernel is not needed here."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        var_hidden_size: int | None = None,
        has_weight: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.variance_epsilon = eps
        weight = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
        self.weight = nn.Parameter(weight) if has_weight else weight

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise InfrastructureCalled("RMSNorm kernels are not available in the conformance harness")


def layernorm(module: types.ModuleType) -> None:
    module.RMSNorm = RMSNorm


class Rotary(nn.Module):
    """What the DFlash loader reads of a rotary embedding (its cos/sin cache is a non-persistent buffer)."""

    def __init__(
        self, head_size: int, max_position: int, is_neox_style: bool, rope_parameters: dict[str, Any]
    ):
        super().__init__()
        self.head_size = head_size
        self.is_neox_style = is_neox_style
        self.rope_parameters = dict(rope_parameters or {})
        self.register_buffer("cos_sin_cache", torch.zeros(1), persistent=False)


def rotary(module: types.ModuleType) -> None:
    def get_rope(
        head_size: int,
        max_position: int = 2048,
        is_neox_style: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Rotary:
        # the released get_rope looks its arguments up in its cache (`key in _ROPE_DICT`, the key a tuple holding
        # is_neox_style): an unhashable value fails there
        hash((head_size, max_position, is_neox_style))
        return Rotary(head_size, max_position, is_neox_style, rope_parameters or {})

    module.get_rope = get_rope


class LogitsProcessor(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        org_vocab_size: int | None = None,
        scale: float = 1.0,
        soft_cap: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        # logits_processor.py LogitsProcessor.__init__: the columns _get_logits keeps (`logits[..., :org_vocab_size]`)
        self.org_vocab_size = org_vocab_size or vocab_size
        self.scale = scale
        self.soft_cap = soft_cap

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise InfrastructureCalled("logits kernels are not available in the conformance harness")

    def get_top_k_tokens(self, lm_head: Any, hidden_states: Any, k: int, *args: Any, **kwargs: Any) -> Any:
        # logits_processor.py get_top_k_tokens (every release): its first statement refuses a scale <= 0 (the
        # local top-k reduction cannot take a non-positive scale), before the GEMM
        if self.scale <= 0.0 and self.scale != 1.0:
            raise ValueError("the local top-k reduction does not support a non-positive logit scale")
        raise InfrastructureCalled("logits kernels are not available in the conformance harness")


def logits_processor(module: types.ModuleType) -> None:
    module.LogitsProcessor = LogitsProcessor


def attention_type(module: types.ModuleType) -> None:
    class AttentionType:
        DECODER = "decoder"
        ENCODER = "encoder"
        ENCODER_ONLY = "encoder_only"
        ENCODER_DECODER = "encoder_decoder"

    module.AttentionType = AttentionType


def multimodal(module: types.ModuleType) -> None:
    module.NestedTensors = Any


def sequence(module: types.ModuleType) -> None:
    _placeholder_classes(module, ("IntermediateTensors",))


def reload(module: types.ModuleType) -> None:
    # torchao_decorator.py: the decorator only acts when a model is re-loaded with `_do_torchao_reload`
    module.support_quantized_model_reload_from_hp_weights = lambda fn: fn


def online_quant(module: types.ModuleType) -> None:
    _placeholder_classes(module, ("OnlineQuantizationConfig", "OnlineLinearBase", "OnlineMoEMethodBase"))


def b12x(module: types.ModuleType) -> None:
    module.B12X_BLOCK_CODECS = {}  # mixed-precision b12x codecs: no ModelOpt linear export uses them


def modelscope(module: types.ModuleType) -> None:
    module.maybe_download_from_modelscope = lambda *a, **k: None


def lora(module: types.ModuleType) -> None:
    _placeholder_classes(module, ("BaseLayerWithLoRA",))


def noop_module(module: types.ModuleType) -> None:
    return None


def forward_context(module: types.ModuleType) -> None:
    _raising_module(module, ("get_forward_context",))  # read by forward passes only


def beam_package(module: types.ModuleType) -> None:
    """vllm/models/beam/__init__.py: its drafter as the package exports it on a CUDA platform (nvidia/), without
    the target model (BeamForCausalLM) and the kernels the package also imports."""
    import importlib

    module.DFlash2BeamForCausalLM = importlib.import_module(
        f"{module.__name__}.nvidia.dflash2"
    ).DFlash2BeamForCausalLM
