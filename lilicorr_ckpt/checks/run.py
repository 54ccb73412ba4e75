"""The validate pipeline: source -> config -> tensor table -> manifest -> rules -> report.

The Report it returns is data (lilicorr_ckpt/results.py); `Report` is importable from here too, for callers of
the pipeline that name its result."""

from __future__ import annotations

from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.geometry import Geometry
from lilicorr_ckpt.checkpoint.load import Checkpoint, NotADrafter, load_checkpoint
from lilicorr_ckpt.checkpoint.remote import (
    DEFAULT_TIMEOUT,
    HubSpec,
    hub_label,
    hub_spec,
    offline_mode,
    open_hub,
)
from lilicorr_ckpt.checkpoint.speculators import layout_name
from lilicorr_ckpt.checkpoint.target import TargetInfo, read_target
from lilicorr_ckpt.checks.context import Context, run_checks
from lilicorr_ckpt.checks.waivers import check_rule_options, explicit_config, parse_config, waive_report
from lilicorr_ckpt.errors import CheckpointInvalid, UsageError
from lilicorr_ckpt.results import SEVERITY_ORDER, Finding, Report, RuntimeVerdict, Summary
from lilicorr_ckpt.runtimes import RuntimeProfile, select_profiles


def verdicts(findings: list[Finding], profiles: list[RuntimeProfile]) -> list[RuntimeVerdict]:
    out = []
    for p in profiles:
        mine = [f for f in findings if not f.runtimes or p.name in f.runtimes]
        errors = sum(f.severity == "error" for f in mine)
        warnings = sum(f.severity == "warning" for f in mine)
        out.append(
            RuntimeVerdict(
                p.name,
                p.display,
                errors == 0,
                errors,
                warnings,
                version=p.version,
                released=p.released,
                source=p.source,
                engine=p.engine_id,
            )
        )
    return out


def exit_code_for(summary: Summary, strict: bool) -> int:
    return 1 if summary.errors or (strict and summary.warnings) else 0


def geometry_summary(g: Geometry) -> dict[str, Any]:
    out = msgspec.structs.asdict(g)
    out["target_layer_ids"] = list(g.target_layer_ids) if g.target_layer_ids is not None else None
    out["slots"] = g.slots
    out["head_mlp_width"] = g.head_mlp_width
    return out


def validate(
    path: str,
    *,
    runtime: str = "all",
    target: str | None = None,
    deep: bool = False,
    strict: bool = False,
    checkpoint: Checkpoint | None = None,
    headers_only: bool = False,
) -> Report:
    try:
        ckpt = checkpoint or load_checkpoint(path)
    except NotADrafter as exc:
        raise NotADrafter(f"{exc} (did you swap PATH and --target?)") from None
    profiles = select_profiles(runtime)
    target_info: TargetInfo | None = read_target(target) if target else None
    ctx = Context(ckpt, profiles=profiles, target=target_info, deep=deep, headers_only=headers_only)
    findings = sorted(run_checks(ctx), key=lambda f: (SEVERITY_ORDER[f.severity], f.rule))
    summary = Summary(
        errors=sum(f.severity == "error" for f in findings),
        warnings=sum(f.severity == "warning" for f in findings),
        infos=sum(f.severity == "info" for f in findings),
    )
    return Report(
        path=path,
        architecture=ckpt.parsed.config.architecture,
        target=target,
        runtimes=verdicts(findings, profiles),
        summary=summary,
        findings=findings,
        geometry=geometry_summary(ckpt.geometry),
        exit_code=exit_code_for(summary, strict),
        strict=strict,
        layout=layout_name(ckpt.parsed.speculators),
    )


def error_report(path: str, error: str, *, target: str | None = None, strict: bool = False) -> Report:
    """The report of a validate that could not read its input (exit 2), so that every report file a CI job
    asked for still exists and says why (JUnit <error>, SARIF executionSuccessful false, JSON `error`)."""
    return Report(
        path=path,
        architecture=None,
        target=target,
        runtimes=[],
        summary=Summary(0, 0, 0),
        findings=[],
        geometry={},
        exit_code=2,
        strict=strict,
        error=error,
    )


def validate_hub(
    spec: HubSpec,
    *,
    runtime: str = "all",
    target: str | None = None,
    strict: bool = False,
    deep: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    """validate() for a Hub repo id: headers read from the Hub (within `timeout` seconds in all), or the cached
    snapshot in offline mode."""
    if deep and not offline_mode():
        raise UsageError(f"--deep cannot read {spec.label} from the Hub (headers only)")
    with open_hub(spec, timeout) as (ckpt, origin):
        report = validate(
            hub_label(spec, origin),
            runtime=runtime,
            target=target,
            strict=strict,
            deep=deep,
            checkpoint=ckpt,
            headers_only=origin.read_from == "hub" and not origin.scales_read,
        )
    return msgspec.structs.replace(report, hub=origin)


def validate_spec(
    path: str,
    *,
    runtime: str = "all",
    target: str | None = None,
    deep: bool = False,
    strict: bool = False,
    revision: str | None = None,
    ignore: str | None = None,
    select: str | None = None,
    config: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    """What `lilicorr-ckpt validate` runs: PATH a local directory or a Hub repo id `org/name[@REV]`, then the
    waivers (--ignore, --select, and --config FILE or else the lilicorr.toml / pyproject.toml found from a local
    checkpoint up to its git work tree's root) applied."""
    check_rule_options(ignore, select)
    select_profiles(runtime)  # an unknown engine or release is a usage error before any work
    if config is not None:
        parse_config(*explicit_config(config))  # a bad waiver file is a usage error before any work
    hub = hub_spec(path, revision, deep=deep)  # None: a local directory
    report = (
        validate_hub(hub, runtime=runtime, target=target, strict=strict, deep=deep, timeout=timeout)
        if hub
        else validate(path, runtime=runtime, target=target, deep=deep, strict=strict)
    )
    return waive_report(
        report,
        checkpoint_dir=None if hub else path,
        ignore=ignore,
        select=select,
        strict=strict,
        config=config,
    )


def require_valid(checkpoint: Checkpoint, runtime: str = "all") -> Report:
    """validate's report for a checkpoint already read; CheckpointInvalid when it has errors for `runtime`."""
    report = validate(checkpoint.source.label, runtime=runtime, checkpoint=checkpoint)
    if report.summary.errors:
        raise CheckpointInvalid(
            f"{checkpoint.source.label} is refused for runtime {runtime!r}:",
            [f"{f.rule} {f.message}" for f in report.findings if f.severity == "error"],
            report,
        )
    return report
