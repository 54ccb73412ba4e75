"""The bump tool's own parts, offline and fast: the hunk listing over two small synthetic trees, and a release the
harness cannot load reported in one line (never a traceback or a page of fixture errors)."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path

import pytest

from .bump import cli, hunks, verdicts

OLD = '''\
"""A loader."""

LIMIT = 16


class Loader:
    def check(self, config):
        if config["k"] > LIMIT:
            raise ValueError("too large")
        return config

    def load(self, weights):
        for name in weights:
            self.take(name)
        return True


def helper():
    return 1
'''

NEW = '''\
"""A loader."""

LIMIT = 32


class Loader:
    def check(self, config):
        if config["k"] > LIMIT:
            raise ValueError("too large")
        return config

    def load(self, weights):
        for name in weights:
            self.take(name)
        return None


def helper():
    return 1
'''


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_each_hunk_is_headed_by_the_definition_it_changes():
    found = hunks.diff_text(OLD, NEW)
    assert [(h.where, h.added, h.removed) for h in found] == [("<module>", 1, 1), ("Loader.load", 1, 1)]
    first, second = found
    assert (first.old_start, first.old_count, first.new_start, first.new_count) == (1, 6, 1, 6)
    assert "-LIMIT = 16" in first.lines and "+LIMIT = 32" in first.lines
    assert second.lines[-4:-2] == ("-        return True", "+        return None") or (
        "-        return True" in second.lines and "+        return None" in second.lines
    )


def test_two_trees_give_a_diff_per_file_added_and_removed_files_and_a_count(tmp_path):
    old = tree(
        tmp_path / "old",
        {"pkg/loader.py": OLD, "pkg/same.py": "x = 1\n", "pkg/gone.py": "def f():\n    pass\n"},
    )
    new = tree(tmp_path / "new", {"pkg/loader.py": NEW, "pkg/same.py": "x = 1\n", "pkg/new.py": "y = 2\n"})
    files = ["pkg/loader.py", "pkg/same.py", "pkg/gone.py", "pkg/new.py", "pkg/nowhere.py"]
    diffs = hunks.diff_trees(old, new, files)
    assert [(d.path, d.status, len(d.hunks)) for d in diffs] == [
        ("pkg/gone.py", "removed", 1),
        ("pkg/loader.py", "changed", 2),
        ("pkg/new.py", "added", 1),
    ]
    text = hunks.render(diffs, "eng-1.0", "eng-2.0")
    assert (
        "--- eng-1.0/pkg/loader.py\n+++ eng-2.0/pkg/loader.py\n@@ -1,6 +1,6 @@ pkg/loader.py:<module>" in text
    )
    assert "@@ pkg/loader.py:Loader.load" in text
    assert "+++ eng-2.0/pkg/gone.py (absent)" in text and "--- eng-1.0/pkg/new.py (absent)" in text
    assert "@@ -1,2 +0,0 @@ pkg/gone.py:f" in text
    head, *per_file = hunks.summary(diffs).splitlines()
    assert head == "3 files changed (1 added, 1 removed), 4 hunks (4 in what the harness reads), +3 -4 lines"
    assert per_file == [
        "  pkg/gone.py [removed]: f",
        "  pkg/loader.py: <module>, Loader.load",
        "  pkg/new.py [added]: <module>",
    ]


def test_a_hunk_outside_what_the_harness_extracts_is_marked(tmp_path):
    filler = "".join(f"\nC{i} = {i}\n" for i in range(5))
    old = tree(tmp_path / "old", {"m.py": OLD + filler + "\n\ndef tail():\n    return 1\n"})
    new = tree(tmp_path / "new", {"m.py": NEW + filler + "\n\ndef tail():\n    return 2\n"})
    (diff,) = hunks.diff_trees(old, new, ["m.py"], {"m.py": frozenset({"Loader.check", "Loader.load"})})
    assert [(h.where, h.read) for h in diff.hunks] == [
        ("<module>", True),
        ("Loader.load", True),
        ("tail", False),
    ]
    assert "@@ m.py:tail  [not read by the harness]" in hunks.render([diff], "a", "b")
    # a class kept whole keeps its methods
    assert hunks._is_read("Loader.load", frozenset({"Loader"}))


def test_the_deciding_files_are_the_harness_tables(tmp_path):
    from . import engines

    spec = engines.Deciding(
        {"pkg.loader": None, "pkg.part": frozenset({"f"}), "pkg.sub": None},
        ("pkg/keys_*.py",),
        {"pkg/part.py": frozenset({"g"})},
        ("pkg.stub",),
    )
    old = tree(
        tmp_path / "old",
        {"pkg/loader.py": "", "pkg/part.py": "", "pkg/sub/__init__.py": "", "pkg/stub.py": ""},
    )
    new = tree(tmp_path / "new", {"pkg/loader.py": "", "pkg/keys_a.py": "", "pkg/stub.py": ""})
    assert spec.files(old, new) == {
        "pkg/keys_a.py": None,
        "pkg/loader.py": None,
        "pkg/part.py": frozenset({"f", "g"}),
        "pkg/sub/__init__.py": None,
    }
    assert spec.stubbed_files(old, new) == ["pkg/stub.py"]


# ---------------------------------------------------------------- a release the harness cannot load


def fake_vllm(root: Path) -> Path:
    """A release tree whose executed module imports a vllm module the harness neither executes nor stubs."""
    return tree(
        root,
        {
            "vllm/__init__.py": "",
            "vllm/_version.py": '__version__ = version = "9.9.9"\n',
            # the first module the harness imports (models/utils.py, executed as released)
            "vllm/model_executor/models/utils.py": "import os\nfrom vllm.brand_new_module import thing\n",
        },
    )


def test_the_harness_names_an_unknown_import_in_one_line(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    root = fake_vllm(tmp_path / "vllm-9.9.9")
    with pytest.raises(verdicts.CandidateUnavailable) as caught:
        verdicts.load("vllm", "9.9.9", root)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(
        "vLLM 9.9.9 imports vllm.brand_new_module, which the conformance harness neither "
    ), line
    assert "(imported by vllm/model_executor/models/utils.py:2)" in line, line
    assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]


def test_the_tool_stops_in_one_line_when_the_candidate_does_not_load(tmp_path, monkeypatch, capsys):
    """End to end past the fetch: the candidate is loaded before any checkpoint is built, and a release the harness
    cannot load ends the run with one line on stderr and exit status 1."""
    pytest.importorskip("torch")
    root = fake_vllm(tmp_path / "vllm-9.9.9")
    monkeypatch.setattr(cli, "fetch", lambda engine, version: root)
    out = io.StringIO()
    assert cli.main(["vllm", "9.9.9", "--fuzz-seconds", "0"], out=out) == 1
    err = capsys.readouterr().err
    assert err == (
        "bump: vLLM 9.9.9 imports vllm.brand_new_module, which the conformance harness neither executes nor "
        "stubs: add it to vllm_release.py (imported by vllm/model_executor/models/utils.py:2)\n"
    ), err
    assert "== vLLM 9.9.9 against" in out.getvalue() and "0 files changed" in out.getvalue()
    assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]


def test_versions_are_checked_before_anything_is_fetched(capsys, monkeypatch):
    monkeypatch.setattr(cli, "fetch", lambda *a: pytest.fail("fetched"))
    assert cli.main(["vllm", "latest"], out=io.StringIO()) == 1
    assert "is not a release version" in capsys.readouterr().err
    newest = cli._engines().versions("vllm")[-1]
    assert cli.main(["vllm", newest, "--against", newest], out=io.StringIO()) == 1
    assert "is not older than" in capsys.readouterr().err
    assert cli.main(["vllm", "0.0.1"], out=io.StringIO()) == 1
    assert "older than every supported release" in capsys.readouterr().err


def test_an_already_supported_release_is_compared_with_the_one_before_it():
    supported = cli._engines().versions("sglang")
    against, profile, own = cli.resolve("sglang", supported[-1], None)
    assert against == profile == supported[-2] and own == supported[-1]
    assert cli.resolve("sglang", "99.0.0", None) == (supported[-1], supported[-1], None)


def test_the_module_docstring_states_the_command():
    assert textwrap.dedent(cli.__doc__ or "").startswith("python -m tests.conformance.bump ENGINE VERSION")
