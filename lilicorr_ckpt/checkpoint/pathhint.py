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


_NESTED_LIMIT = 2000  # directories looked at one level down: a hint must stay instant in a big folder


def _subdirectories(directory: Path) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_dir()]
    except OSError:
        return []


def suggestions(spec: str, limit: int = 3) -> list[str]:
    """Existing directories whose names are close to spec's last component, spelled as spec is: siblings, and
    directories one level below a sibling (`tiny-lilicorr` typed in the repo root is `examples/tiny-lilicorr`).
    Directories of exactly that name win over near misses (checkpoints, holding config.json, first); near misses
    are the closest names only."""
    path = Path(spec.rstrip("/\\") or spec).expanduser()
    parent = path.parent
    prefix = spec.rstrip("/\\")[: len(spec.rstrip("/\\")) - len(path.name)]
    siblings = _subdirectories(parent)
    candidates = [(name, name) for name in siblings]
    seen = 0
    for sibling in sorted(siblings):
        if (
            sibling.startswith((".", "__")) or seen > _NESTED_LIMIT
        ):  # .git, .cache, __pycache__: never a checkpoint
            continue
        nested = _subdirectories(parent / sibling)
        seen += len(nested)
        candidates += [(f"{sibling}/{name}", name) for name in nested]
    exact = [shown for shown, name in candidates if name == path.name and shown != path.name]
    if exact:
        chosen = sorted(exact, key=lambda shown: (not (parent / shown / "config.json").is_file(), shown))
    else:  # near misses: the best, and those almost as close (not every name that shares a word)
        scored = [
            (difflib.SequenceMatcher(None, path.name, name).ratio(), shown) for shown, name in candidates
        ]
        best = max((score for score, _ in scored), default=0.0)
        chosen = [
            shown
            for score, shown in sorted(scored, key=lambda t: (-t[0], "/" in t[1], t[1]))
            if score >= max(0.6, best - 0.1)
        ]
    return [prefix + shown for shown in chosen[:limit]]


def no_such_directory(spec: str, what: str = "checkpoint") -> str:
    """The message for a path-like spec that does not exist."""
    path = Path(spec.rstrip("/\\") or spec).expanduser()
    close = suggestions(spec)
    if close:
        hint = "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        parent = path.parent
        missing_parent = not parent.exists()
        hint = (
            f"; its parent {str(parent) + os.sep!r} does not exist either"
            if missing_parent and str(parent) != "."
            else ""
        )
    if path.suffix == ".gguf" and what == "checkpoint":
        hint += "; a .gguf file is a target model: give it as --target"
    return f"{what} {spec!r} does not exist: no such directory{hint}"


def file_not_a_directory(spec: str, what: str = "checkpoint") -> str:
    """The message for a spec that names a file where a checkpoint directory is expected."""
    path = Path(spec)
    if what == "checkpoint" and path.suffix == ".gguf":
        return (
            f"{what} {spec!r} is a GGUF file, which is a target model, not a drafter checkpoint: give the "
            f"drafter's directory as PATH and this file as --target {spec}"
        )
    hint = (
        f"; pass its folder {str(path.parent) or '.'}"
        if path.name.endswith((".json", ".safetensors"))
        else ""
    )
    return f"{what} {spec!r} is a file, expected a checkpoint directory{hint}"
