"""The released engine wheels the conformance suite judges validate by.

Each pinned wheel is downloaded once into `.cache/engines/` (gitignored, never committed) and only its
Python sources are unpacked beside it. No engine code lives in this repository: the suite reads the wheel at
test time. Under `CI=true` a failed download fails the run instead of skipping it.

The releases are the project's own data: every release `lilicorr_ckpt/runtimes/` models (RELEASES), so a bump is
one entry there (docs/validate.md, "Bumping an engine"). z-lab's `dflash` is pinned here: it is a producer, not an
engine validate judges.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lilicorr_ckpt.runtimes import RELEASES

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "engines"


# the packages the suite executes that are not engines validate judges
PRODUCERS = {"dflash": "0.1.0"}


def versions(name: str) -> tuple[str, ...]:
    """Every release of `name` the suite executes, oldest first (an engine's: the ones validate models)."""
    if name in PRODUCERS:
        return (PRODUCERS[name],)
    return tuple(p.version for p in RELEASES[name] if p.released)


def newest(name: str) -> str:
    return versions(name)[-1]


def _fail_or_skip(message: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def _one_at_a_time(lock: Path) -> Iterator[None]:
    """Test workers asking for the same wheel at once: the first downloads (or unpacks) it, the others wait and
    reuse it (vLLM's wheel is 336 MB). Without fcntl (Windows) each worker does its own, as before."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wheel(name: str, version: str | None = None) -> Path:
    """The wheel of `name` at `version` (its newest supported release when None), downloaded on first use."""
    version = version or newest(name)
    folder = CACHE / "wheels"
    stem = name.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with _one_at_a_time(folder / f".{stem}-{version}.lock"):
        return _download(name, version, folder, stem)


def _download(name: str, version: str, folder: Path, stem: str) -> Path:
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if found:  # another worker downloaded it while this one waited
        return found[0]
    # into a folder of this process's own, then renamed in: test workers running side by side never see a wheel
    # half written by another
    partial = folder / f".{stem}-{version}.partial-{os.getpid()}"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(partial),
        f"{name}=={version}",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _fail_or_skip(f"could not download {name}=={version}: {exc}")
    fetched = sorted(partial.glob(f"{stem}-{version}-*.whl"))
    if done.returncode != 0 or not fetched:
        _fail_or_skip(f"could not download {name}=={version}: {done.stderr.strip()[-500:]}")
    os.replace(
        fetched[0], folder / fetched[0].name
    )  # atomic; a wheel another worker put there first is the same
    shutil.rmtree(partial, ignore_errors=True)
    return sorted(folder.glob(f"{stem}-{version}-*.whl"))[0]


def sources(name: str, version: str | None = None) -> Path:
    """A directory holding the wheel's Python sources (the wheel's top-level packages inside it), for `version`
    (the newest supported release when None)."""
    version = version or newest(name)
    root = CACHE / f"{name}-{version}"
    marker = root / ".complete"
    if marker.exists():
        return root
    whl = wheel(name, version)
    with _one_at_a_time(CACHE / f".{name}-{version}.lock"):
        if marker.exists():  # another worker unpacked it while this one waited
            return root
        partial = CACHE / f".{name}-{version}.partial-{os.getpid()}"
        with zipfile.ZipFile(whl) as z:
            for member in z.namelist():
                if member.endswith((".py", ".json")) and ".dist-info/" not in member:
                    z.extract(member, partial)
        (partial / ".complete").write_text(f"{whl.name}\n")
        try:
            partial.rename(root)
        except OSError:  # another process unpacked it first (no fcntl: no lock)
            shutil.rmtree(partial, ignore_errors=True)
            if not marker.exists():
                raise
    return root
