"""What the user asked for, parsed and checked before any file is read."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.runtimes import PROFILES, select_profiles

LAYOUT_CHOICES = ("zlab", "speculators")  # convert/layout.py

# the default selection: the newest release of every engine that has released one (SGLang and vLLM). An unreleased
# revision's loader (TensorRT-LLM's, which takes q/k/v only in float) decides what convert changes only when it is
# named (`trtllm`, `all`, `every`): by default the output is not degraded for code no release has
DEFAULT_RUNTIME = ",".join(engine for engine, newest in PROFILES.items() if newest.released)
UNRELEASED = tuple(newest for newest in PROFILES.values() if not newest.released)
# --to speculators: the newest release of every released engine that reads the speculators layout (vLLM translates
# it; SGLang has no reader for it)
SPECULATORS_RUNTIME = ",".join(
    engine
    for engine, newest in PROFILES.items()
    if newest.released and newest.speculators_format == "translated"
)


def default_runtime(to: str) -> str:
    """The runtime selection convert writes for when none is given: the released engines that read the layout."""
    return SPECULATORS_RUNTIME if to == "speculators" else DEFAULT_RUNTIME


DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # transformers' save_pretrained default ("5GB")
NAMING_CHOICES = ("auto", "named", "sequential")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}


class ConvertOptions(msgspec.Struct, kw_only=True, frozen=True):
    # a runtime selection (sglang, vllm==VERSION, vllm>=VERSION, all, every, ...): whose loaders the output must
    # satisfy; "" is the default for the layout written (default_runtime)
    runtime: str = ""
    to: str = "zlab"  # the layout of the output's config.json: zlab | speculators
    verifier: str | None = None  # --to speculators: speculators_config.verifier.name_or_path
    # auto (what every selected release loads) | named | sequential (legacy nn.Sequential head names)
    naming: str = "auto"
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    repair: bool = True  # dequantize modules that must stay float (False: refuse instead)
    drop: tuple[str, ...] = ()  # fnmatch patterns over source or converted tensor names
    dequantize: tuple[str, ...] = ()  # extra modules to store in float (fnmatch over module names)
    relabel_w4a16: bool = False  # NVFP4 (W4A4) without activation scales -> W4A16_NVFP4 (weights unchanged)
    set_keys: tuple[tuple[str, Any], ...] = ()  # (dotted config path, JSON value)
    force: bool = False  # replace an existing DST directory
    verify: bool = False  # compare source and output through lilicorr_runtime (needs torch)
    strict: bool = False  # refuse when the output has validate warnings too
    dry_run: bool = False  # plan and pre-validate only; write nothing
    quiet: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.runtime, str):
            raise UsageError(
                f"runtime must be a runtime selection such as 'all' or 'vllm', got {self.runtime!r}"
            )
        if self.to not in LAYOUT_CHOICES:
            raise UsageError(f"--to must be zlab or speculators, got {self.to!r}")
        if self.runtime == "":
            msgspec.structs.force_setattr(self, "runtime", default_runtime(self.to))
        profiles = select_profiles(self.runtime)  # UsageError naming the supported releases
        if self.to == "speculators":
            unread = [p.display for p in profiles if p.speculators_format != "translated"]
            if unread:
                raise UsageError(
                    f"--to speculators: {', '.join(unread)} {'does' if len(unread) == 1 else 'do'} not read the "
                    f"speculators layout (LC017/LC018); write the z-lab layout for {'it' if len(unread) == 1 else 'them'} "
                    f"(--to zlab), or select the releases that translate it (-r {SPECULATORS_RUNTIME})"
                )
        elif self.verifier is not None:
            raise UsageError("--verifier names the target in a speculators config: it needs --to speculators")
        if self.naming not in NAMING_CHOICES:
            raise UsageError(f"--naming must be auto, named or sequential, got {self.naming!r}")
        if self.max_shard_size < 1:
            raise UsageError("--max-shard-size must be positive")

    def record(self) -> dict[str, Any]:
        """The options as conversion.json records them (everything that changes the output)."""
        return {
            "runtime": self.runtime,
            "to": self.to,
            "verifier": self.verifier,
            "naming": self.naming,
            "max_shard_size": self.max_shard_size,
            "repair": self.repair,
            "drop": list(self.drop),
            "dequantize": list(self.dequantize),
            "relabel_w4a16": self.relabel_w4a16,
            "set": {k: v for k, v in self.set_keys},
        }


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '123' (bytes) -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise UsageError(
            f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB, 2GiB or a byte count"
        )
    unit = (m.group(2) or "").lower()
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise UsageError(f"--max-shard-size {text!r} is not positive")
    return value


def parse_set(item: str) -> tuple[str, Any]:
    """'dflash_config.block_size=16' -> ('dflash_config.block_size', 16). VALUE must be JSON: a string is
    quoted (dflash_config.name='"x"'), so a typo never becomes a string silently."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. dflash_config.lilicorr_logit_scale=10")
    try:
        value = json.loads(raw)
    except ValueError:
        quoted = json.dumps(raw.strip())
        raise UsageError(
            f"--set {item!r}: VALUE must be JSON (e.g. 10, 0.5, true, null, [1, 2]); strings must be "
            f"quoted: {key}='{quoted}'"
        ) from None
    return key, value
