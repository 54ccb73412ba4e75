"""The training recipe end to end on the CPU, on the tiny bundled target: data from every prompt source, a run
that pauses at its time budget and resumes, an export that `convert` and `validate` accept, and a new run
started from a trained drafter's weights."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.cli import main as lilicorr
from lilicorr_runtime.load import build_drafter
from lilicorr_runtime.train import prompts
from lilicorr_runtime.train.__main__ import main as train_cli
from lilicorr_runtime.train.data import Dataset
from lilicorr_runtime.train.prompts import stdlib_code_prompts, training_prompts

REPO = Path(__file__).resolve().parents[2]
TARGET = str(REPO / "examples" / "tiny-target")


def _lilicorr(*args) -> int:
    try:
        lilicorr([str(a) for a in args])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _run(args: list[str]):
    result = CliRunner().invoke(train_cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module", autouse=True)
def fewer_stdlib_files():
    with pytest.MonkeyPatch.context() as m:  # a slice of the standard library keeps the tests quick
        m.setattr(prompts, "STDLIB_FILES", 150)
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train") / "data.npz"
    result = _run(["generate", "--target", TARGET, "--out", str(out), "--prompts", "24", "--max-new-tokens", "12",
                   "--mix", "templates=1,stdlib=1,self=1", "--device", "cpu", "--batch-size", "8"])
    assert "usable requests" in result.output
    return out


def test_prompt_sources_are_deterministic_and_real():
    assert training_prompts(20, seed=3) == training_prompts(20, seed=3) != training_prompts(20, seed=4)
    code = stdlib_code_prompts(random.Random(0), 40)
    assert code == stdlib_code_prompts(random.Random(0), 40)
    raw = [p for p in code if not p.chat]
    assert raw
    for p in raw:  # a real signature and its docstring: with a body, it parses as a documented function
        tree = ast.parse(p.text + "    pass\n")
        assert isinstance(tree.body[0], ast.FunctionDef) and ast.get_docstring(tree.body[0]), p.text


def test_generated_data_holds_prompts_and_the_targets_answers(data):
    ds = Dataset.load(data)
    assert 8 <= len(ds) <= 24
    assert (ds.prompt_lengths < ds.lengths()).all()  # every prompt got an answer
    assert ds.tokens.dtype == np.uint16 and int(ds.tokens.max()) < 512


def test_a_run_pauses_resumes_exports_and_converts(data, tmp_path):
    run = tmp_path / "run"
    common = ["--target", TARGET, "--data", str(data), "--device", "cpu", "--batch-size", "2", "--anchors", "4"]
    _run(["train", str(run), *common, "--mask-token-id", "511", "--steps", "4", "--time-budget", "1"])
    first = torch.load(run / "state.pt", weights_only=False)
    assert 1 <= first["step"] <= 4
    _run(["train", str(run), *common, "--steps", "6"])
    state = torch.load(run / "state.pt", weights_only=False)
    assert state["step"] == 6
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert log and all(np.isfinite(r["loss"]) for r in log if "loss" in r)
    _run(["export", str(run), "--out", str(tmp_path / "export")])
    assert _lilicorr("convert", tmp_path / "export", tmp_path / "drafter", "--quiet") == 0
    assert _lilicorr("validate", tmp_path / "drafter", "--target", TARGET) == 0

    # a new run from the converted drafter starts from exactly its weights
    again = tmp_path / "again"
    _run(["train", str(again), *common, "--mask-token-id", "511", "--steps", "1", "--init-from",
          str(tmp_path / "drafter"), "--lr-drafter", "0", "--lr-head", "0"])
    started = torch.load(again / "state.pt", weights_only=False)["model"]
    trained = build_drafter(load_checkpoint(str(tmp_path / "drafter"))).state_dict()
    assert started.keys() == trained.keys()
    for name, value in trained.items():
        torch.testing.assert_close(started[name].float(), value.float(), rtol=0, atol=1e-2, msg=name)


def test_init_from_refuses_a_drafter_of_another_shape(data, tmp_path):
    result = CliRunner().invoke(train_cli, ["train", str(tmp_path / "r"), "--target", TARGET, "--data", str(data),
                                            "--device", "cpu", "--mask-token-id", "511", "--layers", "2",
                                            "--init-from", str(REPO / "examples" / "tiny-lilicorr")])
    assert result.exit_code != 0 and "not a drafter of this shape" in str(result.exception or result.output)
