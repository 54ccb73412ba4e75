"""The library entry point of validate (docs/api.md): what `lilicorr-ckpt validate` runs, without the printing.

`convert` and `smoke` have theirs in their packages: `lilicorr_ckpt.convert.convert` and
`lilicorr_ckpt.smoke.smoke` (a name that is a subpackage cannot also be a function of the top package).
"""

from __future__ import annotations

from lilicorr_ckpt.checkpoint.remote import DEFAULT_TIMEOUT
from lilicorr_ckpt.checks.run import validate_spec
from lilicorr_ckpt.results import Report


def validate(
    path: str,
    *,
    runtime: str = "all",
    target: str | None = None,
    strict: bool = False,
    deep: bool = False,
    revision: str | None = None,
    ignore: str | None = None,
    select: str | None = None,
    config: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    """Judge a drafter checkpoint as SGLang, vLLM and TensorRT-LLM load it; the Report `validate -f json` prints.

    path: a checkpoint directory, or a Hugging Face repo id `org/name[@REV]` (headers only).
    runtime: "all" (the newest release of each engine), an engine ("vllm": its newest release), one release
        ("vllm==VERSION"), a range ("vllm>=VERSION": a verdict per release), "every", or several comma-separated;
        a verdict per release judged in `report.runtimes`. An engine or release not supported is a UsageError
        that lists the supported releases.
    target: the target model (directory, cached repo id or .gguf file) for the compatibility checks.
    strict: warnings count as failures (`report.exit_code` 1).  deep: also read tensor data (local only).
    ignore / select: rule ids or prefixes, comma-separated, as the command line's --ignore / --select;
    waivers in lilicorr.toml or pyproject.toml beside a local checkpoint (up to its git work tree's root) apply
    as on the command line; config: a waiver file to apply instead (the command line's --config).
    timeout: for a Hub repo, the seconds the whole remote read may take (the command line's --timeout).

    Raises InputError for unreadable input (the command line's exit 2) and UsageError for bad arguments (4).
    """
    return validate_spec(
        path,
        runtime=runtime,
        target=target,
        deep=deep,
        strict=strict,
        revision=revision,
        ignore=ignore,
        select=select,
        config=config,
        timeout=timeout,
    )
