"""One released SGLang serving a draft checkpoint, as far as the released code decides whether it loads.

An `Engine` is one release's wheel imported through `wheel.py` (`releases.load_release` makes one and installs it;
the module names are the wheel's own, so one release is installed at a time). `Engine.serve(path)` walks the
steps `python -m sglang.launch_server --speculative-algorithm DFLASH --speculative-draft-model-path PATH` takes
for the draft, each through that wheel's own functions:

1. the draft's Hugging Face config (`utils/hf_transformers/config.py` `get_config`: `AutoConfig.from_pretrained`);
2. `arg_groups/speculative_hook.py` `_handle_dflash`: the block size (`parse_dflash_draft_config`, default 16);
3. `configs/model_config.py` `ModelConfig._config_draft_model` (the draft-architecture rewrites),
   `_verify_quantization` / `_parse_quant_hf_config`: the quantization method, and `_get_and_verify_dtype` for
   `--dtype auto`;
4. `model_executor/model_runner_components/spec_aux_hidden_state.py` `_resolve_dflash_aux_hidden_state`:
   the target layers to capture, and `models/qwen3.py` `Qwen3ForCausalLM.set_dflash_layers_to_capture` /
   `Qwen3Model.forward`: the order the target captures them in;
5. the routing: `model_loader/utils.py` `get_model_architecture` (the Transformers-backend fallback for an
   architecture no model file registers: `resolve_transformers_arch`) -> `models/registry.py`
   `_ModelRegistry.resolve_model_cls`, over the architectures the release registers (every `EntryClass` of its
   `models/*.py`; the drafter files' are the real classes, the others stand for targets);
6. `model_loader/loader.py` `_get_quantization_config` -> `model_loader/weight_utils.py` `get_quant_config`
   -> the quant config's `from_config`, then its supported activation dtypes;
7. `_initialize_model`: the routed class built with that quant config under the model dtype (tensor-parallel
   linears, quant methods and parameters are the wheel's);
8. `DefaultModelLoader.load_weights_and_postprocess`: `model.load_weights` over every tensor of the
   checkpoint, then each module's `process_weights_after_loading` where it checks something on CPU;
9. `speculative/dflash_worker_v2.py` `DFlashWorkerV2.__init__`: `set_block_size`, the mask-token resolution,
   the block's position offsets (`speculative/draft_worker_common.py` `build_block_pos_offsets`);
10. `DFlashWorkerV2.init_cuda_graphs`: the draft decode graph's logits buffer
   (`model_executor/graph_shared_output.py` `GraphSharedOutput.get_logits_buffer`). These two buffers are built
   on the meta device; one larger than any accelerator holds is the out-of-memory failure of a boot (R).

The outcome (`Outcome`): L (loads the trained function), R (refuses with a message), C (crashes with an untyped
error), SW (loads, but serves another function), U (the harness cannot decide it: a step needs what it does not
have, the target's tokenizer). `Outcome.model` names the class the routing built, and for which architecture.

SW is judged from the loaded model: a parameter no checkpoint tensor wrote (it serves its constructor's value),
a tensor no parameter took (its trained function is lost), a quantized tensor read as plain floats, target
features concatenated in another order than the trained one, attention run with another causality or window
than the checkpoint declares; and, where loading cannot show it, from what the release built or parsed: a norm
of another kind than `use_gemma_norm` declares (Gemma's x*(1+w) or RMSNorm's x*w), a rotary width other than
`rope_scaling.rope_dim`, a DSpark draft fed another mask token than its `dflash_config.mask_token_id`.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import logging
import math
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from ..served import bounded_buffer, bounded_build, degenerate_numerics
from . import infra
from .wheel import StubUsed, extract, install

# the exceptions a loader raises on purpose, with a message (anything else is a crash)
TYPED = (ValueError, NotImplementedError, RuntimeError)


class Outcome(NamedTuple):
    verdict: str  # "L" | "R" | "C" | "SW" | "U"
    detail: str  # the refusal's message, the crash, what is served wrongly, or what the harness lacks
    step: str  # the step that decided it ("" when it loads)
    # the class the routing built, for which declared architectures: "DFlash2DraftModel (models/dflash.py) for
    # ['DFlash2BeamDraftModel']" ("" when no class was routed)
    model: str = ""

    @property
    def loads(self) -> bool:
        return self.verdict == "L"


class Decided(Exception):
    def __init__(self, outcome: Outcome):
        super().__init__(outcome.detail)
        self.outcome = outcome


class ForeignQuantMethod:
    """A registered quantization method other than ModelOpt's. SGLang asks every method whether it claims a
    checkpoint's config (`override_quantization_method`); on CUDA the others answer only for their own
    `quant_method` values (awq, gptq, moe_wna16, mlx, humming; petit only on ROCm), never for ModelOpt's."""

    def __init__(self, name: str):
        self.name = name

    def override_quantization_method(self, hf_quant_config, user_quant):
        return None

    def from_config(self, config):
        raise StubUsed(f"the {self.name} quantization method is not modelled")


class Engine:
    """One release's loader, imported from its unpacked wheel at `root` (installs the wheel's importer: see
    releases.py for loading and unloading releases one after another)."""

    def __init__(self, root: Path, version: str = ""):
        self.root = root
        self.version = version
        self.routed = ""  # the last serve's routed class (Outcome.model)
        self.built: Any = None  # the last serve's model, once the release built one (for direct inspection)
        self.finder = install(root, infra.WHOLE, infra.PARTIAL, infra.stubs(root))
        # the wheel logs hardware advice (no flashinfer, experimental FP8) that says nothing about the checkpoint
        logging.getLogger("sglang").setLevel(logging.ERROR)
        import importlib

        # dflash.py decorates its forward-only helpers with torch.compile at import; compiling is serving
        # infrastructure, and importing the compiler costs seconds
        with _patched(torch, "compile", _no_compile):
            self._import_all(importlib)

    def _import_all(self, importlib) -> None:
        srt = self.root / "sglang" / "srt"

        self.modelopt = importlib.import_module("sglang.srt.layers.quantization.modelopt_quant")
        registry_names = _dict_keys(
            srt / "layers" / "quantization" / "__init__.py", "BASE_QUANTIZATION_METHODS"
        )
        real = {
            "modelopt": self.modelopt.ModelOptFp8Config,
            "modelopt_fp8": self.modelopt.ModelOptFp8Config,
            "modelopt_fp4": self.modelopt.ModelOptFp4Config,
            "modelopt_mixed": self.modelopt.ModelOptMixedPrecisionConfig,
        }
        methods = {name: real.get(name) or ForeignQuantMethod(name) for name in registry_names}
        quantization = importlib.import_module("sglang.srt.layers.quantization")
        quantization.QUANTIZATION_METHODS = methods
        quantization.get_quantization_config = lambda name: _registered(methods, name)
        self.model_config = importlib.import_module("sglang.srt.configs.model_config")
        self.model_config.QUANTIZATION_METHODS = methods
        # ModelConfig.__init__ takes its hf_text_config from utils/hf_transformers/common.py get_hf_text_config (a
        # top-level text_config, null included, must carry num_attention_heads): the wheel's own definitions
        from transformers import PretrainedConfig

        patches = extract(srt / "utils" / "hf_transformers_patches.py", ["normalize_rope_scaling_compat"], {})
        self.get_hf_text_config = extract(
            srt / "utils" / "hf_transformers" / "common.py",
            ["_patch_text_config", "get_hf_text_config"],
            {
                "torch": torch,
                "PretrainedConfig": PretrainedConfig,
                "normalize_rope_scaling_compat": patches["normalize_rope_scaling_compat"],
            },
        )["get_hf_text_config"]
        self.loader_utils = importlib.import_module("sglang.srt.model_loader.utils")
        self.weight_utils = importlib.import_module("sglang.srt.model_loader.weight_utils")
        self.weight_utils.get_quantization_config = quantization.get_quantization_config
        self.weight_utils.ModelOptFp4Config = self.modelopt.ModelOptFp4Config
        self.weight_utils.ModelOptFp8Config = self.modelopt.ModelOptFp8Config
        self.dflash_utils = importlib.import_module("sglang.srt.speculative.dflash_utils")
        self.dflash = importlib.import_module("sglang.srt.models.dflash")
        self.lilicorr = importlib.import_module("sglang.srt.models.lilicorr")
        self.qwen3 = importlib.import_module("sglang.srt.models.qwen3")
        self.worker = importlib.import_module("sglang.srt.speculative.dflash_worker_v2")
        self.draft_common = importlib.import_module("sglang.srt.speculative.draft_worker_common")
        self.graph_output = importlib.import_module("sglang.srt.model_executor.graph_shared_output")
        self.dspark = importlib.import_module("sglang.srt.models.dspark")
        self.dspark_config = importlib.import_module("sglang.srt.speculative.dspark_components.dspark_config")
        # every architecture the wheel registers (models/*.py EntryClass); the drafter classes are the real ones
        drafters = {
            cls.__name__: cls for m in (self.dflash, self.lilicorr, self.dspark) for cls in m.EntryClass
        }
        models: dict[str, Any] = {
            name: TargetModelClass(name, file) for name, file in _entry_classes(srt / "models")
        }
        models.update(drafters)
        registry_module = importlib.import_module("sglang.srt.models.registry")
        self.registry = registry_module._ModelRegistry()
        self.registry.models = models
        self.registry._load_default_models = lambda: None
        # get_model_architecture imports the module's ModelRegistry (the real one imports every model file)
        registry_module.ModelRegistry = self.registry

    # ------------------------------------------------------------------ the steps

    def serve(
        self, path: Path, *, target_layers: int | None = None, target_vocab: int | None = None
    ) -> Outcome:
        """What this release does with the draft at `path` for a Qwen3 target of `target_layers` layers and
        `target_vocab` rows (default: the draft's num_target_layers and vocab_size). Raises StubUsed where the
        release reaches serving infrastructure the harness does not model (a harness gap, not a verdict)."""
        self.routed = ""
        self.built = None
        try:
            outcome = self._serve(Path(path), target_layers, target_vocab)
        except Decided as d:
            outcome = d.outcome
        except NotExecuted as exc:
            outcome = Outcome("U", str(exc), "not executed")
        return outcome._replace(model=self.routed)

    def _serve(self, path: Path, target_layers: int | None, target_vocab: int | None) -> Outcome:
        from transformers import AutoConfig

        hf_config = self._step("config", lambda: AutoConfig.from_pretrained(str(path)))
        draft = self._step(
            "block size", lambda: self.dflash_utils.parse_dflash_draft_config(draft_hf_config=hf_config)
        )
        block_size = draft.resolve_block_size(default=None) or 16  # _handle_dflash: failures warn, default 16
        mc = self._step("quantization", lambda: self._model_config(path, hf_config))
        hf_config = mc.hf_config  # _config_draft_model may replace it
        raw = json.loads((path / "config.json").read_text())
        if target_layers is None:
            nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
            # unstated, the target is one deep enough for the draft's taps, the deepest not its last layer (which
            # SGLang never captures: LC148 judges that with --target); validate cannot judge the target's
            # depth without --target, so neither may the harness)
            taps = nested.get("target_layer_ids", raw.get("target_layer_ids"))
            deepest = (
                max((t for t in taps if _int_or(t, -1) >= 0), default=-1) if isinstance(taps, list) else -1
            )
            target_layers = _int_or(
                raw.get("num_target_layers", nested.get("num_target_layers")), max(4, deepest + 2)
            )
            if target_layers > MAX_TARGET_LAYERS:
                target_layers = 4  # the target is the user's model: no real one has that many layers
        if target_vocab is None:
            target_vocab = _int_or(raw.get("vocab_size"), 0)
        expected_layers, captured = self._step(
            "target layers", lambda: self._capture(hf_config, target_layers)
        )

        cls, arch = self._step("model class", lambda: self.loader_utils.get_model_architecture(mc))
        declared = list(getattr(hf_config, "architectures", None) or [])
        file = cls.file if isinstance(cls, TargetModelClass) else _file_of(cls)
        self.routed = f"{getattr(cls, '__name__', arch)} ({file}) for {declared}"
        if isinstance(cls, TargetModelClass):
            raise Decided(
                Outcome(
                    "C",
                    f"architectures {declared} resolve to {arch} ({cls.file}), a model with no "
                    "draft head: the DFLASH worker reads draft_model.candidate_selector "
                    "(AttributeError)",
                    "model class",
                )
            )
        quant_config = self._step("quant config", lambda: self._quant_config(mc, cls))

        def build() -> Any:
            # model_loader/loader.py: the build runs under set_default_torch_dtype(model_config.dtype), which
            # refuses a dtype _get_and_verify_dtype passed through unmapped (a non-string torch_dtype)
            with _default_dtype(mc.dtype), bounded_build():
                return cls(config=hf_config, quant_config=quant_config)

        model = self._step("model", build)
        self.built = model
        tensors = _read_tensors(path)
        for p in model.parameters():  # the values a constructor leaves are told apart from loaded ones
            _fill_sentinel(p.data)
        taken: dict[int, tuple[str, torch.dtype]] = {}
        read: dict[str, int] = {}
        with self._recording(model, taken), _counting_reads(tensors, read):
            self._step("load_weights", lambda: model.load_weights(iter(list(tensors.items()))))
        rescaled = self._fused_global_scales(model)
        self._step("postprocess", lambda: self._postprocess(model))
        self._step("worker", lambda: self._worker(model, hf_config, block_size, target_vocab))
        self._step("draft graphs", lambda: self._draft_graphs(mc, block_size, target_vocab))
        parsed = self._step("draft config", lambda: self._served_config(cls, hf_config))
        return self._judge(
            model, hf_config, raw, tensors, taken, captured, expected_layers, rescaled, parsed, read=read
        )

    def _step(self, step: str, fn):
        try:
            return fn()
        except StubUsed:
            raise
        except TYPED as exc:
            raise Decided(Outcome("R", f"{type(exc).__name__}: {exc}", step)) from exc
        except Exception as exc:  # noqa: BLE001 - an untyped error is the verdict, not a harness failure
            raise Decided(Outcome("C", f"{type(exc).__name__}: {exc}", step)) from exc

    def _model_config(self, path: Path, hf_config) -> Any:
        cls = self.model_config.ModelConfig
        mc = cls.__new__(cls)
        mc.__dict__.update(
            hf_config=hf_config,
            hf_text_config=self.get_hf_text_config(hf_config),
            model_path=str(path),
            revision=None,
            quantization=None,
            is_draft_model=True,
            is_draft_quantization_explicit=False,
            speculative_algorithm="DFLASH",
            # the server's defaults for a text-only draft (--model-impl auto); what get_model_architecture reads
            model_impl=self.model_config.ModelImpl.AUTO,
            is_generation=True,
            is_multimodal=False,
            is_embedding_gemma=False,
        )
        mc._config_draft_model()
        mc._verify_quantization()
        mc.dtype = self.model_config._get_and_verify_dtype(hf_config, "auto")
        return mc

    def _quant_config(self, mc, cls) -> Any:
        """model_loader/loader.py _get_quantization_config, CPU part (no device-capability check)."""
        if mc.quantization is None:
            return None
        load_config = types.SimpleNamespace(download_dir=None, model_loader_extra_config={})
        packed = copy.deepcopy(getattr(cls, "packed_modules_mapping", {}))
        qc = self.weight_utils.get_quant_config(mc, load_config, packed, getattr(cls, "remap_prefix", None))
        if qc is None:
            return None
        if mc.dtype not in qc.get_supported_act_dtypes():
            raise ValueError(f"{mc.dtype} is not supported for quantization method {mc.quantization}")
        return qc

    def _capture(self, hf_config, target_layers: int) -> tuple[list[int], list[int]]:
        """spec_aux_hidden_state.py _resolve_dflash_aux_hidden_state, then the Qwen3 target's capture loop:
        (the target layer ids fc was built for, in fc's order; the layers whose outputs reach fc, in the order
        they are concatenated)."""
        parsed = self.dflash_utils.parse_dflash_draft_config(draft_hf_config=hf_config)
        draft_layers = parsed.require_num_layers()
        layer_ids = parsed.resolve_target_layer_ids(
            target_num_layers=target_layers, draft_num_layers=draft_layers
        )
        target = types.SimpleNamespace(
            pp_group=types.SimpleNamespace(is_last_rank=True, is_first_rank=True),
            model=types.SimpleNamespace(layers_to_capture=[]),
        )
        self.qwen3.Qwen3ForCausalLM.set_dflash_layers_to_capture(target, list(layer_ids))
        return list(layer_ids), _run_capture_loop(self.qwen3, target.model.layers_to_capture, target_layers)

    def _recording(self, model, taken: dict[int, tuple[str, torch.dtype]]):
        """Record which checkpoint tensor reached which parameter's loader (by the tensor's identity)."""
        names = {id(p): n for n, p in model.named_parameters()}

        def wrap(loader):
            def recorded(param, loaded_weight, *args, **kwargs):
                taken[id(loaded_weight)] = (names.get(id(param), "?"), param.dtype)
                return loader(param, loaded_weight, *args, **kwargs)

            return recorded

        stack = contextlib.ExitStack()
        for _, p in model.named_parameters():
            if "_weight_loader" in p.__dict__:  # layers/parameter.py BasevLLMParameter: a read-only property
                p._weight_loader = wrap(p._weight_loader)
            elif hasattr(p, "weight_loader"):
                p.weight_loader = wrap(p.weight_loader)
        for module in (self.dflash, self.lilicorr, self.dspark):
            if "default_weight_loader" in module.__dict__:
                stack.enter_context(
                    _patched(module, "default_weight_loader", wrap(module.default_weight_loader))
                )
        return stack

    def _fused_global_scales(self, model) -> list[str]:
        """NVFP4 linears fused from shards whose loaded weight_scale_2 differ: process_weights_after_loading serves
        every shard with the largest (`weight_scale_2.max()`), which rescales the others' weights."""
        out = []
        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(
                method, (self.modelopt.ModelOptNvFp4A16LinearMethod, self.modelopt.ModelOptFp4LinearMethod)
            ):
                scales = module.weight_scale_2.detach().float()
                if scales.numel() > 1 and not bool((scales == scales[0]).all()):
                    out.append(f"{name} {[round(float(v), 6) for v in scales]}")
        return out

    def _postprocess(self, model) -> None:
        """process_weights_after_loading of the NVFP4 linear methods, as on an SM80-SM90 GPU (Marlin kernels,
        whose repacking is stubbed): where they check the group size."""
        for module in model.modules():
            method = getattr(module, "quant_method", None)
            if isinstance(
                method, (self.modelopt.ModelOptNvFp4A16LinearMethod, self.modelopt.ModelOptFp4LinearMethod)
            ):
                method.process_weights_after_loading(module)

    def _served_config(self, cls, hf_config) -> Any:
        """The DSpark worker's view of the draft (dspark_worker_v2.py -> dspark_config.py resolve_runtime_config ->
        parse_dspark_draft_config: the mask token it feeds the draft), for a class of models/dspark.py; else None."""
        if getattr(cls, "__module__", "") != self.dspark.__name__:
            return None
        return self.dspark_config.parse_dspark_draft_config(draft_hf_config=hf_config)

    def _worker(self, model, hf_config, block_size: int, target_vocab: int) -> None:
        """dflash_worker_v2.py DFlashWorkerV2.__init__: the checks that read the draft."""
        parsed = self.dflash_utils.parse_dflash_draft_config(draft_hf_config=hf_config)
        model.set_block_size(block_size)
        if parsed.is_domino and block_size <= 1:
            raise ValueError(f"DFLASH Domino requires speculative_num_draft_tokens > 1, got {block_size}.")
        worker = types.SimpleNamespace(
            target_worker=types.SimpleNamespace(
                model_runner=types.SimpleNamespace(
                    model_config=types.SimpleNamespace(vocab_size=target_vocab)
                ),
                tokenizer=None,
            )
        )
        if parsed.mask_token_id is None:
            raise NotExecuted(
                "the mask token is resolved through the target's tokenizer, which the harness does not load"
            )
        self.worker.DFlashWorkerV2._resolve_mask_token_id(
            worker, mask_token=parsed.mask_token, mask_token_id=parsed.mask_token_id
        )
        # then the block's position offsets, on the worker's device
        bounded_buffer(
            self.draft_common.build_block_pos_offsets(length=block_size, device=torch.device("meta")),
            "DFlashWorkerV2._block_pos_offsets (draft_worker_common.build_block_pos_offsets)",
        )

    def _draft_graphs(self, mc, block_size: int, target_vocab: int) -> None:
        """dflash_worker_v2.py init_cuda_graphs (captured by default on CUDA): the draft runner's decode graph takes
        its logits buffer from model_executor/graph_shared_output.py GraphSharedOutput.get_logits_buffer, one float32
        row of the draft runner's ModelConfig.vocab_size per token (the draft config's; draft_worker_common.py
        gives a draft without one the target's); one request's block is a lower bound on its rows."""
        vocab = mc.hf_text_config.vocab_size
        if vocab is None:
            vocab = target_vocab
        shared = self.graph_output.GraphSharedOutput(device=torch.device("meta"), max_rows=block_size)
        bounded_buffer(
            shared.get_logits_buffer(vocab, rows=block_size),
            "the draft decode graph's logits buffer (GraphSharedOutput.get_logits_buffer)",
        )

    # ------------------------------------------------------------------ what is served

    def _judge(
        self,
        model,
        hf_config,
        raw: dict[str, Any],
        tensors,
        taken,
        captured: list[int],
        expected_layers: list[int],
        rescaled: list[str],
        dspark: Any = None,
        *,
        read: dict[str, int],
    ) -> Outcome:
        wrong: list[str] = direct_checks(model, raw, dspark)
        degenerate = degenerate_numerics(model)
        if degenerate is not None and degenerate[0] == "C":
            return Outcome("C", degenerate[1], "first draft step")
        if degenerate is not None:
            wrong.append(degenerate[1])
        if rescaled:
            wrong.append(
                f"fused NVFP4 shards with different weight_scale_2 are served with the largest: {rescaled[:2]}"
            )
        unwritten = [n for n, p in model.named_parameters() if _still_sentinel(p.data)]
        if unwritten:
            wrong.append(
                f"{len(unwritten)} parameters keep their constructor's values (e.g. {unwritten[:4]})"
            )
        # DSpark's confidence head only drives ragged verify, off by default (SGLANG_RAGGED_VERIFY_MODE=static):
        # the model then builds none and skips its tensors
        unused = (
            ("confidence_head.",)
            if "confidence_head" in model.__dict__ and model.confidence_head is None
            else ()
        )
        dropped = [
            n
            for n, t in tensors.items()
            if id(t) not in taken and not _discardable(n, raw) and not n.startswith(unused)
        ]
        if dropped:
            wrong.append(f"{len(dropped)} checkpoint tensors are dropped (e.g. {dropped[:4]})")
        cast = [
            f"{name} ({t.dtype} into {pdtype})"
            for t in tensors.values()
            for name, pdtype in [taken.get(id(t), (None, None))]
            if name and t.dtype in _FP8 and pdtype not in _FP8
        ]
        if cast:
            wrong.append(f"FP8 tensors read as plain floats, their scales ignored: {cast[:3]}")
        # a wider float tensor copied into an FP8 parameter (a BF16 weight_scale): layers/parameter.py copies it
        # with a cast, which rounds the values E4M3 cannot hold
        lossy = sorted(
            f"{name} ({t.dtype} into {pdtype})"
            for name, t in tensors.items()
            for _, pdtype in [taken.get(id(t), (None, None))]
            if pdtype in _FP8
            and t.dtype.is_floating_point
            and t.dtype not in _FP8
            and not torch.equal(torch.nan_to_num(t.to(pdtype).float()), torch.nan_to_num(t.float()))
        )
        if lossy:
            wrong.append(f"tensors cast into an FP8 parameter lose their values: {lossy[:3]}")
        # layers/linear.py and the models' loaders narrow a checkpoint tensor larger than its parameter (or
        # its shard of a fused one) to the slice they copy: the rest is never read
        narrowed = sorted(n for n, count in read.items() if 0 < count < tensors[n].numel())
        if narrowed:
            wrong.append(f"checkpoint tensors narrowed to their parameter: {narrowed[:4]}")
        # an integer tensor copied into a float parameter (or back): its values were never the module's
        recast = sorted(
            name
            for name, t in tensors.items()
            for _, pdtype in [taken.get(id(t), (None, None))]
            if pdtype is not None and t.dtype.is_floating_point != pdtype.is_floating_point
        )
        if recast:
            wrong.append(f"integer tensors cast into float parameters (or back): {recast[:4]}")
        if len(captured) == len(expected_layers) and captured != expected_layers:
            wrong.append(
                f"the target captures layers {captured} for target_layer_ids {expected_layers}: fc reads "
                "a permuted concatenation"
            )
        attention = [a for a in model.modules() if isinstance(a, infra.RadixAttention)]
        declared = _declared_causal(hf_config)
        if declared is not None:
            run = {a.attn_type for a in attention if a.sliding_window_size == -1}
            want = infra.AttentionType.DECODER if declared else infra.AttentionType.ENCODER_ONLY
            if run and run != {want}:
                wrong.append(
                    f"full-attention layers run {sorted(run)} while the checkpoint declares "
                    f"{'causal' if declared else 'bidirectional'} attention"
                )
        windows = _declared_windows(raw, len(attention))
        if windows is not None:
            served = [
                None if a.sliding_window_size == -1 else a.sliding_window_size + 1
                for a in sorted(attention, key=lambda a: a.layer_id)
            ]
            if served != windows:
                wrong.append(f"attention windows {served} per layer, the checkpoint declares {windows}")
        if wrong:
            return Outcome("SW", "; ".join(wrong), "served function")
        if len(captured) != len(expected_layers):
            return Outcome(
                "R",
                f"the target captures {len(captured)} layers for {len(expected_layers)} target "
                "layer ids: project_target_hidden refuses the first batch (feature dim mismatch)",
                "first batch",
            )
        return Outcome("L", "", "")


# the DFlash backbone's norms, which use_gemma_norm governs (models/dflash.py DFlashAttention q/k norms,
# DFlashDecoderLayer's two layer norms, DFlashDraftModel's norm and hidden_norm)
_BACKBONE_NORM = re.compile(
    r"(^|.*\.)(q_norm|k_norm|input_layernorm|post_attention_layernorm|norm|hidden_norm)"
)


def direct_checks(model, raw: dict[str, Any], dspark: Any = None) -> list[str]:
    """What the release built or parsed against what config.json declares, where loading the tensors cannot show
    a difference (the norms' and rotary's parameters load alike whatever their kind): a list of what is served
    wrongly (empty: nothing)."""
    wrong: list[str] = []
    gemma = bool(raw.get("use_gemma_norm", False))
    want = infra.GemmaRMSNorm if gemma else infra.RMSNorm
    other = [
        f"{name} {type(m).__name__}"
        for name, m in model.named_modules()
        if isinstance(m, (infra.RMSNorm, infra.GemmaRMSNorm))
        and _BACKBONE_NORM.fullmatch(name)
        and not isinstance(m, want)
    ]
    if other:
        wrong.append(
            f"use_gemma_norm is {str(gemma).lower()} (the draft was trained with "
            f"{'x*(1+w)' if gemma else 'x*w'}) but {len(other)} backbone norms are built as the other kind "
            f"(e.g. {other[:3]})"
        )
    rope_dim = _declared_rope_dim(raw)
    if rope_dim is not None:
        widths = sorted({m.rotary_dim for m in model.modules() if isinstance(m, infra.Rotary)})
        if widths and widths != [rope_dim]:
            wrong.append(
                f"rope_scaling.rope_dim is {rope_dim} (the trained rotary width) but the rotary embedding turns "
                f"{widths} dimensions of each head"
            )
    if dspark is not None:
        trained = _declared_mask_token(raw)
        if trained is not None and dspark.mask_token_id != trained:
            wrong.append(
                f"the DSpark worker feeds mask token {dspark.mask_token_id} (parse_dspark_draft_config), the "
                f"draft was trained with dflash_config.mask_token_id {trained}"
            )
    return wrong


def _declared_rope_dim(raw: dict[str, Any]) -> int | None:
    for key in ("rope_parameters", "rope_scaling"):
        block = raw.get(key)
        if isinstance(block, dict) and isinstance(block.get("rope_dim"), int):
            return int(block["rope_dim"])
    return None


def _declared_mask_token(raw: dict[str, Any]) -> int | None:
    """The mask token the draft was trained with: dflash_config's (what parse_dflash_draft_config and the
    producers use), else the top-level one."""
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    for value in (nested.get("mask_token_id"), raw.get("mask_token_id")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _file_of(cls) -> str:
    return "models/" + getattr(cls, "__module__", "?").rsplit(".", 1)[-1] + ".py"


class TargetModelClass:
    """A registered architecture that is not a drafter (a target model, or the Transformers fallback)."""

    def __init__(self, name: str, file: str):
        self.name = name
        self.file = file


def _entry_classes(models: Path) -> list[tuple[str, str]]:
    """(class name, file) for each `EntryClass = ...` of the wheel's models package."""
    out: list[tuple[str, str]] = []
    for file in sorted(models.glob("*.py")):
        text = file.read_text()
        match = re.search(r"^EntryClass\s*=\s*(\[[^\]]*\]|[A-Za-z_]\w*)", text, re.M)
        if not match:
            continue
        node = ast.parse(match.group(1), mode="eval").body
        for element in node.elts if isinstance(node, ast.List) else [node]:
            if isinstance(element, ast.Name):
                out.append((element.id, f"models/{file.name}"))
    return out


class NotExecuted(StubUsed):
    """A step that needs something the harness does not have (the target's tokenizer)."""


_FP8 = (torch.float8_e4m3fn,)


def _discardable(name: str, raw: dict[str, Any]) -> bool:
    """A tensor SGLang may drop without changing the trained function: a derived rotary buffer, or a frozen
    copy of the target's input table or head (the draft runs on the target's own), unless the config says
    the draft owns its head."""
    bare = name.removeprefix("model.")
    if bare.endswith("rotary_emb.inv_freq"):
        return True
    if bare == "embed_tokens.weight":
        return True
    return bare == "lm_head.weight" and not raw.get("has_own_lm_head")


def _declared_windows(raw: dict[str, Any], num_layers: int) -> list[int | None] | None:
    """Each draft layer's attention window as config.json declares it (None: full), or None when it does not
    say: `layer_types` with the top-level `sliding_window`, or dflash_config `use_swa` (every layer sliding
    over `swa_window_size`) when there are no `layer_types`."""
    nested = raw.get("dflash_config") or {}
    types_ = raw.get("layer_types")
    if isinstance(types_, list) and len(types_) == num_layers:
        window = raw.get("sliding_window")
        if any(t == "sliding_attention" for t in types_) and not isinstance(window, int):
            return None
        return [window if t == "sliding_attention" else None for t in types_]
    if types_ is None and nested.get("use_swa") is True and isinstance(nested.get("swa_window_size"), int):
        return [nested["swa_window_size"]] * num_layers
    return None


def _declared_causal(hf_config) -> bool | None:
    """The attention the checkpoint was trained with: `is_causal`, else dflash_config.causal (None: unsaid)."""
    value = getattr(hf_config, "is_causal", None)
    if value is None:
        value = (getattr(hf_config, "dflash_config", None) or {}).get("causal")
    return None if value is None else bool(value)


def _run_capture_loop(qwen3, layers_to_capture: list[int], num_layers: int) -> list[int]:
    """Qwen3Model.forward with each decoder layer replaced by one that tags the residual stream with its index;
    the captured tags are the target layers fc receives, in order (layer i+1 captures layer i's output)."""

    class Tagged:
        def __init__(self, i: int):
            self.i = i

        def __call__(self, positions, hidden_states, forward_batch, capture_output=None):
            if capture_output is not None:
                capture_output(hidden_states)
            return torch.full_like(hidden_states, float(self.i))

    model = types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_first_rank=True, is_last_rank=True),
        layers=[Tagged(i) for i in range(num_layers)],
        start_layer=0,
        end_layer=num_layers,
        layers_to_capture=list(layers_to_capture),
        norm=None,
    )
    start = torch.full((1, 1), -1.0)
    residual = types.SimpleNamespace(
        start=lambda fb: None,
        final_norm=lambda h, fb, norm, skip_empty=True: h,
        # SGLang 0.5.21 (qwen3.py Qwen3Model.forward): complete_output, then norm
        complete_output=lambda h, fb: h,
        norm=lambda h, fb, norm: h,
    )
    with _patched(qwen3, "residual_batch", residual):
        out = qwen3.Qwen3Model.forward(model, None, None, None, input_embeds=start)
    aux = out[1] if isinstance(out, tuple) else []
    return [int(t.item()) for t in aux]


def _no_compile(fn=None, **_: Any):
    return fn if fn is not None else (lambda f: f)


def _registered(methods: dict[str, Any], name: str):
    if name not in methods:
        raise ValueError(f"Invalid quantization method: {name}. Available methods: {list(methods)}")
    return methods[name]


def _dict_keys(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(
                node.value, ast.Dict
            ):
                return [ast.literal_eval(k) for k in node.value.keys]
    raise RuntimeError(f"{path}: no dict literal {name}")


# the largest target the harness builds from a draft's num_target_layers (a larger value describes no real target)
MAX_TARGET_LAYERS = 1024


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _patched(module, name: str, value) -> Iterator[None]:
    old = module.__dict__[name]
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """safetensors_weights_iterator's order: each file (sorted), its tensors in header order."""
    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no iterator
                out[name] = f.get_tensor(name)
    return out


@contextlib.contextmanager
def _counting_reads(tensors: dict[str, torch.Tensor], read: dict[str, int]) -> Iterator[None]:
    """How many values of each checkpoint tensor the loaders copy (Tensor.copy_ out of its storage, views
    included): every released weight loader writes a parameter through copy_."""
    by_storage = {t.untyped_storage().data_ptr(): n for n, t in tensors.items() if t.numel()}
    original = torch.Tensor.copy_

    def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if isinstance(src, torch.Tensor) and src.numel():
            name = by_storage.get(src.untyped_storage().data_ptr())
            if name is not None:
                read[name] = read.get(name, 0) + src.numel()
        return original(dst, src, non_blocking)

    torch.Tensor.copy_ = copy_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.copy_ = original  # type: ignore[method-assign]


_SENTINEL_BYTE = 0xA7


def _fill_sentinel(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(math.nan)
    else:
        t.view(torch.uint8).fill_(_SENTINEL_BYTE) if t.element_size() == 1 else t.fill_(-7777)


def _still_sentinel(t: torch.Tensor) -> bool:
    """Some row (or the scalar) of `t` still holds the fill: no loaded tensor wrote it."""
    if t.numel() == 0:
        return False
    if t.is_floating_point():
        flat = torch.isnan(t.float()).reshape(t.shape[0] if t.dim() else 1, -1)
    elif t.element_size() == 1:
        flat = (t.view(torch.uint8) == _SENTINEL_BYTE).reshape(t.shape[0] if t.dim() else 1, -1)
    else:
        flat = (t == -7777).reshape(t.shape[0] if t.dim() else 1, -1)
    return bool(flat.all(dim=-1).any())
