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
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from lilicorr_ckpt.checkpoint.load import load_checkpoint
from lilicorr_ckpt.checkpoint.manifest import QUANT_SUFFIXES
from lilicorr_ckpt.checkpoint.names import name_view
from lilicorr_ckpt.checkpoint.stwrite import Entry, StreamWriter
from lilicorr_ckpt.convert.destination import REF_TAG, TMP_TAG
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


def build_reference(plan: Plan, ref: Path) -> None:
    """The source's tensors under the validator's names, with metadata that lets the runtime load them."""
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


def verify_conversion(plan: Plan, output: Path, options: ConvertOptions) -> dict[str, Any]:
    exact = not plan.transformed
    stem, _, pid = output.name.rpartition(TMP_TAG)
    ref = output.with_name(stem + REF_TAG + pid)  # as long as the temporary's name: it fits where that fits
    try:
        build_reference(plan, ref)
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
    finally:
        shutil.rmtree(ref, ignore_errors=True)
    stats, problems = compare(expected, actual, exact)
    mode = "bit-identical (renames only)" if exact else "within bf16 rounding of the repaired modules"
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
    }
