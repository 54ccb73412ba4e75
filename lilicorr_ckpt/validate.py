"""The validate pipeline: source -> config -> tensor table -> manifest -> rules -> report."""

from __future__ import annotations

from typing import Any

import msgspec

from . import __version__
from .config import ParsedConfig, load_json_object, parse_config
from .findings import SEVERITY_ORDER, Finding
from .geometry import Geometry, resolve_geometry
from .manifest import Manifest, build_manifest
from .profiles import RuntimeProfile, select_profiles
from .remote import HubOrigin
from .rules import Context, run_checks
from .source import Source, open_source, read_small
from .target import TargetInfo, read_target
from .tensors import TensorTable, read_tensor_table


class Summary(msgspec.Struct, frozen=True):
    errors: int
    warnings: int
    infos: int
    waived: int = 0  # findings a waiver suppressed (not in the counts above)


class RuntimeVerdict(msgspec.Struct, frozen=True):
    runtime: str
    display: str
    accepted: bool
    errors: int
    warnings: int


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """The validate result; `lilicorr-ckpt validate --format json` prints exactly this."""

    tool: str = "lilicorr-ckpt"
    version: str = __version__
    schema_version: int = 1
    path: str
    architecture: str | None
    target: str | None
    runtimes: list[RuntimeVerdict]
    summary: Summary
    findings: list[Finding]
    geometry: dict[str, Any]
    exit_code: int
    hub: HubOrigin | None = None  # set when PATH was a Hub repo id: the commit it was read at


class Checkpoint(msgspec.Struct, frozen=True):
    """Everything read from a checkpoint directory (headers only)."""

    source: Source
    parsed: ParsedConfig
    geometry: Geometry
    manifest: Manifest
    table: TensorTable
    quant_docs: dict[str, Any]


def load_checkpoint(path: str) -> Checkpoint:
    source = open_source(path)
    assert source.config is not None
    parsed = parse_config(read_small(source.config, "config.json"))
    geometry = resolve_geometry(parsed.config)
    manifest = build_manifest(geometry)
    table = read_tensor_table(source)
    quant_docs: dict[str, Any] = {}
    if parsed.config.quantization_config is not None:
        quant_docs["config.json"] = parsed.config.quantization_config
    if source.hf_quant_config is not None:
        quant_docs["hf_quant_config.json"], _ = load_json_object(
            read_small(source.hf_quant_config, "hf_quant_config.json"), "hf_quant_config.json")
    return Checkpoint(source, parsed, geometry, manifest, table, quant_docs)


def verdicts(findings: list[Finding], profiles: list[RuntimeProfile]) -> list[RuntimeVerdict]:
    out = []
    for p in profiles:
        mine = [f for f in findings if not f.runtimes or p.name in f.runtimes]
        errors = sum(f.severity == "error" for f in mine)
        warnings = sum(f.severity == "warning" for f in mine)
        out.append(RuntimeVerdict(p.name, p.display, errors == 0, errors, warnings))
    return out


def exit_code_for(summary: Summary, strict: bool) -> int:
    return 1 if summary.errors or (strict and summary.warnings) else 0


def geometry_summary(g: Geometry) -> dict[str, Any]:
    out = msgspec.structs.asdict(g)
    out["target_layer_ids"] = list(g.target_layer_ids) if g.target_layer_ids is not None else None
    out["slots"] = g.slots
    out["head_mlp_width"] = g.head_mlp_width
    return out


def validate(path: str, *, runtime: str = "all", target: str | None = None, deep: bool = False,
             strict: bool = False, checkpoint: Checkpoint | None = None) -> Report:
    ckpt = checkpoint or load_checkpoint(path)
    profiles = select_profiles(runtime)
    target_info: TargetInfo | None = read_target(target) if target else None
    ctx = Context(source=ckpt.source, parsed=ckpt.parsed, geometry=ckpt.geometry, manifest=ckpt.manifest,
                  table=ckpt.table, profiles=profiles, quant_docs=ckpt.quant_docs, target=target_info, deep=deep)
    findings = sorted(run_checks(ctx), key=lambda f: (SEVERITY_ORDER[f.severity], f.rule))
    summary = Summary(errors=sum(f.severity == "error" for f in findings),
                      warnings=sum(f.severity == "warning" for f in findings),
                      infos=sum(f.severity == "info" for f in findings))
    return Report(path=path, architecture=ckpt.parsed.config.architecture, target=target,
                  runtimes=verdicts(findings, profiles), summary=summary, findings=findings,
                  geometry=geometry_summary(ckpt.geometry), exit_code=exit_code_for(summary, strict))
