"""Where in a checkpoint's files a finding points: the line of a config.json key (SARIF regions, annotations)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lilicorr_ckpt.errors import InputError

# --- JSON key positions ---------------------------------------------------------------------------------------

class _Scanner:
    """Walks JSON text and records the 1-based line of every value, keyed by its JSONPath ($.a.b[0])."""

    _WS = re.compile(r"[ \t\n\r]*")
    _STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
    _SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.lines: dict[str, int] = {}

    def line(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def ws(self) -> None:
        self.pos = self._WS.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def value(self, path: str, line: int) -> None:
        self.lines.setdefault(path, line)
        self.ws()
        c = self.text[self.pos:self.pos + 1]
        if c == "{":
            self.pos += 1
            self.ws()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return
            while True:
                self.ws()
                m = self._STRING.match(self.text, self.pos)
                if m is None:
                    raise ValueError("expected a key")
                key = json.loads(m.group())
                key_line = self.line(self.pos)
                self.pos = m.end()
                self.ws()
                if not self.text.startswith(":", self.pos):
                    raise ValueError("expected ':'")
                self.pos += 1
                self.value(f"{path}.{key}", key_line)
                self.ws()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if self.text.startswith("}", self.pos):
                    self.pos += 1
                    return
                raise ValueError("expected ',' or '}'")
        if c == "[":
            self.pos += 1
            self.ws()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return
            i = 0
            while True:
                self.ws()
                self.value(f"{path}[{i}]", self.line(self.pos))
                i += 1
                self.ws()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if self.text.startswith("]", self.pos):
                    self.pos += 1
                    return
                raise ValueError("expected ',' or ']'")
        m = self._STRING.match(self.text, self.pos) or self._SCALAR.match(self.text, self.pos)
        if m is None:
            raise ValueError("expected a value")
        self.pos = m.end()


def json_key_lines(text: str) -> dict[str, int]:
    """JSONPath -> line of its key (of the element, in arrays); {} when the text is not JSON."""
    scanner = _Scanner(text)
    try:
        scanner.ws()
        scanner.value("$", scanner.line(scanner.pos))
    except (ValueError, IndexError):
        return {}
    return scanner.lines


def pointer_line(lines: dict[str, int], pointer: str | None) -> int | None:
    """The line of pointer, or of its nearest ancestor that exists (a missing key points at its parent)."""
    if not pointer or not lines:
        return None
    path = pointer if pointer.startswith("$") else "$." + pointer
    while path:
        if path in lines:
            return lines[path] if path != "$" else None
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


LINE_SCAN_LIMIT = 32 << 20  # as the largest JSON a checkpoint reader reads (the index)


class LineFinder:
    """Lines of JSON keys in a local checkpoint's files, each file scanned once; None when unknown."""

    def __init__(self, root: Path | None):
        self.root = root
        self._cache: dict[str, dict[str, int]] = {}

    def line(self, file: str | None, pointer: str | None) -> int | None:
        if self.root is None or not file or not file.endswith(".json"):
            return None
        if file not in self._cache:
            from lilicorr_ckpt.checkpoint.readfile import read_regular_file  # the reader: not at start-up

            try:  # a FIFO or device where a report says a JSON file is: no line numbers, never a hang
                data = read_regular_file(self.root / file, what=file, max_bytes=LINE_SCAN_LIMIT)
                self._cache[file] = json_key_lines(data.decode("utf-8", errors="replace"))
            except InputError:
                self._cache[file] = {}
        return pointer_line(self._cache[file], pointer)
