"""Fixtures of the SGLang conformance suite: every supported release, one at a time, over checkpoints built once.

`release` is module-scoped and parametrized by every SGLang release lilicorr_ckpt.runtimes models
(engines.versions("sglang")): pytest runs a module's tests release by release, loading each before its tests
(releases.load_release) and unloading it after. A release whose modules need something the harness lacks fails
once, in the first test that asks for it, with one line naming what is missing and what to do; its other tests
(in any module or test worker) skip, pointing at that test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ..engines import versions

RELEASES = versions("sglang")


class Unavailable:
    """A release the harness could not load: the first test to use it fails with `why`, the others skip."""

    def __init__(self, version: str, why: str, marks: Path):
        self.version = version
        self.why = why
        self.marker = marks / f"sglang-{version}.unavailable"

    def report(self, nodeid: str) -> None:
        try:  # one failure per run, whichever test (and test worker) gets here first
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            first = self.marker.read_text().strip() or "another test"
            pytest.skip(f"SGLang {self.version} cannot be loaded: see the failure of {first}")
        with os.fdopen(fd, "w") as f:
            f.write(nodeid)
        pytest.fail(self.why, pytrace=False)


def _run_dir(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """A folder this test run's workers share (xdist gives each worker its own basetemp inside it)."""
    base = factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="module", params=RELEASES)
def release(request, tmp_path_factory):
    """The released SGLang loader (engine.Engine) of one release, installed for this module's tests of it (each
    wheel downloaded once into .cache/engines; skipped offline, except under CI=true, where a failed download
    fails)."""
    # the wheel's modules build torch modules, and SGLang parses config.json with transformers (the runtime extra)
    pytest.importorskip("torch", reason="the SGLang conformance suite needs torch")
    pytest.importorskip("transformers", reason="the SGLang conformance suite needs transformers")
    from .releases import ReleaseUnavailable, load_release, unload

    try:
        engine = load_release(request.param)
    except ReleaseUnavailable as exc:
        yield Unavailable(request.param, str(exc), _run_dir(request.config, tmp_path_factory))
        return
    yield engine
    unload()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    release = pyfuncitem.funcargs.get("release")
    if isinstance(release, Unavailable):
        release.report(pyfuncitem.nodeid)
    return None


class Built:
    """Checkpoints built once per test process and shared by every release's tests (name -> directory)."""

    def __init__(self, root: Path):
        self.root = root
        self.paths: dict[str, Path] = {}
        self.failed: dict[str, BaseException] = {}

    def get(self, name: str, build) -> Path:
        if name in self.failed:
            raise self.failed[name]
        if name not in self.paths:
            folder = self.root / f"{len(self.paths) + len(self.failed):03d}"
            folder.mkdir()
            try:
                self.paths[name] = Path(build(folder))
            except Exception as exc:
                self.failed[name] = exc
                raise
        return self.paths[name]


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    return Built(tmp_path_factory.mktemp("sglang-checkpoints"))


@pytest.fixture(scope="session")
def outcomes() -> dict[tuple[str, str], Any]:
    """(release, checkpoint name) -> what that release did with it (each checkpoint served once per release)."""
    return {}
