"""What the reports print from a checkpoint (tensor names, config values, paths) is shown, never obeyed: control
characters are escaped, so a name cannot forge a report line, reach the terminal as an escape sequence, or make
the JUnit XML invalid."""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode line/paragraph separators (which some viewers break lines on)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """text with every control character written as a visible escape (`\\x0a`, `\\x1b`, `\\u2028`)."""
    return _CONTROL.sub(_escape, text)
