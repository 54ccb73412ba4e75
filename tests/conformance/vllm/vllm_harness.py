"""Serve a drafter checkpoint with the released vLLM's own start-up and loading code, on CPU, and say what it
does: refuse (R), crash with an untyped error (C), load (L), or load but serve another function (SW).

The steps follow `vllm serve TARGET --speculative-config '{"method": ..., "model": DRAFT}'` for a draft
checkpoint directory, each naming the released code it runs:

1. config      transformers_utils/config.py `get_config` (the HF config, its quantization_config from
               config.json or hf_quant_config.json, RoPE patching);
2. quant       model_arch_config_convertor.py `_normalize_quantization_config`, config/model.py
               `_verify_quantization` (the quant method the checkpoint declares);
3. speculative config/speculative.py's method handling: method "dspark" for DSpark architectures, else
               "dflash", whose draft config is wrapped in transformers_utils/configs/eagle.py `EAGLEConfig`
               (the architecture rewrite), then models/registry.py `_SPECULATIVE_DECODING_MODELS`;
4. speculator  v1/worker/gpu/spec_decode/__init__.py's choice of speculator and its constructor's checks;
5. build       the model class's constructor (its config checks, the quant config's discovery through
               models/utils.py `get_draft_quant_config` and its exclusion matching per layer);
6. load        the model's `load_weights` over the checkpoint's tensors (AutoWeightsLoader, the weight
               loaders), then each quant method's `process_weights_after_loading`;
7. taps        eagle3_utils.py `get_eagle3_aux_layers_from_config` and interfaces.py
               `EagleModelMixin._set_aux_hidden_state_layers`: which target layers feed fc, in which order;
8. function    the loaded parameters compared with the checkpoint's tensors: a trained tensor the loader
               dropped, or a parameter served at its initialisation, is a silent change of function.

The harness stands in for the engine only where a real engine would use serving infrastructure: the target
model (num_target_layers layers of the draft's width, the draft's vocabulary), one GPU rank, no CUDA kernels.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import vllm_stubs as S
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from vllm_sandbox import SandboxError

# a refusal with a message (transformers' config classes validate their fields as strict dataclasses)
TYPED = (ValueError, RuntimeError, NotImplementedError, StrictDataclassError)


class Outcome(NamedTuple):
    verdict: str  # "L" | "R" | "C" | "SW"
    stage: str
    detail: str
    facts: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.verdict} at {self.stage}: {self.detail}"


class Stop(Exception):
    def __init__(self, verdict: str, stage: str, detail: str):
        super().__init__(detail)
        self.verdict, self.stage, self.detail = verdict, stage, detail


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Classify what the released code raises in this step: a typed refusal (R) or an untyped crash (C)."""
    try:
        yield
    except Stop:
        raise
    except (S.InfrastructureCalled, SandboxError):
        raise
    except TYPED as exc:
        raise Stop("R", name, f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # KeyError, IndexError, TypeError, AssertionError, AttributeError, ...
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" ({Path(frame.filename).name}:{frame.lineno} {frame.name})"
        raise Stop("C", name, f"{type(exc).__name__}: {exc}{where}") from exc


class TargetShape(NamedTuple):
    """The target model the draft is served with (only its shape matters to loading)."""

    num_layers: int
    vocab_size: int
    hidden_size: int


def target_for(config: dict[str, Any]) -> TargetShape:
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    layers = config.get("num_target_layers") or dflash.get("num_target_layers") or 4
    hidden = config.get("target_hidden_size") or config.get("hidden_size") or 64
    return TargetShape(int(layers), int(config.get("vocab_size") or 512), int(hidden))


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in the order vLLM's safetensors iterator yields them (file by file)."""
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    out: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no iteration protocol
                out[key] = f.get_tensor(key)
    return out


class CopyLog:
    """Which checkpoint tensor was written into which parameter, by storage: patches Tensor.copy_ while a
    load runs (every released weight loader writes through copy_)."""

    def __init__(self, tensors: dict[str, torch.Tensor], params: dict[str, torch.Tensor]):
        self.by_source = {t.untyped_storage().data_ptr(): n for n, t in tensors.items() if t.numel()}
        self.by_dest = {p.untyped_storage().data_ptr(): n for n, p in params.items() if p.numel()}
        self.written: dict[str, set[str]] = {}  # checkpoint name -> parameter names

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        original = torch.Tensor.copy_
        log = self

        def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
            if isinstance(src, torch.Tensor) and src.numel():
                source = log.by_source.get(src.untyped_storage().data_ptr())
                if source is not None:
                    dest = log.by_dest.get(dst.untyped_storage().data_ptr(), "?")
                    log.written.setdefault(source, set()).add(dest)
            return original(dst, src, non_blocking)

        torch.Tensor.copy_ = copy_
        try:
            yield
        finally:
            torch.Tensor.copy_ = original


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point and a.element_size() >= 2:
        return bool(
            torch.equal(torch.nan_to_num(a.float(), nan=7.77e7), torch.nan_to_num(b.float(), nan=7.77e7))
        )
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def serve(
    release: Any, path: Path, *, num_speculative_tokens: int | None = None, method: str | None = None
) -> Outcome:
    """What the released vLLM does with the draft checkpoint at `path`."""
    facts: dict[str, Any] = {}
    try:
        return _serve(release, path, facts, num_speculative_tokens, method)
    except Stop as stop:
        return Outcome(stop.verdict, stop.stage, stop.detail, facts)


def _serve(
    release: Any, path: Path, facts: dict[str, Any], num_speculative_tokens: int | None, method: str | None
) -> Outcome:
    raw = json.loads((path / "config.json").read_text())
    target = target_for(raw)

    # 1. the HF config, as ModelConfig reads it
    with stage("config"):
        hf = release.transformers_config.get_config(str(path), trust_remote_code=False)

    # 2. the quant method the checkpoint declares
    with stage("quant"):
        arch = S.Holder(quantization_config=release.convertor._normalize_quantization_config(None, hf))
        model_config = S.Holder(
            quantization=None, model_arch_config=arch, hf_config=hf, allow_deprecated_quantization=False
        )
        release.model_config._verify_quantization(model_config)
    facts["quantization"] = model_config.quantization

    # 3. the speculative method, the EAGLEConfig wrap and the architecture vLLM builds
    architectures = list(hf.architectures or [])
    if method is None:
        method = (
            "dspark"
            if (
                "Qwen3DSparkModel" in architectures
                or ("DSparkDraftModel" in architectures and hf.model_type == "qwen3")
            )
            else "dflash"
        )
    with stage("speculative"):
        if method == "dflash":
            hf = release.eagle.EAGLEConfig(hf, method="dflash", model_type="eagle")
        elif "DSparkDraftModel" in architectures and hf.model_type == "qwen3":
            hf.architectures = ["Qwen3DSparkModel"]  # speculative.py rewrites a Qwen3 DSparkDraftModel
        architectures = list(hf.architectures or [])
        routed = next((a for a in architectures if a in release.registry), None)
        if routed is None:
            raise ValueError(f"Model architectures {architectures} are not supported for now")
    module_name, class_name = release.registry[routed]
    facts["architecture"] = routed
    facts["model_class"] = f"{module_name}.{class_name}"
    if module_name not in release.models:
        raise Stop(
            "U", "speculative", f"routed to {module_name}.{class_name}, which the harness does not execute"
        )
    model_cls = getattr(release.models[module_name], class_name)

    block = (raw.get("dflash_config") or {}).get("block_size", raw.get("block_size"))
    if num_speculative_tokens is None:
        num_speculative_tokens = max(1, int(block) - 1) if isinstance(block, (int, float)) and block else 7
    draft_model_config = S.Holder(
        hf_config=hf,
        model=str(path),
        revision=None,
        quantization=model_config.quantization,
        quantization_config=None,
        hf_overrides={},
        dtype=torch.bfloat16,
        architectures=architectures,
        model_arch_config=arch,
        use_mla=False,
        get_hidden_size=lambda: hf.hidden_size,
        get_vocab_size=lambda: hf.vocab_size,
    )
    speculative_config = S.Holder(
        method=method,
        num_speculative_tokens=num_speculative_tokens,
        draft_model_config=draft_model_config,
        parallel_drafting=True,
        use_local_argmax_reduction=False,
        enable_adaptive_verification=False,
    )
    vllm_config = S.VllmConfig(
        speculative_config=speculative_config,
        model_config=S.Holder(
            get_total_num_hidden_layers=lambda: target.num_layers,
            get_vocab_size=lambda: target.vocab_size,
            get_hidden_size=lambda: target.hidden_size,
            dtype=torch.bfloat16,
        ),
        load_config=S.Holder(download_dir=None, device=None),
        cache_config=S.CacheConfig(cache_dtype="auto"),
        parallel_config=S.Holder(prefill_context_parallel_size=1, decode_context_parallel_size=1),
        scheduler_config=S.Holder(max_num_seqs=2, max_num_batched_tokens=64),
        compilation_config=S.Holder(cudagraph_mode=S.CUDAGraphMode.NONE),
        kernel_config=S.Holder(linear_backend="auto"),
        use_v2_model_runner=True,  # the default for DFlash drafts on a CUDA platform (config/vllm.py)
        quant_config=None,
    )

    with S.current_vllm_config(vllm_config), _default_dtype(torch.bfloat16):
        # 4. the speculator the runner builds first (v1/worker/gpu/spec_decode/__init__.py)
        with stage("speculator"):
            speculator = _speculator_class(release, method, architectures)(vllm_config, torch.device("cpu"))
        facts["mask_token_id"] = speculator.parallel_drafting_token_id

        # 5. the model
        with stage("build"):
            model = model_cls(vllm_config=vllm_config, prefix="")

        # 6. its weights
        tensors = checkpoint_tensors(path)
        params = dict(model.named_parameters())
        before = {n: p.detach().clone() for n, p in params.items()}
        log = CopyLog(tensors, params)
        with stage("load"), log.active():
            model.load_weights(iter(tensors.items()))
        with stage("post-load"):
            for module in model.modules():
                method_obj = module.__dict__.get("quant_method")
                if isinstance(method_obj, release.quantization.base_config.QuantizeMethodBase):
                    method_obj.process_weights_after_loading(module)

    # 7. the target layers fc reads, and their order
    facts.update(_taps(release, model, raw, speculative_config, target))
    if facts.get("taps_problem"):
        verdict, detail = facts["taps_problem"]
        return Outcome(verdict, "taps", detail, facts)

    # 8. the function served
    facts["causal"] = (
        [bool(c) for c in model.get_draft_attn_causal()] if hasattr(model, "get_draft_attn_causal") else None
    )
    facts["sliding_window"] = [layer.self_attn.sliding_window for layer in model.model.layers]
    facts["rope_theta"] = model.model.layers[0].self_attn.rotary_emb.rope_parameters.get("rope_theta")
    facts["quantized"] = sorted(
        name
        for name, module in model.named_modules()
        if "quant_method" in module.__dict__ and type(module.quant_method).__name__ == "ModelOptLinearMethod"
    )
    facts["layer_types"] = list(getattr(hf, "layer_types", None) or [])
    declared = raw.get("layer_types") if isinstance(raw.get("layer_types"), list) else []
    dropped = sorted(n for n in tensors if n not in log.written and not _inert(n))
    written = set().union(*log.written.values()) if log.written else set()
    unused = _unused_after_loading(model)
    unloaded = sorted(
        n
        for n, p in params.items()
        if n not in written and _same(before[n], p.detach()) and _served(model, n) and n not in unused
    )
    # an FP8 scale the checkpoint did not provide keeps vLLM's sentinel (float32 min): served as a real scale
    sentinel = torch.finfo(torch.float32).min
    at_sentinel = sorted(
        n
        for n, p in model.named_parameters()
        if p.dtype == torch.float32 and p.numel() and bool((p.detach() == sentinel).any())
    )
    unloaded = sorted(set(unloaded) | set(at_sentinel))
    facts["dropped"] = dropped
    facts["unloaded"] = unloaded
    if dropped:
        return Outcome("SW", "function", f"trained tensors not loaded: {', '.join(dropped[:6])}", facts)
    if unloaded:
        return Outcome(
            "SW", "function", f"parameters served at their initialisation: {', '.join(unloaded[:6])}", facts
        )
    if not 0 <= facts["mask_token_id"] < target.vocab_size:
        # vocab_parallel_embedding.py get_masked_input_and_mask: an id outside the table embeds as zeros
        return Outcome(
            "SW",
            "function",
            f"mask_token_id {facts['mask_token_id']} lies outside the embedding "
            f"[0, {target.vocab_size}): every mask slot embeds as a zero vector",
            facts,
        )
    # qwen3_dspark.py DSparkMarkovHead: the vanilla head whatever markov_head_type declares
    head_type = getattr(hf, "markov_head_type", None)
    if hasattr(model.model, "markov_head") and head_type not in (None, "vanilla"):
        return Outcome(
            "SW", "function", f"markov_head_type {head_type!r} served as the vanilla Markov head", facts
        )
    # logits_processor.py get_top_k_tokens: the candidate top-k runs over the lm_head's (padded) rows each step
    top_k = getattr(speculator, "top_k", None)
    if top_k is not None:
        rows = model.lm_head.weight.shape[0] if hasattr(model, "lm_head") else target.vocab_size
        try:
            torch.topk(torch.zeros(1, max(rows, target.vocab_size)), int(top_k))
        except RuntimeError as exc:
            return Outcome("R", "first step", f"candidate top-{top_k} over {rows} rows: {exc}", facts)
    # qwen3_dflash.py _resolve_layer_attention: a layer type other than sliding_attention runs full attention
    unknown = sorted({t for t in declared if t not in ("full_attention", "sliding_attention")})
    if unknown:
        return Outcome("SW", "function", f"layer type(s) {unknown} served as full attention", facts)
    return Outcome("L", "function", "loaded", facts)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """base_loader.py `set_default_torch_dtype(model_config.dtype)` around model construction."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _speculator_class(release: Any, method: str, architectures: list[str]) -> Any:
    """v1/worker/gpu/spec_decode/__init__.py `init_speculator`: by method, then by architecture."""
    if method == "dspark":
        return release.speculators["dspark"]
    if "LiLiCorrDraftModel" in architectures:
        return release.speculators["lilicorr"]
    if {"DFlash2DraftModel", "DFlash2BeamDraftModel"} & set(architectures):
        return release.speculators["dflash2"]
    return release.speculators["dflash"]


def _inert(name: str) -> bool:
    """Checkpoint tensors the released loader drops that take no part in the drafted function: qwen3_dflash.py
    `load_weights` skips `t2d` ("training-only"), and AutoWeightsLoader drops recomputed rotary caches
    (REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER)."""
    return "t2d" in name or name.endswith(
        ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
    )


# parameters a served draft does not read from its checkpoint: shared from the target, unused placeholders,
# kv-cache scales without an FP8 cache
def _served(model: Any, name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("k_scale", "v_scale", "q_scale", "prob_scale"):
        return False
    if name == "model.mask_embedding" and not model.model.has_separate_mask_embedding:
        return False
    if name.startswith("model.embed_tokens.") and not getattr(model, "has_own_embed_tokens", False):
        return False  # spec_decode/eagle/utils.py maybe_share_target_embed
    if name.startswith("lm_head.") and not (
        getattr(model, "has_own_lm_head", False) or getattr(model.config, "has_own_lm_head", False)
    ):
        return False  # dflash/utils.py load_dflash_model shares the target's lm_head
    return name != "draft_id_to_target_id"


def _unused_after_loading(model: Any) -> set[str]:
    """Parameters a quant method registers for old exports and discards unread after loading: modelopt.py
    `_DropInputScale` (a W4A16 module's input_scale)."""
    out = set()
    for name, module in model.named_modules():
        spec = getattr(module.__dict__.get("quant_method"), "spec", None)
        if spec is not None and spec.activation is None:
            out.add(f"{name}.input_scale")
    return out


def _taps(
    release: Any, model: Any, raw: dict[str, Any], speculative_config: Any, target: TargetShape
) -> dict[str, Any]:
    """Which target layers feed fc, in which order, against the order the checkpoint was trained with."""
    out: dict[str, Any] = {}
    aux = release.eagle3_utils.get_eagle3_aux_layers_from_config(speculative_config)
    out["aux_layers"] = list(aux) if aux else None
    if not getattr(model.model, "use_aux_hidden_state", False):
        return out

    class TargetModel(release.interfaces.EagleModelMixin):
        start_layer = 0
        layers = [None] * target.num_layers

    holder = TargetModel()
    if not aux:
        # eagle3_utils.py set_eagle3_aux_hidden_state_layers: the target's own default taps
        aux = release.interfaces.SupportsEagle3.get_eagle3_default_aux_hidden_state_layers(holder)
        out["default_taps"] = list(aux)
    holder._set_aux_hidden_state_layers(tuple(aux))
    # the target captures the input of layer i for aux id i, 0 < i <= num_layers (qwen2.py `forward`)
    captured = [i for i in holder.aux_hidden_state_layers if 0 <= i <= target.num_layers]
    out["captured"] = captured
    trained = [i + 1 for i in (raw.get("dflash_config") or {}).get("target_layer_ids") or []]
    width = target.hidden_size * len(captured)
    try:
        model.combine_hidden_states(torch.zeros(1, width))
    except ValueError as exc:
        out["taps_problem"] = ("R", f"at the first draft step, combine_hidden_states: {exc}")
        return out
    except S.InfrastructureCalled:
        pass  # fc's GEMM: the width matched
    if out.get("default_taps"):
        out["taps_problem"] = (
            "SW",
            f"the checkpoint names no target layers: fc reads vLLM's default taps {captured}",
        )
    elif trained and captured != trained:
        out["taps_problem"] = (
            "SW",
            f"fc reads target layers {captured} (aux ids) where the checkpoint was trained on {trained}",
        )
    return out
