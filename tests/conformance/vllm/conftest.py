"""Fixtures of the vLLM conformance suite: every supported release, one at a time, over checkpoints built once.

`released_vllm` is module-scoped and parametrized by every vLLM release lilicorr_ckpt.runtimes models
(vllm_release.versions()): pytest runs a module's tests release by release, loading each before its tests
(vllm_release.load_release) and unloading it after, so no `vllm` module stays importable for the rest of the
suite. Sources come from tests/conformance/engines.py: without them (and no network) the tests skip; under
CI=true a failed fetch fails.

A release that does not load (it imports a module or name the harness neither executes nor stubs) fails once:
the first of its tests fails with vllm_release's one-line message, and every other test of that release is
skipped, pointing at that test (also across the test modules and xdist workers of one run).

`built` is session-scoped: each corpus checkpoint is written once and served by every release.

PENDING (test_vllm_conformance.py) marks the (row, release) cases where validate and the executed loader
disagree: xfail(strict=True), added here at collection.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
# the corpus is tests/checks/test_loader_audit.py, imported as pytest names it (`checks.test_loader_audit`)
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import vllm_release  # noqa: E402 - after the corpus's path


class LoadFailure(NamedTuple):
    version: str
    message: str


# release -> the test that reported its load failure (the others skip, naming it)
_REPORTED: dict[str, str] = {}


def _reporter(version: str, nodeid: str) -> str:
    """The test that reports the release's load failure: the first to ask in this run, across the xdist workers
    (each test module loads the release itself; a marker file per run and release settles which test is first)."""
    if version in _REPORTED:
        return _REPORTED[version]
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return _REPORTED.setdefault(version, nodeid)
    marker = Path(tempfile.gettempdir()) / f"lilicorr-vllm-{run}-{version}.load-failure"
    try:
        with open(marker, "x") as handle:
            handle.write(nodeid)
        first = nodeid
    except FileExistsError:
        first = marker.read_text().strip() or "another test worker's first test of it"
    return _REPORTED.setdefault(version, first)


@pytest.fixture(scope="module")
def released_vllm(request):
    """The release named by the test's parameter, loaded for the module's tests of that release."""
    version = getattr(request, "param", None) or vllm_release.versions()[-1]
    try:
        release = vllm_release.load_release(version)
    except vllm_release.ReleaseNotSupported as exc:
        yield LoadFailure(version, str(exc))
        return
    try:
        yield release
    finally:
        vllm_release.unload(release)


_LOAD_FAILURE = pytest.StashKey[str]()


@pytest.fixture(autouse=True)
def _release_loaded(request):
    """A release that did not load: its first test fails with the one-line reason (in place of the test's own
    body, pytest_pyfunc_call), the others skip naming that test."""
    if "released_vllm" not in request.fixturenames:
        return
    release = request.getfixturevalue("released_vllm")
    if not isinstance(release, LoadFailure):
        return
    first = _reporter(release.version, request.node.nodeid)
    if first != request.node.nodeid:
        pytest.skip(f"vLLM {release.version} did not load: see {first}")
    request.node.stash[_LOAD_FAILURE] = release.message


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    message = pyfuncitem.stash.get(_LOAD_FAILURE, None)
    if message is not None:
        pytest.fail(message, pytrace=False)


class Built:
    """Checkpoints written once per session, by name (every release serves the same directory)."""

    def __init__(self, root: Path):
        self.root = root
        self.paths: dict[str, Path] = {}

    def get(self, name: str, build: Callable[[Path], Path]) -> Path:
        if name not in self.paths:
            self.paths[name] = build(self.root / name)
        return self.paths[name]


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    return Built(tmp_path_factory.mktemp("vllm-corpus"))


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """xfail(strict=True) each (row, release) case the test module's PENDING names."""
    for item in items:
        pending = getattr(getattr(item, "module", None), "PENDING", None)
        callspec = getattr(item, "callspec", None)
        if not pending or callspec is None or "released_vllm" not in callspec.params:
            continue
        case = next((callspec.params[k] for k in ("row", "case") if k in callspec.params), None)
        name = getattr(case, "name", None) or getattr(getattr(case, "row", None), "name", None)
        why = pending.get((name, callspec.params["released_vllm"]))
        if why is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"PENDING (validate disagrees): {why}"))
