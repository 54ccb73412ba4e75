"""The serving stacks validate models, one module per engine, each naming the version it models.

An engine module holds everything engine-specific: its `PROFILE` (what that release accepts, as data), the
`VERSION` it models and where that code comes from, and `match_exclusion`, how it matches quantization
exclusions. Adding a runtime is adding one module here and naming it in `ENGINES`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from lilicorr_ckpt.runtimes import sglang, trtllm, vllm
from lilicorr_ckpt.runtimes.base import (
    FEATURE_MLP,
    HEAD_RAW_LINEARS,
    QKV,
    Exclusion,
    RuntimeProfile,
    fused_name,
    matches_any,
)

ENGINES: dict[str, ModuleType] = {m.PROFILE.name: m for m in (sglang, vllm, trtllm)}
PROFILES: dict[str, RuntimeProfile] = {name: m.PROFILE for name, m in ENGINES.items()}
RUNTIME_CHOICES = (*PROFILES, "all")
MATCHERS = tuple(PROFILES)

__all__ = [
    "ENGINES",
    "FEATURE_MLP",
    "HEAD_RAW_LINEARS",
    "MATCHERS",
    "PROFILES",
    "QKV",
    "RUNTIME_CHOICES",
    "Exclusion",
    "RuntimeProfile",
    "excluded_by",
    "fused_name",
    "matches_any",
    "select_profiles",
]


def select_profiles(choice: str) -> list[RuntimeProfile]:
    return list(PROFILES.values()) if choice == "all" else [PROFILES[choice]]


def excluded_by(
    runtime: str, module: str, patterns: tuple[str, ...], num_target_layers: int | None
) -> Exclusion:
    """Whether `runtime` would treat `module` (a canonical name) as excluded from quantization."""
    match: Callable[[str, tuple[str, ...], int | None], Exclusion] = ENGINES[runtime].match_exclusion
    return match(module, patterns, num_target_layers)
