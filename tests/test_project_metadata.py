"""The project's own bookkeeping: one version, a changelog section for it, and CI running the linters it pins."""

from __future__ import annotations

import re
import sys

import pytest

import lilicorr_ckpt

from helpers import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 CI job
    import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_version_is_written_once_in_the_package_and_read_from_there_by_the_build():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lilicorr_ckpt.__version__"}
    setuptools_expand = pytest.importorskip("setuptools.config.expand")
    assert (
        setuptools_expand.read_attr("lilicorr_ckpt.__version__", root_dir=str(REPO))
        == lilicorr_ckpt.__version__
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[ab]|rc)?\d*", lilicorr_ckpt.__version__)


def test_the_changelog_opens_with_the_current_version_and_keeps_a_section_per_change():
    text = (REPO / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\S+)", text, flags=re.M)
    assert releases and releases[0] == lilicorr_ckpt.__version__, "CHANGELOG.md: a `## VERSION` section first"
    first = text.split(f"## {releases[0]}", 1)[1].split("\n## ", 1)[0]
    changes = re.findall(r"^### (.+)", first, flags=re.M)
    assert changes and all(len(c) <= 100 for c in changes)
    for change in first.split("\n### ")[1:]:
        assert re.search(r"^- \S", change, flags=re.M), f"the change {change.splitlines()[0]!r} lists nothing"


def test_ci_lints_and_checks_the_format_with_the_ruff_the_test_extra_pins():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "ruff check ." in ci and "ruff format --check ." in ci
    pins = [d for d in PYPROJECT["project"]["optional-dependencies"]["test"] if d.startswith("ruff")]
    assert len(pins) == 1 and re.fullmatch(r"ruff==\d+\.\d+\.\d+", pins[0]), pins
