"""Every supported SGLang release's draft loader, one installed at a time: the API of the conformance tests and
of the fuzzer.

    from conformance.sglang.releases import load_release, serve, unload, versions

    for version in versions():              # every release lilicorr_ckpt.runtimes models, oldest first
        load_release(version)               # its wheel's modules become `sglang.*` (any other release unloaded)
        outcome = serve(version, path)      # Outcome(verdict, detail, step, model)
    unload()

`serve(release, path)` returns an `engine.Outcome`: `verdict` is L (loads the trained function), R (refuses
with a message), C (crashes with an untyped error), SW (loads, but serves another function) or U (the harness
cannot decide: it needs the target's tokenizer); `detail` says what (the message, the crash, what is served
wrongly); `step` is the step that decided it; `model` is the class the release's routing built, for which
declared architecture. `release` is a version (loaded first when it is not the installed one) or the Engine
`load_release` returned. A release reaching serving infrastructure the harness does not model raises
`wheel.StubUsed` (a harness gap, never a verdict).

`load_release(version)` fetches the release's sources once (tests/conformance/engines.py `sources`), imports its loader
modules (engine.py, through wheel.py's importer) and installs them; a release loaded before is put back as it
was, without importing it again (a few milliseconds), so a process loads each release once. `unload()` takes
the installed release's modules out of `sys.modules` and its importer off `sys.meta_path`. A release whose
modules need something the harness lacks (a third-party module not installed, a stub the table does not
provide, a definition its PARTIAL list names that the wheel no longer has) raises `ReleaseUnavailable`, whose
message is one line naming the missing module or name and what to do.

transformers: every release pins one (its wheel's METADATA: 0.5.21 `transformers==5.12.1`, 0.5.22 and 0.5.23
`5.19.0`); the suite parses config.json with the environment's. Executed under each release's pin and under
5.25.0, every corpus row gets the same outcome in every release (the rows that transformers' config classes
decide are listed in test_verdicts.py, TRANSFORMERS_DECIDES).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from .. import engines
from .engine import Engine, Outcome
from .wheel import StubUsed, installed, reinstall, uninstall

__all__ = [
    "Outcome",
    "ReleaseUnavailable",
    "import_release",
    "load_release",
    "loaded",
    "serve",
    "unload",
    "versions",
]


class ReleaseUnavailable(RuntimeError):
    """A release's loader modules cannot be imported by the harness; the message is one line saying why and what
    to do."""


_CURRENT: Engine | None = None
_PARKED: dict[str, tuple[Engine, dict]] = {}  # version -> (its engine, its modules while not installed)
_FAILED: dict[str, str] = {}  # version -> why it cannot be loaded (the same line each time it is asked for)


def versions() -> tuple[str, ...]:
    """Every supported SGLang release, oldest first (lilicorr_ckpt.runtimes RELEASES)."""
    return engines.versions("sglang")


def loaded() -> Engine | None:
    """The installed release's engine, if any."""
    return _CURRENT


def load_release(version: str) -> Engine:
    """Install SGLang `version`'s loader (unloading any other); returns its Engine. Raises ReleaseUnavailable."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.version == version:
        return _CURRENT
    if version in _FAILED:
        raise ReleaseUnavailable(_FAILED[version])
    unload()
    if version in _PARKED:
        engine, modules = _PARKED.pop(version)
        reinstall(engine.finder, modules)
        _CURRENT = engine
        return engine
    if version not in versions():
        raise ReleaseUnavailable(
            f"SGLang {version} is not a supported release ({', '.join(versions())}): "
            "lilicorr_ckpt/runtimes/sglang.py lists them"
        )
    try:
        _CURRENT = import_release(version, engines.sources("sglang", version))
    except ReleaseUnavailable as exc:
        _FAILED[version] = str(exc)
        raise
    return _CURRENT


def import_release(version: str, root: Path) -> Engine:
    """Import and install the release's loader from its unpacked wheel at `root`, afresh (nothing else may be
    installed: load_release is the entry point). Raises ReleaseUnavailable, leaving nothing installed."""
    try:
        return Engine(root, version)
    except Exception as exc:  # noqa: BLE001 - turned into one line naming what is missing
        finder = installed()
        if finder is not None:
            uninstall(finder)
        raise ReleaseUnavailable(_why(version, root, exc)) from exc


def unload() -> None:
    """Uninstall the installed release (kept aside: loading it again does not import it again)."""
    global _CURRENT
    if _CURRENT is None:
        return
    _PARKED[_CURRENT.version] = (_CURRENT, uninstall(_CURRENT.finder))
    _CURRENT = None


def serve(release: str | Engine, path: str | Path, **kwargs) -> Outcome:
    """What `release` (a version, or an Engine from load_release) does with the draft at `path`; keyword
    arguments go to Engine.serve (target_layers, target_vocab)."""
    engine = load_release(release if isinstance(release, str) else release.version)
    return engine.serve(Path(path), **kwargs)


def _why(version: str, root: Path, exc: BaseException) -> str:
    """One line: where the release's import failed, on what, and what to do."""
    where = "its loader modules"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith(str(root)):
            where = f"{Path(frame.filename).relative_to(root)}:{frame.lineno}"
            break
    head = f"SGLang {version} cannot be loaded by the conformance harness: {where}"
    if isinstance(exc, ImportError) and exc.name and not exc.name.startswith("sglang"):
        top = exc.name.split(".")[0]
        return (
            f"{head} imports `{exc.name}`, which is not installed here ({exc}): install `{top}` into the test "
            f"environment (python -m pip install {top}; pyproject.toml's extras list what the suite needs)"
        )
    if isinstance(exc, StubUsed):
        name = str(exc).split(" is not modelled", 1)[0].split(" (a base class)", 1)[0]
        return (
            f"{head} uses `{name}` at import time, which the harness does not model: give its module that name "
            "in the stub table (tests/conformance/sglang/infra.py stubs()) or import the module (infra.WHOLE / "
            "PARTIAL)"
        )
    if isinstance(exc, RuntimeError) and "no longer defines" in str(exc):
        missing = str(exc).split("no longer defines", 1)[1].strip()
        return (
            f"{head}: the wheel does not define {missing}, which tests/conformance/sglang/infra.py PARTIAL names: "
            "take the name out for this release or extract its replacement"
        )
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return f"{head} failed ({text}): the harness (tests/conformance/sglang/infra.py) needs updating for this release"


def _self_check() -> None:  # pragma: no cover
    """`python -m conformance.sglang.releases PATH` (from tests/): what each release does with PATH."""
    for version in versions():
        try:
            print(version, serve(version, sys.argv[1]))
        except ReleaseUnavailable as exc:
            print(version, "unavailable:", exc)


if __name__ == "__main__":  # pragma: no cover
    _self_check()
