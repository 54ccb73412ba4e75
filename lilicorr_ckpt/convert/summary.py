"""The convert command's text summary of a ConvertResult (its record)."""

from __future__ import annotations

import json
import re
from typing import Any

from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.convert.options import DEFAULT_RUNTIME, UNRELEASED

SHOWN_FILES = 6  # other files of SRC listed one per line in the summary before they are counted


def render_summary(result: Any) -> str:
    """The text `convert` prints: what was written (or would be), renamed, repaired, dropped and validated."""
    r = result.record
    out = r["output"]
    lines = [f"{'would convert' if not result.written else 'converted'} {result.src} -> {result.dst}"]
    quant = f", {out['quant_algo']} ({out['quant_method']})" if out["quant_algo"] else ""
    arch = (out["architecture"] or ["?"])[0]
    lines.append(
        f"  {arch}{quant}, {out['tensors']} tensors, {out['tensor_bytes'] / 1e6:.1f} MB in "
        f"{', '.join(out['files'])}"
    )
    lines += _render_layout(r.get("layout"))
    if r["renames"]:
        reasons: dict[str, int] = {}
        for item in r["renames"]:
            reasons[item["why"]] = reasons.get(item["why"], 0) + 1
        lines.append(
            f"  renamed   {len(r['renames'])} tensors ("
            + "; ".join(f"{why}: {n}" for why, n in sorted(reasons.items()))
            + ")"
        )
    groups: dict[tuple[str, str], list[str]] = {}
    for repair in r["repairs"]:
        if repair["action"] == "dequantized":
            what = f"{repair['from']} -> {repair['to']}: {repair['reason']}"
        else:
            what = "float module, dropped its stray " + ", ".join(
                sorted({d.rsplit(".", 1)[1] for d in repair["dropped"]})
            )
        groups.setdefault((re.sub(r"\.\d+\.", ".*.", repair["module"]), what), []).append(repair["module"])
    for (label, what), modules in groups.items():
        count = f" ({len(modules)} modules)" if len(modules) > 1 else ""
        lines.append(f"  repaired  {label}{count}: {what}")
    lines += _render_fused(r.get("fused_scales") or [], result.written)
    relabel = r.get("relabel")
    if relabel:
        dropped = relabel["input_scales_dropped"]
        lines.append(
            f"  relabel   quant_algo {relabel['from']} -> {relabel['to']} (--relabel-w4a16): {relabel['modules']} "
            "modules served weight-only, weights unchanged"
            + (f"; {dropped} input_scale dropped" if dropped else "")
        )
    explicit = [d for d in r["drops"] if not d["reason"].startswith("scale of a module")]
    for d in explicit:
        lines.append(f"  dropped   {d['tensor']} ({d['reason']})")
    for change in r["config"]:
        if change["key"] == "quantization_config":
            what = "removed" if change["action"] == "removed" else "rewritten in the flat form"
            lines.append(f"  config    quantization_config {what}")
        else:
            after = json.dumps(change.get("after")) if change["action"] != "removed" else "(removed)"
            lines.append(f"  config    {change['key']} = {after} ({change['reason']})")
    ex = r.get("exclusions") or {}
    if ex.get("dropped") or ex.get("stripped"):
        lines.append(
            f"  exclusions: {len(ex.get('stripped', {}))} training-prefixed entries stripped, "
            f"{len(ex.get('dropped', {}))} base-model entries dropped"
        )
    if "output" in ex:
        lines.append(f"  ignore    {ex['output']}")
    fixed = r.get("index_fixed") or {}
    if fixed:
        first = next(iter(fixed))
        lines.append(
            f"  index     the source index placed {len(fixed)} tensor(s) in a shard that does not hold them (e.g. "
            f"{first}: listed in {fixed[first]['listed']}, found in {fixed[first]['found']}); read from where they "
            "are, each placed right in the output"
        )
    lines += _render_other_files(r.get("other_files") or {})
    lines += _render_selection(r["options"]["runtime"])
    v = r.get("validation")
    if v:
        verdicts = ", ".join(f"{k}: {s}" for k, s in v["verdicts"].items())
        warn = f", {v['warnings']} warnings" if v["warnings"] else ""
        lines.append(f"  validate  {verdicts}{warn}")
    if r.get("verify"):
        lines.append(f"  verify    {r['verify']['summary']}")
    if result.kept:
        verb = "kept" if result.written else "would keep"
        lines.append(
            f"  {verb:<9} {shorten(result.kept, SHOWN_FILES, quote='')} in {result.dst} (not written by "
            "convert)"
        )
    if result.written:
        lines.append(f"  record    {result.dst}/conversion.json")
    return "\n".join(lines) + "\n"


def _render_layout(layout: dict[str, Any] | None) -> list[str]:
    """The layout line, when a speculators config is read or written."""
    if not layout or layout["source"] == layout["output"] == "z-lab":
        return []
    lines = [f"  layout    {layout['source']} -> {layout['output']}"]
    spec = layout.get("speculators")
    if spec:
        verifier = spec["verifier"]
        lines.append(
            f"  speculators  {spec['speculators_model_type']}: aux_hidden_state_layer_ids "
            f"{spec['aux_hidden_state_layer_ids']}, {spec['speculative_tokens']} speculative tokens, "
            f"sample_from_anchor {json.dumps(spec['sample_from_anchor'])}, sliding_window_non_causal "
            f"{json.dumps(spec['sliding_window_non_causal'])} (the mask it was trained with), verifier "
            + (json.dumps(verifier) if verifier is not None else "null (name the target with --verifier)")
        )
    return lines


def _render_fused(groups: list[dict[str, Any]], written: bool) -> list[str]:
    """What giving each fused linear one NVFP4 global scale did: the shards re-quantized and their largest
    error, next to the error of serving them as stored (what LC327 describes)."""
    lines: list[str] = []
    requant = [g for g in groups if g["requantized"]]
    if requant:
        kinds: dict[str, int] = {}
        for g in requant:
            label = re.sub(r"\.\d+\.", ".*.", g["module"])
            kinds[label] = kinds.get(label, 0) + 1
        shards = [s for g in requant for s in g["requantized"]]
        where = ", ".join(f"{label} x{n}" for label, n in kinds.items())
        line = (
            f"  unified   weight_scale_2 of {len(requant)} fused linears ({where}): {len(shards)} shards "
            f"{'re-quantized' if written else 'to re-quantize'} to their group's largest"
        )
        errors = [s["max_abs_error"] for s in shards if s["max_abs_error"] is not None]
        kept = [s["max_abs_error_if_kept"] for s in shards if s["max_abs_error_if_kept"] is not None]
        if errors and kept:
            line += f", max |dw| {max(errors):.3g} (served as stored: {max(kept):.3g})"
        lines.append(line)
    inputs = [g for g in groups if g.get("input_scale")]
    if inputs:
        lines.append(
            f"  unified   input_scale of {len(inputs)} fused linears to their group's largest (what SGLang and "
            "vLLM apply to the fused input already)"
        )
    return lines


def _render_selection(runtime: str) -> list[str]:
    """With the default selection, the unreleased loaders it leaves out and how to include them."""
    if runtime != DEFAULT_RUNTIME or not UNRELEASED:
        return []
    left = ", ".join(p.display for p in UNRELEASED)
    return [f"  runtimes  the released engines ({runtime}); {left} only with --runtime all (or naming it)"]


def _render_other_files(other: dict[str, Any]) -> list[str]:
    """One line per file, or per reason with a count and the first few names when there are many."""
    lines: list[str] = []
    copied, dropped = other.get("copied", []), other.get("dropped", [])
    if len(copied) <= SHOWN_FILES:
        lines += [f"  copied    {name} (unchanged)" for name in copied]
    else:
        lines.append(
            f"  copied    {len(copied)} other files unchanged: {shorten(copied, SHOWN_FILES, quote='')}"
        )
    if len(dropped) <= SHOWN_FILES:
        lines += [f"  left out  {d['file']}: {d['reason']}" for d in dropped]
    else:
        by_reason: dict[str, list[str]] = {}
        for d in dropped:
            by_reason.setdefault(d["reason"], []).append(d["file"])
        for reason, names in by_reason.items():
            count = f"{len(names)} files" if len(names) > 1 else names[0]
            shown = f" ({shorten(names, 3, quote='')})" if len(names) > 1 else ""
            lines.append(f"  left out  {count}{shown}: {reason}")
    return lines
