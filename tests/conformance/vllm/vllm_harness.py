"""Serve a drafter checkpoint with a released vLLM's own start-up and loading code, on CPU, and say what it
does: refuse (R), crash with an untyped error (C), load (L), or load but serve another function (SW); U when the
release routes it to code the harness does not execute.

    serve(release, path, method=FAMILY) -> Outcome    release: vllm_release.load_release(version)

The steps follow `vllm serve TARGET --speculative-config '{"method": ..., "model": DRAFT}'` for a draft
checkpoint directory, each naming the released code it runs (vllm_release's docstring lists what is executed,
extracted or stubbed in each release):

1. config      transformers_utils/config.py `get_config` with the draft's hf_overrides (config/speculative.py
               `compose_draft_hf_overrides` -> `hf_config_override`: the architecture rewrites, e.g. 0.34's
               DFlash2DraftModel + no_rope_layers -> DFlash2RicursiveDraftModel);
2. quant       model_arch_config_convertor.py `_normalize_quantization_config`, config/model.py
               `_verify_quantization` (the quant method the checkpoint declares);
3. speculative config/speculative.py's method handling, as the release runs it: up to 0.33 the statements of
               `SpeculativeConfig.__post_init__` (method inference and detection, the EAGLEConfig wrap, the
               Qwen3 DSparkDraftModel rewrite), in 0.34 spec_decode/speculator_config.py
               (`get_method_config_class`, `_resolve_checkpoint_config_class`, `adapt_draft_model_config`,
               `get_speculator_config_class`, `apply_options`); then the model class the registry names for the
               resulting architecture;
4. speculator  spec_decode/__init__.py `init_speculator`, as released, and the speculator's constructor checks;
5. build       the model class's constructor (its config checks, the quant config's discovery through
               models/utils.py `get_draft_quant_config` and its exclusion matching per layer);
6. load        the model's `load_weights` over the checkpoint's tensors (AutoWeightsLoader, the weight
               loaders), then each quant method's `process_weights_after_loading`, then the model's own post-load
               hooks (0.34 weight_utils.py `finalize_model_weights`; up to 0.33 model_loader/utils.py's
               `model.process_weights_after_loading()`);
7. taps        eagle3_utils.py `get_eagle3_aux_layers_from_config` and interfaces.py
               `EagleModelMixin._set_aux_hidden_state_layers`: which target layers feed fc, in which order;
8. function    what is served against what the checkpoint holds: a model class other than the one the
               checkpoint's architecture names in the release's registry (declared_class: the release reroutes it,
               e.g. 0.34's Ricursive DFlash2; an alias of the declared class is the same model), a trained tensor
               the loader dropped, a parameter served at its initialisation (Sharing: what the release shares
               from the target instead, per drafter family), fused NVFP4 shards served with one global scale,
               an out-of-vocabulary mask token, the vanilla Markov head for another head type, unknown layer types.

The serving command's method (`method`): FAMILY (the default) names the checkpoint's family's, as vLLM's docs for
these drafters say ("dspark" for a DSpark architecture, "dflash" for the rest); None names none (the release
detects it: up to 0.33 from the path's name, 0.34 from the model class); any other string is passed as given.

The harness stands in for the engine only where a real engine would use serving infrastructure: the target
model (num_target_layers layers of the draft's width, the draft's vocabulary), one GPU rank, no CUDA kernels,
and registry.py's class inspection (vllm_release.ModelRegistry).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
import vllm_stubs as S
from conformance.served import bounded_build, degenerate_numerics
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from vllm_sandbox import SandboxError

# a refusal with a message (transformers' config classes validate their fields as strict dataclasses)
TYPED = (ValueError, RuntimeError, NotImplementedError, StrictDataclassError)


class Outcome(NamedTuple):
    verdict: str  # "L" | "R" | "C" | "SW" | "U" (routed to code the harness does not execute)
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
    except Unexecuted as exc:
        raise Stop("U", name, str(exc)) from exc
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
    """The target a drafter of this config is served with: its own geometry where the config states a usable
    size, else a small Qwen3's (the target is the user's model, never read from the draft's config)."""
    nested = config.get("transformer_layer_config")
    if isinstance(nested, dict) and "speculators_config" in config:
        config = {**nested, **{k: v for k, v in config.items() if k != "transformer_layer_config"}}
    raw = config.get("dflash_config")
    dflash: dict[str, Any] = raw if isinstance(raw, dict) else {}

    def size(*values: Any, default: int) -> int:
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31:
                return value
        return default

    # unstated, the target is one deep enough for the draft's taps (validate cannot judge the target's depth
    # without --target, so neither may the harness); speculators' aux ids count the embedding as layer 0
    deepest = 3
    for taps, shift in (
        (dflash.get("target_layer_ids", config.get("target_layer_ids")), 1),
        (config.get("aux_hidden_state_layer_ids"), 0),
    ):
        if isinstance(taps, list):
            ok = [t for t in taps if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1024]
            deepest = max([deepest, *(t + shift - 1 for t in ok)])
    layers = size(config.get("num_target_layers"), dflash.get("num_target_layers"), default=deepest + 1)
    hidden = size(config.get("target_hidden_size"), config.get("hidden_size"), default=64)
    return TargetShape(layers, size(config.get("vocab_size"), default=512), hidden)


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
        self.read: dict[str, int] = {}  # checkpoint name -> how many of its values were copied
        self.filled: dict[str, int] = {}  # parameter name -> how many of its values were written

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
                    log.read[source] = log.read.get(source, 0) + src.numel()
                    log.filled[dest] = log.filled.get(dest, 0) + dst.numel()
            return original(dst, src, non_blocking)

        torch.Tensor.copy_ = copy_
        try:
            yield
        finally:
            torch.Tensor.copy_ = original


def _lossy_casts(
    tensors: dict[str, torch.Tensor], params: dict[str, torch.Tensor], log: CopyLog
) -> list[str]:
    """Checkpoint float tensors copied into a float8 parameter whose values the cast changes (a BF16 weight_scale
    of values E4M3 cannot hold): the parameter then serves other values than the checkpoint's."""
    out = []
    for name, dests in log.written.items():
        t = tensors[name]
        if not t.dtype.is_floating_point or t.element_size() < 2:
            continue
        for dest in dests:
            p = params.get(dest)
            if p is None or p.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
                continue
            back = t.to(p.dtype).to(t.dtype)
            if not torch.equal(torch.nan_to_num(back.float()), torch.nan_to_num(t.float())):
                out.append(f"{name} ({t.dtype} into {p.dtype})")
    return sorted(out)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point and a.element_size() >= 2:
        return bool(
            torch.equal(torch.nan_to_num(a.float(), nan=7.77e7), torch.nan_to_num(b.float(), nan=7.77e7))
        )
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


# `serve(..., method=FAMILY)`: the serving command names the method of the checkpoint's family, as vLLM's docs
# for these drafters say (`"method": "dspark"` for a DSpark draft, `"dflash"` for the DFlash family)
FAMILY = "family"


def family_method(raw: dict[str, Any]) -> str:
    """The method a serving command names for the checkpoint: what the user passes, not what vLLM decides."""
    architectures = raw.get("architectures") if isinstance(raw.get("architectures"), list) else []
    return "dspark" if any(isinstance(a, str) and "DSpark" in a for a in architectures) else "dflash"


class Unexecuted(Exception):
    """The release routes the checkpoint to code the harness does not execute (the Outcome is "U")."""


def serve(
    release: Any, path: Path, *, num_speculative_tokens: int | None = None, method: str | None = FAMILY
) -> Outcome:
    """What the released vLLM does with the draft checkpoint at `path`.

    `method` is the serving command's `--speculative-config` method: FAMILY (the default) names the checkpoint's
    family's (family_method), None names none (the release detects it), any other string is passed as given."""
    facts: dict[str, Any] = {"release": release.version}
    try:
        return _serve(release, path, facts, num_speculative_tokens, method)
    except Stop as stop:
        return Outcome(stop.verdict, stop.stage, stop.detail, facts)


def _serve(
    release: Any, path: Path, facts: dict[str, Any], num_speculative_tokens: int | None, method: str | None
) -> Outcome:
    raw = json.loads((path / "config.json").read_text())
    target = target_for(raw)
    if method == FAMILY:
        method = family_method(raw)
    facts["requested_method"] = method

    # 1. the HF config, as the draft's ModelConfig reads it: with the draft's hf_overrides (speculative.py
    # compose_draft_hf_overrides -> hf_config_override, the architecture rewrites), applied by get_config
    with stage("config"):
        overrides = release.SpeculativeConfig.compose_draft_hf_overrides({})
        hf = release.transformers_config.get_config(
            str(path), trust_remote_code=False, hf_overrides_fn=overrides
        )
        # config/model.py ModelConfig.__post_init__: `self.hf_text_config = get_hf_text_config(self.hf_config)`
        # (a top-level text_config or decoder that is not null and has no num_attention_heads is refused)
        release.transformers_config.get_hf_text_config(hf)

    # 2. the quant method the checkpoint declares
    with stage("quant"):
        arch = S.Holder(quantization_config=release.convertor._normalize_quantization_config(None, hf))
        model_config = S.Holder(
            quantization=None, model_arch_config=arch, hf_config=hf, allow_deprecated_quantization=False
        )
        release.model_config._verify_quantization(model_config)
    facts["quantization"] = model_config.quantization

    # 3. the speculative method, the draft's architecture and the model class: the release's own method handling
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    block = nested.get("block_size", raw.get("block_size"))
    if num_speculative_tokens is None:
        usable = isinstance(block, (int, float)) and math.isfinite(block) and block > 1
        num_speculative_tokens = max(1, int(block) - 1) if usable else 7
    draft_model_config = DraftModelConfig(
        release,
        hf_config=hf,
        model=str(path),
        revision=None,
        quantization=model_config.quantization,
        quantization_config=None,
        hf_overrides={},
        dtype=torch.bfloat16,
        max_model_len=getattr(hf, "max_position_embeddings", None),
        use_mla=False,
        get_hidden_size=lambda: hf.hidden_size,
        get_vocab_size=lambda: hf.vocab_size,
    )
    target_model_config = S.Holder(
        get_total_num_hidden_layers=lambda: target.num_layers,
        get_vocab_size=lambda: target.vocab_size,
        get_hidden_size=lambda: target.hidden_size,
        dtype=torch.bfloat16,
        max_model_len=TARGET_MAX_MODEL_LEN,
        hf_config=S.Holder(model_type="qwen3", architectures=["Qwen3ForCausalLM"]),
        quantization=None,
    )
    speculative_config = speculative_config_for(
        release, method, str(path), draft_model_config, target_model_config, num_speculative_tokens
    )
    with stage("speculative"):
        # ModelConfig.__post_init__: the draft's architectures must be registered
        draft_model_config.inspect()
        route(release, speculative_config)
    facts["method"] = speculative_config.method
    routed = draft_model_config._architecture
    module_name, class_name = release.registry.entry(routed)
    facts["architecture"] = routed
    facts["model_class"] = f"{module_name.rsplit('.', 1)[-1]}.{class_name}"
    facts["declared_class"] = declared_class(release, raw)
    model_cls = release.registry.model_class(module_name, class_name)
    if model_cls is None:
        raise Stop(
            "U", "speculative", f"routed to {module_name}.{class_name}, which the harness does not execute"
        )

    vllm_config = release.VllmConfig(
        speculative_config=speculative_config,
        model_config=target_model_config,
        load_config=S.Holder(download_dir=None, device=None),
        cache_config=S.CacheConfig(cache_dtype="auto"),
        parallel_config=S.Holder(prefill_context_parallel_size=1, decode_context_parallel_size=1),
        scheduler_config=S.Holder(max_num_seqs=2, max_num_batched_tokens=64),
        compilation_config=S.Holder(cudagraph_mode=S.CUDAGraphMode.NONE),
        kernel_config=S.Holder(linear_backend="auto"),
        use_v2_model_runner=True,  # the default for DFlash drafts on a CUDA platform (config/vllm.py, 0.31-0.33)
        quant_config=None,
    )

    with S.current_vllm_config(vllm_config), _default_dtype(torch.bfloat16):
        # 4. the speculator the runner builds first (spec_decode/__init__.py init_speculator, as released)
        with stage("speculator"):
            speculator = build_speculator(release, vllm_config, speculative_config)
        facts["speculator"] = type(speculator).__name__
        facts["mask_token_id"] = speculator.parallel_drafting_token_id

        # 5. the model
        with stage("build"), bounded_build():
            model = model_cls(vllm_config=vllm_config, prefix="")

        # 6. its weights
        tensors = checkpoint_tensors(path)
        params = dict(model.named_parameters())
        # modelopt.py QuantKeyScheme.register_params builds the NVFP4 scales with torch.empty: a fused linear's
        # shard slot that no tensor writes keeps uninitialised memory, which KNvfp4Static / KNvfp4Dynamic.process
        # fold in with max(). Poisoned here so an unwritten slot shows (the CPU's fresh memory is mostly zeros)
        poisoned = {
            n: p
            for n, p in params.items()
            if n.rsplit(".", 1)[-1] in ("input_scale", "weight_scale_2")
            and p.dtype.is_floating_point
            and p.numel() > 1
        }
        for p in poisoned.values():
            p.data.fill_(float("nan"))
        before = {n: p.detach().clone() for n, p in params.items()}
        log = CopyLog(tensors, params)
        with stage("load"), log.active():
            model.load_weights(iter(tensors.items()))
        # (a W4A16 module's input_scale is registered for old exports and discarded unread: _unused_after_loading)
        discarded = _unused_after_loading(model)
        facts["unwritten_shard_scales"] = sorted(
            n for n, p in poisoned.items() if n not in discarded and bool(torch.isnan(p.detach()).any())
        )
        for p in poisoned.values():  # what the post-load processing then reads: the written slots' max
            p.data.nan_to_num_(nan=0.0)
        facts["lossy_casts"] = _lossy_casts(tensors, params, log)
        # a fused NVFP4 linear stores one weight_scale_2 per shard; its quant method serves them all with one
        # global scale (modelopt.py KNvfp4Static.process: the largest, "the global weight scale differs" warning)
        facts["shard_scales"] = {
            name: sorted({float(v) for v in module.weight_scale_2.detach().float().flatten()})
            for name, module in model.named_modules()
            if isinstance(getattr(module, "weight_scale_2", None), torch.Tensor)
            and module.weight_scale_2.numel() > 1
            and "quant_method" in module.__dict__
        }
        # model_loader/utils.py process_weights_after_loading: every quant method's, then the model's own hooks
        # (0.34 weight_utils.finalize_model_weights; up to 0.33 `model.process_weights_after_loading()`)
        with stage("post-load"):
            for module in model.modules():
                method_obj = module.__dict__.get("quant_method")
                if isinstance(method_obj, release.quantization.base_config.QuantizeMethodBase):
                    method_obj.process_weights_after_loading(module)
            if release.finalize_model_weights is not None:
                release.finalize_model_weights(model, torch.device("cpu"))
            elif hasattr(model, "process_weights_after_loading"):
                model.process_weights_after_loading()

    # 7. the target layers fc reads, and their order
    facts.update(_taps(release, model, raw, speculative_config, target))
    if facts.get("taps_problem"):
        verdict, detail = facts["taps_problem"]
        return Outcome(verdict, "taps", detail, facts)

    # 8. the function served
    facts["causal"] = (
        [bool(c) for c in model.get_draft_attn_causal()] if hasattr(model, "get_draft_attn_causal") else None
    )
    attentions = [getattr(layer, "self_attn", None) for layer in model.model.layers]
    facts["sliding_window"] = [getattr(a, "sliding_window", None) for a in attentions]
    ropes = [getattr(a, "rotary_emb", None) for a in attentions]
    facts["rope_theta"] = (
        (getattr(ropes[0], "rope_parameters", None) or {}).get("rope_theta") if ropes else None
    )
    # ricursive_dflash2.py RicursiveDFlash2DecoderLayer: an identity rotation on its no_rope_layers
    facts["nope_layers"] = [i for i, rope in enumerate(ropes) if type(rope).__name__ == "_NoRope"]
    facts["quantized"] = sorted(
        name
        for name, module in model.named_modules()
        if "quant_method" in module.__dict__ and type(module.quant_method).__name__ == "ModelOptLinearMethod"
    )
    facts["layer_types"] = list(getattr(hf, "layer_types", None) or [])
    declared = raw.get("layer_types") if isinstance(raw.get("layer_types"), list) else []
    sharing = Sharing(model, hf, target, speculative_config)
    # a DSpark confidence_head.* tensor skipped by qwen3_dspark.py load_weights (no head built: enable_confidence_head
    # falsy) takes no part in the drafted function: the head is read only under adaptive verification (off here),
    # like the built head's parameters (Sharing.served)
    dropped = sorted(
        n
        for n in tensors
        if n not in log.written
        and not _inert(n)
        and not (n.startswith("confidence_head.") and not sharing.adaptive)
    )
    written = set().union(*log.written.values()) if log.written else set()
    unused = _unused_after_loading(model)
    unloaded = sorted(
        n
        for n, p in params.items()
        if n not in written and _same(before[n], p.detach()) and sharing.served(n) and n not in unused
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
    # linear.py QKVParallelLinear / MergedColumnParallelLinear weight_loader: each shard is copied into its slice
    # of the fused parameter (a missing shard leaves its slice at its initial value), and a checkpoint tensor
    # larger than its slice is narrowed to it (the rest is never read)
    narrowed = sorted(n for n, count in log.read.items() if 0 < count < tensors[n].numel())
    partial = sorted(
        n
        for n, count in log.filled.items()
        if n.endswith(("qkv_proj.weight", "gate_up_proj.weight")) and 0 < count < params[n].numel()
    )
    # an integer checkpoint tensor cast into a float parameter (or back): the loader copies the values, which
    # were never the float values the module computes with
    recast = sorted(
        n
        for n, dests in log.written.items()
        for d in dests
        if d in params and tensors[n].dtype.is_floating_point != params[d].dtype.is_floating_point
    )
    facts["narrowed"], facts["partial"], facts["recast"] = narrowed, partial, recast
    expected = facts["declared_class"]
    if expected is not None and expected != facts["model_class"]:
        return Outcome(
            "SW",
            "function",
            f"served by {facts['model_class']}, not {expected} (the class the checkpoint's architecture "
            f"{raw['architectures'][0]} names): another model",
            facts,
        )
    if dropped:
        return Outcome("SW", "function", f"trained tensors not loaded: {', '.join(dropped[:6])}", facts)
    if facts.get("unwritten_shard_scales"):
        return Outcome(
            "SW",
            "function",
            "fused shard scale slots no tensor writes keep torch.empty's memory, folded in by the quant method's "
            f"max(): {', '.join(facts['unwritten_shard_scales'][:4])}",
            facts,
        )
    if facts.get("lossy_casts"):
        return Outcome(
            "SW",
            "function",
            "tensors cast into a narrower parameter dtype lose their values (models/utils.py AutoWeightsLoader: "
            f"a warning, then the copy): {', '.join(facts['lossy_casts'][:4])}",
            facts,
        )
    if narrowed:
        return Outcome(
            "SW",
            "function",
            f"checkpoint tensors narrowed to their parameter: {', '.join(narrowed[:6])}",
            facts,
        )
    if partial:
        return Outcome(
            "SW",
            "function",
            f"fused parameters partly served at their initialisation (a shard missing): {', '.join(partial[:6])}",
            facts,
        )
    if recast:
        return Outcome(
            "SW", "function", f"integer tensors cast into float parameters: {', '.join(recast[:6])}", facts
        )
    mixed = {name: scales for name, scales in facts["shard_scales"].items() if len(scales) > 1}
    if mixed:
        name, scales = next(iter(sorted(mixed.items())))
        return Outcome(
            "SW",
            "function",
            f"{name}'s shards carry different weight_scale_2 {scales}, served with one global scale (the "
            "largest): the other shards' weights are scaled by the ratio",
            facts,
        )
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
    # a norm's eps, the LiLiCorr head's logit scale: stored as the config says, used only when the draft runs
    degenerate = degenerate_numerics(model)
    if degenerate is not None:
        verdict, detail = degenerate
        return Outcome(verdict, "function" if verdict == "SW" else "first step", detail, facts)
    failed = _first_step_logits(model, sharing, target)
    if failed is not None:
        verdict, detail = failed
        return Outcome(verdict, "first step" if verdict == "C" else "function", detail, facts)
    # spec_decode/dspark/speculator.py _sample_sequential_topk: `base_logits.topk(self._draft_topk, dim=-1)` at
    # every draft step, the config's dspark_draft_topk as read (torch's topk takes an int: a bool or a float fails)
    topk = speculator.__dict__.get("_draft_topk")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int)):
        return Outcome(
            "C",
            "first step",
            f"dspark_draft_topk is {topk!r}: the first draft step's topk() takes an int, not a "
            f"{type(topk).__name__}",
            facts,
        )
    return Outcome("L", "function", "loaded", facts)


class _HeadLogits(torch.nn.Module):
    """What logits_processor.py LogitsProcessor._get_logits returns on one rank: the lm_head's `rows` logits per
    hidden state, cut to the processor's org_vocab_size (the GEMM itself is a kernel the harness does not run)."""

    def __init__(self, rows: int, keep: int):
        super().__init__()
        self.rows, self.keep = rows, keep

    def forward(self, lm_head: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states.new_zeros(hidden_states.shape[0], self.rows)[..., : self.keep]


def _first_step_logits(model: Any, sharing: Sharing, target: TargetShape) -> tuple[str, str] | None:
    """(verdict, why) where the first draft step's logits fail (C) or hold no finite value (SW: the argmax is
    token 0 whatever the draft computed), or None: the released compute_logits (qwen3_dflash.py
    DFlashQwen3ForCausalLM, which LiLiCorr, DFlash2 and Domino inherit) scatters the lm_head's logits into the
    draft's vocabulary through draft_id_to_target_id (built when draft_vocab_size differs from the target's), and
    the speculator's greedy_argmax (v1/worker/gpu/sample/greedy_argmax.py: `logits.argmax(dim=-1)` off CUDA) picks
    a token from each row. The lm_head is the target's unless the draft owns one (dflash/utils.py
    load_dflash_model)."""
    # qwen3_dflash2.py compute_candidates, the DFlash2 speculator's every draft step: the candidates' logits
    # processor's get_top_k_tokens
    if hasattr(model, "compute_candidates"):
        try:
            model.compute_candidates(torch.zeros(1, model.config.hidden_size))
        except S.InfrastructureCalled:
            pass  # the GEMM: every check before it passed
        except (RuntimeError, ValueError, TypeError) as exc:
            return "C", f"compute_candidates (the candidates' top-k at the first draft step): {exc}"
    d2t = getattr(model, "draft_id_to_target_id", None)
    processor = getattr(model, "logits_processor", None)
    if sharing.dspark or not isinstance(d2t, torch.Tensor) or not isinstance(processor, S.LogitsProcessor):
        return None
    owned = getattr(model, "has_own_lm_head", False) or getattr(model.config, "has_own_lm_head", False)
    rows = model.lm_head.weight.shape[0] if owned and hasattr(model, "lm_head") else target.vocab_size
    model.logits_processor = _HeadLogits(rows, processor.org_vocab_size)
    try:
        logits = model.compute_logits(torch.zeros(1, model.config.hidden_size))
        logits.argmax(dim=-1)
    except (RuntimeError, IndexError, ValueError) as exc:
        return "C", (
            f"compute_logits over the {'draft' if owned else 'target'}'s {rows}-row lm_head and a "
            f"draft_id_to_target_id of {d2t.numel()} rows (draft_vocab_size), then the greedy argmax: {exc}"
        )
    finally:
        model.logits_processor = processor
    if not bool(torch.isfinite(logits).any()):
        return "SW", (
            f"draft_id_to_target_id has {d2t.numel()} rows (draft_vocab_size): compute_logits scatters no "
            f"lm_head logit into the {logits.shape[-1]} draft logits, all -inf, so every draft token is token 0"
        )
    return None


# the target's served context (max_model_len): a Qwen3 target's
TARGET_MAX_MODEL_LEN = 40960


class DraftModelConfig(S.Holder):
    """config/model.py ModelConfig for the draft, as the method handling reads it: `architectures` through the
    release's model_arch_config_convertor (`get_architectures`), the registry's inspection (`_model_info`,
    `_architecture`, `speculator_config_class`)."""

    def __init__(self, release: Any, **values: Any):
        super().__init__(**values)
        self.registry = release.registry
        self._release = release
        self.model_arch_config = self.get_model_arch_config()
        self._model_info = None
        self._architecture = None

    def __deepcopy__(self, memo: dict[int, Any]) -> DraftModelConfig:
        # config/vllm.py get_quantization_config deep-copies the model config: the release is shared, not copied
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            shared = key in ("_release", "registry")
            new.__dict__[key] = value if shared else copy.deepcopy(value, memo)
        return new

    def get_model_arch_config(self) -> Any:
        return S.Holder(
            architectures=self._release.convertor.get_architectures(S.Holder(hf_config=self.hf_config)),
            quantization_config=self._release.convertor._normalize_quantization_config(None, self.hf_config),
        )

    @property
    def architectures(self) -> list[str]:
        return self.model_arch_config.architectures

    @property
    def architecture(self) -> str:
        return self._architecture

    @property
    def speculator_config_class(self) -> str | None:
        declared = self._model_info.speculator_config_class
        if declared is not None and declared.startswith("unexecuted:"):
            raise Unexecuted(
                f"vLLM {self._release.version} reads the speculator config {declared[11:]} declares, a module "
                "the harness does not execute"
            )
        return declared

    def inspect(self) -> None:
        self._model_info, self._architecture = self.registry.inspect_model_cls(self.architectures, self)

    def get_sliding_window(self) -> Any:
        return getattr(self.hf_config, "sliding_window", None)


def speculative_config_for(
    release: Any,
    method: str | None,
    model: str,
    draft: DraftModelConfig,
    target: Any,
    num_speculative_tokens: int,
) -> Any:
    """The SpeculativeConfig stand-in (the release's lifted methods on it) as the serving command builds it,
    before its method handling runs: every field the handling reads, at the command's value or its default."""
    spec = release.SpeculativeConfig(
        method=method,
        custom_method=None,
        model=model,
        draft_model_config=draft,
        target_model_config=target,
        target_parallel_config=S.Holder(tensor_parallel_size=1, decode_context_parallel_size=1),
        num_speculative_tokens=num_speculative_tokens,
        quantization=None,
        parallel_drafting=True,
        use_local_argmax_reduction=False,
        enable_adaptive_verification=False,
        draft_decode_context_parallel_size=1,
        draft_tensor_parallel_size=None,
        kv_cache_dtype=None,
        max_model_len=None,
        revision=None,
    )
    # the method-specific options the command does not set (0.33: xpress_topc, dspark_draft_topk; 0.34: each
    # of _METHOD_SPECIFIC_OPTIONS)
    for option in (
        "xpress_topc",
        "dspark_draft_topk",
        "draft_lm_head_quantization",
        *getattr(release.speculative, "_METHOD_SPECIFIC_OPTIONS", ()),
    ):
        if not hasattr(spec, option):
            setattr(spec, option, None)
    return spec


def route(release: Any, spec: Any) -> None:
    """config/speculative.py's method handling for the draft, as the release runs it (vllm_release's docstring)."""
    _call_span(release.infer_method, self=spec)
    if release.route_draft is not None:  # 0.31-0.33: __post_init__ after the draft ModelConfig
        # __post_init__'s locals the statements read: a Transformers-backend MTP draft (0.33) it is not
        _call_span(release.route_draft, self=spec, using_transformers_mtp=False)
        return
    # 0.34: SpeculativeConfig.__post_init__ -> get_method_config_class, configure (after its ModelConfig), the rest
    config_cls = release.speculator_config.get_method_config_class(spec)
    _call_span(
        release.configure_draft,
        spec=spec,
        cls=config_cls,
        target=spec.target_model_config,
        SpeculativeConfig=release.SpeculativeConfig,
    )
    _call_span(release.after_configure, self=spec)


def _call_span(function: Any, **values: Any) -> Any:
    """Call a span (vllm_sandbox.Span) with the method's variables it reads. A variable the harness does not
    provide stays None: fine for locals of branches a drafter never takes, which is what the spans are checked
    for (test_vllm_conformance: every span's free variables are known)."""
    accepted = inspect.signature(function).parameters
    return function(**{k: v for k, v in values.items() if k in accepted})


def build_speculator(release: Any, vllm_config: Any, spec: Any) -> Any:
    """spec_decode/__init__.py init_speculator, as released, for the speculators the harness executes."""
    if release.speculator_config is None and spec.method not in ("dflash", "dspark"):
        raise Stop(
            "U",
            "speculator",
            f"vLLM {release.version} serves the draft with method {spec.method!r}; the harness executes the "
            "DFlash-family speculators only",
        )
    kwargs = (
        {"req_states": None} if "req_states" in inspect.signature(release.init_speculator).parameters else {}
    )
    try:
        return release.init_speculator(vllm_config, torch.device("cpu"), **kwargs)
    except SandboxError as exc:
        if exc.module and exc.module.startswith("vllm.v1.worker.gpu.spec_decode."):
            raise Stop("U", "speculator", f"builds {exc.module}, which the harness does not execute") from exc
        raise


# a declared architecture served by another registered class that is the same model: SpecForge declares a Qwen3
# DSpark draft under DeepSeek-V4's DSpark name, and every release builds Qwen3DSparkForCausalLM for it (0.31-0.33
# speculative.py __post_init__, 0.34 hf_config_override)
ALIASES = {("DSparkDraftModel", "qwen3"): "Qwen3DSparkModel"}


def declared_class(release: Any, raw: dict[str, Any]) -> str | None:
    """The model class the checkpoint's declared architecture names in the release's registry: its own entry,
    else (a target architecture's name) the DFlash variant EAGLEConfig names it after (`DFlash{arch}`); an alias
    (ALIASES) names its alias's class. None when the checkpoint declares no registered architecture."""
    architectures = raw.get("architectures") if isinstance(raw.get("architectures"), list) else []
    if not architectures or not isinstance(architectures[0], str):
        return None
    model_type = raw.get("model_type")
    nested = raw.get("transformer_layer_config")
    if model_type is None and "speculators_config" in raw and isinstance(nested, dict):
        model_type = nested.get("model_type")  # a speculators config: the layer config names the backbone
    arch = ALIASES.get((architectures[0], model_type), architectures[0])
    entry = None
    if arch in release.registry.speculative:
        entry = release.registry.entry(arch)
    elif not arch.startswith("DFlash"):
        entry = release.registry.entry(f"DFlash{arch}")
    return f"{entry[0].rsplit('.', 1)[-1]}.{entry[1]}" if entry else None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """base_loader.py `set_default_torch_dtype(model_config.dtype)` around model construction."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _inert(name: str) -> bool:
    """Checkpoint tensors the released loader drops that take no part in the drafted function: qwen3_dflash.py
    `load_weights` skips `t2d` ("training-only"), and AutoWeightsLoader drops recomputed rotary caches
    (REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER)."""
    return "t2d" in name or name.endswith(
        ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
    )


class Sharing:
    """Which of a served draft's parameters come from its checkpoint: not those shared from the target, unused
    placeholders or kv-cache scales without an FP8 cache."""

    def __init__(self, model: Any, hf: Any, target: TargetShape, spec: Any):
        self.model = model
        self.dspark = hasattr(model.model, "markov_head")
        vocab = getattr(hf, "vocab_size", None) or target.vocab_size
        output_vocab = getattr(hf, "draft_vocab_size", None) or vocab
        if self.dspark:
            # spec_decode/dspark/utils.py load_dspark_model: the target's input embedding only for a draft
            # vocabulary within the target's, its lm_head only for an output vocabulary equal to the target's
            self.embed_shared = vocab <= target.vocab_size
            self.lm_head_shared = output_vocab == target.vocab_size
        else:
            self.embed_shared = self.lm_head_shared = True
        self.adaptive = bool(getattr(spec, "enable_adaptive_verification", False))

    def served(self, name: str) -> bool:
        model = self.model
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("k_scale", "v_scale", "q_scale", "prob_scale"):
            return False
        if name == "model.mask_embedding" and not model.model.has_separate_mask_embedding:
            return False
        if name.startswith("model.embed_tokens.") and not getattr(model, "has_own_embed_tokens", False):
            return not self.embed_shared  # spec_decode/eagle/utils.py maybe_share_target_embed
        if name.startswith("lm_head.") and not (
            getattr(model, "has_own_lm_head", False) or getattr(model.config, "has_own_lm_head", False)
        ):
            return not self.lm_head_shared  # dflash/utils.py load_dflash_model shares the target's lm_head
        if name.startswith("model.confidence_head."):
            # qwen3_dspark.py: the confidence head is read only under adaptive verification (compute_confidence)
            return self.adaptive
        if name == "draft_id_to_target_id":
            # qwen3_dspark.py builds it only for a draft vocabulary smaller than the target's, which it maps
            return self.dspark
        return True


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
    nested = raw.get("dflash_config") if isinstance(raw.get("dflash_config"), dict) else {}
    ids = nested.get("target_layer_ids")
    trained = [i + 1 for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
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
