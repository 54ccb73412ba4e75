"""The Prometheus text exposition format (what vLLM's /metrics serves), read for the few samples smoke needs.

`name{label="value",...} value [timestamp]` per line, `#` lines are HELP / TYPE comments. Only the samples whose
name is asked for are parsed; a line that cannot be read is an error only when it is one of those.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

import msgspec

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class Sample(msgspec.Struct, frozen=True):
    name: str
    labels: dict[str, str]
    value: float


class ExpositionError(ValueError):
    """A wanted sample's line does not follow the text format."""


def _labels(text: str, line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise ExpositionError(f"unreadable labels in {line[:120]!r}")
        out[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: _ESCAPES[e.group(0)], m.group(2))
        pos = m.end()
    return out


def _value(text: str, line: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ExpositionError(f"unreadable value in {line[:120]!r}") from None
    return value


def parse(text: str, wanted: Collection[str]) -> list[Sample]:
    """The samples named in `wanted`, in order of appearance."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        cut = brace if brace != -1 and (space == -1 or brace < space) else space
        name = line if cut == -1 else line[:cut]
        if name not in wanted:
            continue
        if cut == brace and brace != -1:
            close = line.rfind("}")
            if close < brace:
                raise ExpositionError(f"unclosed labels in {line[:120]!r}")
            labels = _labels(line[brace + 1 : close], line)
            rest = line[close + 1 :].split()
        else:
            labels = {}
            rest = line[cut:].split() if cut != -1 else []
        if not rest:
            raise ExpositionError(f"no value in {line[:120]!r}")
        out.append(Sample(name, labels, _value(rest[0], line)))
    return out


def count(value: float, what: str) -> int:
    """A counter's value as the whole non-negative number it must be."""
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ExpositionError(f"{what} is {value!r}, not a count")
    return int(value)
