"""The conversion plan: every output tensor with where its bytes come from, the output configs and the
record of every rename, drop, repair and synthesized key. Built from headers and configs only."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt import __version__
from lilicorr_ckpt.checkpoint.config import ARCHITECTURES, load_json_object, parse_config
from lilicorr_ckpt.checkpoint.geometry import resolve_geometry
from lilicorr_ckpt.checkpoint.load import assemble
from lilicorr_ckpt.checkpoint.manifest import (
    DTYPE_BYTES,
    QUANT_SUFFIXES,
    LinearModule,
    Manifest,
    build_manifest,
    quant_scheme,
)
from lilicorr_ckpt.checkpoint.names import map_name, strip_prefixes
from lilicorr_ckpt.checkpoint.source import Source, open_source, read_small
from lilicorr_ckpt.checkpoint.stwrite import Entry, header_bytes, layout
from lilicorr_ckpt.checkpoint.tensors import ShardFacts, TensorInfo, TensorTable, read_tensor_table
from lilicorr_ckpt.checkpoint.text import shorten
from lilicorr_ckpt.checks.findings import RULES
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.convert import extras
from lilicorr_ckpt.convert.fused import FusedGroup, describe_groups, plan_fused_scales, scalar_bytes
from lilicorr_ckpt.convert.layout import (
    DISPLAY,
    SPECULATORS,
    ZLAB,
    layout_of,
    speculators_from_zlab,
    zlab_from_speculators,
)
from lilicorr_ckpt.convert.naming import (
    is_derived_buffer,
    matches,
    natural_key,
    output_name,
    resolve_naming,
)
from lilicorr_ckpt.convert.normalize import (
    DSPARK_FLAT_TO_SERVED,
    ConfigEditor,
    apply_overrides,
    model_dtype,
    normalize_config,
)
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.qmeta import (
    FP8_ALGOS,
    NVFP4_ALGOS,
    WEIGHT_KIND,
    SourceQuant,
    declared_excluded,
    infer_algo,
    infer_group_size,
    module_state,
    output_exclusions,
    output_quant_docs,
    quant_method,
    read_exclusions,
    read_source_quant,
)
from lilicorr_ckpt.convert.reader import SourceReader
from lilicorr_ckpt.convert.repair import expected_inputs, input_fits
from lilicorr_ckpt.errors import ConversionRefused, InputError, UsageError
from lilicorr_ckpt.families import FAMILIES
from lilicorr_ckpt.runtimes import fused_name, matches_any, select_profiles

HASH_PLACEHOLDER = "0" * 64
META_TOOL = "lilicorr_ckpt.tool"
META_SOURCE = "lilicorr_ckpt.source_sha256"
META_RECORD = "lilicorr_ckpt.record"
# the target-to-draft mask speculators saves beside d2t for a reduced draft vocabulary: training-only (vLLM's loaders
# skip it, SGLang drops it), copied unchanged so that the layouts convert into each other byte for byte
TARGET_TO_DRAFT = "t2d"
SHOWN = 8  # names listed in a refusal before "and N more"


class OutTensor(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # in the output (requested naming)
    canonical: str
    dtype: str
    shape: tuple[int, ...]
    op: str  # copy | dequantize | requantize | constant
    source: TensorInfo | None = None  # copy: the bytes to copy
    # dequantize, requantize: weight, weight_scale[, weight_scale_2] of the source module
    inputs: dict[str, TensorInfo] = {}
    kind: str = ""  # dequantize: nvfp4 | fp8
    group_size: int = 16
    part: str = ""  # requantize: which tensor of the re-quantized shard this is (weight | weight_scale)
    shared_scale_2: float = 0.0  # requantize: the fused group's weight_scale_2
    data: bytes = b""  # constant: the bytes (a unified scale)

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


class ShardPlan(msgspec.Struct, kw_only=True):
    file: str
    entries: list[Entry]  # safetensors layout order
    header_length: int  # bytes before the first tensor (8-byte length + JSON), same with real hashes

    @property
    def data_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


class Plan(msgspec.Struct, kw_only=True):
    source: Source
    table: TensorTable
    source_files: list[str]  # every source file read (relative), hashed for provenance
    config: dict[str, Any]
    hf_quant_config: dict[str, Any] | None
    tensors: dict[str, OutTensor]  # output name -> tensor
    shards: list[ShardPlan]
    index: dict[str, Any] | None
    model_dtype: str
    manifest: Manifest
    record: dict[str, Any]
    quant_algo: str | None = None  # of the source's quantized weights (before repairs)
    group_size: int = 16
    fused: list[FusedGroup] = []  # fused linears whose shards get one global scale (re-quantized)
    copies: list[str] = []  # other files of the source, copied unchanged (relative names)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def transformed(self) -> list[OutTensor]:
        return [t for t in self.tensors.values() if t.op != "copy"]

    @property
    def dequantized(self) -> list[OutTensor]:
        return [t for t in self.tensors.values() if t.op == "dequantize"]


def shard_metadata(source_hashes: dict[str, str]) -> dict[str, str]:
    return {
        "format": "pt",
        META_TOOL: f"lilicorr-ckpt {__version__} convert",
        META_SOURCE: json.dumps(dict(sorted(source_hashes.items())), separators=(",", ":")),
        META_RECORD: "conversion.json",
    }


def _check_layout(source: Source, raw: dict[str, Any]) -> None:
    arch = raw.get("architectures")
    known = isinstance(arch, list) and arch and arch[0] in ARCHITECTURES
    if not known and not isinstance(raw.get("dflash_config"), dict):
        found = f"architectures {arch!r}" if arch is not None else "no architectures"
        raise InputError(
            f"{source.label} is not a DFlash-family drafter export ({found}, no dflash_config); expected a ModelOpt "
            f"DFlash-family export: config.json with a `dflash_config` object (or architectures one of "
            f"{', '.join(ARCHITECTURES)}) next to model.safetensors or a sharded index"
        )
    if not source.safetensors and source.index is None:
        pickles = (
            f" (found {', '.join(p.name for p in source.pickles)}; pickle files are never unpickled)"
            if source.pickles
            else ""
        )
        raise InputError(
            f"{source.label} has no *.safetensors weights{pickles}; expected model.safetensors or "
            "model.safetensors.index.json with its shards"
        )


def _check_shards(table: TensorTable) -> None:
    s = table.shards
    problems: list[str] = []
    for shard, names in s.missing_shards.items():
        problems.append(f"the index places {len(names)} tensors in {shard}, which does not exist")
    if s.index_only:
        problems.append(
            f"the index lists tensors its shards do not hold: {shorten(sorted(s.index_only), SHOWN, quote='')}"
        )
    for name, holders in sorted(s.duplicates.items()):
        problems.append(f"{name} is stored in {', '.join(holders)}; keep one copy")
    if s.shard_only:
        problems.append(
            f"the shards hold tensors the index does not list (stale index?): {shorten(sorted(s.shard_only), SHOWN, quote='')}"
        )
    if s.unreferenced:
        problems.append(
            f"safetensors files the index does not reference: {', '.join(s.unreferenced)}; move them "
            "out so it is clear which files are the checkpoint"
        )
    if problems:
        raise InputError(
            "the source's shards and index disagree, so which tensors form the checkpoint is "
            "ambiguous:\n  - " + "\n  - ".join(problems)
        )


REWRITTEN_KEYS = ("$.architectures", "$.quantization_config")  # convert replaces these whatever they hold


def _refuse_mistyped(doc: dict[str, Any]) -> None:
    issues = [
        i
        for i in parse_config(json.dumps(doc, allow_nan=True).encode()).issues
        if not i.path.startswith(REWRITTEN_KEYS)
    ]
    if issues:
        raise ConversionRefused(
            "config.json has fields of the wrong type",
            [f"{i.describe()}; fix: --set {i.path[2:].split('[')[0]}=VALUE" for i in issues],
        )


def _config_errors(source: Source, parsed: Any, runtime: str) -> list[str]:
    """validate's config findings (errors) for a config, without looking at any tensor."""
    facts = ShardFacts(
        missing_shards={},
        index_only={},
        shard_only={},
        misplaced={},
        duplicates={},
        unreferenced=[],
        total_size_declared=None,
        total_size_actual=0,
        has_index=False,
        both_single_and_index=False,
    )
    empty = TensorTable(tensors={}, files=[], metadata={}, shards=facts)
    report = validate(source.label, runtime=runtime, checkpoint=assemble(source, parsed, empty, {}))
    return [
        f"{f.rule} {f.message}"
        for f in report.findings
        if f.severity == "error" and RULES[f.rule].area == "config"
    ]


# ---------------------------------------------------------------- the phases of a plan, in order
# Each phase reads what the earlier ones decided and returns its own part; a refusal is raised by the phase that
# finds it, in this order, so the first problem a source has is the one reported.


class SourceRead(msgspec.Struct, frozen=True, kw_only=True):
    source: Source
    raw: dict[str, Any]  # config.json as found; a speculators config as the z-lab config it stands for
    table: TensorTable
    layout: str = ZLAB  # of config.json as found (convert/layout.py)


class Naming(msgspec.Struct, frozen=True, kw_only=True):
    by_canonical: dict[
        str, list[str]
    ]  # canonical name -> the source names that map to it (one, or a collision)
    canonical: dict[str, TensorInfo]  # canonical name -> the source tensor
    drops: list[dict[str, str]]  # --drop and derived buffers, as conversion.json records them


class ConfigPlan(msgspec.Struct, frozen=True, kw_only=True):
    editor: ConfigEditor  # the output config, edited further by the quantization metadata phase
    dtype: str  # the model's float dtype: what repairs write
    manifest: Manifest


class QuantPlan(msgspec.Struct, frozen=True, kw_only=True):
    squant: SourceQuant | None  # the source's quantization metadata
    states: dict[str, str]  # module -> float | nvfp4 | fp8 (as its tensors are stored)
    quantized: dict[str, str]  # module -> nvfp4 | fp8
    algo: str | None  # named by the metadata, or inferred from the tensors
    group: int
    synthesized_algo: bool  # algo was inferred (the source had no metadata naming it)


class RepairPlan(msgspec.Struct, frozen=True, kw_only=True):
    repaired: dict[str, str]  # quantized module that must be dequantized -> why
    stray: dict[str, list[str]]  # float module -> the scales it ships, dropped
    kinds: dict[str, str] = {}  # repaired module -> nvfp4 | fp8 (as stored)
    siblings: dict[
        str, LinearModule
    ] = {}  # a sibling head's linears (manifest.tensors lists them as tensors)


class ActivationPlan(msgspec.Struct, frozen=True, kw_only=True):
    algo: str | None  # the output's quant_algo (W4A16_NVFP4 after --relabel-w4a16)
    relabel: dict[str, Any] | None  # conversion.json's account of a relabelling
    dropped: list[str]  # input_scale tensors --relabel-w4a16 drops (canonical names)


class OutputTensors(msgspec.Struct, frozen=True, kw_only=True):
    tensors: dict[str, OutTensor]  # output name -> tensor, in the order they are planned
    renames: list[dict[str, str]]
    drops: list[dict[str, str]]  # the naming phase's, then the scales the repairs drop
    repairs: list[dict[str, Any]]


class QuantMetadata(msgspec.Struct, frozen=True, kw_only=True):
    quantized_out: set[str]  # modules still quantized in the output
    hf_quant: dict[str, Any] | None  # hf_quant_config.json to write
    exclusions: dict[str, Any]  # conversion.json's account of the exclusion lists


def read_source(src: str) -> SourceRead:
    """The source's config and tensor table; refused when it is not a drafter export or its shards disagree."""
    source = open_source(src)
    assert source.config is not None
    raw, _ = load_json_object(read_small(source.config, "config.json"), "config.json")
    found = layout_of(raw)
    if found == SPECULATORS:  # planned as the z-lab config it stands for; --to speculators writes it back
        raw = zlab_from_speculators(raw)
    _check_layout(source, raw)
    table = read_tensor_table(source)
    if table.duplicate_keys:  # LC609: which entry a loader keeps is not defined, so there is nothing to copy
        raise ConversionRefused(
            "a safetensors header names a tensor twice (convert cannot tell which entry is meant)",
            [f"{rel}: {', '.join(names)}" for rel, names in table.duplicate_keys.items()],
        )
    _check_shards(table)
    return SourceRead(source=source, raw=raw, table=table, layout=found)


def name_tensors(read: SourceRead, options: ConvertOptions, src: str) -> Naming:
    """Every source tensor's canonical name, after --drop and the derived buffers; no two may share one."""
    drops: list[dict[str, str]] = []
    used_drop: set[str] = set()
    by_canonical: dict[str, list[str]] = {}
    for name in sorted(read.table.tensors, key=natural_key):
        m = map_name(name)
        hits = [p for p in options.drop if matches((p,), name, m.canonical)]
        if hits:
            used_drop.update(hits)
            drops.append({"tensor": name, "reason": f"--drop {hits[0]}"})
            continue
        if is_derived_buffer(m.canonical):
            drops.append(
                {
                    "tensor": name,
                    "reason": "derived buffer every loader recomputes (ModelOpt's exporter drops it too)",
                }
            )
            continue
        by_canonical.setdefault(m.canonical, []).append(name)
    by_canonical = _served_dspark(by_canonical, read.raw)
    unused = [p for p in options.drop if p not in used_drop]
    if unused:
        raise UsageError(
            f"--drop {', '.join(unused)} matches no tensor of {src} (patterns match source or "
            "converted names, e.g. 'model.embed_tokens.*')"
        )
    collisions = {c: names for c, names in by_canonical.items() if len(names) > 1}
    if collisions:
        raise ConversionRefused(
            "tensor names collide after renaming (prefixes stripped, legacy head names made canonical)",
            [
                f"{', '.join(names)} all become {c}; keep one with --drop"
                for c, names in sorted(collisions.items())
            ],
        )
    canonical = {c: read.table.tensors[names[0]] for c, names in by_canonical.items()}
    return Naming(by_canonical=by_canonical, canonical=canonical, drops=drops)


def _served_name(canonical: str) -> str:
    """A flat DSpark name in the served layout; its quantization scales follow the weight (markov_w2.weight_scale ->
    markov_head.markov_w2.weight_scale)."""
    base, _, suffix = canonical.rpartition(".")
    if suffix in QUANT_SUFFIXES and f"{base}.weight" in DSPARK_FLAT_TO_SERVED:
        return DSPARK_FLAT_TO_SERVED[f"{base}.weight"].removesuffix("weight") + suffix
    return DSPARK_FLAT_TO_SERVED.get(canonical, canonical)


def _served_dspark(by_canonical: dict[str, list[str]], raw: dict[str, Any]) -> dict[str, list[str]]:
    """Model-Optimizer's flat DSpark names: no serving loader reads them; write the served (nested) layout."""
    if not any(c in DSPARK_FLAT_TO_SERVED for c in by_canonical):
        return by_canonical
    if str(raw.get("model_type", "qwen3")).lower() not in ("qwen3", "qwen3_moe"):
        raise ConversionRefused(
            "no runtime loads this DSpark layout",
            [
                f"model_type {raw.get('model_type')!r}: the served DSpark "
                "layout (Qwen3DSparkModel) is the Qwen3 one; vLLM's DSparkDraftModel is its DeepSeek-V4 class"
            ],
        )
    merged: dict[str, list[str]] = {}
    for c, names in by_canonical.items():
        merged.setdefault(_served_name(c), []).extend(names)
    return merged


def plan_config(read: SourceRead, naming: Naming, options: ConvertOptions) -> ConfigPlan:
    """The output config (--set, then what the tensors imply) and the manifest of tensors it determines."""
    pinned = {k for k, _ in options.set_keys}
    editor = ConfigEditor(read.raw, pinned)
    apply_overrides(editor, options.set_keys)
    _refuse_mistyped(editor.doc)
    normalize_config(editor, naming.canonical)
    dtype = model_dtype(editor, naming.canonical)
    parsed = parse_config(json.dumps(editor.doc, allow_nan=True).encode())
    geometry = resolve_geometry(parsed.config)
    manifest = build_manifest(geometry, len(naming.canonical))
    if manifest.incomplete:
        reasons = _config_errors(read.source, parsed, options.runtime)
        reasons += [
            f"the {component} tensors cannot be named: {why}"
            for component, why in manifest.incomplete.items()
        ]
        reasons += list(manifest.implausible.values())
        raise ConversionRefused(
            "config.json does not determine the drafter's tensors (fix the keys with --set KEY=VALUE)",
            reasons,
        )
    return ConfigPlan(editor=editor, dtype=dtype, manifest=manifest)


def check_coverage(read: SourceRead, naming: Naming, manifest: Manifest, src: str) -> None:
    """Every source tensor maps to something a loader reads, and every tensor the config implies is there."""
    canonical, by_canonical = naming.canonical, naming.by_canonical
    unexplained = [
        c
        for c in canonical
        if c not in manifest.tensors
        and manifest.module_of(c) is None
        and not any(c.startswith(p) for p in manifest.family_prefixes)
        and not (c == TARGET_TO_DRAFT and "d2t" in manifest.tensors)
    ]
    if not any(c in manifest.tensors for c in canonical):
        raise InputError(
            f"no tensor of {src} has a DFlash-family name (expected e.g. layers.0.self_attn.q_proj.weight, "
            f"fc.weight, hidden_norm.weight, lilicorr.*, optionally under dflash_module./eagle_module./model.); "
            f"found e.g. {shorten(sorted(read.table.tensors), 4, quote='')}"
        )
    if unexplained:
        where = "; ".join(f"{k}: {v}" for k, v in manifest.incomplete.items())
        sources = [
            by_canonical[c][0] + (f" (as {c})" if by_canonical[c][0] != c else "") for c in unexplained
        ]
        reasons = [
            f"{len(unexplained)} tensors map to nothing the drafter builds: {shorten(sources, SHOWN, quote='')}"
        ]
        if where:
            reasons.append(
                f"the config leaves parts of the drafter undetermined ({where}); fix them with --set"
            )
        reasons.append(
            "drop tensors that do not belong to the drafter explicitly with --drop PATTERN "
            "(it is reported in conversion.json)"
        )
        raise ConversionRefused(
            "the source has tensors no loader reads (convert never drops silently)", reasons
        )
    missing = [
        n
        for n, t in manifest.tensors.items()
        if n not in canonical and t.component not in manifest.incomplete
    ]
    if missing:
        raise ConversionRefused(
            "the source lacks tensors its config implies (convert cannot synthesize weights)",
            [
                f"missing {len(missing)}: {shorten(missing, SHOWN, quote='')}",
                "check the geometry keys in config.json (or fix them with --set)",
            ],
        )


def read_quantization(read: SourceRead, naming: Naming, manifest: Manifest) -> QuantPlan:
    """How each module is stored (the tensors decide), and the algorithm and group size, checked against the
    source's metadata."""
    canonical = naming.canonical
    docs: dict[str, Any] = {}
    if isinstance(read.raw.get("quantization_config"), dict):
        docs["config.json"] = read.raw["quantization_config"]
    if read.source.hf_quant_config is not None:
        docs["hf_quant_config.json"], _ = load_json_object(
            read_small(read.source.hf_quant_config, "hf_quant_config.json"), "hf_quant_config.json"
        )
    squant = read_source_quant(docs)
    states = {mod: module_state(canonical, mod) for mod in manifest.modules}
    other = sorted(m for m, s in states.items() if s == "other")
    if other:
        raise ConversionRefused(
            "modules with a weight dtype convert does not know",
            [f"{m}.weight is {canonical[m + '.weight'].dtype}" for m in other],
        )
    quantized = {m: s for m, s in states.items() if s in ("nvfp4", "fp8")}
    algo = squant.algo if squant else None
    group_size = (squant.group_size if squant else None) or infer_group_size(canonical, quantized)
    _check_algo(algo, quantized)
    synthesized_algo = False
    if quantized and algo is None:
        algo = infer_algo(canonical, quantized)
        synthesized_algo = True
    group = group_size or 16
    implied = infer_group_size(canonical, quantized) if "nvfp4" in quantized.values() else None
    if implied is not None and implied != group:
        raise ConversionRefused(
            f"the quantization metadata says group_size {group} but the NVFP4 weight scales imply {implied}",
            ["re-export, or correct group_size in the source's metadata"],
        )
    return QuantPlan(
        squant=squant,
        states=states,
        quantized=quantized,
        algo=algo,
        group=group,
        synthesized_algo=synthesized_algo,
    )


def _check_algo(algo: str | None, quantized: dict[str, str]) -> None:
    """The metadata's algorithm is one the loaders support, and the one the weights are stored in."""
    if algo == "MIXED_PRECISION":
        raise ConversionRefused(
            "MIXED_PRECISION exports are not supported yet",
            ["convert one algorithm per checkpoint (NVFP4, W4A16_NVFP4 or FP8)"],
        )
    if algo is not None and algo not in NVFP4_ALGOS + FP8_ALGOS:
        raise ConversionRefused(
            f"quant_algo {algo} is not one the drafter loaders support",
            ["supported: " + ", ".join(NVFP4_ALGOS + FP8_ALGOS)],
        )
    kinds = set(quantized.values())
    if len(kinds) > 1:
        raise ConversionRefused(
            "the source mixes NVFP4 and FP8 weights",
            [
                f"{k}: {shorten(sorted(m for m, s in quantized.items() if s == k), 4, quote='')}"
                for k in sorted(kinds)
            ],
        )
    if quantized and algo is not None and (("nvfp4" in kinds) != (algo in NVFP4_ALGOS)):
        raise ConversionRefused(
            f"the metadata says {algo} but the weights are {kinds.pop()}",
            ["re-export, or fix quant_algo with --set (hf_quant_config.json is rewritten)"],
        )


def sibling_modules(manifest: Manifest) -> dict[str, LinearModule]:
    """The linears of a sibling family's head (DFlash2's selector projection, DSpark's Markov and confidence heads),
    which the manifest lists as plain float tensors: module -> its shape as a linear. validate reads each weight as
    a float tensor (a quantized one is LC208/LC209), so convert stores them in float, dequantizing one only when
    --dequantize names it."""
    if not manifest.family_prefixes:
        return {}
    out: dict[str, LinearModule] = {}
    for name, t in manifest.tensors.items():
        if t.module is None and t.component == "head" and name.endswith(".weight") and len(t.shape) == 2:
            module = name.removesuffix(".weight")
            out[module] = LinearModule(
                module, t.shape[0], t.shape[1], "head", f"{module}.bias" in manifest.tensors
            )
    return out


def _source_module(naming: Naming, module: str) -> str:
    """The module's name in the source (training prefixes stripped; Model-Optimizer's flat DSpark names kept)."""
    names = naming.by_canonical.get(f"{module}.weight")
    return strip_prefixes(names[0])[0].removesuffix(".weight") if names else module


def plan_repairs(naming: Naming, manifest: Manifest, quant: QuantPlan, options: ConvertOptions) -> RepairPlan:
    """The quantized modules to dequantize (a runtime needs them in float, --dequantize names them, or a shard of
    their fused linear is float) and the float modules whose stray scales to drop; refused under --no-repair when
    there are any. A sibling head's quantized linear is dequantized only when --dequantize names it (refused
    otherwise, naming the flag)."""
    profiles = select_profiles(options.runtime)
    extra = options.dequantize
    siblings = sibling_modules(manifest)
    sibling_kinds = {
        m: WEIGHT_KIND[naming.canonical[f"{m}.weight"].dtype]
        for m in siblings
        if f"{m}.weight" in naming.canonical and naming.canonical[f"{m}.weight"].dtype in WEIGHT_KIND
    }
    known = list(manifest.modules) + [n for m in siblings for n in {m, _source_module(naming, m)}]
    unmatched = [p for p in extra if not any(fnmatch.fnmatchcase(m, p) for m in known)]
    if unmatched:
        examples = "lilicorr.out_head or layers.*.self_attn.o_proj"
        if siblings:
            examples = f"{shorten(sorted({_source_module(naming, m) for m in siblings}), 3)} or {examples}"
        raise UsageError(
            f"--dequantize {', '.join(unmatched)} matches no module (patterns match module names "
            f"such as {examples})"
        )
    repaired: dict[str, str] = {}  # module -> why
    for module, kind in sorted(quant.quantized.items(), key=lambda kv: natural_key(kv[0])):
        mod = manifest.modules[module]
        why = None
        strict = [p.display for p in profiles if p.must_stay_float(module, manifest.geometry.family)]
        if kind == "nvfp4" and mod.in_features % quant.group:
            # ModelOpt's exporter asserts on this (its NVFP4 packing checks the width): the blocks cannot be decoded reliably
            raise ConversionRefused(
                f"{module} is stored NVFP4 but its in_features {mod.in_features} is not a "
                f"multiple of the group size {quant.group}; no ModelOpt export has this shape",
                [f"re-export with {module} excluded from quantization"],
            )
        if strict:
            why = f"must stay floating point for {' and '.join(strict)}"
        elif matches_any(module, extra):
            why = "--dequantize"
        if why:
            repaired[module] = why
    _whole_fused_linears(quant, repaired)
    unasked: list[str] = []
    for module in sorted(sibling_kinds, key=natural_key):
        src = _source_module(naming, module)
        if matches((*extra,), module, src) is not None:
            repaired[module] = "--dequantize (the head's linears are read as float tensors)"
        else:
            unasked.append(module)
    if unasked:
        family = (
            FAMILIES[manifest.geometry.family].TITLE if manifest.geometry.family in FAMILIES else "sibling"
        )
        reasons = [
            f"{_source_module(naming, m)} is stored {sibling_kinds[m].upper()} "
            f"({naming.canonical[f'{m}.weight'].dtype} {list(naming.canonical[f'{m}.weight'].shape)} with its "
            f"scales); validate reads the {family} head's {m}.weight as a float "
            f"{list(manifest.tensors[f'{m}.weight'].shape)} tensor"
            for m in unasked
        ]
        flags = " ".join(f"--dequantize {_source_module(naming, m)}" for m in unasked)
        raise ConversionRefused(
            f"the {family} head has linears stored quantized, which no runtime validate models loads "
            "quantized; convert dequantizes them to the model dtype when asked",
            reasons + [f"fix: rerun with {flags}"],
        )
    stray: dict[str, list[str]] = {}
    for module, state in quant.states.items():
        if state == "float":
            scales = [f"{module}.{s}" for s in QUANT_SUFFIXES if f"{module}.{s}" in naming.canonical]
            if scales:
                stray[module] = scales
    for module in siblings:
        if module not in sibling_kinds:
            scales = [f"{module}.{s}" for s in QUANT_SUFFIXES if f"{module}.{s}" in naming.canonical]
            if scales:
                stray[module] = scales
    kinds = {**quant.quantized, **sibling_kinds}
    if not options.repair and (repaired or stray):
        reasons = [f"{m} is stored {kinds[m].upper()} but {why}" for m, why in repaired.items()]
        reasons += [
            f"{m} is float but ships {', '.join(s.rsplit('.', 1)[1] for s in scales)}"
            for m, scales in stray.items()
        ]
        raise ConversionRefused(
            "the source needs repairs and --no-repair was given (run without it to dequantize "
            "them and drop stray scales)",
            reasons,
        )
    return RepairPlan(
        repaired=repaired,
        stray=stray,
        kinds={m: kinds[m] for m in repaired},
        siblings={m: siblings[m] for m in siblings},
    )


def _whole_fused_linears(quant: QuantPlan, repaired: dict[str, str]) -> None:
    """A fused linear (q/k/v, gate/up) is built all float or all quantized: when some of its shards are stored in
    float or repaired, the quantized rest is repaired too (a runtime refuses shards that disagree)."""
    changed = True
    while changed:
        changed = False
        for module in sorted(quant.quantized, key=natural_key):
            fused = fused_name(module)
            if module in repaired or fused is None:
                continue
            floats = [s for s in fused[1] if quant.states.get(s) == "float" or s in repaired]
            if floats:
                repaired[module] = (
                    f"fused with {floats[0].rsplit('.', 1)[-1]}, which is "
                    f"{'stored in float' if quant.states.get(floats[0]) == 'float' else 'repaired'}: the runtimes "
                    f"build {fused[0].rsplit('.', 1)[-1]} as one linear"
                )
                changed = True


W4A16 = "W4A16_NVFP4"
RELABEL_DROP = "scale of a module served weight-only (--relabel-w4a16: W4A16_NVFP4 reads no input_scale)"


def _names(profiles: list[Any]) -> str:
    shown = [p.display for p in profiles]
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else "".join(shown)


def plan_activations(
    naming: Naming, quant: QuantPlan, repairs: RepairPlan, options: ConvertOptions
) -> ActivationPlan:
    """The output's quant_algo. An NVFP4 (W4A4) export whose modules lack input_scale (calibrated without running
    the drafter) is refused, naming --relabel-w4a16 where every selected release loads W4A16_NVFP4; with it, the
    algorithm becomes W4A16_NVFP4 (weights unchanged) and any input_scale of the quantized modules is dropped."""
    profiles = select_profiles(options.runtime)
    quant_out = sorted((m for m in quant.quantized if m not in repairs.repaired), key=natural_key)
    no_w4a16 = [p for p in profiles if p.quant_algos is not None and W4A16 not in p.quant_algos]
    if options.relabel_w4a16:
        if quant.algo != "NVFP4":
            raise UsageError(
                "--relabel-w4a16 relabels an NVFP4 (W4A4) export as weight-only NVFP4; this one is "
                + (f"{quant.algo}" if quant.algo else "not quantized")
            )
        if no_w4a16:
            raise ConversionRefused(
                f"--relabel-w4a16: {_names(no_w4a16)} {'does' if len(no_w4a16) == 1 else 'do'} not load "
                f"{W4A16}",
                [
                    "re-export with a calibration that runs the drafter (its training forward), so every "
                    "quantized module has an input_scale",
                    f"or convert for the releases that load {W4A16}",
                ],
            )
        if not quant_out:
            return ActivationPlan(algo=quant.algo, relabel=None, dropped=[])
        dropped = [f"{m}.input_scale" for m in quant_out if f"{m}.input_scale" in naming.canonical]
        relabel = {
            "from": "NVFP4",
            "to": W4A16,
            "reason": "--relabel-w4a16: served weight-only (activations stay in the model dtype); the weights "
            "and their scales are unchanged",
            "modules": len(quant_out),
            "without_input_scale": len(quant_out) - len(dropped),
            "input_scales_dropped": len(dropped),
        }
        return ActivationPlan(algo=W4A16, relabel=relabel, dropped=dropped)
    if quant.algo == "NVFP4" and quant_out:
        missing = [m for m in quant_out if f"{m}.input_scale" not in naming.canonical]
        if missing:
            if no_w4a16:
                fix = (
                    "fix: re-export with a calibration that runs the drafter (its training forward); "
                    f"{_names(no_w4a16)} {'does' if len(no_w4a16) == 1 else 'do'} not load {W4A16}, so "
                    "--relabel-w4a16 cannot serve them"
                )
            elif len(missing) == len(quant_out):
                fix = (
                    f"fix: --relabel-w4a16 serves it weight-only: quant_algo {W4A16} in config.json and "
                    f"hf_quant_config.json, which {_names(profiles)} load; the weights are unchanged"
                )
            else:
                fix = (
                    "fix: re-export with a calibration that runs the drafter (its training forward), or "
                    f"--relabel-w4a16 to serve it weight-only ({W4A16}, which {_names(profiles)} load; the "
                    f"{len(quant_out) - len(missing)} input_scale it has are dropped)"
                )
            raise ConversionRefused(
                f"quant_algo NVFP4 quantizes activations too (W4A4), but {len(missing)} of the "
                f"{len(quant_out)} modules it keeps quantized have no input_scale (an export calibrated with "
                "a forward that does not run the drafter, such as ModelOpt's eval-mode one, records none)",
                [f"no input_scale: {shorten(missing, SHOWN, quote='')}", fix],
            )
    return ActivationPlan(algo=quant.algo, relabel=None, dropped=[])


def plan_fused(
    read: SourceRead,
    naming: Naming,
    quant: QuantPlan,
    repairs: RepairPlan,
    activations: ActivationPlan,
    options: ConvertOptions,
) -> list[FusedGroup]:
    """The fused linears whose NVFP4 shards the output gives one global scale (convert/fused.py); a few bytes of
    the source are read (each shard's scalar scales). Refused under --no-repair when there are any."""
    quant_out = {m: k for m, k in quant.quantized.items() if m not in repairs.repaired}
    reader = SourceReader(read.source.root)
    try:
        groups = plan_fused_scales(
            quant_out, naming.canonical, reader.read, keep_input_scales=activations.algo == "NVFP4"
        )
    finally:
        reader.close()
    if groups and not options.repair:
        reasons = describe_groups(groups) + [
            f"{g.module}: the shards' input_scale differ; the runtimes quantize its input with the largest"
            for g in groups
            if not g.requantized and g.shared_input is not None
        ]
        raise ConversionRefused(
            "the source needs repairs and --no-repair was given (run without it to give each fused "
            "linear's shards one global scale, re-quantizing the others against the largest)",
            reasons,
        )
    return groups


def plan_tensors(
    naming: Naming,
    config: ConfigPlan,
    quant: QuantPlan,
    repairs: RepairPlan,
    options: ConvertOptions,
    activations: ActivationPlan | None = None,
    fused: list[FusedGroup] | None = None,
) -> OutputTensors:
    """Every output tensor: the repaired modules' dequantized weights first, then the copies (renamed as the
    requested naming says; a fused linear's re-quantized shards and unified scales in their place); with the
    renames, drops and repairs conversion.json records."""
    out: dict[str, OutTensor] = {}
    records: list[dict[str, Any]] = []
    dropped_by_repair: set[str] = set()
    refusals: list[str] = []
    for module, why in repairs.repaired.items():
        tensor, dropped = _dequantized(module, naming, config, quant, repairs, options.naming, refusals)
        dropped_by_repair.update(dropped)
        out[tensor.name] = tensor
        records.append(
            {
                "module": module,
                "action": "dequantized",
                "from": quant.algo if quant.algo else repairs.kinds[module].upper(),
                "to": config.dtype,
                "reason": why,
                "dropped": [naming.by_canonical[d][0] for d in dropped],
            }
        )
    for module, scales in sorted(repairs.stray.items()):
        dropped_by_repair.update(scales)
        records.append(
            {
                "module": module,
                "action": "dropped stray scales",
                "reason": "the module is stored in "
                "float; runtimes that build it unquantized have no parameter for its scales",
                "dropped": [naming.by_canonical[s][0] for s in scales],
            }
        )
    if refusals:
        raise ConversionRefused("a module that must stay floating point cannot be dequantized", refusals)
    relabelled = set(activations.dropped) if activations else set()
    replaced = _unified(fused or [], naming, quant.group)
    renames: list[dict[str, str]] = []
    for c, info in sorted(naming.canonical.items(), key=lambda kv: natural_key(kv[0])):
        if (
            c in dropped_by_repair
            or c in relabelled
            or (c.endswith(".weight") and c[:-7] in repairs.repaired)
        ):
            continue
        name = output_name(c, options.naming)
        src_name = naming.by_canonical[c][0]
        out[name] = (
            msgspec.structs.replace(replaced[c], name=name)
            if c in replaced
            else OutTensor(name=name, canonical=c, dtype=info.dtype, shape=info.shape, op="copy", source=info)
        )
        if name != src_name:
            renames.append({"from": src_name, "to": name, "why": _rename_reason(src_name, c, name)})
    drops = naming.drops + [
        {"tensor": naming.by_canonical[d][0], "reason": "scale of a module stored in float (repair)"}
        for d in sorted(dropped_by_repair)
    ]
    drops += [{"tensor": naming.by_canonical[d][0], "reason": RELABEL_DROP} for d in sorted(relabelled)]
    return OutputTensors(tensors=out, renames=renames, drops=drops, repairs=records)


def _unified(fused: list[FusedGroup], naming: Naming, group_size: int) -> dict[str, OutTensor]:
    """canonical name -> the tensor written in place of the source's, for the fused linears given one global
    scale: each re-quantized shard's weight and block scales (streamed), its weight_scale_2, and any input_scale
    that is not the group's largest."""
    out: dict[str, OutTensor] = {}
    for group in fused:
        for shard in group.requantized:
            inputs = {
                s: naming.canonical[f"{shard}.{s}"] for s in ("weight", "weight_scale", "weight_scale_2")
            }
            for part in ("weight", "weight_scale"):
                info = inputs[part]
                out[f"{shard}.{part}"] = OutTensor(
                    name=info.name,
                    canonical=f"{shard}.{part}",
                    dtype=info.dtype,
                    shape=info.shape,
                    op="requantize",
                    inputs=inputs,
                    kind="nvfp4",
                    group_size=group_size,
                    part=part,
                    shared_scale_2=group.shared,
                )
            scale_2 = inputs["weight_scale_2"]
            out[f"{shard}.weight_scale_2"] = OutTensor(
                name="",
                canonical=f"{shard}.weight_scale_2",
                dtype=scale_2.dtype,
                shape=scale_2.shape,
                op="constant",
                data=scalar_bytes(group.shared, scale_2),
            )
        if group.shared_input is not None:
            for shard, value in group.input_scale.items():
                if value != group.shared_input:
                    info = naming.canonical[f"{shard}.input_scale"]
                    out[f"{shard}.input_scale"] = OutTensor(
                        name="",
                        canonical=f"{shard}.input_scale",
                        dtype=info.dtype,
                        shape=info.shape,
                        op="constant",
                        data=scalar_bytes(group.shared_input, info),
                    )
    return out


def _dequantized(
    module: str,
    naming: Naming,
    config: ConfigPlan,
    quant: QuantPlan,
    repairs: RepairPlan,
    naming_style: str,
    refusals: list[str],
) -> tuple[OutTensor, list[str]]:
    """(the float weight a repair writes for `module`, the source tensors it replaces); an input that is missing or
    not laid out as the scheme says is added to `refusals`."""
    assert quant.algo is not None  # a quantized module implies an algorithm, named or inferred
    scheme = quant_scheme(quant.algo, quant.group)  # the layout the repairs read the source's modules in
    if (
        scheme is None
    ):  # _check_algo admits only algorithms with a modelled layout; kept explicit for new ones
        raise ConversionRefused(
            f"cannot repair {module}: quant_algo {quant.algo} has no tensor layout this version "
            "can dequantize",
            [f"re-export with {module} excluded from quantization"],
        )
    manifest = config.manifest
    if module not in manifest.modules:  # a sibling head's linear: laid out as a linear of its weight's shape
        manifest = msgspec.structs.replace(
            manifest, modules={**manifest.modules, module: repairs.siblings[module]}
        )
    mod = manifest.modules[module]
    inputs: dict[str, TensorInfo] = {}
    for suffix, expected in expected_inputs(manifest, module, scheme).items():
        info = naming.canonical.get(f"{module}.{suffix}")
        if info is None:
            refusals.append(f"cannot repair {module}: {module}.{suffix} is missing")
        elif not input_fits(expected, info):
            refusals.append(
                f"cannot repair {module}: {module}.{suffix} is {info.dtype} {list(info.shape)}, "
                f"expected {'/'.join(sorted(expected.dtypes))} {list(expected.shape)}"
            )
        else:
            inputs[suffix] = info
    dropped = [f"{module}.{s}" for s in QUANT_SUFFIXES if f"{module}.{s}" in naming.canonical]
    name = output_name(f"{module}.weight", naming_style)
    tensor = OutTensor(
        name=name,
        canonical=f"{module}.weight",
        dtype=config.dtype,
        shape=(mod.out_features, mod.in_features),
        op="dequantize",
        inputs=inputs,
        kind=repairs.kinds[module],
        group_size=quant.group,
    )
    return tensor, dropped


def plan_quant_metadata(
    config: ConfigPlan,
    quant: QuantPlan,
    repairs: RepairPlan,
    options: ConvertOptions,
    activations: ActivationPlan | None = None,
) -> QuantMetadata:
    """The output's quantization metadata: the flat quantization_config in config.json (set or removed) and
    hf_quant_config.json, with exclusions safe under every runtime; and the account of the source's exclusions."""
    manifest, squant, editor = config.manifest, quant.squant, config.editor
    quant_out = {m for m in quant.quantized if m not in repairs.repaired}
    float_modules = {
        m
        for m, s in quant.states.items()
        if s == "float" or (m in repairs.repaired and m in manifest.modules)
    }
    float_modules = {m for m in float_modules if manifest.modules[m].component not in manifest.incomplete}
    exclusions: dict[str, Any] = {}
    hf_quant: dict[str, Any] | None = None
    if squant is not None:
        reading = read_exclusions(squant.exclude)
        declared = declared_excluded(sorted(manifest.modules), reading.kept)
        disagreements = sorted(
            [
                f"{m}: the exclusions list it but it is stored quantized"
                for m in declared
                if m in quant.quantized
            ]
            + [
                f"{m}: stored in float but not excluded"
                for m in manifest.modules
                if quant.states[m] == "float" and m not in declared
            ]
        )
        exclusions = {
            "source": reading.source,
            "stripped": reading.stripped,
            "dropped": reading.dropped,
            "disagreements": disagreements,
        }
    if quant_out:
        algo = activations.algo if activations else quant.algo
        assert algo is not None
        # every sibling head linear is written in float (a quantized one is refused or dequantized)
        sibling_float = set(repairs.siblings) if "head" not in manifest.incomplete else set()
        patterns = output_exclusions(manifest, float_modules, quant_out, options.naming, sibling_float)
        out_group = quant.group if algo in NVFP4_ALGOS else (squant.group_size if squant else None)
        flat, hf_quant = output_quant_docs(
            algo,
            out_group,
            squant.kv_cache_quant_algo if squant else None,
            squant.producer if squant else None,
            patterns,
        )
        why = (
            "the flat form runtimes read (quant_method + ignore); the nested form stays in hf_quant_config.json"
            if squant
            else f"the weights are {algo} but the source had no quantization metadata"
        )
        if quant.synthesized_algo:
            why += f" (quant_algo {algo} inferred from the tensor layout)"
        if activations is not None and activations.relabel is not None:
            why += f"; quant_algo {activations.relabel['from']} -> {algo} (--relabel-w4a16)"
        editor.set("quantization_config", flat, why)
        exclusions["output"] = patterns
    else:
        editor.remove("quantization_config", "no module is stored quantized in the output")
        if squant is not None:
            exclusions["output"] = []
    return QuantMetadata(quantized_out=quant_out, hf_quant=hf_quant, exclusions=exclusions)


def _record(
    read: SourceRead,
    files: list[str],
    config: ConfigPlan,
    quant: QuantPlan,
    tensors: OutputTensors,
    meta: QuantMetadata,
    shards: list[ShardPlan],
    index: dict[str, Any] | None,
    options: ConvertOptions,
    other_files: dict[str, Any],
    activations: ActivationPlan,
    fused: list[FusedGroup],
) -> dict[str, Any]:
    """conversion.json as planned (the writer adds the hashes, the repairs' rounding and the re-quantized shards'
    errors)."""
    squant, algo, doc = quant.squant, activations.algo, config.editor.doc
    return {
        "tool": "lilicorr-ckpt",
        "version": __version__,
        "schema_version": 1,
        "source": {
            "architecture": read.raw.get("architectures"),
            "files": {f: None for f in files},
            "quantization": ({"algo": squant.algo, "forms": squant.forms} if squant else None),
        },
        "output": {
            "architecture": doc.get("architectures"),
            "dtype": config.dtype,
            "quant_algo": algo if meta.quantized_out else None,
            "quant_method": quant_method(algo) if meta.quantized_out and algo else None,
            "files": [s.file for s in shards] + (["model.safetensors.index.json"] if index else []),
            "tensors": len(tensors.tensors),
            "tensor_bytes": sum(t.nbytes for t in tensors.tensors.values()),
        },
        "options": options.record(),
        "renames": tensors.renames,
        "drops": tensors.drops,
        "repairs": tensors.repairs,
        "fused_scales": [g.record() for g in fused],
        "relabel": activations.relabel,
        "config": config.editor.changes,
        "exclusions": meta.exclusions,
        "other_files": other_files,
        # tensors the source index placed in a shard that does not hold them (validate's LC603): read from where
        # they are, and the written index (or single file) places each right
        "index_fixed": {
            name: {"listed": listed, "found": real}
            for name, (listed, real) in sorted(read.table.shards.misplaced.items())
        },
    }


def build_plan(src: str, options: ConvertOptions) -> Plan:
    """The plan for converting `src`: the phases above in order, then the shards and the record."""
    read = read_source(src)
    naming = name_tensors(read, options, src)
    resolved = resolve_naming(options.naming, select_profiles(options.runtime), naming.canonical)
    options = msgspec.structs.replace(options, naming=resolved)  # the naming written, and recorded
    config = plan_config(read, naming, options)
    check_coverage(read, naming, config.manifest, src)
    quant = read_quantization(read, naming, config.manifest)
    repairs = plan_repairs(naming, config.manifest, quant, options)
    activations = plan_activations(naming, quant, repairs, options)
    fused = plan_fused(read, naming, quant, repairs, activations, options)
    tensors = plan_tensors(naming, config, quant, repairs, options, activations, fused)
    meta = plan_quant_metadata(config, quant, repairs, options, activations)
    source, table = read.source, read.table
    assert source.config is not None  # open_source found it
    files = sorted(
        [source.rel(source.config)]
        + ([source.rel(source.hf_quant_config)] if source.hf_quant_config else [])
        + ([source.rel(source.index)] if source.index else [])
        + list(table.files)
    )
    shards, index = _shard(tensors.tensors, options.max_shard_size, files)
    written = {s.file for s in shards} | {
        "model.safetensors.index.json",
        "config.json",
        "hf_quant_config.json",
        extras.RECORD_NAME,
    }
    copies, left_out = extras.classify(source.root, {f.split("/", 1)[0] for f in files}, written)
    record = _record(
        read,
        files,
        config,
        quant,
        tensors,
        meta,
        shards,
        index,
        options,
        extras.record(copies, left_out),
        activations,
        fused,
    )
    output_config = config.editor.doc
    if options.to == SPECULATORS:
        output_config = speculators_from_zlab(output_config, verifier=options.verifier)
    record["layout"] = _layout_record(read, options, output_config)
    return Plan(
        source=source,
        table=table,
        source_files=files,
        config=output_config,
        hf_quant_config=meta.hf_quant,
        tensors=tensors.tensors,
        shards=shards,
        index=index,
        model_dtype=config.dtype,
        manifest=config.manifest,
        record=record,
        quant_algo=quant.algo if quant.quantized else None,
        group_size=quant.group,
        fused=fused,
        copies=copies,
    )


def _layout_record(read: SourceRead, options: ConvertOptions, output: dict[str, Any]) -> dict[str, Any]:
    """conversion.json's `layout`: the source's and the output's, and what the speculators keys say."""
    doc: dict[str, Any] = {"source": DISPLAY[read.layout], "output": DISPLAY[options.to]}
    if options.to == SPECULATORS:
        proposal = output["speculators_config"]["proposal_methods"][0]
        doc["speculators"] = {
            "speculators_model_type": output["speculators_model_type"],
            "aux_hidden_state_layer_ids": output["aux_hidden_state_layer_ids"],
            "speculative_tokens": proposal["speculative_tokens"],
            "sample_from_anchor": output["sample_from_anchor"],
            "sliding_window_non_causal": output["sliding_window_non_causal"],
            "verifier": output["speculators_config"]["verifier"]["name_or_path"],
        }
    return doc


def _rename_reason(src: str, canonical: str, out: str) -> str:
    bare, prefixes = strip_prefixes(src)
    why = [f"strip {p}" for p in prefixes]
    dspark = bare != canonical and _served_name(bare) == canonical
    if bare != canonical and not dspark:
        why.append("legacy Sequential head name -> named MLP")
    if dspark:
        why.append("Model-Optimizer's flat DSpark name -> the served markov_head / confidence_head layout")
    if out != canonical:
        why.append("named MLP -> legacy Sequential head name (--naming sequential)")
    return "; ".join(why)


def _shard(
    tensors: dict[str, OutTensor], max_size: int, source_files: list[str]
) -> tuple[list[ShardPlan], dict[str, Any] | None]:
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for t in sorted(tensors.values(), key=lambda t: natural_key(t.canonical)):
        if groups[-1] and size + t.nbytes > max_size:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    n = len(groups)
    # the real hashes are written last; a placeholder of the same length fixes every offset now
    placeholder = shard_metadata(dict.fromkeys(source_files, HASH_PLACEHOLDER))
    shards = []
    for k, group in enumerate(groups):
        file = "model.safetensors" if n == 1 else f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        entries = layout(Entry(t.name, t.dtype, t.shape) for t in group)
        shards.append(
            ShardPlan(file=file, entries=entries, header_length=len(header_bytes(entries, placeholder)))
        )
    if n == 1:
        return shards, None
    weight_map = {e.name: s.file for s in shards for e in s.entries}
    index = {
        "metadata": {"total_size": sum(s.data_bytes for s in shards)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    return shards, index


def output_source(plan: Plan, root: Path) -> Source:
    """The output directory as `open_source` would describe it (for validating a plan before writing)."""
    return Source(
        root=root,
        link_root=root,
        label=str(root),
        config=root / "config.json",
        safetensors=tuple(root / s.file for s in plan.shards),
        index=root / "model.safetensors.index.json" if plan.index else None,
        hf_quant_config=root / "hf_quant_config.json" if plan.hf_quant_config else None,
        pickles=(),
    )
