"""Helpers for the validate rule tests: edit a fixture checkpoint's JSON, run validate, pick findings."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lilicorr_ckpt.checks.findings import Finding
from lilicorr_ckpt.checks.run import Report, validate

RUNTIMES = ("sglang", "vllm", "trtllm")
ALL = sorted(RUNTIMES)


def edit_json(path: Path, fn: Callable[[Any], Any]) -> None:
    """Apply `fn` to the JSON document at `path` in place (its return value is ignored)."""
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=1))


def edit_config(ckpt: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    edit_json(ckpt / "config.json", fn)


def dflash_edit(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """A config edit setting dflash_config keys; a value of DROP removes the key."""

    def apply(cfg: dict[str, Any]) -> None:
        for key, value in changes.items():
            if value is DROP:
                cfg["dflash_config"].pop(key, None)
            else:
                cfg["dflash_config"][key] = value

    return apply


def edit_dflash(ckpt: Path, **changes: Any) -> None:
    edit_config(ckpt, dflash_edit(**changes))


DROP = object()


def set_exclusions(ckpt: Path, fn: Callable[[list[str]], list[str]]) -> list[str]:
    """Rewrite the exclusion list identically in config.json (flat `ignore`) and hf_quant_config.json."""
    box: dict[str, list[str]] = {}

    def cfg(doc: dict[str, Any]) -> None:
        qc = doc["quantization_config"]
        key = "ignore" if "ignore" in qc else None
        if key:
            box["new"] = qc[key] = fn(list(qc[key]))
        else:
            box["new"] = qc["quantization"]["exclude_modules"] = fn(
                list(qc["quantization"]["exclude_modules"])
            )

    edit_config(ckpt, cfg)
    if (ckpt / "hf_quant_config.json").exists():
        edit_json(
            ckpt / "hf_quant_config.json",
            lambda doc: doc["quantization"].__setitem__("exclude_modules", list(box["new"])),
        )
    return box["new"]


def run(ckpt: Path, **kw: Any) -> Report:
    return validate(str(ckpt), **kw)


def hits(report: Report, rule: str, severity: str | None = None) -> list[Finding]:
    return [f for f in report.findings if f.rule == rule and (severity is None or f.severity == severity)]


def one(report: Report, rule: str, severity: str | None = None) -> Finding:
    found = hits(report, rule, severity)
    assert len(found) == 1, f"expected one {rule} {severity or ''} finding, got {describe(report)}"
    return found[0]


def accepted(report: Report) -> dict[str, bool]:
    return {v.runtime: v.accepted for v in report.runtimes}


def problems(report: Report, ignore: Iterable[str] = ()) -> list[tuple[str, str, tuple[str, ...]]]:
    """(rule, severity, runtimes) of every error and warning, except rules in `ignore`."""
    skip = set(ignore)
    return sorted(
        (f.rule, f.severity, tuple(sorted(f.runtimes)))
        for f in report.findings
        if f.severity in ("error", "warning") and f.rule not in skip
    )


def describe(report: Report) -> str:
    return (
        "\n".join(f"{f.rule} {f.severity} {f.runtimes}: {f.message}" for f in report.findings)
        or "no findings"
    )


def assert_clean(report: Report, allowed: Iterable[tuple[str, str, tuple[str, ...]]] = ()) -> None:
    """No error and no warning for any runtime, except the (rule, severity, runtimes) listed."""
    assert problems(report) == sorted(allowed), describe(report)
    assert all(v.accepted for v in report.runtimes), describe(report)


def refused_by(report: Report) -> list[str]:
    return sorted(r for r, ok in accepted(report).items() if not ok)
