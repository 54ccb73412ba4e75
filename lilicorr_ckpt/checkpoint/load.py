"""A checkpoint directory read once (headers and configs only): what every command passes on."""

from __future__ import annotations

from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import (
    ParsedConfig,
    load_json_object,
    parse_config,
    target_model_architecture,
)
from lilicorr_ckpt.checkpoint.geometry import Geometry, resolve_geometry
from lilicorr_ckpt.checkpoint.manifest import Manifest, build_manifest
from lilicorr_ckpt.checkpoint.names import NameView, name_view
from lilicorr_ckpt.checkpoint.quant import QuantConfig, parse_quant_config
from lilicorr_ckpt.checkpoint.source import Source, open_source, read_small
from lilicorr_ckpt.checkpoint.speculators import KINDS, SpeculatorsOrigin, is_speculators, kind_of
from lilicorr_ckpt.checkpoint.tensors import TensorTable, read_tensor_table
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.report.escape import printable


class NotADrafter(InputError):
    """The directory holds a plain model (a target), not a drafter checkpoint."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    source: Source
    parsed: ParsedConfig
    geometry: Geometry
    manifest: Manifest
    table: TensorTable
    names: NameView
    quant_docs: dict[str, Any]  # source file -> raw quantization config document
    quant_configs: dict[str, QuantConfig]  # the documents that parse
    quant_problems: dict[str, list[str]]  # source file -> why (part of) it cannot be interpreted

    @property
    def speculators(self) -> SpeculatorsOrigin | None:
        """The speculators layout config.json was read from (None for the z-lab layout)."""
        return self.parsed.speculators

    @property
    def quant(self) -> QuantConfig | None:
        """The quantization config the loaders act on: config.json's, else hf_quant_config.json's."""
        return self.quant_configs.get("config.json") or self.quant_configs.get("hf_quant_config.json")


def assemble(
    source: Source, parsed: ParsedConfig, table: TensorTable, quant_docs: dict[str, Any]
) -> Checkpoint:
    """A Checkpoint from parts already read (convert builds one for its output before writing it)."""
    geometry = resolve_geometry(parsed.config)
    configs: dict[str, QuantConfig] = {}
    problems: dict[str, list[str]] = {}
    for src, doc in quant_docs.items():
        qc, issues = parse_quant_config(doc, src)
        if qc is not None:
            configs[src] = qc
        if issues:
            problems[src] = issues
    return Checkpoint(
        source=source,
        parsed=parsed,
        geometry=geometry,
        manifest=build_manifest(geometry, len(table.tensors)),
        table=table,
        names=name_view(table),
        quant_docs=quant_docs,
        quant_configs=configs,
        quant_problems=problems,
    )


def load_checkpoint(path: str) -> Checkpoint:
    source = open_source(path)
    assert source.config is not None
    parsed = parse_config(read_small(source.config, "config.json"))
    if is_speculators(parsed.raw) and kind_of(parsed.raw) not in KINDS:
        kind = parsed.raw.get("speculators_model_type")
        raise NotADrafter(
            f"{source.label} is a speculators "
            f"{printable(kind)[:80] if isinstance(kind, str) else '(no speculators_model_type)'} "
            f"drafter, not one of the DFlash family this tool checks (speculators_model_type "
            f"{', '.join(KINDS)})"
        )
    arch = target_model_architecture(parsed.raw)
    if arch is not None:  # a Llama passed where the drafter goes: say so, not "set architectures: ..."
        raise NotADrafter(
            f"{source.label} is a target model, not a drafter ({arch}; its config.json has no dflash_config)"
        )
    quant_docs: dict[str, Any] = {}
    if parsed.config.quantization_config is not None:
        quant_docs["config.json"] = parsed.config.quantization_config
    if source.hf_quant_config is not None:
        quant_docs["hf_quant_config.json"], _ = load_json_object(
            read_small(source.hf_quant_config, "hf_quant_config.json"), "hf_quant_config.json"
        )
    return assemble(source, parsed, read_tensor_table(source), quant_docs)
