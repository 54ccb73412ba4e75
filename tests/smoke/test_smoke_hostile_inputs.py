"""Hostile files in a smoke target: whatever transformers or tokenizers raise on them (a bare Exception from the Rust
tokenizer, an AttributeError on a list where an object belongs, ...) is exit 2 naming the target, and a file a
loader would block on (a FIFO) is refused by name before any loader opens it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import QUICK

from lilicorr_ckpt.cli import main

from helpers import raised_within


def _copy(target: Path, dest: Path) -> Path:
    dest.mkdir()
    for entry in target.iterdir():
        if entry.name.endswith(".safetensors"):
            os.link(entry, dest / entry.name)
        else:
            (dest / entry.name).write_bytes(entry.read_bytes())
    return dest


def _edit_tokenizer(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["model"]["type"] = "NoSuchModel"  # the Rust tokenizer raises a bare Exception
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "name, spoil, needle",
    [
        ("tokenizer.json", _edit_tokenizer, "Exception: data did not match any variant"),
        # a Llama / Qwen target is read without transformers: the file and its fault are named, no exception
        (
            "tokenizer_config.json",
            lambda p: p.write_text("[1]"),
            "tokenizer_config.json must hold a JSON object",
        ),
        (
            "tokenizer_config.json",
            lambda p: p.write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}"),
            "tokenizer_config.json is nested 5001 levels deep; the limit is 64",
        ),
        (
            "generation_config.json",
            lambda p: p.write_text("[]"),
            "generation_config.json must hold a JSON object",
        ),
    ],
)
def test_a_hostile_tokenizer_or_config_file_is_exit_2_naming_the_target(
    smoke, drafter, target, tmp_path, name, spoil, needle
):
    spoiled = _copy(target, tmp_path / "spoiled")
    spoil(spoiled / name)
    result = smoke(drafter, "-t", spoiled, *QUICK)
    assert result.code == 2, result.stderr
    if needle.startswith("Exception"):  # the Rust tokenizer's own words, after the target's name
        assert f"lilicorr-ckpt: error: cannot load target {str(spoiled)!r}: {needle}" in result.stderr
    else:  # the file, by its directory and name, and what is wrong with it
        assert f"lilicorr-ckpt: error: spoiled/{needle}" in result.stderr, result.stderr
        assert "Error" not in result.stderr  # no Python exception name
    assert "internal error" not in result.stderr


@pytest.mark.parametrize("name", ["added_tokens.json", "special_tokens_map.json", "tokenizer.json"])
def test_a_fifo_in_the_target_is_refused_before_a_loader_blocks_on_it(
    drafter, target, tmp_path, capsys, name
):
    spoiled = _copy(target, tmp_path / "spoiled")
    (spoiled / name).unlink(missing_ok=True)
    os.mkfifo(spoiled / name)
    raised = raised_within(120, main, ["smoke", str(drafter), "-t", str(spoiled), *QUICK])
    err = capsys.readouterr().err
    assert isinstance(raised, SystemExit) and raised.code == 2, err
    assert f"target {str(spoiled)!r}: {name} is a FIFO (named pipe), not a regular file" in err
