"""The embedded reference runtime: DFlash backbone + LiLiCorr head + exact speculative decoding (torch).

`build_drafter(checkpoint, dtype, device)` builds from a `lilicorr_ckpt.checkpoint.Checkpoint` and never judges it.
Reading a path, validating it and building its drafter is the tooling's: `lilicorr_ckpt.load_drafter(path,
runtime=, dtype=, device=)`. The runtime imports nothing of lilicorr_ckpt but its reader, lilicorr_ckpt.checkpoint."""

from .decode import BlockRecord, GenerationResult, Proposal, SpeculativeDecoder, draft_block
from .dflash import Drafter, DraftKVCache
from .head import LiLiCorrHead
from .load import CheckpointRefused, build_drafter
from .stats import AcceptanceStats, acceptance_stats
from .target import TargetModel, load_target

__all__ = [
    "AcceptanceStats", "BlockRecord", "CheckpointRefused", "DraftKVCache", "Drafter", "GenerationResult",
    "LiLiCorrHead", "Proposal", "SpeculativeDecoder", "TargetModel", "acceptance_stats", "build_drafter",
    "draft_block", "load_target",
]

