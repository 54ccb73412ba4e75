"""docs/training.md's tiny CPU recipe, run line by line as written ($W a fresh directory, from the repository root)."""

from __future__ import annotations

import re
import shlex

from click.testing import CliRunner

from lilicorr_ckpt.cli import main as lilicorr
from lilicorr_train.__main__ import main as train_cli
from lilicorr_train.state import read_state

from helpers import REPO

TRAIN = "python -m lilicorr_train"


def _recipe() -> list[str]:
    doc = (REPO / "docs" / "training.md").read_text()
    section = doc.split("## A tiny run on the CPU", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "docs/training.md has no ```sh block under `A tiny run on the CPU`"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _lilicorr(args: list[str]) -> int:
    try:
        lilicorr(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def test_the_tiny_cpu_recipe_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    lines = _recipe()
    assert lines[0] == "W=$(mktemp -d)"
    work = tmp_path / "w"
    work.mkdir()
    commands = [shlex.split(line.replace("$W", str(work))) for line in lines[1:]]
    assert [c[:4] if c[0] == "python" else c[:2] for c in commands] == [
        [*TRAIN.split(), "generate"],
        [*TRAIN.split(), "train"],
        [*TRAIN.split(), "export"],
        ["lilicorr-ckpt", "convert"],
        ["lilicorr-ckpt", "validate"],
    ]
    for command in commands:
        if command[0] == "python":
            result = CliRunner().invoke(train_cli, command[3:], catch_exceptions=False)
            assert result.exit_code == 0, (command, result.output)
            assert "warning" not in result.output, result.output  # the recipe starts from a target layer
        else:
            assert _lilicorr(command[1:]) == 0, command
    assert read_state(work / "run" / "state.safetensors").step == 2
    assert (work / "drafter" / "conversion.json").is_file()


def test_the_helps_tiny_example_is_the_recipe_of_the_docs():
    text = CliRunner().invoke(train_cli, ["--help"]).output
    example = text.split("A tiny run on the CPU", 1)[1].split("\n\n", 1)[0].split("\n", 1)[1]
    joined = re.sub(r"\\\n\s*", "", example)  # continuation lines
    helped = [" ".join(line.split()) for line in joined.splitlines() if line.strip()]
    documented = [line.replace("$W/", "") for line in _recipe()[1:4]]
    assert helped == documented
