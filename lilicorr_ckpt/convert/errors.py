"""Why a conversion was refused: reasons a person can act on (exit code 1)."""

from __future__ import annotations


class ConversionRefused(Exception):
    """The source can be read but not converted as asked; nothing was written."""

    def __init__(self, summary: str, reasons: list[str] | None = None):
        super().__init__(summary)
        self.summary = summary
        self.reasons = list(reasons or [])

    def __str__(self) -> str:
        lines = [self.summary] + [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)
