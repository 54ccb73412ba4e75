"""The serving stacks validate models: one module per engine, each listing every release it supports as data.

An engine module holds everything engine-specific: `RELEASES` (oldest first: the first release's profile in full,
then each later release as its differences, base.release_chain), where each release's code comes from, and
`match_exclusion`, how it matches quantization exclusions. A new release is one Bump appended to its engine's
chain; a new engine is one module named in `ENGINES`.

A runtime selection (`--runtime`, the Python API's `runtime=`, the Action's and the hook's input) is parsed here
and nowhere else (select_profiles):

    all                     the newest release of every engine (the default)
    vllm                    the newest vLLM release
    vllm==0.33.0            that release (vllm==0.33 and vllm==0.33.* say the same)
    vllm>=0.32              every supported release in the range: a verdict each (>, >=, <, <=, ==, !=,
                            clauses joined by commas: vllm>=0.32,<0.34)
    sglang,vllm==0.32.0     several, comma-separated
    every                   every supported release of every engine

No engine version is written anywhere outside this package (tests/test_runtime_releases.py checks it).
"""

from __future__ import annotations

import re
from types import ModuleType

import msgspec

from lilicorr_ckpt.errors import UsageError
from lilicorr_ckpt.runtimes import sglang, trtllm, vllm
from lilicorr_ckpt.runtimes.base import (
    FEATURE_MLP,
    HEAD_RAW_LINEARS,
    QKV,
    Bump,
    Exclusion,
    RuntimeProfile,
    fused_name,
    matches_any,
    version_key,
)

ENGINES: dict[str, ModuleType] = {m.FIRST.engine_id: m for m in (sglang, vllm, trtllm)}
# engine id -> every supported release, oldest first
RELEASES: dict[str, tuple[RuntimeProfile, ...]] = {name: m.RELEASES for name, m in ENGINES.items()}
# engine id -> its newest release: what `--runtime ENGINE` and `all` judge
PROFILES: dict[str, RuntimeProfile] = {name: chain[-1] for name, chain in RELEASES.items()}
EVERY_RELEASE: tuple[RuntimeProfile, ...] = tuple(p for chain in RELEASES.values() for p in chain)
RUNTIME_CHOICES = (
    *PROFILES,
    "all",
)  # the plain choices; a release or a range is written ENGINE==V, ENGINE>=V
# the releases every exclusion must be safe under (a pattern that means the same to each): one per way of matching
# (releases of one engine that map the draft's patterns alike match alike)
MATCHERS: tuple[RuntimeProfile, ...] = tuple(
    {(p.engine_id, p.draft_exclusion_mapping): p for p in EVERY_RELEASE}.values()
)

__all__ = [
    "ENGINES",
    "EVERY_RELEASE",
    "FEATURE_MLP",
    "HEAD_RAW_LINEARS",
    "MATCHERS",
    "PROFILES",
    "QKV",
    "RELEASES",
    "RUNTIME_CHOICES",
    "Bump",
    "Exclusion",
    "RuntimeProfile",
    "excluded_by",
    "fused_name",
    "matches_any",
    "release_of",
    "runtime_matches",
    "select_profiles",
    "supported_releases",
]

_OPS = ("==", "!=", ">=", "<=", ">", "<")
# a selection's length: a version of thousands of digits would be an int() past Python's 4,300-digit limit
MAX_SELECTION_CHARS = 1000
_CLAUSE = re.compile(r"^(==|!=|>=|<=|>|<)\s*([0-9]+(?:\.[0-9]+)*(?:\.\*)?)$")
_ENGINE_CLAUSE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)\s*(.*)$")


def supported_releases() -> str:
    """`sglang 0.5.21, 0.5.22, 0.5.23; vllm 0.31.0, ...`: what a runtime selection may name."""
    return "; ".join(f"{e} {', '.join(p.version for p in chain)}" for e, chain in RELEASES.items())


def _usage(spec: str, why: str) -> UsageError:
    return UsageError(
        f"--runtime {spec[:200]!r}{' (cut)' if len(spec) > 200 else ''}: {why}. "
        f"Supported: {supported_releases()} (ENGINE for its newest release, "
        "ENGINE==VERSION for one, ENGINE>=VERSION for a range, `all` for the newest of each, `every` for every "
        "release)"
    )


def _matches(profile: RuntimeProfile, op: str, version: str) -> bool:
    if not profile.released:  # an unreleased revision is named exactly, never by a range
        return op == "==" and version == profile.version
    wildcard = version.endswith(".*")
    want = version_key(version[:-2] if wildcard else version)
    have = version_key(profile.version)
    if wildcard or op in ("==", "!="):
        # pip's rule: ==0.33 is 0.33.0; ==0.33.* is every 0.33 release
        if wildcard:
            equal = have[: len(want)] == want
        else:
            width = max(len(want), len(have))
            equal = want + (0,) * (width - len(want)) == have + (0,) * (width - len(have))
        return equal if op == "==" else not equal
    width = max(len(want), len(have))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]


def _parse(spec: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """`sglang,vllm>=0.32,<0.34` -> [("sglang", []), ("vllm", [(">=", "0.32"), ("<", "0.34")])]."""
    out: list[tuple[str, list[tuple[str, str]]]] = []
    if len(spec) > MAX_SELECTION_CHARS:  # every release named one by one is a few hundred characters
        raise _usage(spec, f"it is {len(spec)} characters long; the limit is {MAX_SELECTION_CHARS}")
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise _usage(spec, "an empty entry")
        clause = _CLAUSE.match(part)
        if clause:  # `<0.34` continues the engine before it
            if not out:
                raise _usage(spec, f"{part!r} names no engine")
            out[-1][1].append((clause.group(1), clause.group(2)))
            continue
        m = _ENGINE_CLAUSE.match(part)
        if not m:
            raise _usage(spec, f"{part!r} is not ENGINE, ENGINE==VERSION or ENGINE>=VERSION")
        engine, rest = m.group(1).lower(), m.group(2).strip()
        if engine in ("all", "every") and not rest:
            out.append((engine, []))
            continue
        if engine not in RELEASES:
            raise _usage(spec, f"{m.group(1)!r} is not an engine this tool models")
        clauses: list[tuple[str, str]] = []
        if rest:
            c = _CLAUSE.match(rest)
            # an unreleased revision (trtllm==main@8d62b3e) is matched as written
            if (
                c is None
                and rest.startswith("==")
                and any(p.version == rest[2:].strip() for p in RELEASES[engine])
            ):
                clauses.append(("==", rest[2:].strip()))
            elif c is None:
                raise _usage(
                    spec,
                    f"{part!r}: the version must be numbers such as 0.33.0, after ==, !=, >=, <=, > or <",
                )
            else:
                clauses.append((c.group(1), c.group(2)))
        out.append((engine, clauses))
    return out


def select_profiles(spec: str = "all") -> list[RuntimeProfile]:
    """The releases a runtime selection names, engines in their usual order and each engine's releases oldest
    first. An engine judged at more than one release names each verdict by the release (`vllm==0.33.0`); one
    judged at a single release keeps the engine's name (`vllm`). Raises UsageError (listing what is supported)
    for an unknown engine, a release not supported, or a range that holds none."""
    if not isinstance(spec, str) or not spec.strip():
        raise _usage(str(spec), "no runtime named")
    chosen: dict[str, list[RuntimeProfile]] = {}
    for engine, clauses in _parse(spec):
        if engine == "all":
            picked = {e: [chain[-1]] for e, chain in RELEASES.items()}
        elif engine == "every":
            picked = {e: list(chain) for e, chain in RELEASES.items()}
        elif not clauses:
            picked = {engine: [RELEASES[engine][-1]]}
        else:
            hits = [p for p in RELEASES[engine] if all(_matches(p, op, v) for op, v in clauses)]
            if not hits:
                asked = ",".join(op + v for op, v in clauses)
                raise _usage(spec, f"no supported {ENGINES[engine].FIRST.engine} release is {asked}")
            picked = {engine: hits}
        for e, profiles in picked.items():
            have = chosen.setdefault(e, [])
            have += [p for p in profiles if p not in have]
    out: list[RuntimeProfile] = []
    for engine, chain in RELEASES.items():
        mine = [p for p in chain if p in chosen.get(engine, [])]
        if len(mine) > 1:
            mine = [msgspec.structs.replace(p, name=p.release_id) for p in mine]
        out += mine
    return out


def release_of(key: str) -> RuntimeProfile:
    """The release a finding's or verdict's runtime key names: `vllm` (its newest) or `vllm==0.33.0`."""
    engine, _, version = key.partition("==")
    chain = RELEASES.get(engine)
    if chain is None:
        raise KeyError(key)
    if not version:
        return chain[-1]
    for p in chain:
        if p.version == version:
            return p
    raise KeyError(key)


def runtime_matches(key: str, entry: str) -> bool:
    """Whether a waiver's runtime `entry` (an engine, or one release `engine==V`) covers the runtime `key` of a
    finding (an engine judged at one release, or `engine==V`)."""
    engine, _, version = key.partition("==")
    e_engine, _, e_version = entry.partition("==")
    return engine == e_engine and (not e_version or not version or e_version == version)


def excluded_by(
    runtime: str | RuntimeProfile, module: str, patterns: tuple[str, ...], num_target_layers: int | None
) -> Exclusion:
    """Whether `runtime` (a release, or a key naming one) treats `module` (a canonical name) as excluded from
    quantization."""
    profile = runtime if isinstance(runtime, RuntimeProfile) else release_of(runtime)
    matcher = ENGINES[profile.engine_id].match_exclusion
    result: Exclusion = matcher(module, patterns, num_target_layers, profile)
    return result
