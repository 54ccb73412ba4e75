"""The embedded reference runtime: DFlash backbone + LiLiCorr head + exact speculative decoding (torch)."""

from .decode import BlockRecord, GenerationResult, Proposal, SpeculativeDecoder, draft_block
from .dflash import Drafter, DraftKVCache
from .head import LiLiCorrHead
from .loader import CheckpointRefused, load_drafter
from .stats import AcceptanceStats, acceptance_stats
from .target import TargetModel, load_target

__all__ = [
    "AcceptanceStats", "BlockRecord", "CheckpointRefused", "DraftKVCache", "Drafter", "GenerationResult",
    "LiLiCorrHead", "Proposal", "SpeculativeDecoder", "TargetModel", "acceptance_stats", "draft_block",
    "load_drafter", "load_target",
]
