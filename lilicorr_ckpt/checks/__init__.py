"""Judging a checkpoint: one module per rule family, each rule's catalogue row beside its check."""

from lilicorr_ckpt.checks import rules  # noqa: F401  (registers the catalogue and the checks)
from lilicorr_ckpt.checks.findings import RULES

__all__ = ["RULES"]
