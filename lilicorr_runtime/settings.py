"""Every LILICORR_* environment variable the runtime reads, read here and nowhere else.

Each setting is one `Setting` in SETTINGS: its name, its default, the spellings it accepts and what it does. The
table in docs/runtime.md ("Settings") lists the same settings with the same defaults and values, and a test keeps
the two equal both ways and fails on a LILICORR_ name anywhere else in the runtime's code.

A setting is read when it is used (not at import), so a test or a bench can change it between calls. A value that
is not one of a setting's spellings raises `SettingError` (a ValueError) naming the variable, the value and what
it accepts; `check()` reads every setting at once, so a command can refuse a bad environment before it loads
anything (smoke does, as a usage error). Case and surrounding spaces are ignored; an empty value is the default.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path


class SettingError(ValueError):
    """A LILICORR_* variable holds a value its setting does not accept."""


@dataclass(frozen=True)
class Setting:
    """One environment variable. `choices` maps each accepted spelling (lower case) to the value it stands for;
    None for a path setting, which takes `off` or a file name."""

    name: str
    default: str
    choices: dict[str, str] | None
    meaning: str

    @property
    def values(self) -> str:
        """The accepted values as the docs table lists them: the canonical ones, in order, then their aliases."""
        if self.choices is None:
            return "`off` or a file path"
        canonical = list(dict.fromkeys(self.choices.values()))
        aliases = [spelling for spelling in self.choices if spelling not in canonical]
        return ", ".join(f"`{v}`" for v in canonical + aliases)

    def raw(self) -> str:
        """The variable's value as set, stripped (empty when unset)."""
        return os.environ.get(self.name, "").strip()

    def read(self) -> str:
        """The canonical value in force: the default when unset or empty, else the one the spelling stands for
        (SettingError for a spelling the setting does not take). A path setting returns `off` or the path."""
        setting = self.raw()
        if not setting:
            return self.default
        if self.choices is None:
            return "off" if setting.lower() == "off" else setting
        value = self.choices.get(setting.lower())
        if value is None:
            raise SettingError(
                f"{self.name}={_shown(setting)} is not a value it takes; expected one of {self._expected()} "
                f"(unset: {self.default})"
            )
        return value

    def _expected(self) -> str:
        assert self.choices is not None
        return ", ".join(dict.fromkeys(self.choices))


def _shown(value: str, limit: int = 80) -> str:
    """`value` quoted for a message, cut to `limit` characters (a value pasted by mistake can be megabytes)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def _switch() -> dict[str, str]:
    return {
        "on": "on",
        "off": "off",
        "1": "on",
        "0": "off",
        "yes": "on",
        "no": "off",
        "true": "on",
        "false": "off",
    }


TILE_CACHE = Setting(
    "LILICORR_TILE_CACHE",
    "$XDG_CACHE_HOME/lilicorr/step_tiles.json",
    None,
    "where the step GEMMs' tuned tiles are stored and read (ops/tuning/tables.py); `off`: neither, every process tunes",
)
KERNEL_CACHE = Setting(
    "LILICORR_KERNEL_CACHE",
    "$XDG_CACHE_HOME/lilicorr/kernels.json",
    None,
    "where the kernel variants a run compiled are noted, to compile ahead next time (ops/tuning/kernels.py); `off`: "
    "neither that file nor the bundled table",
)
STREAM_K = Setting(
    "LILICORR_STREAM_K",
    "on",
    _switch(),
    "whether the tuner times stream-K tiles of the step GEMMs (`off`: the tiles stored before stream-K stay valid)",
)
GGUF_LOADER = Setting(
    "LILICORR_GGUF_LOADER",
    "direct",
    {"direct": "direct", "transformers": "transformers"},
    "how a GGUF target is read: `direct` (target/gguf_direct.py; transformers' loader for a file it does not "
    "map), `transformers` (always transformers' GGUF loader)",
)
SETTINGS: tuple[Setting, ...] = (
    TILE_CACHE,
    KERNEL_CACHE,
    STREAM_K,
    GGUF_LOADER,
)


# switches of paths the project's measurements found slower than the default, retired with their code
# (docs/performance.md has the measurements): setting one changes nothing, and `check()` says so once
RETIRED = {
    "LILICORR_LAYER_KERNEL": "the persistent layer kernel (831 against 707 us of kernel time per SmolLM2 step)",
    "LILICORR_LAYER_PREFETCH": "the layer kernel's L2 prefetch",
    "LILICORR_LAYER_UNROLL": "the layer kernel's unrolled K loops",
    "LILICORR_PDL": "programmatic dependent launch (5-7% more kernel time late, 16-32% slower early)",
    "LILICORR_MLP": "silu(gate) x up in down's prologue (a Qwen3-8B-shaped step 6.3 -> 9.9 ms)",
}

TABLE_HEADER = ("| variable | values | unset | what it does |", "|---|---|---|---|")


def table() -> list[str]:
    """The docs table's lines (docs/runtime.md, "Settings"), one row per setting in SETTINGS order."""
    rows = [f"| `{s.name}` | {s.values} | `{s.default}` | {s.meaning} |" for s in SETTINGS]
    return [*TABLE_HEADER, *rows]


def check() -> None:
    """Read every setting: SettingError for the first that holds a value it does not take. A retired switch that
    is set costs one RuntimeWarning naming it."""
    for setting in SETTINGS:
        setting.read()
    for name, what in RETIRED.items():
        if name in os.environ and name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"{name} is ignored: {what} was measured slower than the default and retired "
                "(docs/performance.md)",
                RuntimeWarning,
                stacklevel=2,
            )


_warned: set[str] = set()


def cache_dir() -> Path:
    """Where the runtime keeps what it measured or compiled between processes: $XDG_CACHE_HOME/lilicorr."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lilicorr"


def cache_file(setting: Setting) -> Path | None:
    """A path setting's file: the one it names (`~` expanded), else its default file name in cache_dir(); None
    when it says `off`."""
    value = setting.raw()
    if value.lower() == "off":
        return None
    if not value:
        return cache_dir() / Path(setting.default).name
    return Path(value).expanduser()


def tile_cache() -> Path | None:
    return cache_file(TILE_CACHE)


def kernel_cache() -> Path | None:
    return cache_file(KERNEL_CACHE)


def stream_k() -> bool:
    return STREAM_K.read() == "on"


def gguf_loader() -> str:
    """`direct` or `transformers`."""
    return GGUF_LOADER.read()
