"""A released vLLM, loaded from its wheel's sources: which of its modules run as released, which definitions are
extracted from their files, and which serving infrastructure is stubbed.

Every supported release (tests/conformance/engines.py `versions("vllm")`, the releases lilicorr_ckpt/runtimes
models) is loaded the same way: the lists below are the union over the releases, a module is only imported when
some executed code imports it, and a definition only some releases have is an optional extraction. One release
is loaded at a time (its modules are installed under their real names, `vllm.*`).

API (the conformance tests and the fuzzer):

    load_release(version) -> Release   fetch the release's sources (engines.sources) and load it; raises
                                       ReleaseNotSupported, one line naming the module/name the release
                                       imports that the harness neither executes nor stubs
    unload(release)                    remove it again: no `vllm` module stays importable
    loaded(version)                    a context manager: load_release, then unload
    vllm_harness.serve(release, path)  what that release does with a checkpoint (an Outcome)

The Release's attributes are the released objects the harness calls, by role. The method handling is executed
from the release (vllm_harness step 3):

- every release: config/speculative.py `SpeculativeConfig.compose_draft_hf_overrides` ->
  `hf_config_override` (the architecture rewrites applied to the draft's HF config, as ModelConfig applies them
  through get_config's hf_overrides_fn), `update_arch_`, `use_dspark` (methods lifted onto a stand-in class);
- 0.31-0.33: the statements of `SpeculativeConfig.__post_init__` that follow the draft ModelConfig's
  construction up to the draft's tensor-parallel size (`route_draft`): method detection, the EAGLEConfig wrap,
  the Qwen3 DSparkDraftModel rewrite, num_speculative_tokens, DSpark's top-k and Omni checks;
- 0.34: spec_decode/speculator_config.py `get_method_config_class`, the statements of
  `DraftModelSpeculatorConfig.configure` after its ModelConfig construction (`_resolve_checkpoint_config_class`,
  `adapt_draft_model_config`, `resolve_num_speculative_tokens`), then `__post_init__`'s remainder
  (`get_speculator_config_class`, the method-specific options, `apply_options`);
- every release: spec_decode/__init__.py `init_speculator` (by method and architecture up to 0.33, by the
  speculator config's `speculator_class` in 0.34).

Not executed: the model registry's class inspection (registry.py `inspect_model_cls` imports every model module
and runs a subprocess). `ModelRegistry` below reads the release's own `_VLLM_MODELS` and `_resolve_module_name`
and looks architectures up as `_normalize_arch` does for a registered name; a model's declared speculator
config is computed as registry.py `_ModelInfo.from_model_cls` does, from the class when the harness executes
its module, else from the module's source text.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import vllm_stubs as S
from vllm_sandbox import Extract, Sandbox, SandboxError, Span, methods_of

ME = "vllm.model_executor"
LAYERS = f"{ME}.layers"
QUANT = f"{LAYERS}.quantization"
MODELS = f"{ME}.models"
SPEC = "vllm.v1.worker.gpu.spec_decode"
HERE = Path(__file__).resolve().parent

# the drafter model modules the harness builds and loads (a release that routes a checkpoint to another module
# is answered "U": routed to code the harness does not execute)
EXECUTED_MODELS = ("qwen3_dflash", "qwen3_dflash2", "qwen3_dspark", "lilicorr", "ricursive_dflash2")
# DFlash2BeamDraftModel's module (0.33+): its package __init__ also imports the Beam target model and kernels,
# so the package is a stub exporting the drafter of its nvidia/ implementation, which runs as released
BEAM = "vllm.models.beam"
EXECUTED_MODULES = (*(f"{MODELS}.{name}" for name in EXECUTED_MODELS), BEAM)

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
    "vllm.transformers_utils.configs.speculators",
    "vllm.transformers_utils.configs.speculators.base",
    "vllm.transformers_utils.configs.speculators.algos",
    "vllm.scalar_type",
    "vllm.config.utils",
    "vllm.config.quantization",
    "vllm.utils.math_utils",
    "vllm.utils.collection_utils",
    "vllm.utils.func_utils",
    "vllm.utils.import_utils",
    f"{ME}.utils",
    f"{ME}.parameter",
    f"{LAYERS}.linear",
    QUANT,  # the package: QuantizationMethods, get_quantization_config
    f"{QUANT}.base_config",
    f"{QUANT}.modelopt",
    f"{QUANT}.kv_cache",
    f"{QUANT}.online.requantization",
    f"{QUANT}.utils.quant_utils",
    f"{QUANT}.utils.w8a8_utils",
    f"{QUANT}.utils.mxfp8_utils",
    f"{QUANT}.utils.nvfp4_utils",
    f"{MODELS}.utils",
    f"{MODELS}.interfaces",
    f"{MODELS}.interfaces_base",
    *(f"{MODELS}.{name}" for name in EXECUTED_MODELS),
    f"{BEAM}.nvidia.dflash2",
    f"{BEAM}.nvidia.dflash2_ops",  # 0.33
    "vllm.transformers_utils.configs.eagle",
    f"{SPEC}.eagle.eagle3_utils",
    # 0.34: the speculator configs (spec_decode/speculator_config.py and each method's config.py)
    f"{SPEC}.speculator_config",
    *(
        f"{SPEC}.{m}.config"
        for m in ("dflash", "dflash2", "lilicorr", "dspark", "eagle", "mtp", "standalone_ar", "xpress")
    ),
)

# SpeculativeConfig's methods the harness calls (lifted onto a stand-in class, vllm_stubs.SpeculativeConfig)
SPECULATIVE_METHODS = (
    "_is_custom_proposer_path",  # 0.31-0.33
    "hf_config_override",
    "compose_draft_hf_overrides",
    "_apply_composed_hf_override",
    "_maybe_override_draft_max_position_embeddings",
    "update_arch_",
    "use_dspark",
    "is_xpress",  # 0.33
    "speculator_config",  # 0.34, a property
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
    # the architectures every release registers, and where each one's module is
    f"{MODELS}.registry": Extract(
        [
            "_TEXT_GENERATION_MODELS",
            "_EMBEDDING_MODELS",
            "_LATE_INTERACTION_MODELS",
            "_REWARD_MODELS",
            "_TOKEN_CLASSIFICATION_MODELS",
            "_SEQUENCE_CLASSIFICATION_MODELS",
            "_MULTIMODAL_MODELS",
            "_SPECULATIVE_DECODING_MODELS",
            "_TRANSFORMERS_SUPPORTED_MODELS",
            "_TRANSFORMERS_BACKEND_MODELS",
            "_VLLM_MODELS",
            "_resolve_module_name",
        ]
    ),
    f"{ME}.model_loader.weight_utils": Extract(
        [
            "default_weight_loader",
            "make_attention_sink",
            "load_attention_sink",
            "get_quant_config",
            "maybe_download_from_modelscope",
            "get_lock",
            "DisabledTqdm",
            "finalize_model_weights",
        ],
        # the attention sink helpers are 0.33+, the per-module post-load hooks 0.34
        optional=("make_attention_sink", "load_attention_sink", "finalize_model_weights"),
    ),
    f"{LAYERS}.attention.attention": Extract(
        ["set_default_quant_scales", "_init_kv_cache_quant", "should_load_quant_weights"]
    ),
    # the FP8 block config ModelOptMixedPrecisionConfig builds (its checks); the MoE method is a base class only
    f"{QUANT}.fp8": Extract(
        ["ACTIVATION_SCHEMES", "Fp8Config", "Fp8MoEMethod"],
        only={"Fp8Config": ("__init__", "get_name"), "Fp8MoEMethod": ()},
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
        [], methods={"ModelArchConfigConvertorBase": ("_normalize_quantization_config", "get_architectures")}
    ),
    "vllm.config.vllm": Extract(
        [], methods={"VllmConfig": ("_get_quantization_config", "get_quantization_config")}
    ),
    # config/speculative.py: the method handling (module docstring) and what the 0.34 speculator configs import
    "vllm.config.speculative": Extract(
        [
            "_MINIMAX_M3_MODEL_TYPES",
            "_QWEN3_OMNI_DSPARK_ARCHITECTURE",
            "_get_minimax_m3_dspark_draft",
            "_validate_qwen3_omni_dspark",
            "XPRESS_ARCHITECTURES",
            "_METHOD_SPECIFIC_OPTIONS",
            "MTPModelTypes",
        ],
        methods={"SpeculativeConfig": SPECULATIVE_METHODS},
        spans={
            # every release: the method inferred from the command's arguments
            "infer_method": Span(
                "SpeculativeConfig",
                "__post_init__",
                start=None,
                stop=(
                    "if self.model is None and self.num_speculative_tokens is not None",  # 0.31-0.33
                    "config_cls = get_method_config_class(self)",  # 0.34
                ),
            ),
            # 0.31-0.33
            "route_draft": Span(
                "SpeculativeConfig",
                "__post_init__",
                start="self.draft_model_config = ModelConfig(",
                stop="self.draft_tensor_parallel_size =",
            ),
            # 0.34: after `config_cls.configure(self)`
            "after_configure": Span(
                "SpeculativeConfig",
                "__post_init__",
                start="config_cls.configure(self)",
                stop="if config_cls.adaptive_verification_uses_draft_logits",
            ),
        },
        optional=(
            "_MINIMAX_M3_MODEL_TYPES",
            "_get_minimax_m3_dspark_draft",
            "XPRESS_ARCHITECTURES",
            "_METHOD_SPECIFIC_OPTIONS",
            "is_xpress",
            "speculator_config",
            "_is_custom_proposer_path",
            "route_draft",
            "after_configure",
        ),
        closure=True,
    ),
    # the runner's choice of speculator
    SPEC: Extract(["init_speculator"]),
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

# the speculators whose constructors the harness executes (init_speculator building another is answered "U")
EXECUTED_SPECULATORS = tuple(
    f"{SPEC}.{m}.speculator.{c}"
    for m, c in (
        ("dflash", "DFlashSpeculator"),
        ("dflash2", "DFlash2Speculator"),
        ("lilicorr", "LiLiCorrSpeculator"),
        ("dspark", "DSparkSpeculator"),
    )
)

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
    f"{ME}.kernels.linear.scaled_mm": S.scaled_mm,
    f"{ME}.kernels.linear.scaled_mm.cutlass": S.scaled_mm,
    f"{ME}.model_loader.reload": S.reload,
    f"{ME}.model_loader.reload.direct": S.reload_direct,
    f"{ME}.model_loader.utils": S.model_loader_utils,
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
    "vllm.forward_context": S.forward_context,
    BEAM: S.beam_package,
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
    # 0.34 weight_utils.finalize_model_weights: an attention layer's deferred post-load hook (the kv-cache
    # scales' processing, a backend's); the stand-in has none
    module.is_deferred_attention_layer = lambda layer: (
        isinstance(layer, (Attention, module.MLAAttention))
        and (callable(getattr(layer, "process_weights_after_loading", None)))
    )


class ReleaseNotSupported(RuntimeError):
    """The release imports (or no longer defines) something the harness neither executes nor stubs: one line."""


class ModelRegistry:
    """registry.py's ModelRegistry for a draft (module docstring): which class an architecture builds."""

    def __init__(self, release: Release, registry: Any):
        self.release = release
        self.models: dict[str, tuple[str, str]] = dict(registry._VLLM_MODELS)
        self.speculative: dict[str, tuple[str, str]] = dict(registry._SPECULATIVE_DECODING_MODELS)
        self.resolve_module_name = registry._resolve_module_name

    def entry(self, arch: str) -> tuple[str, str] | None:
        """(module, class) the architecture is registered as, or None."""
        found = self.models.get(arch)
        return (self.resolve_module_name(found[0]), found[1]) if found else None

    def inspect_model_cls(self, architectures: list[str] | str, model_config: Any = None) -> tuple[Any, str]:
        if isinstance(architectures, str):
            architectures = [architectures]
        if not architectures:
            raise ValueError("No model architectures are specified")
        for arch in architectures:
            entry = self.entry(arch)
            if entry is not None:
                return S.Holder(
                    architecture=entry[1],
                    module=entry[0],
                    speculator_config_class=self.declared_config(*entry),
                ), arch
        # registry.py _raise_for_unsupported (the supported list left out)
        raise ValueError(f"Model architectures {architectures} are not supported for now.")

    def model_class(self, module: str, name: str) -> Any:
        """The class, from a module the harness executes; None for any other module (routed, not executed)."""
        if module not in EXECUTED_MODULES:
            return None
        return getattr(self.release.sandbox.module(module), name)

    def declared_config(self, module: str, name: str) -> str | None:
        """registry.py _ModelInfo.from_model_cls `speculator_config_class`: the qualname of the class's declared
        speculator config. For a module the harness does not execute: None when its source never names one, else
        the marker "unexecuted:<module>.<class>" (a release that needs it is answered "U")."""
        cls = self.model_class(module, name)
        if cls is not None:
            config_cls = getattr(cls, "speculator_config_class", None)
            return f"{config_cls.__module__}.{config_cls.__qualname__}" if config_cls else None
        path = self.release.root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = self.release.root / module.replace(".", "/") / "__init__.py"
        if path.exists() and "speculator_config_class" not in path.read_text():
            return None
        return f"unexecuted:{module}.{name}"


class Release:
    """The released objects the harness calls, by role."""

    def __init__(self, root: Path, sandbox: Sandbox):
        self.root = root
        self.version = wheel_version(root)
        self.sandbox = sandbox
        m = sandbox.module
        self.models = {
            name: m(f"{MODELS}.{name}")
            for name in EXECUTED_MODELS
            if (root / "vllm" / "model_executor" / "models" / f"{name}.py").exists()
        }
        self.utils = m(f"{MODELS}.utils")
        self.modelopt = m(f"{QUANT}.modelopt")
        # fp8.py Fp8Config is extracted for its constructor's checks (ModelOptMixedPrecisionConfig builds one for
        # block-FP8 MoE layers); the methods that serve it, abstract in QuantizationConfig, are not
        m(f"{QUANT}.fp8").Fp8Config.__abstractmethods__ = frozenset()
        self.quantization = m(QUANT)
        self.linear = m(f"{LAYERS}.linear")
        self.eagle = m("vllm.transformers_utils.configs.eagle")
        self.eagle3_utils = m(f"{SPEC}.eagle.eagle3_utils")
        self.interfaces = m(f"{MODELS}.interfaces")
        self.weight_utils = m(f"{ME}.model_loader.weight_utils")
        self.spec_utils = m(f"{SPEC}.utils")
        self.convertor = m("vllm.transformers_utils.model_arch_config_convertor")
        self.vllm_config = m("vllm.config.vllm")
        self.model_config = m("vllm.config.model")
        self.transformers_config = m("vllm.transformers_utils.config")
        # config.py's registry names the speculators config by attribute of the configs package, which the harness
        # does not import whole (its __init__ imports every model's config): the class comes from its own module
        configs = sys.modules.get("vllm.transformers_utils.configs")
        if configs is not None:
            configs.SpeculatorsConfig = m("vllm.transformers_utils.configs.speculators").SpeculatorsConfig
        # get_config parses through repo_utils.with_retry, which waits 2 s and parses again after a failure (a Hub
        # cache refresh can hide config.json for a moment). A local checkpoint's parse fails the same way twice, so
        # the wait only cost each refused config 2 s: the second parse still runs, without the wait
        m("vllm.transformers_utils.repo_utils").time = S.Holder(sleep=lambda seconds: None)
        self.registry = ModelRegistry(self, m(f"{MODELS}.registry"))
        # quantization/__init__.py `get_quantization_config` imports every method's config class (GPTQ, AWQ, Quark,
        # ...); the ModelOpt family is what a ModelOpt checkpoint can resolve to
        registry = modelopt_registry(self)
        self.model_config.me_quant = registry
        self.weight_utils.get_quantization_config = registry.get_quantization_config
        # the engine config classes of this release (vllm_stubs.config_package), with the release's own methods
        config = m("vllm.config")
        self.VllmConfig = config.VllmConfig
        self.VllmConfig._get_quantization_config = staticmethod(self.vllm_config._get_quantization_config)
        self.VllmConfig.get_quantization_config = staticmethod(self.vllm_config.get_quantization_config)
        self.vllm_config.VllmConfig = self.VllmConfig
        # the method handling (module docstring)
        self.speculative = m("vllm.config.speculative")
        self.SpeculativeConfig = config.SpeculativeConfig
        for name, method in methods_of(self.speculative).items():
            setattr(self.SpeculativeConfig, name, method)
        self.speculative.SpeculativeConfig = self.SpeculativeConfig
        self.infer_method = self.speculative.infer_method
        self.route_draft = getattr(self.speculative, "route_draft", None)  # 0.31-0.33
        self.speculator_config = None  # 0.34
        if (root / SPEC.replace(".", "/") / "speculator_config.py").exists():
            self.speculator_config = m(f"{SPEC}.speculator_config")
            self.configure_draft = sandbox.function_from_span(
                f"{SPEC}.speculator_config",
                "configure_draft",
                Span(
                    "DraftModelSpeculatorConfig",
                    "configure",
                    start="spec.draft_model_config = ModelConfig(",
                    stop="spec.draft_tensor_parallel_size =",
                ),
            )
            self.after_configure = self.speculative.after_configure
        if self.route_draft is None and self.speculator_config is None:
            raise SandboxError(
                "config/speculative.py: neither __post_init__'s draft routing (up to 0.33) nor "
                "spec_decode/speculator_config.py (0.34)",
                module="vllm.config.speculative",
                name="route_draft",
            )
        self.init_speculator = m(SPEC).init_speculator
        self.finalize_model_weights = getattr(self.weight_utils, "finalize_model_weights", None)

    def __repr__(self) -> str:
        return f"<vLLM {self.version} from {self.root}>"


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


# ---------------------------------------------------------------- loading and unloading


def engines() -> Any:
    """tests/conformance/engines.py, the shared fetcher (a sibling directory's module, loaded by path)."""
    name = "conformance_engines"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "engines.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def versions() -> tuple[str, ...]:
    """Every vLLM release the harness runs, oldest first."""
    return engines().versions("vllm")


def load(
    root: Path,
    *,
    real: tuple[str, ...] = REAL,
    extracted: dict[str, Extract] | None = None,
    stubs: dict[str, Any] | None = None,
) -> Release:
    """Load the release whose sources are unpacked at `root` (the directory holding `vllm/`). `real`,
    `extracted` and `stubs` replace the module lists (the tests of the harness itself)."""
    stubs = dict(STUBS if stubs is None else stubs)
    if stubs.get(f"{LAYERS}.attention", attention_stub) is None:
        stubs[f"{LAYERS}.attention"] = attention_stub
    sandbox = Sandbox(root, real, EXTRACTED if extracted is None else extracted, stubs)
    sandbox.install()
    try:
        return Release(root, sandbox)
    except BaseException as exc:
        sandbox.uninstall()
        if isinstance(exc, (ImportError, AttributeError, LookupError)):
            raise ReleaseNotSupported(unsupported(root, exc)) from exc
        raise


def load_release(version: str) -> Release:
    """Fetch the sources of vLLM `version` (tests/conformance/engines.py) and load them. Only one release is
    loaded at a time: unload() it before loading another."""
    return load(engines().sources("vllm", version))


def unload(release: Release) -> None:
    """Remove the release's modules: no `vllm` module stays importable."""
    release.sandbox.uninstall()


@contextlib.contextmanager
def loaded(version: str) -> Iterator[Release]:
    release = load_release(version)
    try:
        yield release
    finally:
        unload(release)


def unsupported(root: Path, exc: BaseException) -> str:
    """One line: the module (and name) the release imports that the harness neither executes nor stubs, and
    the released file that imports it."""
    version = wheel_version(root)
    module = getattr(exc, "module", None) or getattr(exc, "name", None)
    name = getattr(exc, "missing", None)
    text = str(exc)
    if isinstance(exc, ImportError) and name is None:
        found = re.search(r"cannot import name '([^']+)' from '([^']+)'", text)
        if found:
            name, module = found.groups()
    by = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename.split(" (")[0])
        if root in path.parents:
            # an extracted module's line numbers are its extraction's, not the file's
            where = " (extracted)" if frame.filename.endswith("(extracted)") else f":{frame.lineno}"
            by = f" (imported by {path.relative_to(root)}{where})"
            break
    if isinstance(exc, SandboxError) and "has no top-level" in text:
        return (
            f"vLLM {version} has no {module}.{name}, which the conformance harness extracts: "
            f"update vllm_release.py (make it optional or follow the release){by}"
        )
    if module is None:
        return f"vLLM {version} failed to load in the conformance harness: {type(exc).__name__}: {text}{by}"
    what = f"{module} (name {name})" if name else module
    return (
        f"vLLM {version} imports {what}, which the conformance harness neither executes nor stubs: "
        f"add it to vllm_release.py{by}"
    )
