"""Does the drafter fit the target? validate's `--target` rules (LC5xx), run by smoke before anything decodes.

Torch-free. smoke calls `require_fit` twice: on what `read_target` reads from the target's config or GGUF header
(before its weights load, so a misfit costs no load), and on the geometry of the model actually loaded (the
config may lack a value the loader fills in, which validate reports as LC507 and cannot judge).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from lilicorr_ckpt.checkpoint.load import Checkpoint
from lilicorr_ckpt.checkpoint.target import TargetInfo
from lilicorr_ckpt.checks import RULES
from lilicorr_ckpt.checks.context import Context, run_checks
from lilicorr_ckpt.checks.findings import SEVERITY_ORDER, Finding
from lilicorr_ckpt.checks.target import TGT
from lilicorr_ckpt.errors import SmokeRefused
from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.report.validate import finding_lines
from lilicorr_ckpt.runtimes import select_profiles

# what each target rule is about, for the refusal's first line
_ASPECT = {
    "LC501": "widths",
    "LC502": "taps",
    "LC503": "vocabulary",
    "LC504": "mask token",
    "LC505": "taps",
    "LC506": "rope_theta",
    "LC507": "unchecked target geometry",
}


class LoadedGeometry(Protocol):
    """What a loaded target (lilicorr_runtime's TargetModel or FastTarget) says about its own shape."""

    hidden_size: int
    num_layers: int
    vocab_size: int  # rows of its input embedding table


def target_findings(checkpoint: Checkpoint, target: TargetInfo, runtime: str) -> list[Finding]:
    """The findings `lilicorr-ckpt validate PATH --target T --runtime R` reports about the pair: every check runs,
    as validate runs them, and the target family's findings (LC5xx) are kept."""
    ctx = Context(checkpoint, profiles=select_profiles(runtime), target=target, deep=False)
    findings = [f for f in run_checks(ctx) if RULES[f.rule].area == TGT]
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.rule))


def loaded_info(header: TargetInfo, loaded: LoadedGeometry) -> TargetInfo:
    """The header's TargetInfo with the geometry of the model as loaded: nothing left unreadable."""
    return msgspec.structs.replace(
        header,
        hidden_size=int(loaded.hidden_size),
        num_layers=int(loaded.num_layers),
        vocab_size=int(loaded.vocab_size),
        embedding_rows=int(loaded.vocab_size),
        embedding_width=int(loaded.hidden_size),
        unreadable={},
    )


def require_fit(
    checkpoint: Checkpoint, target: TargetInfo, *, path: str, spec: str, runtime: str, loaded: bool = False
) -> list[Finding]:
    """validate's target findings for the pair (warnings included); SmokeRefused (exit 1) when one is an error, with
    every finding's line, so the taps, widths and vocabulary are named before anything decodes."""
    findings = target_findings(checkpoint, target, runtime)
    refusal = _refusal(checkpoint, target, findings, path=path, spec=spec, runtime=runtime, loaded=loaded)
    if refusal is not None:
        raise SmokeRefused(refusal)
    return findings


def fit_refusal(
    checkpoint: Checkpoint, target: TargetInfo, *, path: str, spec: str, runtime: str
) -> str | None:
    """require_fit's refusal as text, or None when the pair fits: smoke adds it to validate's refusal of the
    drafter, so that one run names every problem."""
    return _refusal(
        checkpoint,
        target,
        target_findings(checkpoint, target, runtime),
        path=path,
        spec=spec,
        runtime=runtime,
    )


def _refusal(
    checkpoint: Checkpoint,
    target: TargetInfo,
    findings: list[Finding],
    *,
    path: str,
    spec: str,
    runtime: str,
    loaded: bool = False,
) -> str | None:
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return None
    aspects = list(dict.fromkeys(_ASPECT.get(f.rule, f.name) for f in errors))
    when = (
        "checked on the target as loaded, before decoding"
        if loaded
        else "checked from the target's config, before its weights load"
    )
    lines = [f"drafter and target do not match: {', '.join(aspects)} ({when}; nothing was decoded)"]
    g = checkpoint.geometry
    for f in findings:
        if f.severity == "info":
            continue
        lines += finding_lines(f)
        if (
            f.rule == "LC501"
            and f.pointer == "$.hidden_size"
            and g.num_taps
            and g.hidden_size
            and target.hidden_size
        ):
            taps = g.num_taps
            lines.append(
                f"      fc takes {taps} taps x {g.hidden_size} = {taps * g.hidden_size} features of the "
                f"target's hidden states; this target's give {taps} x {target.hidden_size} = "
                f"{taps * target.hidden_size}"
            )
    flag = "" if runtime == "all" else f" --runtime {runtime}"
    lines.append(
        f"  `lilicorr-ckpt validate {printable(path)} --target {printable(spec)}{flag}` reports the same findings"
    )
    return "\n".join(lines)
