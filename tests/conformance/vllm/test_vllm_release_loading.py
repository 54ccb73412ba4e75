"""Loading a release into the harness, and what a release the harness cannot load does to the suite.

These tests load releases themselves (vllm_release.load), so they live apart from test_vllm_conformance.py, whose
module-scoped fixture keeps a release installed while its tests run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import vllm_release
from vllm_sandbox import Extract

HERE = Path(__file__).resolve().parent
NEWEST = vllm_release.versions()[-1]


@pytest.fixture(scope="module")
def newest_root() -> Path:
    return vllm_release.engines().sources("vllm", NEWEST)


def _unsupported(root: Path, **lists) -> str:
    with pytest.raises(vllm_release.ReleaseNotSupported) as info:
        vllm_release.load(root, **lists)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_unlisted_module_is_named_in_one_line(newest_root):
    real = tuple(m for m in vllm_release.REAL if m != "vllm.utils.import_utils")
    message = _unsupported(newest_root, real=real)
    assert message.startswith(
        f"vLLM {NEWEST} imports vllm.utils.import_utils, which the conformance harness neither executes nor "
        "stubs: add it to vllm_release.py (imported by vllm/"
    ), message


def test_a_name_a_stub_lacks_is_named_with_its_module(newest_root):
    stubs = dict(vllm_release.STUBS)
    stubs["vllm.model_executor.layers.utils"] = lambda module: None  # a stub that provides nothing
    message = _unsupported(newest_root, stubs=stubs)
    assert (
        message.startswith(f"vLLM {NEWEST} imports vllm.model_executor.layers.utils (name ")
        and "neither executes nor stubs: add it to vllm_release.py" in message
    ), message


def test_a_definition_the_release_no_longer_has_is_named(newest_root):
    extracted = dict(vllm_release.EXTRACTED)
    extracted["vllm.model_executor.models.qwen2"] = Extract(["Qwen2MLP", "Qwen2NoSuchThing"])
    message = _unsupported(newest_root, extracted=extracted)
    assert message.startswith(
        f"vLLM {NEWEST} has no vllm.model_executor.models.qwen2.Qwen2NoSuchThing, which the conformance harness "
        "extracts"
    ), message


def test_load_and_unload_leave_no_vllm_module():
    with vllm_release.loaded(NEWEST) as release:
        assert release.version == NEWEST
        assert "vllm.model_executor.models.lilicorr" in sys.modules
    assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]


def test_every_span_the_harness_runs_reads_only_what_it_is_given():
    """A span's free variables are the method's locals the harness passes (vllm_harness.route): a release whose
    span reads another local would run it as None."""
    given = {
        "infer_method": {"self"},
        "route_draft": {"self", "using_transformers_mtp"},
        "after_configure": {"self"},
        "configure_draft": {"spec", "cls", "target", "SpeculativeConfig"},
    }
    import inspect

    for version in vllm_release.versions():
        with vllm_release.loaded(version) as release:
            spans = {
                "infer_method": release.infer_method,
                "route_draft": release.route_draft,
                "after_configure": getattr(release, "after_configure", None),
                "configure_draft": getattr(release, "configure_draft", None),
            }
            for name, function in spans.items():
                if function is not None:
                    free = set(inspect.signature(function).parameters)
                    assert free <= given[name], (version, name, sorted(free - given[name]))


FAKE_RELEASE = '''
"""A vllm_release whose every release fails to load, as one that imports a module the harness lacks."""


class ReleaseNotSupported(RuntimeError):
    pass


def versions():
    return ("9.9.0", "9.9.1")


def load_release(version):
    if version == "9.9.0":
        raise ReleaseNotSupported(
            "vLLM 9.9.0 imports vllm.foo.bar (name baz), which the conformance harness neither executes nor "
            "stubs: add it to vllm_release.py"
        )
    return version


def unload(release):
    pass
'''

FAKE_TESTS = """
import pytest

VERSIONS = ("9.9.0", "9.9.1")


@pytest.mark.parametrize("released_vllm", VERSIONS, indirect=True, scope="module")
@pytest.mark.parametrize("row", range(5))
def test_row(released_vllm, row):
    assert released_vllm == "9.9.1"
"""


def test_a_release_that_does_not_load_fails_once_and_skips_the_rest(tmp_path):
    """conftest.py: the first test of the release fails with the one line, the others skip naming it; the
    other release's tests run."""
    (tmp_path / "conftest.py").write_text((HERE / "conftest.py").read_text())
    (tmp_path / "vllm_release.py").write_text(FAKE_RELEASE)
    (tmp_path / "test_fake.py").write_text(textwrap.dedent(FAKE_TESTS))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-rfs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    out = done.stdout
    assert "1 failed, 5 passed, 4 skipped" in out, out
    # once in the failures (the short summary repeats it or not, by terminal width)
    failures = out.split("short test summary info")[0]
    assert failures.count("vLLM 9.9.0 imports vllm.foo.bar (name baz)") == 1, out
    assert (
        "SKIPPED [4] test_fake.py:7: vLLM 9.9.0 did not load: see test_fake.py::test_row[0-9.9.0]" in out
    ), out
