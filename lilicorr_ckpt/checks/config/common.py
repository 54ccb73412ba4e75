"""What the config rule modules share."""

from __future__ import annotations

from typing import Any, TypeGuard

CFG = "config"  # the area of every config rule (LC0xx, LC1xx)


def is_number(value: Any) -> TypeGuard[float]:
    """A JSON number (a bool is not one, though Python counts it as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
