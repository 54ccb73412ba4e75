"""Probe prompts for `smoke`: the bundled sets (lilicorr_ckpt/probes/, licences beside them) or a user JSONL.

One JSON object per line: {"id": str, "category": str, "prompt": str, "chat": bool}; other keys are kept
out of the way. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import msgspec

from lilicorr_ckpt.checkpoint.readfile import decode_utf8, read_regular_file
from lilicorr_ckpt.errors import InputError, UsageError

BUNDLED = ("code", "chat", "math")


class Probe(msgspec.Struct, frozen=True):
    id: str
    category: str
    prompt: str
    chat: bool


PROBE_LIMIT = 16 << 20  # a probe file is prompts, not a corpus
# a prompt of 256k characters is tens of thousands of tokens, past most targets' context: longer ones would only
# cost minutes of tokenizing before smoke refuses them by position count
MAX_PROMPT_CHARS = 256 << 10
MAX_LABEL_CHARS = 256  # an id or a category is a label in the report, one line of a table


def is_probe_file(spec: str) -> bool:
    """A file unless every comma-separated item names a bundled category (so a stray file called `code`
    in the working directory does not shadow the bundled set)."""
    if all(n.strip() in BUNDLED for n in spec.split(",") if n.strip()):
        return False
    return spec.endswith((".jsonl", ".json")) or "/" in spec or os.sep in spec or Path(spec).is_file()


def load_probes(spec: str, limit: int = 0) -> list[Probe]:
    """`code,chat,math` (any subset of the bundled categories) or a JSONL file; at most `limit` prompts per
    category, in file order (0: all)."""
    if limit < 0:
        raise UsageError(f"--limit must be >= 0 (0 runs every prompt), got {limit}")
    if is_probe_file(spec):
        probes = read_jsonl(Path(spec))
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in names if n not in BUNDLED]
        if unknown or not names:
            raise UsageError(
                f"--probes {spec!r}: unknown categor{'ies' if len(unknown) > 1 else 'y'} "
                f"{', '.join(unknown) or '(none given)'}; choose from {', '.join(BUNDLED)} "
                "(comma-separated), or give a .jsonl file"
            )
        probes = []
        for name in dict.fromkeys(names):
            # one step at a time: Traversable.joinpath takes a single name before Python 3.11
            text = (
                resources.files("lilicorr_ckpt")
                .joinpath("probes")
                .joinpath(f"{name}.jsonl")
                .read_text("utf-8")
            )
            probes.extend(parse_lines(jsonl_lines(text), f"bundled {name}.jsonl"))
    return select(probes, limit)


def read_jsonl(path: Path) -> list[Probe]:
    if not path.exists() and not path.is_symlink():
        raise InputError(f"probe file {str(path)!r} does not exist")
    what = f"probe file {str(path)!r}"
    text = decode_utf8(read_regular_file(path, what=what, max_bytes=PROBE_LIMIT), what=what)
    probes = parse_lines(jsonl_lines(text), str(path))
    if not probes:
        raise InputError(
            f"probe file {str(path)!r} holds no prompts (expected one JSON object per line: "
            '{"id": ..., "category": ..., "prompt": ..., "chat": true|false})'
        )
    return probes


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL text: split at LF only (CRLF tolerated). str.splitlines would also split inside a
    JSON string at U+2028, U+0085 or a form feed, which JSON allows raw."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _unpaired_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_lines(lines: Sequence[str], where: str) -> list[Probe]:
    probes, seen = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{at}: not JSON ({exc.msg} at column {exc.colno}); each line must be one object "
                '{"id": ..., "category": ..., "prompt": ..., "chat": true|false}'
            ) from None
        except RecursionError:
            raise InputError(
                f"{at}: nested too deeply to be a probe (expected one flat JSON object)"
            ) from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise InputError(f"{at}: not a usable JSON line ({str(exc).split(';')[0]})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{at}: expected a JSON object, found {type(obj).__name__}")
        for key, kind in (("id", str), ("category", str), ("prompt", str), ("chat", bool)):
            if key not in obj:
                raise InputError(
                    f"{at}: missing key {key!r} (every line needs id, category, prompt and chat)"
                )
            if not isinstance(obj[key], kind):
                raise InputError(
                    f"{at}: {key!r} must be a {'boolean' if kind is bool else 'string'}, "
                    f"found {json.dumps(obj[key])[:60]}"
                )
        if not obj["prompt"].strip() or not obj["category"].strip():
            raise InputError(f"{at}: 'prompt' and 'category' must not be empty")
        for key in ("id", "category", "prompt"):
            if _unpaired_surrogate(obj[key]):
                raise InputError(
                    f"{at}: {key!r} holds an unpaired UTF-16 surrogate (such as \\ud800), which is not "
                    "text a tokenizer can encode"
                )
        for key, cap in (
            ("id", MAX_LABEL_CHARS),
            ("category", MAX_LABEL_CHARS),
            ("prompt", MAX_PROMPT_CHARS),
        ):
            if len(obj[key]) > cap:
                raise InputError(f"{at}: {key!r} is {len(obj[key])} characters; the limit is {cap}")
        if obj["id"] in seen:
            raise InputError(f"{at}: duplicate id {obj['id']!r}")
        seen.add(obj["id"])
        probes.append(Probe(obj["id"], obj["category"], obj["prompt"], obj["chat"]))
    return probes


def select(probes: Sequence[Probe], limit: int) -> list[Probe]:
    taken: dict[str, int] = {}
    out = []
    for p in probes:
        if limit and taken.get(p.category, 0) >= limit:
            continue
        taken[p.category] = taken.get(p.category, 0) + 1
        out.append(p)
    return out


def digest(probes: Sequence[Probe]) -> str:
    h = hashlib.sha256()
    for p in probes:
        h.update(json.dumps([p.id, p.category, p.chat, p.prompt]).encode())
    return h.hexdigest()


def counts(probes: Sequence[Probe]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in probes:
        out[p.category] = out.get(p.category, 0) + 1
    return out
