from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

# Without a GPU, Triton kernels run in its interpreter. The choice is made when a function is decorated,
# including triton.language's own helpers, so it must be set before anything (transformers, torch)
# imports triton: here, the first conftest pytest loads.
if not any(Path("/dev").glob("nvidia[0-9]*")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests' models are tiny: one thread per process. Several intra-op threads only wait on each other there, and on
# a loaded 2-core machine their spinning made a 64-wide linear layer take milliseconds (a test 14x slower). Set before
# torch is imported, so subprocesses inherit it too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# A shell starts a background job with SIGINT ignored, and an ignored signal stays ignored across exec: the tests
# that Ctrl-C a subprocess then waited on one that never saw it. A handler here (not inherited; exec resets it to
# the default) gives the subprocesses the disposition a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The tests run hostile inputs through shells and file writers: none of them may reach the user's home. They
# get a private HOME (and so private Hugging Face, XDG and git settings); pip's and pre-commit's caches stay
# shared so that the tests which install packages do not download them again.
_REAL_HOME = Path.home()
os.environ.setdefault("PIP_CACHE_DIR", str(_REAL_HOME / ".cache" / "pip"))
os.environ.setdefault("PRE_COMMIT_HOME", str(_REAL_HOME / ".cache" / "pre-commit"))
os.environ["HOME"] = tempfile.mkdtemp(prefix="lilicorr-tests-home-")

from lilicorr_ckpt import fixtures  # noqa: E402


@pytest.fixture
def make_ckpt(tmp_path):
    """make_ckpt(name="ckpt", config=None, **write_checkpoint kwargs) -> Path"""

    def make(name: str = "ckpt", config=None, **kw):
        return fixtures.write_checkpoint(tmp_path / name, config, **kw)

    return make


# Scheduling for `-n auto --dist loadfile`. xdist hands out whole files, by default the files with the most tests
# first, so the files holding one or two long tests (the real target's, pre-commit's) were handed out last, and
# one worker ran them alone while the other had finished. Files holding a test marked `slow` go first instead
# (the longest units first, the many small files fill in around them); the others keep xdist's order, most
# tests first. Test order within a file is unchanged.
def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False  # our order below, not xdist's count-only one


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only an xdist worker's collection is what gets scheduled
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    slow = {name for name, tests in files.items() if any(t.get_closest_marker("slow") for t in tests)}
    # sorted() is stable: files that tie keep their collection order
    order = sorted(files, key=lambda name: (name not in slow, -len(files[name])))
    items[:] = [item for name in order for item in files[name]]
