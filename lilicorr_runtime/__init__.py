"""The embedded reference runtime: DFlash backbone + LiLiCorr head + exact speculative decoding (torch).

`build_drafter(checkpoint, dtype, device)` builds from a `lilicorr_ckpt.checkpoint.Checkpoint` and never judges it.
`load_drafter(path, runtime=, dtype=, device=)` (validate, then build) is the tooling's, from
lilicorr_ckpt.smoke.load: it is re-exported here lazily, so importing the runtime never imports the validator."""

from typing import Any

from .decode import BlockRecord, GenerationResult, Proposal, SpeculativeDecoder, draft_block
from .dflash import Drafter, DraftKVCache
from .head import LiLiCorrHead
from .load import CheckpointRefused, build_drafter
from .stats import AcceptanceStats, acceptance_stats
from .target import TargetModel, load_target

__all__ = [
    "AcceptanceStats", "BlockRecord", "CheckpointRefused", "DraftKVCache", "Drafter", "GenerationResult",
    "LiLiCorrHead", "Proposal", "SpeculativeDecoder", "TargetModel", "acceptance_stats", "build_drafter",
    "draft_block", "load_drafter", "load_target",
]


def __getattr__(name: str) -> Any:
    if name == "load_drafter":
        from lilicorr_ckpt.smoke.load import (
            load_drafter,  # the one upward edge: a convenience for library callers
        )

        return load_drafter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
