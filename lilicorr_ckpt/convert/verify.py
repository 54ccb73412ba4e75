"""--verify: run the source and the output through the reference runtime and compare what they compute.

Imports torch and `lilicorr_runtime` at import time: convert imports this module only for --verify (a missing
runtime is a usage error there). The converted output is loaded as smoke loads a drafter (validate, then build:
`lilicorr_ckpt.smoke.load.load_drafter`), and `lilicorr_runtime.model.probe.reference_outputs(drafter, seed=0)` gives
draft logits and head scores on fixed random inputs.

The runtime's loader is strict (it refuses what validate refuses), so a ModelOpt export cannot be loaded
as it is. The reference is therefore the source's own tensor bytes, renamed by the validator's
independent name mapping (checkpoint/names.py), quantized modules left quantized, next to the output's
config with quantization metadata that describes them; it is built without validation (no serving
runtime accepts every module quantized: TensorRT-LLM also slices the raw q/k/v weight), and the runtime
dequantizes with its own torch codec. Both drafters run in float32, so a correct conversion differs only by the rounding of the
repaired modules to the model dtype; renames must reproduce the source bit for bit.

A fused linear whose shards convert gave one NVFP4 global scale is re-quantized in the reference too, from the
source's own bytes under the validator's names (numerics' codec: dequantize, then quantize with the shared
weight_scale_2), so those shards must match bit for bit as well: a shard written under the wrong name, or
re-quantized from the wrong source, fails. How close a re-quantized shard stays to the source is measured here
(`requantized`: the largest |dw| per shard) and proven by the codec's tests.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lilicorr_ckpt.checkpoint.load import load_checkpoint
from lilicorr_ckpt.checkpoint.manifest import QUANT_SUFFIXES
from lilicorr_ckpt.checkpoint.names import name_view
from lilicorr_ckpt.checkpoint.numerics import decode, nvfp4_dequantize, nvfp4_quantize
from lilicorr_ckpt.checkpoint.stwrite import Entry, StreamWriter
from lilicorr_ckpt.checkpoint.tensors import TensorInfo
from lilicorr_ckpt.convert.destination import REF_TAG, TMP_TAG
from lilicorr_ckpt.convert.fused import scalar_bytes
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.plan import Plan
from lilicorr_ckpt.convert.qmeta import module_state, output_exclusions, output_quant_docs
from lilicorr_ckpt.smoke.load import load_drafter
from lilicorr_runtime.model.load import build_drafter
from lilicorr_runtime.model.probe import reference_outputs

REPAIR_RTOL = 2.0**-5  # a few bf16 ulps (2^-8 relative) after a handful of layers
REPAIR_ATOL = 1e-3
CHUNK = 16 << 20


def compare(
    reference: dict[str, Any], converted: dict[str, Any], exact: bool
) -> tuple[dict[str, Any], list[str]]:
    """Per-output differences, and the problems that fail verification."""
    stats: dict[str, Any] = {}
    problems: list[str] = []
    for key in sorted(set(reference) | set(converted)):
        if key not in reference or key not in converted:
            problems.append(f"output {key!r} is produced by only one of the source and the converted drafter")
            continue
        a, b = reference[key].detach().cpu(), converted[key].detach().cpu()
        if a.shape != b.shape:
            problems.append(f"{key}: shape {list(a.shape)} vs {list(b.shape)}")
            continue
        same = bool(torch.equal(a, b))
        if not a.is_floating_point():
            stats[key] = {"identical": same}
            if not same:
                differ = int((a != b).sum())
                problems.append(
                    f"{key}: {differ} of {a.numel()} entries differ"
                    + (
                        ""
                        if exact
                        else " (a candidate tie can flip under rounding; rerun on the source to compare)"
                    )
                )
            continue
        a64, b64 = a.double(), b.double()
        finite = torch.isfinite(a64) & torch.isfinite(b64)
        diff = (a64 - b64).abs()[finite]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        scale = float(a64.abs()[finite].max()) if finite.any() else 0.0
        stats[key] = {"identical": same, "max_abs_diff": max_abs, "max_abs_value": scale}
        if not torch.equal(torch.isfinite(a64), torch.isfinite(b64)):
            problems.append(f"{key}: non-finite values differ")
        elif exact and not same:
            problems.append(
                f"{key}: differs (max |diff| {max_abs:.3g}) although nothing was repaired, so it must "
                "be bit-identical"
            )
        elif not exact and max_abs > REPAIR_ATOL + REPAIR_RTOL * scale:
            problems.append(
                f"{key}: max |diff| {max_abs:.3g} exceeds bf16 rounding "
                f"({REPAIR_ATOL:g} + {REPAIR_RTOL:g} x {scale:.3g})"
            )
    return stats, problems


def _read(plan: Plan, info: TensorInfo) -> bytes:
    fd = os.open(plan.source.root / info.file, os.O_RDONLY)
    try:
        return os.pread(fd, info.end - info.start, info.start)
    finally:
        os.close(fd)


def requantized_reference(
    plan: Plan, keep: dict[str, TensorInfo]
) -> tuple[dict[str, bytes], dict[str, dict[str, float]]]:
    """The bytes of every tensor convert re-quantized or unified, computed again from the source (canonical name
    under the validator's mapping -> bytes), and each re-quantized shard's largest |dw| against the source."""
    out: dict[str, bytes] = {}
    stats: dict[str, dict[str, float]] = {}
    for group in plan.fused:
        for shard in group.requantized:
            weight, scale, scale_2 = (
                keep[f"{shard}.{s}"] for s in ("weight", "weight_scale", "weight_scale_2")
            )
            packed = np.frombuffer(_read(plan, weight), np.uint8).reshape(weight.shape)
            codes = np.frombuffer(_read(plan, scale), np.uint8).reshape(scale.shape)
            own = float(decode(_read(plan, scale_2), scale_2.dtype)[0])
            old = nvfp4_dequantize(packed, codes, own, plan.group_size)
            new_packed, new_codes, _ = nvfp4_quantize(old, plan.group_size, weight_scale_2=group.shared)
            new = nvfp4_dequantize(new_packed, new_codes, group.shared, plan.group_size)
            out[f"{shard}.weight"] = new_packed.tobytes()
            out[f"{shard}.weight_scale"] = new_codes.tobytes()
            out[f"{shard}.weight_scale_2"] = scalar_bytes(group.shared, scale_2)
            stats[shard] = {
                "max_abs_error": float(np.abs(new - old).max()),
                "max_abs_weight": float(np.abs(old).max()),
            }
        if group.shared_input is not None:
            for shard, value in group.input_scale.items():
                if value != group.shared_input:
                    out[f"{shard}.input_scale"] = scalar_bytes(
                        group.shared_input, keep[f"{shard}.input_scale"]
                    )
    return out, stats


def build_reference(plan: Plan, ref: Path, requantize: bool = True) -> dict[str, dict[str, float]]:
    """The source's tensors under the validator's names, with metadata that lets the runtime load them (a fused
    linear's shards re-quantized to its shared global scale, as convert does); returns each re-quantized shard's
    largest |dw| against the source."""
    explicit = {d["tensor"] for d in plan.record["drops"] if not d["reason"].startswith("scale of a module")}
    view = name_view(plan.table)
    keep = {c: info for c, info in view.by_canonical.items() if view.actual[c] not in explicit}
    states = {m: module_state(keep, m) for m in plan.manifest.modules}
    for module, state in states.items():  # unused scales of float modules would be refused as surplus
        if state == "float":
            for suffix in QUANT_SUFFIXES:
                keep.pop(f"{module}.{suffix}", None)
    quantized = {m for m, s in states.items() if s in ("nvfp4", "fp8")}
    floats = {m for m, s in states.items() if s == "float"}
    replaced, stats = requantized_reference(plan, keep) if requantize else ({}, {})
    config = copy.deepcopy(plan.config)
    config.pop("quantization_config", None)
    ref.mkdir()
    if quantized and plan.quant_algo:
        exclude = output_exclusions(plan.manifest, floats, quantized, "named")
        flat, nested = output_quant_docs(plan.quant_algo, plan.group_size, None, None, exclude)
        config["quantization_config"] = flat
        (ref / "hf_quant_config.json").write_text(json.dumps(nested))
    (ref / "config.json").write_text(json.dumps(config, allow_nan=True))
    writer = StreamWriter(ref / "model.safetensors", [Entry(c, i.dtype, i.shape) for c, i in keep.items()])
    fds: dict[str, int] = {}
    try:
        for entry in writer.entries:
            if entry.name in replaced:
                writer.write(entry.name, replaced[entry.name])
                continue
            info = keep[entry.name]
            fd = fds.setdefault(info.file, os.open(plan.source.root / info.file, os.O_RDONLY))
            for offset in range(info.start, info.end, CHUNK):
                writer.write(entry.name, os.pread(fd, min(CHUNK, info.end - offset), offset))
        writer.close(fsync=False)
    except BaseException:
        writer.abort()
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    return stats


def verify_conversion(plan: Plan, output: Path, options: ConvertOptions) -> dict[str, Any]:
    exact = not plan.dequantized  # re-quantized shards are reproduced in the reference: exact
    stem, _, pid = output.name.rpartition(TMP_TAG)
    ref = output.with_name(stem + REF_TAG + pid)  # as long as the temporary's name: it fits where that fits
    try:
        requantized = build_reference(plan, ref)
        try:
            source = build_drafter(load_checkpoint(str(ref)), dtype=torch.float32, device="cpu")
        except Exception as exc:  # the runtime's own refusal: a verification problem, not a crash
            return {
                "passed": False,
                "summary": "the reference runtime cannot load the source's tensors",
                "problems": [
                    f"lilicorr_runtime.build_drafter(source tensors) failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0]}"
                ],
            }
        converted = load_drafter(str(output), runtime=options.runtime, dtype=torch.float32, device="cpu")
        expected = reference_outputs(source, seed=0)
        actual = reference_outputs(converted, seed=0)
        as_stored: dict[str, Any] = {}
        if requantized:  # what the re-quantization changes, against the shards as stored (information only)
            shutil.rmtree(ref, ignore_errors=True)
            build_reference(plan, ref, requantize=False)
            stored = reference_outputs(
                build_drafter(load_checkpoint(str(ref)), dtype=torch.float32, device="cpu"), seed=0
            )
            as_stored = compare(stored, actual, exact=False)[0]
    finally:
        shutil.rmtree(ref, ignore_errors=True)
    stats, problems = compare(expected, actual, exact)
    mode = (
        (
            "bit-identical"
            + (" (re-quantized shards reproduced from the source)" if requantized else " (renames only)")
        )
        if exact
        else "within bf16 rounding of the repaired modules"
    )
    summary = (
        f"{len(stats)} outputs {mode}, through lilicorr_runtime"
        if not problems
        else f"{len(problems)} outputs differ beyond tolerance"
    )
    return {
        "passed": not problems,
        "mode": "exact" if exact else "bf16-rounding",
        "outputs": stats,
        "problems": problems,
        "summary": summary,
        "requantized": requantized,
        # each output against the source with its fused shards as stored (per-shard scales, as the reference runtime
        # computes them one by one): the effect of the re-quantization
        "against_shards_as_stored": as_stored,
    }
