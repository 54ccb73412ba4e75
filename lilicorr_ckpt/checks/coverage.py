"""Coverage rules (LC2xx): which tensors the geometry builds, which are missing or surplus, shapes and dtypes."""

from __future__ import annotations

import re

from lilicorr_ckpt.checkpoint.geometry import routed_by_projector
from lilicorr_ckpt.checkpoint.manifest import FLOAT_DTYPES, ExpectedTensor, component_of_name
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.context import Context, check
from lilicorr_ckpt.checks.findings import rule

# ---------------------------------------------------------------- catalogue
COV = "coverage"
rule("LC201", "head-missing", "error", COV, "Head tensors the geometry requires are missing.",
     "Export the full head; a draft with no LiLiCorr head should declare DFlashDraftModel.")
rule("LC202", "head-surplus", "error", COV, "Head tensors the geometry does not build (they would be dropped or refused).",
     "Check lilicorr_hidden_size, lilicorr_num_layers and lilicorr_factor_dim against the tensors.")
rule("LC203", "backbone-missing", "error", COV, "Backbone tensors are missing.",
     "Export every layer's attention, MLP and norm weights plus fc, hidden_norm and norm.")
rule("LC204", "unexpected-tensor", "error", COV, "A tensor no loader reads; SGLang drops it silently.",
     "Remove it, or fix the config so that the module it belongs to is built.")
rule("LC205", "conv-dropped", "error", COV, "Convolution tensors are present but the conv keys are absent or 0: every one would be dropped silently.",
     "Write conv_kernel_size and conv_group_size in dflash_config.")
rule("LC206", "conv-missing", "error", COV, "The conv keys are set but the checkpoint has no convolution tensors (kernel_projection would stay random).",
     "Export the convolution tensors, or remove conv_kernel_size / conv_group_size.")
rule("LC207", "conv-partial", "error", COV, "Only some convolution tensors are present.",
     "Export all 4 tensors per layer (base_kernel and kernel_projection for attention_conv and mlp_conv).")
rule("LC208", "shape", "error", COV, "A tensor's shape differs from what the config implies.",
     "Fix the config geometry or re-export the tensor.")
rule("LC209", "dtype", "error", COV, "A tensor's dtype is not allowed for it.",
     "Store floating-point tensors as bf16/fp16/fp32; quantized weights need their scales and metadata.")
rule("LC211", "name-collision", "error", COV, "Two tensors map to the same name after the loaders' renaming.",
     "Keep one of them.")
rule("LC212", "training-prefix", "error", COV, "Tensor names still carry a training prefix (dflash_module./eagle_module.) no loader strips.",
     "Run `lilicorr-ckpt convert` (it strips training prefixes).")
rule("LC213", "model-prefix", "info", COV, "Tensor names carry a `model.` prefix (every loader strips it).",
     "Nothing to do.")
rule("LC214", "mixed-float-dtypes", "warning", COV, "Floating-point tensors use more than one dtype.",
     "Export every float tensor in the model dtype.")
rule("LC215", "coverage-skipped", "info", COV, "Coverage of a component was not checked because its geometry is incomplete.",
     "Fix the geometry findings first.")

rule("LC217", "legacy-names-refused", "error", COV,
     "Legacy Sequential MLP names in the head, for which the runtime has no parameter (it does not rename them).",
     "Run `lilicorr-ckpt convert` to write the named-MLP layout.")
rule("LC218", "embed-tokens-copy", "warning", COV,
     "The draft carries its own embed_tokens.weight: the runtimes disagree on using it (dropped, used as the "
     "draft's input table, or replaced by the target's).",
     "Drop it unless it is the target's table; drafters borrow the target's embeddings.")
rule("LC216", "legacy-names-renamed", "info", COV,
     "Legacy Sequential MLP names in the head, which every selected runtime renames.",
     "Nothing to do; `lilicorr-ckpt convert` writes the named-MLP layout.")



# ---------------------------------------------------------------- checks


@check
def coverage(ctx: Context) -> None:
    m, view = ctx.manifest, ctx.names
    present = view.by_canonical
    for component, reason in m.incomplete.items():
        ctx.emit("LC215", f"{component} tensors not checked: {reason}")
    for key, reason in m.implausible.items():  # a layer count the files cannot hold: reported, never expanded
        ctx.emit("LC118" if key == "num_hidden_layers" else "LC103", reason, file="config.json", pointer=f"$.{key}")
    if view.training_prefixed:
        ctx.emit("LC212", f"{len(view.training_prefixed)} tensor names keep a training prefix, e.g. "
                 f"{shorten(view.training_prefixed, 3)}: no loader strips it, so SGLang drops them all",
                 subjects=view.training_prefixed)
    if view.model_prefixed:
        ctx.emit("LC213", f"{len(view.model_prefixed)} tensor names carry a `model.` prefix (stripped by loaders)")
    for canonical, names in view.collisions.items():
        ctx.emit("LC211", f"{shorten(names)} all map to `{canonical}` after renaming; TensorRT-LLM refuses this",
                 subjects=names)
    if view.legacy:
        refusing = [p for p in ctx.profiles if p.legacy_mlp_names == "refused"]
        renaming = [p for p in ctx.profiles if p.legacy_mlp_names == "renamed"]
        head = f"{len(view.legacy)} head tensors use the legacy Sequential names ({shorten(view.legacy, 3)})"
        ctx.emit_for("LC217", refusing, f"{head}: {' and '.join(p.display for p in refusing)} does not rename "
                     "them and has no parameter for them", subjects=view.legacy)
        ctx.emit_for("LC216", renaming, f"{head}: {' and '.join(p.display for p in renaming)} renames them to the "
                     "named-MLP layout", subjects=view.legacy)

    expected = m.tensors
    # quantized modules legitimately replace .weight's dtype/shape and add scale tensors
    missing: dict[str, list[str]] = {}
    for name, tensor in expected.items():
        if tensor.component in m.incomplete:
            continue
        if name not in present:
            missing.setdefault(tensor.component, []).append(name)
    [n for n in present if ".attention_conv." in n or ".mlp_conv." in n]
    conv_expected = [n for n, t in expected.items() if t.component == "conv"]
    if missing.get("head") and not (routed_by_projector(ctx.config) and not any(
            n.startswith("lilicorr.") for n in present)):  # LC011 says the head is absent
        names = missing["head"]
        family = ctx.geometry.family if ctx.geometry.family in SIBLINGS else None
        what = f"{family} head" if family else "lilicorr.*"
        ctx.emit("LC201", f"missing {len(names)} {family + ' ' if family else ''}head tensors: {shorten(names)}",
                 subjects=names,
                 expected=f"{len(m.names('head'))} {what} tensors",
                 actual=f"{len(m.names('head')) - len(names)} present")
    fused = _fused_qkv(ctx)  # fused qkv_proj tensor -> the q/k/v tensors it stands for
    split = {n for parts in fused.values() for n in parts}
    strict = [p for p in ctx.profiles if not p.accepts_fused_qkv]
    if missing.get("backbone"):
        names = [n for n in missing["backbone"] if n not in split]
        if names:
            ctx.emit("LC203", f"missing {len(names)} backbone tensors: {shorten(names)}", subjects=names)
        names = [n for n in missing["backbone"] if n in split]
        if names:
            ctx.emit_for("LC203", strict, f"missing {len(names)} backbone tensors: {shorten(names)} (stored fused "
                         f"as {shorten(sorted(fused), 2)}, which " + " and ".join(p.display for p in strict)
                         + " does not split)", subjects=names)
    if missing.get("lm_head"):
        loaders = [p for p in ctx.profiles if p.owned_lm_head == "supported"]
        ctx.emit_for("LC401", loaders, "has_own_lm_head is true but lm_head.weight is absent: "
                     + " and ".join(p.display for p in loaders) + " refuse the load" if loaders else "",
                     pointer="lm_head.weight", subjects=missing["lm_head"])
    if conv_expected and "conv" not in m.incomplete:
        gone = missing.get("conv", [])
        if len(gone) == len(conv_expected):
            g = ctx.geometry
            ctx.emit("LC206", f"conv_kernel_size {g.conv_kernel_size} / conv_group_size {g.conv_group_size} build "
                     f"{len(conv_expected)} convolution tensors but the checkpoint has none: kernel_projection "
                     "would stay at random initialisation", file="config.json",
                     pointer="$.dflash_config.conv_kernel_size", subjects=gone)
        elif gone:
            ctx.emit("LC207", f"convolution coverage is partial: missing {shorten(gone)} (check conv_kernel_size, "
                     "conv_group_size and num_hidden_layers)", subjects=gone)

    # surplus: present tensors the manifest does not explain
    surplus: dict[str, list[str]] = {}
    for name in present:
        if name in expected:
            continue
        if m.module_of(name) is not None:
            continue  # a scale tensor of a known module: judged by the quantization checks
        component = component_of_name(name)
        if component in m.incomplete or (component == "fc" and "backbone" in m.incomplete):
            continue  # its geometry is unknown: LC215 says so, and the geometry findings say why
        if component == "head":
            sibling_name = not name.startswith("lilicorr.")
            # LC011 / LC108 / LC016 cover heads the architecture does not declare
            key = "head" if (ctx.geometry.lilicorr_enabled and not sibling_name) or (
                sibling_name and ctx.geometry.family in SIBLINGS and not _foreign(ctx, name)) else None
        elif component in ("conv", "lm_head"):
            key = component
        else:
            key = "other"
        if key:
            surplus.setdefault(key, []).append(name)
    if surplus.get("head"):
        names = surplus["head"]
        g = ctx.geometry
        token = [n for n in names if n.startswith("lilicorr.token_proj.")]
        if token and g.head_hidden_size == g.hidden_size:
            raw = g.head_hidden_size_raw
            ctx.emit("LC202", f"`lilicorr.token_proj.*` is present but the head is as wide as the draft "
                     f"(lilicorr_hidden_size {raw} -> h = {g.head_hidden_size} = hidden_size), so token_proj is the "
                     "identity and its weights would be dropped", file="config.json",
                     pointer="$.dflash_config.lilicorr_hidden_size", subjects=token,
                     expected=f"lilicorr_hidden_size = {_token_proj_width(ctx)}" if _token_proj_width(ctx) else None)
            names = [n for n in names if n not in token]
        if names:
            ctx.emit("LC202", f"{len(names)} head tensors the geometry does not build: {shorten(names)}",
                     subjects=names)
    if surplus.get("conv"):
        names = surplus["conv"]
        if not ctx.geometry.has_conv:
            d = ctx.config.dflash
            hint = _conv_hint(ctx, names)
            if ctx.geometry.conv_kernel_size > 0:
                # the kernel size is set: the missing/zero group size is the cause (LC116), not the kernel size
                group = d.conv_group_size if d.conv_group_size is not None else "absent"
                ctx.emit("LC205", f"{len(names)} convolution tensors are present and conv_kernel_size is "
                         f"{d.conv_kernel_size}, but conv_group_size is {group}: no convolution is built for these "
                         f"tensors until conv_group_size is set{hint}", file="config.json",
                         pointer="$.dflash_config.conv_group_size", subjects=names)
            else:
                ctx.emit("LC205", f"{len(names)} convolution tensors are present but conv_kernel_size is "
                         f"{d.conv_kernel_size if d.conv_kernel_size is not None else 'absent'}: every one would be "
                         f"dropped silently and the draft would serve as its convolution-free parent{hint}",
                         file="config.json", pointer="$.dflash_config.conv_kernel_size", subjects=names)
        else:
            ctx.emit("LC207", f"convolution tensors the geometry does not build: {shorten(names)} (check "
                     "conv_kernel_size, conv_group_size and num_hidden_layers)", subjects=names)
    if surplus.get("lm_head") and not ctx.geometry.has_own_lm_head and ctx.geometry.family == "dspark":
        ctx.emit("LC405", "a DSpark drafter carries lm_head tensors without has_own_lm_head, as DeepSpec exports a "
                 "frozen copy of the target's head: TensorRT-LLM skips it and uses the target's, vLLM keeps it as "
                 "the draft's own; the same function only if it is the target's head unchanged", file="config.json",
                 pointer="$.has_own_lm_head", subjects=surplus["lm_head"])
    elif surplus.get("lm_head") and not ctx.geometry.has_own_lm_head:
        names = surplus["lm_head"]
        ctx.emit("LC402", "lm_head tensors are present but has_own_lm_head is not true: TensorRT-LLM ignores them "
                 "and uses the target's head, vLLM treats any lm_head tensor as owned", file="config.json",
                 pointer="$.has_own_lm_head", subjects=names, expected="true", actual=ctx.config.has_own_lm_head)
    if surplus.get("other"):
        names = [n for n in surplus["other"] if n not in fused]
        if len(names) < len(surplus["other"]):
            qkv = [n for n in surplus["other"] if n in fused]
            ctx.emit_for("LC204", strict, f"{len(qkv)} fused q/k/v tensors ({shorten(qkv)}) that "
                         + " and ".join(p.display for p in strict) + " does not split", subjects=qkv)
    if surplus.get("other") and names:
        embed = [n for n in names if n == "embed_tokens.weight"]
        if embed:
            uses = {"dropped": "drops it", "used": "uses it as the draft's own input embedding",
                    "replaced": "loads it, then replaces it with the target's"}
            ctx.emit("LC218", "the draft carries embed_tokens.weight: "
                     + "; ".join(f"{p.display} {uses[p.embed_tokens_copy]}" for p in ctx.profiles),
                     pointer="embed_tokens.weight", subjects=embed)
            names = [n for n in names if n not in embed]
    if surplus.get("other") and names:
        ctx.emit("LC204", f"{len(names)} tensors no loader reads: {shorten(names)}", subjects=names)

    _shapes_and_dtypes(ctx)


SIBLINGS = ("dflash2", "dspark", "domino")
_OWNER = {"candidate_selector.": "dflash2", "markov_head.": "dspark", "confidence_head.": "dspark",
          "prefix_gru.": "domino", "embed_proj.": "domino"}


def _foreign(ctx: Context, name: str) -> bool:
    """A sibling-head tensor of another family than the one declared (LC016 reports it)."""
    owner = next((f for prefix, f in _OWNER.items() if name.startswith(prefix)), "dspark")
    return owner != ctx.geometry.family


def _fused_qkv(ctx: Context) -> dict[str, list[str]]:
    """Float `layers.i.self_attn.qkv_proj.{weight,bias}` standing in for absent q/k/v tensors (every runtime
    resolves it to its fused qkv_proj and splits it), with the shape the manifest's separate tensors stack to."""
    present, expected = ctx.names.by_canonical, ctx.manifest.tensors
    out: dict[str, list[str]] = {}
    for name, info in present.items():
        m = re.fullmatch(r"(layers\.\d+\.self_attn\.)qkv_proj\.(weight|bias)", name)
        if not m or info.dtype not in FLOAT_DTYPES:
            continue
        parts = [f"{m.group(1)}{x}_proj.{m.group(2)}" for x in "qkv"]
        if not all(p in expected and p not in present for p in parts):
            continue
        shapes = [expected[p].shape for p in parts]
        if tuple(info.shape) == (sum(s[0] for s in shapes), *shapes[0][1:]):
            out[name] = parts
    return out


def _token_proj_width(ctx: Context) -> int | None:
    info = ctx.names.by_canonical.get("lilicorr.token_proj.weight")
    return info.shape[0] if info is not None and len(info.shape) == 2 else None


def _conv_hint(ctx: Context, names: list[str]) -> str:
    m = ctx.geometry.hidden_size
    for n in names:
        info = ctx.names.by_canonical[n]
        if n.endswith("base_kernel") and len(info.shape) == 3:
            taps = info.shape[1]
            for k in names:
                p = ctx.names.by_canonical[k]
                if k.endswith("kernel_projection.weight") and len(p.shape) == 2 and m and taps:
                    groups = p.shape[0] // (2 * taps)
                    if groups and m % groups == 0:
                        return f" (the tensors imply conv_kernel_size {taps}, conv_group_size {m // groups})"
            return f" (the tensors imply conv_kernel_size {taps})"
    return ""




def _shapes_and_dtypes(ctx: Context) -> None:
    m, present = ctx.manifest, ctx.names.by_canonical
    float_dtypes: dict[str, int] = {}
    for name, tensor in m.tensors.items():
        info = present.get(name)
        if info is None:
            continue
        if tensor.module and name == f"{tensor.module}.weight" and info.dtype in ("U8", "F8_E4M3"):
            continue  # quantized weight: checked against its quantized form below
        if info.dtype not in tensor.dtypes:
            hint = " (a quantized dtype on a module that cannot carry quantization)" if info.dtype in (
                "U8", "F8_E4M3") else ""
            ctx.emit("LC209", f"`{name}` is {info.dtype}{hint}", file=info.file, pointer=name,
                     expected="/".join(sorted(tensor.dtypes)), actual=info.dtype, subjects=[name])
        else:
            float_dtypes[info.dtype] = float_dtypes.get(info.dtype, 0) + 1
        if not tensor.shape_ok(info.shape):
            ctx.emit("LC208", _shape_message(ctx, name, tensor, info), file=info.file, pointer=name,
                     expected=list(tensor.shape), actual=list(info.shape), subjects=[name])
    if len(float_dtypes) > 1:
        ctx.emit("LC214", "floating-point tensors mix dtypes: " + ", ".join(f"{k} x{v}" for k, v in
                                                                            sorted(float_dtypes.items())))


def _shape_message(ctx: Context, name: str, tensor: ExpectedTensor, info: TensorInfo) -> str:
    g = ctx.geometry
    base = f"`{name}` is {list(info.shape)}, the config implies {list(tensor.shape)}"
    if name == "fc.weight" and len(info.shape) == 2 and g.hidden_size and info.shape[0] == g.hidden_size \
            and g.target_layer_ids is not None:
        taps = info.shape[1] / g.hidden_size
        return (base + f": fc reads {taps:g} target layers but target_layer_ids lists {len(g.target_layer_ids)} "
                f"({list(g.target_layer_ids)})")
    if tensor.component == "conv":
        return base + (f" (conv_kernel_size {g.conv_kernel_size}, conv_group_size {g.conv_group_size}: base_kernel is "
                       "[2, taps, M], kernel_projection [2*taps*M/group, M])")
    if name.startswith("lilicorr.") and g.head_hidden_size and len(info.shape) == len(tensor.shape):
        return base + (f" (lilicorr_hidden_size resolves to {g.head_hidden_size}; K={g.candidate_topk}, "
                       f"B={g.block_size}, N={g.head_num_heads}, F={g.head_factor_dim}, R={g.head_mlp_width})")
    return base
