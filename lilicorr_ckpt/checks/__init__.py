"""Judging a checkpoint: one module per rule family, each rule's catalogue row beside its check.

Importing the package registers the catalogue and the checks, family by family in id order (the README table
and `lilicorr-ckpt rules` follow it)."""

# isort: off
from lilicorr_ckpt.checks import config  # noqa: F401 (LC0xx, LC1xx)
from lilicorr_ckpt.checks import coverage  # noqa: F401 (LC2xx)
from lilicorr_ckpt.checks import quantization  # noqa: F401 (LC3xx)
from lilicorr_ckpt.checks import sibling_quant  # noqa: F401 (LC305, LC307 for the sibling heads' linears)
from lilicorr_ckpt.checks import lm_head  # noqa: F401 (LC4xx)
from lilicorr_ckpt.checks import target  # noqa: F401 (LC5xx)
from lilicorr_ckpt.checks import files  # noqa: F401 (LC6xx)
from lilicorr_ckpt.checks import deep  # noqa: F401 (LC7xx; its check runs only with --deep)

# the speculators layout and the draft vocabulary (LC017-LC019, LC176-LC179); last, as its `scope` check narrows
# the findings of the others to the releases that read that layout
from lilicorr_ckpt.checks import speculators  # noqa: F401

# isort: on
from lilicorr_ckpt.checks.findings import RULES

# the catalogue in id order (the README table, `lilicorr-ckpt rules`): each module registers its rows beside its
# checks, by concern, so registration order is not id order
_by_id = sorted(RULES.items())
RULES.clear()
RULES.update(_by_id)

__all__ = ["RULES"]
