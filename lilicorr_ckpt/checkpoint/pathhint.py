"""Telling a mistyped local path from a Hugging Face repo id, and suggesting what was meant.

`examples/tiny-lilicorrr` matches the repo id pattern (org/name) but is a typo of a sibling directory;
treating it as a repo id sends the user to `hf download` for a repo that does not exist. A spec that
*looks like a path* is answered as one: "no such directory", with the closest siblings.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

_PATH_PREFIXES = ("./", "../", ".\\", "..\\", "/", "~", "\\")


def looks_like_path(spec: str) -> bool:
    """True when spec can only be (or most plausibly is) a local path rather than `org/name`.

    A path: no / at all, `.`/`..`, anything starting with ./ ../ / ~ (or their Windows forms), a drive letter,
    more than one separator, a trailing separator, or a first component that is an existing local
    directory (`examples/x` while ./examples exists)."""
    if spec in (".", "..") or spec.startswith(_PATH_PREFIXES) or "/" not in spec:  # a repo id has one /
        return True
    if len(spec) >= 2 and spec[1] == ":" and spec[0].isalpha():  # C:\... or C:/...
        return True
    if "\\" in spec or spec.endswith("/") or spec.count("/") >= 2:
        return True
    head, sep, _ = spec.partition("/")
    return bool(sep) and Path(head).expanduser().is_dir()


def suggestions(spec: str, limit: int = 3) -> list[str]:
    """Existing sibling directories whose names are close to spec's last component, spelled as spec is."""
    path = Path(spec.rstrip("/\\") or spec).expanduser()
    parent = path.parent
    try:
        siblings = [p.name for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return []
    close = difflib.get_close_matches(path.name, siblings, n=limit, cutoff=0.6)
    prefix = spec.rstrip("/\\")[: len(spec.rstrip("/\\")) - len(path.name)]
    return [prefix + name for name in close]


def no_such_directory(spec: str, what: str = "checkpoint") -> str:
    """The message for a path-like spec that does not exist."""
    path = Path(spec.rstrip("/\\") or spec).expanduser()
    close = suggestions(spec)
    if close:
        hint = "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        parent = path.parent
        missing_parent = not parent.exists()
        hint = (f"; its parent {str(parent) + os.sep!r} does not exist either" if missing_parent and str(parent) != "."
                else "")
    return f"{what} {spec!r} does not exist: no such directory{hint}"
