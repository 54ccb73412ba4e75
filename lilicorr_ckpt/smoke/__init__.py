"""`lilicorr-ckpt smoke`: run the reference drafter against its target. Torch is imported only when it runs.

from lilicorr_ckpt.smoke import smoke
profile = smoke("./drafter", target="./Qwen3-8B", limit=4)   # a SmokeReport; profile.passed is the verdict
"""

from __future__ import annotations

import importlib
from typing import Any

from lilicorr_ckpt.errors import UsageError

_EXPORTS = {
    "SmokeOptions": ".options",
    "run_smoke": ".run",
    "SmokeReport": ".profile",
    "SmokeRefused": "lilicorr_ckpt.errors",
}
__all__ = sorted([*_EXPORTS, "smoke"])


def smoke(path: str, *, target: str, **options: Any) -> Any:
    """Run `lilicorr-ckpt smoke PATH --target T` and return its SmokeReport (the profile `--out` writes).

    options: the SmokeOptions fields (gpu, probes, limit, max_new_tokens, temperature, seeds, runtime, ...),
    named as the command line's flags with `_` for `-`. Raises SmokeRefused when the drafter is refused
    before it runs, InputError for unreadable input, UsageError for bad options."""
    from lilicorr_ckpt.smoke.options import SmokeOptions, check_options, runner

    try:
        opts = SmokeOptions(path=path, target=target, **options)
    except TypeError as exc:  # an option SmokeOptions has no field for
        raise UsageError(f"smoke(): {exc}") from None
    check_options(opts)
    return runner()(opts, None)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
