"""plan -> pre-validate (virtual output) -> write to a temporary sibling -> validate -> [verify] -> rename."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from lilicorr_ckpt.checkpoint.config import parse_config
from lilicorr_ckpt.checkpoint.load import Checkpoint, assemble
from lilicorr_ckpt.checkpoint.tensors import ShardFacts, TensorInfo, TensorTable
from lilicorr_ckpt.checks.run import validate
from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.convert.destination import (
    check_destination,
    discard_temporary,
    make_temporary,
    move_into_place,
    output_error,
    remove_created,
    remove_stale_temporaries,
    restore_interrupted_replacement,
)
from lilicorr_ckpt.convert.earlier import EarlierOutput
from lilicorr_ckpt.convert.options import ConvertOptions
from lilicorr_ckpt.convert.plan import Plan, build_plan, output_source
from lilicorr_ckpt.convert.writer import generated_files, planned_files, write_json, write_plan
from lilicorr_ckpt.errors import ConversionRefused, UsageError, sigterm_unwinds
from lilicorr_ckpt.results import Finding, Report

SET_HINT_RULES = {"LC101", "LC102", "LC110", "LC113", "LC115", "LC118", "LC122"}


class ConvertResult(msgspec.Struct, kw_only=True):
    src: str
    dst: str
    written: bool
    record: dict[str, Any]  # conversion.json
    report: Report  # validate on the output (the virtual output for --dry-run)
    kept: list[str] = []  # entries of an earlier output DST that --force kept (convert did not write them)


def virtual_checkpoint(plan: Plan, root: Path) -> Checkpoint:
    """The output as validate would read it from disk, built from the plan before anything is written."""
    parsed = parse_config(json.dumps(plan.config, allow_nan=True).encode())
    tensors: dict[str, TensorInfo] = {}
    for shard in plan.shards:
        offset = shard.header_length
        for e in shard.entries:
            tensors[e.name] = TensorInfo(e.name, e.dtype, e.shape, shard.file, offset, offset + e.nbytes)
            offset += e.nbytes
    total = sum(s.data_bytes for s in plan.shards)
    facts = ShardFacts(
        missing_shards={},
        index_only={},
        shard_only={},
        misplaced={},
        duplicates={},
        unreferenced=[],
        total_size_declared=plan.index["metadata"]["total_size"] if plan.index else None,
        total_size_actual=total,
        has_index=plan.index is not None,
        both_single_and_index=False,
    )
    table = TensorTable(
        tensors=tensors,
        files=[s.file for s in plan.shards],
        metadata={s.file: {} for s in plan.shards},
        shards=facts,
    )
    quant_docs: dict[str, Any] = {}
    if isinstance(plan.config.get("quantization_config"), dict):
        quant_docs["config.json"] = plan.config["quantization_config"]
    if plan.hf_quant_config is not None:
        quant_docs["hf_quant_config.json"] = plan.hf_quant_config
    return assemble(output_source(plan, root), parsed, table, quant_docs)


def _hint(f: Finding) -> str:
    if f.rule in SET_HINT_RULES and f.pointer and f.pointer.startswith("$."):
        return f"supply it with --set {f.pointer[2:]}=VALUE"
    return f.fix or ""


def _refuse_on_findings(report: Report, options: ConvertOptions, stage: str) -> None:
    bad = [
        f for f in report.findings if f.severity == "error" or (options.strict and f.severity == "warning")
    ]
    if not bad:
        return
    refused = [v.display for v in report.runtimes if not v.accepted]
    who = f" ({', '.join(refused)} would refuse it)" if refused else ""
    reasons = []
    for f in bad:
        runtimes = f" [{', '.join(f.runtimes)}]" if f.runtimes else ""
        hint = _hint(f)
        reasons.append(f"{f.rule} {f.message}{runtimes}" + (f"; fix: {hint}" if hint else ""))
    accepting = [v for v in report.runtimes if v.accepted and not (options.strict and v.warnings)]
    if refused and accepting:  # e.g. a reduced draft vocabulary: SGLang serves none, vLLM does
        names = " and ".join(v.display for v in accepting)
        selection = ",".join(v.runtime for v in accepting)
        reasons.append(
            f"or convert for {'the release that accepts' if len(accepting) == 1 else 'the releases that accept'} "
            f"it alone: {names} ({'-r ' + selection})"
        )
    raise ConversionRefused(f"the converted checkpoint {stage} validate{who}", reasons)


def record_requantized(record: dict[str, Any], measured: dict[str, Any]) -> None:
    """Each re-quantized shard's errors into conversion.json's fused_scales: the largest |new - old| of its
    dequantized weights, and what SGLang and vLLM would have served had it been kept (its weights times the
    ratio of the shared scale to its own: |w| * (ratio - 1))."""
    for group in record.get("fused_scales", []):
        for shard in group["requantized"]:
            stats = measured.get(shard["module"])
            if stats is None:
                continue
            shard["max_abs_weight"] = stats.max_abs_weight
            shard["max_abs_error"] = stats.max_abs_error
            ratio = shard["ratio"]
            shard["max_abs_error_if_kept"] = stats.max_abs_weight * (ratio - 1) if ratio else None


def validation_record(report: Report, runtime: str) -> dict[str, Any]:
    return {
        "runtime": runtime,
        "verdicts": {v.runtime: "accepts" if v.accepted else "refuses" for v in report.runtimes},
        "errors": report.summary.errors,
        "warnings": report.summary.warnings,
        "findings": [f"{f.severity} {f.rule}: {f.message}" for f in report.findings if f.severity != "info"],
    }


VERIFY_INSTALL_HINT = "--verify needs torch and lilicorr_runtime: pip install 'lilicorr-ckpt[runtime]'"


def _verifier() -> Callable[[Plan, Path, ConvertOptions], dict[str, Any]]:
    """verify.verify_conversion, or a usage error saying what to install: the verifier imports torch and the
    runtime, which convert without --verify never does."""
    try:
        from lilicorr_ckpt.convert.verify import verify_conversion
    except ImportError as exc:
        raise UsageError(f"{VERIFY_INSTALL_HINT} ({exc})") from None
    return verify_conversion


def _keep_destination_files(plan: Plan, earlier: EarlierOutput) -> Plan:
    """A file of SRC that DST already holds as its own (one convert did not write, or a copy changed since) is
    not copied over it: DST's file is kept, and the record says so."""
    skipped = [name for name in plan.copies if name in earlier.kept]
    if not skipped:
        return plan
    other = plan.record["other_files"]
    other["copied"] = [name for name in other["copied"] if name not in skipped]
    for name in skipped:
        why = (
            "changed since the earlier convert copied it"
            if name in earlier.changed_copies
            else "not written by the earlier convert"
        )
        other["dropped"].append({"file": name, "reason": f"DST has its own {name} ({why}); it is kept"})
    other["dropped"].sort(key=lambda d: d["file"])
    return msgspec.structs.replace(plan, copies=[name for name in plan.copies if name not in skipped])


def convert(src: str, dst: str, options: ConvertOptions) -> ConvertResult:
    verify = _verifier() if options.verify else None  # before anything is read
    dst_path = Path(dst).expanduser()
    for note in restore_interrupted_replacement(dst_path):  # before anything else, even a refusal
        print(f"lilicorr-ckpt convert: {note}", file=sys.stderr)
    plan = build_plan(src, options)
    generated = set(generated_files(plan))
    earlier = check_destination(plan.source.root, dst_path, options.force, generated)
    if earlier is not None:
        plan = _keep_destination_files(plan, earlier)
    # headers only: the output's bytes do not exist yet (an earlier DST's would be read otherwise); what the
    # bytes decide (LC327's shared scales) is checked again on the files written
    pre = validate(
        str(dst_path),
        runtime=options.runtime,
        checkpoint=virtual_checkpoint(plan, dst_path.resolve()),
        headers_only=True,
    )
    _refuse_on_findings(pre, options, "would not pass")
    record = plan.record
    record["written"] = dict.fromkeys(planned_files(plan))  # sha256 of each, once written
    kept = earlier.kept if earlier is not None else []
    if options.dry_run:
        record["validation"] = validation_record(pre, options.runtime)
        return ConvertResult(src=src, dst=dst, written=False, record=record, report=pre, kept=kept)

    remove_stale_temporaries(dst_path)
    progress = Progress.for_terminal(options.quiet, total=plan.total_bytes)
    with sigterm_unwinds():  # the temporary directory is removed on SIGTERM too
        tmp, created = make_temporary(dst_path)
        try:
            try:
                facts = write_plan(plan, tmp, progress)
                progress.note("validating the output")
                report = validate(str(tmp), runtime=options.runtime)
                _refuse_on_findings(report, options, "does not pass")
                record["source"]["files"] = facts["source_sha256"]
                record["written"] = facts["written"]
                for repair in record["repairs"]:
                    err = facts["repair_rounding"].get(repair["module"] + ".weight")
                    if err is not None:
                        repair["max_rounding_error"] = err
                record_requantized(record, facts["requantized"])
                record["validation"] = validation_record(report, options.runtime)
                if verify is not None:
                    progress.note("verifying through lilicorr_runtime")
                    record["verify"] = verify(plan, tmp, options)
                    if not record["verify"]["passed"]:
                        raise ConversionRefused(
                            "--verify: the output does not reproduce the source", record["verify"]["problems"]
                        )
                write_json(tmp / "conversion.json", record)
                kept = move_into_place(tmp, dst_path, options.force, generated, earlier)
            except OSError as exc:  # ENOSPC, EFBIG, EIO, ...: the real cause, never a traceback
                raise output_error(exc, dst_path, tmp, existed=earlier is not None) from None
        except BaseException:
            discarded = discard_temporary(tmp, dst_path)  # DST's own files that were moved in go back first
            if discarded:
                print(f"lilicorr-ckpt convert: {discarded}", file=sys.stderr)
            remove_created(created)
            raise
        finally:
            progress.finish()
    return ConvertResult(src=src, dst=dst, written=True, record=record, report=report, kept=kept)
