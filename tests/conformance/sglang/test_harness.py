"""The harness's own promises: a release that needs something the harness lacks fails once, in one line naming
it and what to do, and every other test of that release skips, pointing at that failure; releases load and unload
one after another without importing any twice."""

from __future__ import annotations

import sys

import pytest

from ..engines import sources, versions
from .conftest import Unavailable


def test_a_release_missing_a_module_is_one_line_naming_it(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from . import releases
    from .wheel import installed

    releases.unload()
    version = versions("sglang")[-1]
    root = sources("sglang", version)
    # the wheel's loader modules import msgspec at their top (layers/linear.py first): as if it were not installed
    monkeypatch.setitem(sys.modules, "msgspec", None)
    with pytest.raises(releases.ReleaseUnavailable) as caught:
        releases.import_release(version, root)
    line = str(caught.value)
    assert "\n" not in line
    assert f"SGLang {version}" in line and "sglang/srt/layers/linear.py:" in line, line
    assert "imports `msgspec`, which is not installed" in line, line
    assert "pip install msgspec" in line, line
    assert installed() is None and not [m for m in sys.modules if m.startswith("sglang.")]


def test_a_release_needing_a_stub_the_table_lacks_is_one_line_naming_it(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from . import infra, releases

    releases.unload()
    version = versions("sglang")[-1]
    full = infra.stubs

    def without_is_hip(root):
        table = full(root)
        table["sglang.srt.utils"] = {k: v for k, v in table["sglang.srt.utils"].items() if k != "is_hip"}
        return table

    # layers/linear.py calls is_hip() at import (`_is_hip = is_hip()`): as if the table did not provide it
    monkeypatch.setattr(infra, "stubs", without_is_hip)
    with pytest.raises(releases.ReleaseUnavailable) as caught:
        releases.import_release(version, sources("sglang", version))
    line = str(caught.value)
    assert "\n" not in line
    assert "sglang/srt/layers/linear.py:" in line, line
    assert "uses `sglang.srt.utils.is_hip` at import time" in line, line
    assert "infra.py stubs()" in line, line


def test_an_unavailable_release_fails_its_first_test_and_skips_the_others(tmp_path):
    gone = Unavailable("9.9.9", "SGLang 9.9.9 cannot be loaded: why", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="SGLang 9.9.9 cannot be loaded: why"):
        gone.report("first::test")
    again = Unavailable("9.9.9", "SGLang 9.9.9 cannot be loaded: why", tmp_path)  # another module, or worker
    with pytest.raises(pytest.skip.Exception, match="see the failure of first::test"):
        again.report("second::test")


def test_releases_load_one_at_a_time_and_come_back_without_reimporting():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from . import releases

    engines = {}
    for version in versions("sglang"):
        try:
            engines[version] = releases.load_release(version)
        except releases.ReleaseUnavailable:
            continue  # failed once, in the first test that loaded it
        assert sys.modules["sglang.srt.models.dflash"] is engines[version].dflash
    if len(engines) < 2:
        pytest.skip("fewer than two SGLang releases can be loaded (see the failures of their first tests)")
    for version, engine in engines.items():
        assert releases.load_release(version) is engine
        assert sys.modules["sglang.srt.models.dflash"] is engine.dflash
    releases.unload()
    assert releases.loaded() is None and "sglang.srt.models.dflash" not in sys.modules
