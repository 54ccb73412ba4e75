"""The embedded reference runtime: DFlash backbone + LiLiCorr head + exact speculative decoding (torch).

`build_drafter(checkpoint, dtype, device)` builds from a `lilicorr_ckpt.checkpoint.Checkpoint` and never judges it.
Reading a path, validating it and building its drafter is the tooling's: `lilicorr_ckpt.load_drafter(path,
runtime=, dtype=, device=)`. The runtime imports nothing of lilicorr_ckpt but its reader, lilicorr_ckpt.checkpoint."""

import sys as _sys

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # a clear message, not a ModuleNotFoundError from deep inside the first import
    import os as _os
    import platform as _platform
    import shutil as _shutil

    # lilicorr-ckpt is not on PyPI: the extra installs from the checkout. Without an NVIDIA driver (Linux,
    # Windows) the CPU torch wheel first, or pip fetches the CUDA build (GBs). lilicorr_ckpt.install says the
    # same for the command line; the runtime may import nothing of lilicorr_ckpt but its reader.
    _nvidia = _shutil.which("nvidia-smi") or _os.path.exists("/proc/driver/nvidia/version")
    _cpu = _platform.system() in ("Linux", "Windows") and not _nvidia
    _HINT = (
        f"lilicorr_runtime needs torch ({_exc}): from the lilicorr-ckpt checkout, "
        + ("pip install torch --index-url https://download.pytorch.org/whl/cpu && " if _cpu else "")
        + "pip install '.[runtime]'"
        + (" (no NVIDIA driver found: the CPU torch wheel)" if _cpu else "")
    )
    _argv = list(getattr(_sys, "orig_argv", []))
    _main = _argv[_argv.index("-m") + 1] if "-m" in _argv[:-1] else ""
    if _main.startswith(
        ("lilicorr_runtime", "lilicorr_train")
    ):  # `python -m lilicorr_train ...`: a message, exit 4
        _sys.stderr.write(f"python -m {_main}: {_HINT}\n")
        raise SystemExit(4) from None
    raise ModuleNotFoundError(_HINT, name="torch") from None

from .decode.speculative import BlockRecord, GenerationResult, Proposal, SpeculativeDecoder, draft_block
from .decode.stats import AcceptanceStats, acceptance_stats
from .model.drafter import Drafter, DraftKVCache, LiLiCorrHead
from .model.load import CheckpointRefused, build_drafter
from .target.fast import TargetModel
from .target.load import load_target

__all__ = [
    "AcceptanceStats",
    "BlockRecord",
    "CheckpointRefused",
    "DraftKVCache",
    "Drafter",
    "GenerationResult",
    "LiLiCorrHead",
    "Proposal",
    "SpeculativeDecoder",
    "TargetModel",
    "acceptance_stats",
    "build_drafter",
    "draft_block",
    "load_target",
]
