"""The released vLLM, loaded once from the pinned wheel (tests/conformance/engines.py) for the conformance module,
and unloaded after it: no `vllm` module stays importable for the rest of the suite.

Without the wheel (and no network) the vLLM conformance tests skip; under CI=true a failed download fails.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
# the corpus is tests/checks/test_loader_audit.py, imported as pytest names it (`checks.test_loader_audit`)
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def _engines():
    """tests/conformance/engines.py, the shared fetcher (a sibling directory's module, loaded by path)."""
    name = "conformance_engines"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "engines.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def released_vllm():
    import vllm_release

    root = _engines().sources("vllm")
    release = vllm_release.load(root)
    yield release
    release.sandbox.uninstall()
