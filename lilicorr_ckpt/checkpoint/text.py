"""Shortening a list of names for a message: the one implementation, here so that the runtime (which imports only
lilicorr_ckpt.checkpoint) shares it with the checks, convert and smoke."""

from __future__ import annotations

from collections.abc import Iterable


def shorten(items: Iterable[str], n: int = 6, *, quote: str = "`") -> str:
    """The first `n` items, each between `quote`s (a finding's code spans by default), then "and N more"."""
    items = list(items)
    shown = ", ".join(f"{quote}{x}{quote}" for x in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")
