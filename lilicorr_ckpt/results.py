"""What judging a checkpoint produces, as data: the document `lilicorr-ckpt validate --format json` prints.

Data only (msgspec records, no rule, no check, no renderer), so every side imports it without the others: the
checks fill a Report (checks/run.py), the waivers rewrite one (checks/waivers.py), the renderers show one
(report/), `lilicorr-ckpt report` decodes one from a file, and the Python API returns one. Importing it costs
msgspec and nothing of the catalogue, the reader or numpy. schemas/validate-report.schema.json is generated from
`Report` (`python scripts/sync_docs.py`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from lilicorr_ckpt import __version__

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


class Waiver(msgspec.Struct, frozen=True, kw_only=True):
    """Why a finding is waived (lilicorr_ckpt/checks/waivers.py): still reported, no longer counted."""

    reason: str
    source: str  # "--ignore", or the config file (and its entry) the waiver comes from


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    rule: str
    name: str
    severity: Severity
    message: str
    fix: str | None = None
    file: str | None = None  # checkpoint-relative file the finding is about
    pointer: str | None = None  # JSON path or tensor name inside `file`
    expected: str | None = None
    actual: str | None = None
    runtimes: list[str] = []  # empty: independent of the runtime
    subjects: list[str] = []  # every key/tensor/module involved, up to MAX_SUBJECTS (checks/findings.py)
    waived: Waiver | None = None  # set by a waiver: shown as suppressed, not in the summary or the verdicts
    subjects_omitted: int = 0  # subjects left out of `subjects` (beyond MAX_SUBJECTS)
    # runtimes for which this error is a silent mis-load (the checkpoint loads and serves another function) though
    # the rule's errors are refusals elsewhere (checks/findings.py SILENT_RULES: the rules whose errors always are)
    silent_for: list[str] = []


# filled by the Hub reader (checkpoint/remote.py); here so that a saved report decodes without the reader
class HubOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """Where a validated checkpoint came from when it was not a local directory."""

    repo_id: str
    revision: str  # as asked for (a branch, tag, refs/pr/N or commit); "main" when none was given
    commit: str  # the commit every file was read at (for the cache: the snapshot's name); 40 hex digits
    read_from: Literal["hub", "hf_cache"]
    endpoint: str | None = (
        None  # the Hub endpoint asked (HF_ENDPOINT, credentials redacted), None for the cache
    )
    header_bytes: int = 0  # bytes of safetensors files read: their length prefixes and headers
    # bytes of NVFP4 global scales (4-byte weight_scale_2 values) read besides, for LC327; scales_read false:
    # the repo had more than a few hundred ranges of them, or the Hub would not serve them, so LC327 was skipped
    scale_bytes: int = 0
    scales_read: bool = True


class Summary(msgspec.Struct, frozen=True):
    errors: int
    warnings: int
    infos: int
    waived: int = 0  # findings a waiver suppressed (not in the counts above)


class RuntimeVerdict(msgspec.Struct, frozen=True):
    runtime: str  # the key findings name it by: the engine ("vllm"), or the release ("vllm==1.2.3") when the
    # report judges several releases of that engine
    display: str  # the engine and the version judged, e.g. "SGLang 1.2.3"
    accepted: bool
    errors: int
    warnings: int
    version: str = ""  # the release modelled, or the unreleased revision (empty in reports older than 0.1.1)
    released: bool = True  # False: the verdict models code no release has yet
    source: str = ""  # where the modelled loader code comes from
    engine: str = (
        ""  # the engine's id ("sglang", "vllm", "trtllm"; empty in reports written before it was kept)
    )

    @property
    def engine_id(self) -> str:
        """The engine judged, also for reports written before `engine` was recorded."""
        return self.engine or self.runtime.partition("==")[0]


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
    strict: bool = False  # judged with --strict: warnings count as failures (JUnit failures, SARIF errors)
    error: str | None = None  # the input could not be read (exit 2): no findings, no verdicts, this reason
    # the layout of config.json: "z-lab" (dflash_config) or "speculators" (judged as vLLM translates it); None
    # when the input could not be read
    layout: str | None = None
