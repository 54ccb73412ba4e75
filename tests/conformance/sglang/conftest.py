from __future__ import annotations

import pytest

from ..engines import sources
from .engine import Engine


@pytest.fixture(scope="session")
def sglang():
    """The released SGLang 0.5.23 draft loader (downloaded once into .cache/engines; skipped offline, except
    under CI=true, where a failed download fails)."""
    return Engine(sources("sglang"))
