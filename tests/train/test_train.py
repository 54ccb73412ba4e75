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
from lilicorr_runtime import load_target
from lilicorr_runtime.model.load import build_drafter
from lilicorr_train import prompts
from lilicorr_train.__main__ import _split
from lilicorr_train.__main__ import main as train_cli
from lilicorr_train.data import Dataset, self_written_prompts
from lilicorr_train.export import build_drafter as fresh_drafter
from lilicorr_train.prompts import stdlib_code_prompts, training_prompts
from lilicorr_train.state import read_state

from helpers import REPO

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
    result = _run(
        [
            "generate",
            "--target",
            TARGET,
            "--out",
            str(out),
            "--prompts",
            "24",
            "--max-new-tokens",
            "12",
            "--mix",
            "templates=1,stdlib=1,self=1",
            "--device",
            "cpu",
            "--batch-size",
            "8",
        ]
    )
    assert "usable requests" in result.output
    return out


def test_prompt_sources_are_deterministic_and_real():
    assert training_prompts(20, seed=3) == training_prompts(20, seed=3) != training_prompts(20, seed=4)
    code = stdlib_code_prompts(random.Random(0), 40)
    assert code == stdlib_code_prompts(random.Random(0), 40)
    raw = [p for p in code if not p.chat]
    assert raw
    for p in code:  # a request to write a function names it by its one-line signature, never a decorator
        if p.text.startswith("Write a Python function `"):
            signature = p.text.split("`")[1]
            assert not signature.startswith("@") and "\n" not in signature
            ast.parse(f"def {signature}: pass")
    for p in raw:  # a real signature and its docstring: with a body, it parses as a documented function
        tree = ast.parse(p.text + "    pass\n")
        assert isinstance(tree.body[0], ast.FunctionDef) and ast.get_docstring(tree.body[0]), p.text


def test_generated_data_holds_prompts_and_the_targets_answers(data):
    ds = Dataset.load(data)
    assert 8 <= len(ds) <= 24
    assert (ds.prompt_lengths < ds.lengths()).all()  # every prompt got an answer
    assert ds.tokens.dtype == np.uint16 and int(ds.tokens.max()) < 512


def _cpu_run(data: Path, anchors: int) -> list[str]:
    """A train command's target, data and CPU settings for the tiny pair (batches of 2)."""
    return [
        "--target",
        TARGET,
        "--data",
        str(data),
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--anchors",
        str(anchors),
    ]


def test_a_run_pauses_resumes_exports_and_converts(data, tmp_path):
    run = tmp_path / "run"
    common = _cpu_run(data, anchors=4)
    _run(["train", str(run), *common, "--mask-token-id", "511", "--steps", "4", "--time-budget", "1"])
    first = read_state(run / "state.safetensors")
    assert 1 <= first.step <= 4
    _run(["train", str(run), *common, "--steps", "6"])
    state = read_state(run / "state.safetensors")
    assert state.step == 6
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert log and all(np.isfinite(r["loss"]) for r in log if "loss" in r)
    _run(["export", str(run), "--out", str(tmp_path / "export")])
    assert _lilicorr("convert", tmp_path / "export", tmp_path / "drafter", "--quiet") == 0
    assert _lilicorr("validate", tmp_path / "drafter", "--target", TARGET) == 0

    def frozen_run(name: str, *extra: str) -> dict[str, torch.Tensor]:
        """The weights a new one-step run from the converted drafter starts with (learning rates 0)."""
        args = ["--mask-token-id", "511", "--steps", "1", "--init-from", str(tmp_path / "drafter"), *extra]
        _run(["train", str(tmp_path / name), *common, *args, "--lr-drafter", "0", "--lr-head", "0"])
        return read_state(tmp_path / name / "state.safetensors").model

    # a new run from the converted drafter starts from exactly its weights
    started = frozen_run("again")
    one = build_drafter(load_checkpoint(str(tmp_path / "drafter")), dtype=torch.float32)
    trained = one.state_dict()
    assert started.keys() == trained.keys()
    for name, value in trained.items():
        torch.testing.assert_close(started[name].float(), value.float(), rtol=0, atol=0, msg=name)

    # a deeper run grows from it: the new layer is the last one with its residual branches closed, so the
    # deeper drafter drafts exactly what the trained one drafts
    grown = frozen_run("deeper", "--layers", "2")
    assert grown.keys() - trained.keys() == {
        k.replace("layers.0.", "layers.1.") for k in trained if k.startswith("layers.0.")
    }
    for name, value in trained.items():
        torch.testing.assert_close(grown[name].float(), value.float(), rtol=0, atol=0, msg=name)
        if name.startswith("layers.0."):
            new = grown[name.replace("layers.0.", "layers.1.")].float()
            closed = name.endswith(("o_proj.weight", "down_proj.weight"))
            torch.testing.assert_close(
                new, torch.zeros_like(new) if closed else value.float(), rtol=0, atol=0
            )
    two_config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    two_config["num_hidden_layers"] = 2
    two = fresh_drafter(two_config)
    two.load_state_dict({k: v.float() for k, v in grown.items()})
    context = torch.randn(1, 12, one.geometry.hidden_size)
    blocks = torch.randn(1, 2, one.block_size, one.geometry.hidden_size)
    anchors = torch.tensor([[4, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            two.forward_blocks(context, blocks, anchors), one.forward_blocks(context, blocks, anchors)
        )


def test_init_from_refuses_a_drafter_of_another_shape(data, tmp_path):
    common = [
        "train",
        str(tmp_path / "r"),
        "--target",
        TARGET,
        "--data",
        str(data),
        "--device",
        "cpu",
        "--mask-token-id",
        "511",
    ]
    result = CliRunner().invoke(
        train_cli, [*common, "--layers", "2", "--init-from", str(REPO / "examples" / "tiny-lilicorr")]
    )
    assert result.exit_code == 1 and "not a drafter of this shape" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # a message, not a traceback
    both = CliRunner().invoke(train_cli, [*common, "--init-layer", "1", "--init-from", str(tmp_path / "r")])
    assert both.exit_code == 4  # a usage error, as lilicorr-ckpt's


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("no weights", "its weights lack"),  # KeyError in the loader: an internal error before
        (
            "a wider head in its config",
            "is not a drafter this run can start from",
        ),  # state_dict size mismatch
        ("no draft layer in its config", "geometry is incomplete"),  # CheckpointRefused, an internal error
    ],
)
def test_init_from_refuses_a_drafter_whose_config_and_weights_disagree(data, tmp_path, edit, said):
    import shutil

    drafter = tmp_path / "drafter"
    shutil.copytree(REPO / "examples" / "tiny-lilicorr", drafter)
    config = json.loads((drafter / "config.json").read_text())
    if edit == "no weights":
        (drafter / "model.safetensors").unlink()
    elif edit == "a wider head in its config":
        config["dflash_config"]["lilicorr_hidden_size"] = 2 * config["dflash_config"]["lilicorr_hidden_size"]
    else:
        config["num_hidden_layers"] = 0
    (drafter / "config.json").write_text(json.dumps(config))
    args = ["train", str(tmp_path / "r"), "--target", TARGET, "--data", str(data), "--device", "cpu"]
    result = CliRunner().invoke(train_cli, [*args, "--mask-token-id", "511", "--init-from", str(drafter)])
    assert result.exit_code == 1, result.output
    assert said in result.output and "internal error" not in result.output, result.output
    assert not (tmp_path / "r" / "state.safetensors").exists()


def test_a_run_from_a_drafter_taps_the_layers_it_was_trained_on(data, tmp_path):
    """`train --init-from D` builds the new run's drafter on D's target_layer_ids, not the spread default: D's fc
    projection reads its taps in order, so other layers would feed it features it never saw."""
    from lilicorr_train.export import DrafterShape, drafter_config, export_modelopt, spread_taps

    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    assert spread_taps(target.num_layers) != (0, 2)
    config = drafter_config(target.config, DrafterShape(target_layer_ids=(0, 2), mask_token_id=511))
    export_modelopt(fresh_drafter(config), config, tmp_path / "trained", dtype=torch.float32)
    args = ["--mask-token-id", "511", "--steps", "1", "--init-from", str(tmp_path / "trained")]
    _run(["train", str(tmp_path / "run"), *_cpu_run(data, anchors=2), *args])
    state = read_state(tmp_path / "run" / "state.safetensors")
    assert state.config["dflash_config"]["target_layer_ids"] == [0, 2]


def test_prompt_counts_add_up_and_an_empty_mix_is_a_clean_error(tmp_path):
    assert sum(_split(1, {"templates": 1, "stdlib": 1, "self": 1}).values()) == 1
    assert _split(2, {"templates": 1, "stdlib": 1, "self": 1}) in (
        {"templates": 1, "stdlib": 1, "self": 0},
        {"templates": 1, "stdlib": 0, "self": 1},
        {"templates": 0, "stdlib": 1, "self": 1},
    )
    assert sum(_split(16384, {"templates": 0.35, "stdlib": 0.3, "self": 0.35}).values()) == 16384
    # the tiny target writes no usable request: nothing to answer is a message, not a traceback
    result = CliRunner().invoke(
        train_cli,
        [
            "generate",
            "--target",
            TARGET,
            "--out",
            str(tmp_path / "d.npz"),
            "--prompts",
            "4",
            "--max-new-tokens",
            "4",
            "--mix",
            "self",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1 and "no prompts to answer" in result.output, result.output
    assert not (tmp_path / "d.npz").exists()
    bad = CliRunner().invoke(
        train_cli,
        ["generate", "--target", str(tmp_path / "nope"), "--out", str(tmp_path / "d.npz"), "--device", "cpu"],
    )
    assert (
        bad.exit_code == 2 and "--target" in bad.output and "Traceback" not in bad.output
    )  # unreadable input


def test_self_written_requests_keep_finished_turns_of_a_few_words(monkeypatch):
    target = load_target(TARGET, dtype=torch.float32, fast=True)
    tok = target.tokenizer
    eos = target.eos_token_ids[0]
    replies = [
        tok(" is the sky blue on most days?", add_special_tokens=False)["input_ids"] + [eos],
        tok(" me", add_special_tokens=False)["input_ids"] + [eos],  # too short
        tok(" write a poem about the sea and", add_special_tokens=False)["input_ids"],
    ]  # never ended
    seen = {}

    def fake_generate(starts, max_tokens, **kw):
        seen.update(kw, starts=starts)
        return replies

    monkeypatch.setattr(target, "generate_batch", fake_generate)
    prompts = self_written_prompts(target, ["Why", "Help", "Please"], seed=3)
    assert [p.text for p in prompts] == ["Why is the sky blue on most days?"]
    assert prompts[0].chat and prompts[0].kind == "self"
    assert seen["temperature"] > 0 and seen["seed"] == 3
    # each start is the chat template's user turn up to the opener
    assert tok.decode(seen["starts"][0]).endswith("Why")


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 30, 36])
def test_default_taps_spread_below_the_targets_last_layer(layers):
    from lilicorr_train.export import spread_taps

    taps = spread_taps(layers)
    assert taps == tuple(sorted(set(taps))) and all(0 <= t < layers for t in taps)
    if layers >= 2:  # SGLang 0.5.23 has no feature for the last layer (validate's LC148)
        assert max(taps) == max(layers - 2, 0)
    if layers >= 6:
        assert len(taps) == 5 and taps[0] == 1
