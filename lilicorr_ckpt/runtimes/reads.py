"""How each release reads a config.json value (RuntimeProfile.config_reads / dspark_reads): which reader applies
to a JSON path for a head kind, and whether a reader fails on a value. The config checks (checks/config/types.py)
and the per-release casts (checks/casts.py) both read the profiles through these; nothing here imports a check."""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Any

from lilicorr_ckpt.runtimes.base import RuntimeProfile

# the readers that convert a value of the wrong JSON type: the number type each gives (checks/casts.py judges the
# cast value; LC141 names an integer cast)
CASTS: dict[str, type] = {
    "int()": int,
    "int()?": int,
    "int()-bool": int,
    "float()": float,
    "float()-bool": float,
    # compared with 0 as it is, then cast with int() where it builds something: a bool is 0 or 1 there, 2.5 is 2
    # (vLLM lilicorr.py LiLiCorr.__init__, then qwen3_dflash2.py DFlash2Qwen3DecoderLayer)
    "number>int()": int,
}


def _numeric_text(value: str, cast: type) -> bool:
    try:
        cast(value)
    except (ValueError, OverflowError):
        return False
    return True


def reader_refuses(reader: str, value: Any) -> bool:
    """Whether a release reading `value` with `reader` (RuntimeProfile.config_reads) fails on it."""
    if reader in ("unread", "truth", "truth?", "equals", "str()"):
        return False
    if (
        reader == "schema|falsy"
    ):  # a falsy value is absent; any other must have the schema's type (field_types)
        return False
    if reader == "float()|falsy":
        return bool(value) and reader_refuses("float()", value)
    if reader == "int|falsy":  # `value or default`, a truthy value used uncast as a size
        return bool(value) and reader_refuses("int", value)
    if reader == "int()?":  # `None if value is None else int(value)`
        return value is not None and reader_refuses("int()", value)
    if reader == "float()-bool":  # float(value), where float(true) == 1.0 is a ratio no trained head has
        return isinstance(value, bool) or reader_refuses("float()", value)
    if reader == "int()-bool":  # int(value), where null and int(true) == 1 are sizes no model is built with
        # (4.5 is int()'s 4: the cast value is judged against the tensors, checks/casts.py)
        return value is None or isinstance(value, bool) or reader_refuses("int()", value)
    if reader == "int":  # used uncast as a size: a JSON integer only (a whole-number float is LC139's)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return False
        return not (isinstance(value, int) and not isinstance(value, bool))
    if reader in ("float()", "int()"):
        if isinstance(value, (bool, int)):
            return False
        if isinstance(value, float):
            return reader == "int()" and not math.isfinite(value)
        if isinstance(value, str):
            return not _numeric_text(value, float if reader == "float()" else int)
        return True  # null, a list, an object
    if reader == "flag":  # `if value:` where a true value builds something: only a bool says which
        return bool(value) and not isinstance(value, bool)
    if reader == "count?":
        return not (value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1))
    if reader == "truth==":  # a truth value, also hashed and compared with itself (NaN never equals itself)
        return isinstance(value, (list, dict)) or (isinstance(value, float) and math.isnan(value))
    # compared with 0 as it is (`< 0`, a truth value), then cast with int() where it builds something: a bool is
    # a number there (false is 0, no convolution), a string or null fails the comparison
    if reader == "number>int()":
        return not isinstance(value, (int, float))
    # used in arithmetic as it is: a bool is a number there, a string repeats
    if reader == "number":
        return not (isinstance(value, (int, float)) and not isinstance(value, bool))
    if reader == "number?":
        return not (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)))
    if reader == "bool":
        return not isinstance(value, bool)
    if reader == "str?":
        return not (value is None or isinstance(value, str))
    if reader == "str+":
        return not (value is None or (isinstance(value, str) and value != ""))
    if reader == "object":
        return not isinstance(value, dict)
    raise ValueError(f"unknown config reader {reader!r}")


def _family_matches(spec: str, family: str | None) -> bool:
    if spec == "*":
        return True
    negate = spec.startswith("!")
    listed = family in spec.lstrip("!").split(",")
    return listed != negate


def config_read(profile: RuntimeProfile, family: str | None, path: str) -> str | None:
    """How `profile` reads the config value at `path` ("$.dflash_config.causal") for a head of `family`: a reader of
    RuntimeProfile.config_reads, or None (the schema's type holds)."""
    for pattern, families, reader in (*profile.dspark_reads, *profile.config_reads):
        if fnmatch.fnmatchcase(path, pattern) and _family_matches(families, family):
            return reader
    return None


def resolve_read(reader: str | None, path: str, raw: dict[str, Any]) -> str | None:
    """An "else:READER" entry resolved against the config: READER for a top-level key dflash_config has no value
    of that name for, "unread" where it has one (the nested value wins)."""
    if reader is None or not reader.startswith("else:"):
        return reader
    nested = raw.get("dflash_config")
    key = path.removeprefix("$.")
    shadowed = path.count(".") == 1 and isinstance(nested, dict) and key in nested
    return "unread" if shadowed else reader.removeprefix("else:")


_INDEX = re.compile(r"\[\d+\]$")


def _key_path(path: str) -> str:
    while _INDEX.search(path):
        path = _INDEX.sub("", path)
    return path


def present(raw: dict[str, Any]) -> dict[str, Any]:
    """Every top-level and dflash_config value, by JSON path."""
    out = {f"$.{k}": v for k, v in raw.items()}
    nested = raw.get("dflash_config")
    if isinstance(nested, dict):
        out.update({f"$.dflash_config.{k}": v for k, v in nested.items()})
    return out
