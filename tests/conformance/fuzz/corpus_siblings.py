"""Corpus rows for the sibling heads (DFlash2, DSpark, Domino) and quantized tensors: the fuzzer's cases that once
disagreed, each fixed at its root. corpus.py joins them."""

from __future__ import annotations

from .cases import Case

SIBLING_ROWS: tuple[Case, ...] = ()

# (case, release) -> why validate and that release still disagree (corpus.PENDING)
SIBLING_PENDING: dict[tuple[Case, str], str] = {}
