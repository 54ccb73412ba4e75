"""`lilicorr-ckpt inspect`: what a checkpoint is, from its headers."""

from __future__ import annotations

from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.load import Checkpoint, NotADrafter, load_checkpoint
from lilicorr_ckpt.checkpoint.manifest import COMPONENTS, component_of_name
from lilicorr_ckpt.checkpoint.names import observed_scheme
from lilicorr_ckpt.checkpoint.speculators import SPECULATORS_LAYOUT, layout_name
from lilicorr_ckpt.checks.run import geometry_summary, validate
from lilicorr_ckpt.families import FAMILIES, is_drafter
from lilicorr_ckpt.report.escape import printable


class ComponentStats(msgspec.Struct, frozen=True):
    component: str
    tensors: int
    parameters: int
    bytes: int
    dtypes: dict[str, int]


class Inspection(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    architecture: str | None
    layout: str  # of config.json: "z-lab" (dflash_config) or "speculators" (read as vLLM translates it)
    geometry: dict[str, Any]
    components: list[ComponentStats]
    quantization: dict[str, Any] | None
    quantized_modules: dict[str, str]  # module -> nvfp4 | fp8
    files: list[str]
    runtimes: dict[str, bool]  # runtime -> accepts
    errors: int
    warnings: int


def _component(name: str, ckpt: Checkpoint) -> str:
    expected = ckpt.manifest.tensors.get(name)
    if expected is not None:
        return expected.component
    module = ckpt.manifest.module_of(name)
    if module is not None:
        return ckpt.manifest.modules[module].component
    component = component_of_name(name)
    return "backbone" if component == "fc" else component or "other"


def inspect_checkpoint(path: str) -> Inspection:
    try:
        ckpt = load_checkpoint(path)
    except NotADrafter as exc:
        raise NotADrafter(
            f"{exc}; inspect summarises drafter checkpoints (a DFlash-family config with dflash_config)"
        ) from None
    if not is_drafter(ckpt.parsed.raw):  # no dflash_config, no drafter architecture: nothing to summarise
        archs = ckpt.parsed.raw.get("architectures")
        raise NotADrafter(
            f"{ckpt.source.label} is not a drafter checkpoint (no dflash_config; architectures: "
            f"{archs if archs is not None else 'absent'}); inspect summarises drafters, "
            f"`lilicorr-ckpt validate` says what a drafter config needs"
        )
    view = ckpt.names
    stats: dict[str, dict[str, Any]] = {}
    for canonical, info in view.by_canonical.items():
        comp = _component(canonical, ckpt)
        entry = stats.setdefault(comp, {"tensors": 0, "parameters": 0, "bytes": 0, "dtypes": {}})
        entry["tensors"] += 1
        is_scale = canonical.rsplit(".", 1)[-1] in ("weight_scale", "weight_scale_2", "input_scale")
        if not is_scale:
            entry["parameters"] += info.numel * (2 if info.dtype == "U8" else 1)
        entry["bytes"] += info.nbytes
        entry["dtypes"][info.dtype] = entry["dtypes"].get(info.dtype, 0) + 1
    order = {c: i for i, c in enumerate((*COMPONENTS, "other"))}
    components = [
        ComponentStats(c, v["tensors"], v["parameters"], v["bytes"], dict(sorted(v["dtypes"].items())))
        for c, v in sorted(stats.items(), key=lambda kv: order.get(kv[0], 99))
    ]
    quantized = {m: s for m in ckpt.manifest.modules if (s := observed_scheme(view, m)) in ("nvfp4", "fp8")}
    report = validate(path, checkpoint=ckpt)
    quant = ckpt.quant.summary() if ckpt.quant is not None else None
    return Inspection(
        path=path,
        architecture=ckpt.parsed.config.architecture,
        layout=layout_name(ckpt.parsed.speculators),
        geometry=geometry_summary(ckpt.geometry),
        components=components,
        quantization=quant,
        quantized_modules=quantized,
        files=ckpt.table.files,
        runtimes={v.runtime: v.accepted for v in report.runtimes},
        errors=report.summary.errors,
        warnings=report.summary.warnings,
    )


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


# geometry keys every drafter has; a None among them (or among its head's) earns the "?" note
_BASE_KEYS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "block_size",
    "target_layer_ids",
    "mask_token_id",
)


def render_inspection(ins: Inspection) -> str:
    g = ins.geometry
    d = {key: "?" if value is None else value for key, value in g.items()}  # what the text shows
    lines = [f"{ins.path}: {ins.architecture or 'unknown architecture'}"]
    lines.append(
        f"  layout     {ins.layout}"
        + (
            " (speculators_config; shown as vLLM translates it)"
            if ins.layout == SPECULATORS_LAYOUT
            else " (dflash_config)"
        )
    )
    lines.append(
        f"  backbone   hidden {d['hidden_size']}, {d['num_layers']} layers, heads {d['num_heads']}/"
        f"{d['num_kv_heads']} x {d['head_dim']}, mlp {d['intermediate_size']}, vocab {d['vocab_size']}"
    )
    lines.append(
        f"  drafting   block {d['block_size']} ({d['slots']} slots), taps {d['target_layer_ids']}, "
        f"mask {d['mask_token_id']}"
    )
    # the heads it carries: LiLiCorr's when enabled (whatever the architecture), then its family's own
    heads = [FAMILIES["lilicorr"]] if g["lilicorr_enabled"] else []
    family = FAMILIES.get(g.get("family") or "")
    if family is not None and family.NAME != "lilicorr":
        heads.append(family)
    shown = set(_BASE_KEYS)
    for head in heads:
        lines += head.describe(d, g)
        shown |= set(head.DESCRIBED_KEYS)
    if g["conv_kernel_size"]:
        lines.append(f"  conv       {d['conv_kernel_size']} taps, group {d['conv_group_size']}")
    lines.append(f"  own head   {'yes' if g['has_own_lm_head'] else 'no (borrows the target lm_head)'}")
    if any(g.get(key) is None for key in shown):
        lines.append("  (? = missing or invalid in config.json; `lilicorr-ckpt validate` says which and why)")
    lines.append("")
    lines.append(f"  {'component':<10} {'tensors':>8} {'params':>9} {'bytes':>9}  dtypes")
    for c in ins.components:
        dtypes = ", ".join(f"{k} x{v}" for k, v in c.dtypes.items())
        lines.append(
            f"  {c.component:<10} {c.tensors:>8} {_human(c.parameters):>9} {_human(c.bytes):>9}  {dtypes}"
        )
    if ins.quantization:
        q = ins.quantization
        lines.append("")
        lines.append(
            f"  quantization {q['quant_algo']} (group {q['group_size']}, {q['form']} form in {q['source']}, "
            f"quant_method {q['quant_method']}), {len(ins.quantized_modules)} modules quantized"
        )
        lines.append(f"  exclusions   {', '.join(q['exclude']) or '(none)'}")
    lines.append("")
    verdict = ", ".join(f"{k}: {'accepts' if v else 'refuses'}" for k, v in ins.runtimes.items())
    lines.append(
        f"  runtimes     {verdict} ({ins.errors} errors, {ins.warnings} warnings; run `validate` for details)"
    )
    return (
        "\n".join(printable(line) for line in lines) + "\n"
    )  # names from the checkpoint cannot forge a line
