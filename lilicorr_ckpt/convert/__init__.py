"""`lilicorr-ckpt convert`: a ModelOpt DFlash-family export -> the layout SGLang, vLLM and TensorRT-LLM load.

    from lilicorr_ckpt.convert import ConvertOptions, convert
    result = convert("export/", "serving/", ConvertOptions(runtime="vllm"))

Planning (plan.py) reads headers and configs only; writing (writer.py) streams tensor bytes into a
temporary sibling directory that is renamed into place after `validate` accepts it. Torch is never
imported on this path; `--verify` (verify.py) is the only part that needs it.
"""

from __future__ import annotations

from .errors import ConversionRefused
from .options import ConvertOptions
from .pipeline import ConvertResult, convert

__all__ = ["ConversionRefused", "ConvertOptions", "ConvertResult", "convert"]
