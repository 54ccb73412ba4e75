"""Corpus rows for config values as each release reads them (the backbone, types, schema, geometry, taps
and block checks): the fuzzer's cases that once disagreed, each fixed at its root. corpus.py joins them."""

from __future__ import annotations

from .cases import Case

VALUE_ROWS: tuple[Case, ...] = ()

# (case, release) -> why validate and that release still disagree (corpus.PENDING)
VALUE_PENDING: dict[tuple[Case, str], str] = {}
