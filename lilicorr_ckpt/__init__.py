"""lilicorr-ckpt: validate, convert and smoke-test LiLiCorr / DFlash-family drafter checkpoints.

The Python API (docs/api.md), loaded on first use so that `import lilicorr_ckpt` stays cheap:

    import lilicorr_ckpt
    report = lilicorr_ckpt.validate("./drafter", runtime="vllm", target="./Qwen3-8B")   # -> Report
    report.exit_code, report.runtimes, report.findings

    from lilicorr_ckpt.convert import ConvertOptions, convert
    result = convert("export/", "serving/", ConvertOptions(runtime="vllm"))            # -> ConvertResult

    from lilicorr_ckpt.smoke import smoke
    profile = smoke("./drafter", target="./Qwen3-8B", limit=4)                          # -> SmokeReport

    drafter = lilicorr_ckpt.load_drafter("./drafter", runtime="vllm")  # validate, then build (needs torch)
"""

from __future__ import annotations

import importlib  # loaded by the interpreter at start-up already: costs nothing before the Ctrl-C handler

__version__ = "0.1.0"

_EXPORTS = {
    "validate": "lilicorr_ckpt.api",
    "Report": "lilicorr_ckpt.results",
    "Finding": "lilicorr_ckpt.results",
    "InputError": "lilicorr_ckpt.errors",
    "UsageError": "lilicorr_ckpt.errors",
    "load_drafter": "lilicorr_ckpt.smoke.load",
}
__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:  # no typing import: this runs before the entry's Ctrl-C handler
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
