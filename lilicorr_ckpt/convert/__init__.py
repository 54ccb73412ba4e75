"""`lilicorr-ckpt convert`: a ModelOpt DFlash-family export -> the layout SGLang, vLLM and TensorRT-LLM load.

    from lilicorr_ckpt.convert import ConvertOptions, convert
    result = convert("export/", "serving/", ConvertOptions(runtime="vllm"))

Planning (plan.py, one function per phase) reads headers and configs only; writing (writer.py) streams tensor
bytes, read by reader.py, into a temporary sibling directory that destination.py renames into place after
`validate` accepts it. Torch is never
imported on this path; `--verify` (verify.py) is the only part that needs it. Attributes load lazily so
that registering the command does not slow down the other commands.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConversionRefused": "lilicorr_ckpt.errors",
    "ConvertOptions": ".options",
    "ConvertResult": ".pipeline",
    "convert": ".pipeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
