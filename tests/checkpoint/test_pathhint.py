"""Path hints: what a mistyped or misplaced PATH was most likely meant to be (issue 22, cosmetics)."""

from __future__ import annotations

import pytest

from lilicorr_ckpt.checkpoint.pathhint import no_such_directory, suggestions
from lilicorr_ckpt.cli import main


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout: examples/ with two checkpoints, a package directory whose name shares a word with them."""
    for name in ("tiny-lilicorr", "smollm2-lilicorr"):
        (tmp_path / "examples" / name).mkdir(parents=True)
        (tmp_path / "examples" / name / "config.json").write_text("{}")
    (tmp_path / "lilicorr_ckpt").mkdir()
    (tmp_path / ".cache" / "tiny-lilicorr").mkdir(parents=True)  # never looked into
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_checkpoint_named_without_its_folder_is_found_one_level_down(repo):
    assert no_such_directory("tiny-lilicorr").endswith("did you mean 'examples/tiny-lilicorr'?")
    assert suggestions("./tiny-lilicorr") == ["./examples/tiny-lilicorr"]
    assert suggestions("lilicorr_ckp") == ["lilicorr_ckpt"]  # a near miss among the siblings
    assert suggestions("examples/tiny-lilicorrr") == [
        "examples/tiny-lilicorr"
    ]  # the closest, not every -lilicorr


def test_a_gguf_given_as_path_says_it_is_a_target(repo, capsys):
    (repo / "model.Q4.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as exc:
        main(["validate", "model.Q4.gguf"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert (
        "'model.Q4.gguf' is a GGUF file, which is a target model" in err and "--target model.Q4.gguf" in err
    )
    assert no_such_directory("missing.gguf").endswith("a .gguf file is a target model: give it as --target")
