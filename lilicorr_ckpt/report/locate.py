"""Where in a checkpoint's files a finding points (SARIF regions, GitHub annotations): the line of the JSON key
it names (a config.json key, an index entry), or, for a tensor, its line in model.safetensors.index.json when
the index lists it and line 1 of its shard file otherwise (a header is one line of JSON)."""

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
        c = self.text[self.pos : self.pos + 1]
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


INDEX = "model.safetensors.index.json"


class LineFinder:
    """Lines of JSON keys in a local checkpoint's files, each file scanned once; None when unknown."""

    def __init__(self, root: Path | None):
        self.root = root
        self._cache: dict[str, dict[str, int]] = {}

    def _lines(self, file: str) -> dict[str, int]:
        if file not in self._cache:
            from lilicorr_ckpt.checkpoint.readfile import read_regular_file  # the reader: not at start-up

            assert self.root is not None
            try:  # only a regular file of a sane size is read (a FIFO would block), even one swapped in meanwhile
                data = read_regular_file(self.root / file, what=file, max_bytes=_MAX_SCAN_BYTES)
                self._cache[file] = json_key_lines(data.decode("utf-8", errors="replace"))
            except InputError:
                self._cache[file] = {}
        return self._cache[file]

    def line(self, file: str | None, pointer: str | None) -> int | None:
        if self.root is None or not file or not file.endswith(".json"):
            return None
        return pointer_line(self._lines(file), pointer)

    def locate(self, file: str, pointer: str | None) -> tuple[str, int] | None:
        """(file, line) a finding about `file` (checkpoint-relative) at `pointer` points at; None when the file
        is not there (a missing shard, a Hub repo). A JSON file: the pointer's line (of its nearest existing
        ancestor), line 1 without one. A tensor in a shard: its weight_map entry in the index, when the index
        lists it, else line 1 of the shard (the header)."""
        if self.root is None or not _inside(self.root, file) or not (self.root / file).is_file():
            return None
        if file.endswith(".json"):
            return file, pointer_line(self._lines(file), pointer) or 1
        if (
            file.endswith(".safetensors")
            and pointer
            and not pointer.startswith("$")
            and (self.root / INDEX).is_file()
        ):
            line = self._lines(INDEX).get(f"$.weight_map.{pointer}")
            if line is not None:
                return INDEX, line
        return file, 1


_MAX_SCAN_BYTES = 64 << 20  # a config or index larger than this is validate's to refuse; no line, not a hang


def _inside(root: Path, file: str) -> bool:
    """file is a relative path that stays inside root (a finding's file comes from the checkpoint or a saved
    report: never a way to point outside it)."""
    rel = Path(file)
    return not rel.is_absolute() and ".." not in rel.parts
