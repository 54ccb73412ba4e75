"""--verify: load source and output through the reference runtime and compare what they compute.

Needs torch and `lilicorr_runtime` with
    load_drafter(path, runtime=..., dtype=..., device=...) -> drafter
    probe.reference_outputs(drafter, seed=0) -> dict[str, Tensor]   (draft logits and head scores)
Both are loaded in float32, so the only difference a correct conversion leaves is the rounding of the
repaired modules to the model dtype: renames must reproduce the source bit for bit.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .options import ConvertOptions
from .plan import Plan

# repaired modules are rounded to bf16 (8 significant bits): outputs may move by a few ulps of bf16
REPAIR_RTOL = 2.0**-6
REPAIR_ATOL = 1e-3
INSTALL_HINT = "--verify needs torch and lilicorr_runtime: pip install 'lilicorr-ckpt[runtime]'"


def require_runtime() -> Any:
    """The runtime module, or a usage error saying what to install."""
    try:
        importlib.import_module("torch")
        runtime = importlib.import_module("lilicorr_runtime")
        probe = importlib.import_module("lilicorr_runtime.probe")
    except ImportError as exc:
        raise UsageError(f"{INSTALL_HINT} ({exc})") from None
    if not callable(getattr(runtime, "load_drafter", None)) or not callable(getattr(probe, "reference_outputs", None)):
        raise UsageError(f"{INSTALL_HINT}: this lilicorr_runtime has no load_drafter / probe.reference_outputs")
    return runtime


def _runtime_name(options: ConvertOptions) -> str:
    return "sglang" if options.runtime == "all" else options.runtime


def compare(reference: dict[str, Any], converted: dict[str, Any], exact: bool) -> tuple[dict[str, Any], list[str]]:
    """Per-output max differences, and the problems that fail verification."""
    import torch

    stats: dict[str, Any] = {}
    problems: list[str] = []
    for key in sorted(set(reference) | set(converted)):
        if key not in reference or key not in converted:
            problems.append(f"output {key!r} is produced by only one of source and converted drafter")
            continue
        a = reference[key].detach().to("cpu", torch.float64)
        b = converted[key].detach().to("cpu", torch.float64)
        if a.shape != b.shape:
            problems.append(f"{key}: shape {list(a.shape)} vs {list(b.shape)}")
            continue
        same = bool(torch.equal(reference[key].detach().cpu(), converted[key].detach().cpu()))
        finite = torch.isfinite(a) & torch.isfinite(b)
        diff = (a - b).abs()[finite]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        scale = float(a.abs()[finite].max()) if finite.any() else 0.0
        stats[key] = {"identical": same, "max_abs_diff": max_abs, "max_abs_value": scale}
        if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
            problems.append(f"{key}: non-finite values differ")
        elif exact and not same:
            problems.append(f"{key}: differs (max |diff| {max_abs:.3g}) but nothing was repaired, so it must be "
                            "bit-identical")
        elif not exact and max_abs > REPAIR_ATOL + REPAIR_RTOL * scale:
            problems.append(f"{key}: max |diff| {max_abs:.3g} exceeds bf16 rounding "
                            f"({REPAIR_ATOL:g} + {REPAIR_RTOL:g} x {scale:.3g})")
    return stats, problems


def verify_conversion(plan: Plan, output: Path, options: ConvertOptions) -> dict[str, Any]:
    runtime = require_runtime()
    probe = importlib.import_module("lilicorr_runtime.probe")
    import torch

    name = _runtime_name(options)
    exact = not plan.transformed
    try:
        source = runtime.load_drafter(str(plan.source.root), runtime=name, dtype=torch.float32, device="cpu")
    except Exception as exc:  # the runtime's own refusal, reported as a verification problem
        return {"passed": False, "runtime": name, "summary": "the reference runtime cannot load the source",
                "problems": [f"lilicorr_runtime.load_drafter(source) failed: {type(exc).__name__}: {exc}"]}
    converted = runtime.load_drafter(str(output), runtime=name, dtype=torch.float32, device="cpu")
    reference = probe.reference_outputs(source, seed=0)
    result = probe.reference_outputs(converted, seed=0)
    stats, problems = compare(reference, result, exact)
    mode = "bit-identical (renames only)" if exact else "within bf16 rounding (repaired modules)"
    summary = (f"{len(stats)} outputs {mode} through lilicorr_runtime ({name})" if not problems
               else f"{len(problems)} outputs differ beyond tolerance")
    return {"passed": not problems, "runtime": name, "mode": "exact" if exact else "bf16-rounding",
            "outputs": stats, "problems": problems, "summary": summary}
