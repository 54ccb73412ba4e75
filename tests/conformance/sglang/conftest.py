from __future__ import annotations

import pytest

from ..engines import sources


@pytest.fixture(scope="session")
def sglang():
    """The released SGLang 0.5.23 draft loader (downloaded once into .cache/engines; skipped offline, except
    under CI=true, where a failed download fails)."""
    root = sources("sglang")
    # the wheel's modules build torch modules, and SGLang parses config.json with transformers (the runtime extra)
    pytest.importorskip("torch", reason="the SGLang conformance suite needs torch")
    pytest.importorskip("transformers", reason="the SGLang conformance suite needs transformers")
    from .engine import Engine

    return Engine(root)
