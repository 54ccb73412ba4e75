"""Bad options to the training pieces (`lilicorr_train.pieces`, `lilicorr_train.mixes`, bench/train_step.py) are
refused with the option named and the right exit code, before anything is trained or written: an impossible tap
once trained a drafter on features no layer wrote, and a negative batch size marked the whole data plan done."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from lilicorr_train import mixes, pieces
from lilicorr_train.data import Dataset
from lilicorr_train.mixes import Shard, write_npz

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")  # 4 layers, 512 ids


@pytest.fixture
def sets(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A training set, a held-out set of 6 sequences and an empty held-out set, of tiny-target ids (no 511)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 500, 6 * 40).astype(np.uint16)
    offsets = np.arange(7, dtype=np.int64) * 40
    prompts = np.full(6, 10, dtype=np.int32)
    Dataset(tokens, offsets, prompts).save(tmp_path / "train.npz")
    six = Shard(tokens, offsets, prompts, np.arange(6, dtype=np.uint8) % 3, np.zeros(6, dtype=np.uint8))
    write_npz(tmp_path / "val.npz", six.arrays())
    none = Shard(tokens[:0], offsets[:1], prompts[:0], six.category[:0], six.source[:0])
    write_npz(tmp_path / "empty.npz", none.arrays())
    return tmp_path / "train.npz", tmp_path / "val.npz", tmp_path / "empty.npz"


def _code(main, argv: list[str]) -> int:
    """A CLI main's exit code, whether it returns it or exits (argparse's usage errors exit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _fit(tmp_path: Path, sets, *extra: str, val: Path | None = None) -> int:
    train, held, _ = sets
    argv = ["fit", str(tmp_path / "run"), "--target", TARGET, "--data", str(train), "--val", str(val or held)]
    return _code(pieces.main, [*argv, "--device", "cpu", "--mask-token-id", "511", "--steps", "1", *extra])


@pytest.mark.parametrize(
    "option, said",
    [
        (["--taps", "1,1"], "names a layer twice"),
        (["--taps", "-1"], "a layer is a whole number from 0"),
        (["--taps", "a,b"], "give target layers as whole numbers"),
        (["--taps", "1_0,2"], "'1_0,2': '1_0' is not a whole number"),  # int() reads 1_0 as 10
        (["--taps", "\u0661,\u0662"], "'\u0661,\u0662': '\u0661' is not a whole number"),  # Arabic-Indic 1, 2
        (["--taps", "+1"], "'+1': '+1' is not a whole number"),
        (["--taps", "1,,2"], "'1,,2' has an empty item"),
        (["--taps", "1,2,"], "'1,2,' has an empty item"),
        (["--taps", ",1"], "',1' has an empty item"),
        (["--taps", "1, ,2"], "'1, ,2' has an empty item"),
        (["--taps", " "], "' ' names no layer"),
        (["--taps", ""], "'' names no layer"),
        (["--steps", "0"], "steps is from 1"),
        (["--batch-size", "0"], "batch size is from 1"),
        (["--anchors", "-3"], "anchors is from 1"),
        (["--k", "3"], "is a power of two"),
        (["--taps", "9"], "--taps [9] past the target's layers (0 to 3)"),
        (["--mask-token-id", "9999"], "past the target's vocabulary (512 ids)"),
        (["--init-layer", "9"], "--init-layer 9 past the target's layers"),
        (["--k", "1024"], "--k 1024 is more candidates than the target's vocabulary (512 ids)"),
        (["--head-width", "3"], "--head-width 3: the head's 4 attention heads need a multiple of 4"),
    ],
)
def test_fit_refuses_an_impossible_option_before_it_trains(tmp_path, sets, capsys, option, said):
    assert _fit(tmp_path, sets, *option) == 4
    assert said in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing written: no state, no log


def test_taps_are_ascii_digits_with_blanks_around_them_allowed():
    assert pieces.parse_taps(" 1 , 2,3 ") == (1, 2, 3) and pieces.parse_taps("0") == (0,)


def test_a_tap_on_the_last_layer_trains_with_a_warning_about_sglang(tmp_path, sets, capsys):
    assert _fit(tmp_path, sets, "--taps", "1,3", "--batch-size", "2", "--anchors", "2", "--budget", "60") == 0
    assert "last layer, which SGLang cannot capture" in capsys.readouterr().err
    assert (tmp_path / "run" / "state.safetensors").is_file()
    state = (tmp_path / "run" / "state.safetensors").read_bytes()
    # resumed with other values of what the run keeps (its taps, its K): a usage error naming each option and
    # both values, before anything loads (the run went on with its own, silently but for one line naming them)
    assert _fit(tmp_path, sets, "--taps", "0,1", "--k", "4", "--init-layer", "2", "--budget", "60") == 4
    err = capsys.readouterr().err
    assert "--taps 0,1 (the run's: 1,3), --k 4 (the run's: 8) would change them" in err, err
    assert "leave them out (or give the run's values) to resume it" in err and "--init-layer" not in err
    assert (tmp_path / "run" / "state.safetensors").read_bytes() == state
    # resumed by the command that started it: each new-run option named as ignored, with the value kept
    assert (
        _fit(tmp_path, sets, "--taps", "1,3", "--init-layer", "2", "--batch-size", "2", "--budget", "60") == 0
    )
    out, err = capsys.readouterr()
    assert (
        "resumes at step 1 with its own drafter and settings; ignored: --taps 1,3 (the run's own), --init-layer 2 "
        "(a new run's start only), --mask-token-id 511 (the run's own), --batch-size 2 (the run's own)"
    ) in err, err
    assert "--steps 1 is not past the run's step 1: nothing to train" in err
    assert '"taps": [1, 3]' in out


def test_fit_and_heldout_refuse_an_empty_or_wrong_held_out_set(tmp_path, sets, capsys):
    train, _, empty = sets
    assert _fit(tmp_path, sets, val=empty) == 2
    assert "holds no sequence" in capsys.readouterr().err
    assert _fit(tmp_path, sets, val=train) == 2  # training data, no categories
    assert "--val takes the held-out set `mixes build` writes" in capsys.readouterr().err
    drafter = str(REPO / "examples" / "tiny-lilicorr")  # convolution layers: not the training forward's
    assert (
        pieces.main(["heldout", drafter, "--target", TARGET, "--val", str(sets[1]), "--device", "cpu"]) == 4
    )
    assert "full-attention drafters without convolution" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, said",
    [
        (["--batch-size", "-5"], "the batch size is from 1"),
        (["--batch-size", "0"], "the batch size is from 1"),
        (["--first", "5", "--last", "2"], "--last 2 is before --first 5"),
        (["--first", "72"], "a shard of the plan's 72"),
    ],
)
def test_generate_refuses_a_batch_or_range_that_makes_nothing(tmp_path, capsys, option, said):
    argv = ["generate", "--target", TARGET, "--dir", str(tmp_path / "shards"), "--device", "cpu", *option]
    assert _code(mixes.main, argv) == 4
    assert said in capsys.readouterr().err
    assert not (tmp_path / "shards").exists()


def test_audit_and_build_name_a_missing_or_wrong_shard_directory_before_loading(tmp_path, sets, capsys):
    # a target that does not exist: the directory is judged first
    assert mixes.main(["audit", "--dir", str(tmp_path / "nope"), "--target", "/no/target"]) == 2
    assert "nope does not exist" in capsys.readouterr().err
    assert mixes.main(["audit", "--dir", str(sets[0]), "--target", "/no/target"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    out = ["--train", str(tmp_path / "t.npz"), "--val", str(tmp_path / "v.npz")]
    assert mixes.main(["build", "--dir", str(tmp_path / "empty"), *out]) == 2
    assert "holds no finished shard" in capsys.readouterr().err
    assert mixes.main(["generate", "--target", TARGET, "--dir", str(sets[0]), "--device", "cpu"]) == 4
    assert "is a file" in capsys.readouterr().err


def test_the_bench_refuses_a_tap_past_the_target(capsys):
    spec = importlib.util.spec_from_file_location("train_step_bench", REPO / "bench" / "train_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--target", TARGET, "--device", "cpu", "--taps", "9"]) == 4
    assert "must lie inside the target (4 layers, 512 ids)" in capsys.readouterr().err


def test_a_run_resumed_with_another_target_is_refused_naming_both(tmp_path, sets, capsys):
    sys.path.insert(0, str(REPO / "tests" / "smoke"))
    from smoke_helpers import write_target  # a random Llama of 16 ids and hidden 64

    assert _fit(tmp_path, sets, "--taps", "1,2", "--batch-size", "2", "--anchors", "2", "--budget", "60") == 0
    other = write_target(tmp_path / "other", layers=3)
    train, held, _ = sets
    argv = ["fit", str(tmp_path / "run"), "--target", str(other), "--data", str(train), "--val", str(held)]
    assert _code(pieces.main, [*argv, "--device", "cpu", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "was trained for another target" in err and "This is a bug" not in err
    assert "vocabulary 512 (this --target: 16)" in err and "layers 4 (this --target: 3)" in err
    # a target that differs from the run's in its hidden size alone (its vocabulary and layers the same)
    narrow = _narrow_target(tmp_path / "narrow")
    argv = ["fit", str(tmp_path / "run"), "--target", str(narrow), "--data", str(train), "--val", str(held)]
    assert _code(pieces.main, [*argv, "--device", "cpu", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "was trained for another target: its target's hidden size 64 (this --target: 32);" in err, err
    assert "vocabulary" not in err and "layers 4" not in err and "This is a bug" not in err, err


def _narrow_target(path: Path) -> Path:
    """tiny-target's tokenizer and shape (512 ids, 4 layers) with a hidden size of 32 (its 64 halved), random
    weights."""
    import shutil

    import torch
    import transformers

    shutil.copytree(TARGET, path)
    config = transformers.LlamaConfig.from_pretrained(path)
    config.hidden_size, config.head_dim, config.intermediate_size = 32, 8, 64
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_a_device_that_is_not_here_is_a_usage_error_naming_it(capsys):
    from lilicorr_train.__main__ import main as train_main

    assert _code(mixes.main, ["generate", "--target", TARGET, "--dir", "d", "--device", "tpu"]) == 4
    assert "'tpu': give cpu, cuda or cuda:N" in capsys.readouterr().err
    assert _code(train_main, ["generate", "--target", TARGET, "--out", "x.npz", "--device", "gpu"]) == 4
    assert "'gpu': give cpu, cuda or cuda:N" in capsys.readouterr().err
    mix = ["generate", "--target", TARGET, "--out", "x.npz", "--device", "cpu", "--mix", "foo=1"]
    assert _code(train_main, mix) == 4
    assert "--mix" in capsys.readouterr().err


def test_a_fresh_head_starts_on_a_trained_backbone_of_another_head_shape(tmp_path, sets, capsys):
    """--fresh-head: the backbone is --init-from's tensor for tensor, the head the new shape's own start; without
    it a head of another width is refused; and it needs --init-from."""
    import torch

    from lilicorr_runtime.target.load import load_target
    from lilicorr_train.export import DrafterShape, build_drafter, drafter_config, export_modelopt
    from lilicorr_train.loop import HEAD_PREFIX, init_from_checkpoint

    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    narrow = drafter_config(
        target.config,
        DrafterShape(target_layer_ids=(1, 2), mask_token_id=511, head_hidden_size=32, head_num_heads=2),
    )
    torch.manual_seed(3)
    trained = build_drafter(narrow)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))  # weights no fresh build has
    export_modelopt(trained, narrow, tmp_path / "trained", dtype=torch.float32)
    wide_config = drafter_config(
        target.config,
        DrafterShape(target_layer_ids=(1, 2), mask_token_id=511, head_hidden_size=64, head_num_heads=2),
    )
    wide = build_drafter(wide_config)
    start = {k: v.clone() for k, v in wide.state_dict().items()}
    with pytest.raises(ValueError, match="not a drafter of this shape"):
        init_from_checkpoint(wide, tmp_path / "trained")
    init_from_checkpoint(wide, tmp_path / "trained", fresh_head=True)
    got, theirs = wide.state_dict(), trained.state_dict()
    heads = [k for k in got if k.startswith(HEAD_PREFIX)]
    assert heads and got.keys() - set(heads) == theirs.keys() - {
        k for k in theirs if k.startswith(HEAD_PREFIX)
    }
    for name, value in got.items():
        want = start[name] if name.startswith(HEAD_PREFIX) else theirs[name]
        torch.testing.assert_close(value, want, rtol=0, atol=0, msg=name)

    # through the CLI: a new run of the wider head on that backbone; and --fresh-head alone is a usage error
    assert _fit(tmp_path, sets, "--fresh-head") == 4
    assert "give --init-from" in capsys.readouterr().err
    common = ["--taps", "1,2", "--batch-size", "2", "--anchors", "2", "--budget", "60", "--head-width", "64"]
    assert _fit(tmp_path, sets, *common, "--init-from", str(tmp_path / "trained")) == 2
    assert "not a drafter of this shape" in capsys.readouterr().err
    assert _fit(tmp_path, sets, *common, "--init-from", str(tmp_path / "trained"), "--fresh-head") == 0
    from lilicorr_train.state import read_state

    model = read_state(tmp_path / "run" / "state.safetensors").model
    width = [v.shape for k, v in model.items() if k.startswith(HEAD_PREFIX) and v.dim() == 2]
    assert any(64 in s for s in width)


def test_a_run_from_a_trained_drafter_taps_its_layers_unless_told_and_refuses_others(tmp_path, sets, capsys):
    """--init-from without --taps: the new run reads the layers the drafter's fc projection learned (not the
    spread default); --taps naming other layers is refused with both lists, before any step."""
    import torch

    from lilicorr_runtime.target.load import load_target
    from lilicorr_train.export import (
        DrafterShape,
        build_drafter,
        drafter_config,
        export_modelopt,
        spread_taps,
    )
    from lilicorr_train.state import read_state

    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    assert spread_taps(target.num_layers) != (0, 2)  # else the default would pass unnoticed
    config = drafter_config(target.config, DrafterShape(target_layer_ids=(0, 2), mask_token_id=511))
    torch.manual_seed(5)
    export_modelopt(build_drafter(config), config, tmp_path / "trained", dtype=torch.float32)
    head = ["--batch-size", "2", "--anchors", "2", "--budget", "60"]

    assert _fit(tmp_path, sets, *head, "--init-from", str(tmp_path / "trained")) == 0
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["taps"] for r in said if "taps" in r] == [[0, 2]]  # the start line names the run's taps
    state = read_state(tmp_path / "run" / "state.safetensors")
    assert tuple(state.config["dflash_config"]["target_layer_ids"]) == (0, 2)

    other = tmp_path / "other"
    argv = [
        "fit",
        str(other),
        "--target",
        TARGET,
        "--data",
        str(sets[0]),
        "--val",
        str(sets[1]),
        "--device",
        "cpu",
    ]
    code = _code(
        pieces.main, [*argv, "--steps", "1", *head, "--taps", "1,3", "--init-from", str(tmp_path / "trained")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "trained on target layers [0, 2], this run taps [1, 3]" in err
    assert not (other / "state.safetensors").exists()


@pytest.fixture
def deeper_drafter(tmp_path: Path) -> Path:
    """A drafter whose taps (0, 9) name a layer past tiny-target's four: trained for a deeper target."""
    import torch

    from lilicorr_runtime.target.load import load_target
    from lilicorr_train.export import DrafterShape, build_drafter, drafter_config, export_modelopt

    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    assert target.num_layers <= 9
    config = drafter_config(target.config, DrafterShape(target_layer_ids=(0, 9), mask_token_id=511))
    torch.manual_seed(0)
    export_modelopt(build_drafter(config), config, tmp_path / "deeper", dtype=torch.float32)
    return tmp_path / "deeper"


def test_train_init_from_refuses_a_drafter_tapping_past_the_targets_layers(tmp_path, deeper_drafter, sets):
    """`train --init-from D` takes D's taps, so a D of a deeper target is refused, naming the layers, before a run
    trains on features no layer wrote."""
    from click.testing import CliRunner

    from lilicorr_train.__main__ import main as train_cli

    result = CliRunner().invoke(
        train_cli,
        [
            "train", str(tmp_path / "run"), "--target", TARGET, "--data", str(sets[0]), "--device", "cpu",
            "--batch-size", "2", "--anchors", "2", "--mask-token-id", "511", "--steps", "1",
            "--init-from", str(deeper_drafter),
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "[9] are not layers of this target (0 to 3)" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "state.safetensors").exists()


def test_fit_init_from_names_init_from_not_taps_for_a_drafter_of_a_deeper_target(
    tmp_path, deeper_drafter, sets, capsys
):
    """`fit --init-from D` with no --taps refuses such a D naming --init-from, not --taps, which was not given."""
    argv = [
        "fit", str(tmp_path / "run"), "--target", TARGET, "--data", str(sets[0]), "--val", str(sets[1]),
        "--device", "cpu", "--mask-token-id", "511", "--steps", "1", "--init-from", str(deeper_drafter),
    ]  # fmt: skip
    try:
        code = pieces.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert "--init-from" in err and "[9] are not layers of this target" in err and "--taps" not in err, err


def test_fit_and_heldout_refuse_a_held_out_set_of_another_vocabulary(tmp_path, sets, capsys):
    """A --val set with a token id past the target's vocabulary (written by another target) is refused with
    exit 1 naming the id; before, the embedding lookup failed as an internal error."""
    train, held, _ = sets
    shard = Shard.load(held)
    tokens = shard.tokens.copy()
    tokens[5] = 600  # tiny-target has 512 ids
    other = Shard(tokens, shard.offsets, shard.prompt_lengths, shard.category, shard.source)
    write_npz(tmp_path / "other.npz", other.arrays())
    assert _fit(tmp_path, sets, val=tmp_path / "other.npz") == 1
    assert "holds token id 600, past the target's vocabulary of 512" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_run_resumed_on_data_holding_its_mask_token_is_refused(tmp_path, sets, capsys):
    """A new run refuses a mask token the data holds; a resumed run keeps its mask, and new data holding it was
    trained on silently (by `pieces fit` and by `python -m lilicorr_train train`). Both now refuse it, exit 1."""
    from click.testing import CliRunner

    from lilicorr_train.__main__ import main as train_cli

    train, _, _ = sets
    assert _fit(tmp_path, sets, "--init-layer", "3", "--batch-size", "2", "--anchors", "2") == 0
    capsys.readouterr()
    data = Dataset.load(train)
    tokens = data.tokens.copy()
    tokens[50] = 511  # the run's mask token
    Dataset(tokens, data.offsets, data.prompt_lengths).save(tmp_path / "masked.npz")
    state = (tmp_path / "run" / "state.safetensors").read_bytes()
    argv = ["fit", str(tmp_path / "run"), "--target", TARGET, "--data", str(tmp_path / "masked.npz")]
    code = _code(pieces.main, [*argv, "--val", str(sets[1]), "--device", "cpu", "--steps", "3"])
    assert code == 1 and "holds token 511, the run's mask token" in capsys.readouterr().err
    assert (tmp_path / "run" / "state.safetensors").read_bytes() == state  # not trained

    runner = CliRunner()
    common = ["--target", TARGET, "--device", "cpu", "--data", str(tmp_path / "masked.npz")]
    result = runner.invoke(train_cli, ["train", str(tmp_path / "run"), *common, "--steps", "3"])
    assert result.exit_code == 1 and "the run's mask token" in result.output, result.output
    assert (tmp_path / "run" / "state.safetensors").read_bytes() == state
    new = ["train", str(tmp_path / "new"), *common, "--mask-token-id", "511", "--init-layer", "3"]
    result = runner.invoke(train_cli, new)
    assert result.exit_code == 1 and "--mask-token-id 511 occurs in the training data" in result.output


def test_an_internal_error_of_pieces_names_the_command_and_its_inputs(tmp_path, sets, capsys, monkeypatch):
    """The catch-all line of `pieces` says which command failed on which files (it said only the exception),
    as `python -m lilicorr_train` does; still no traceback, still exit 2."""
    train, held, _ = sets

    def broken(path):
        raise ValueError("boom")

    monkeypatch.setattr(pieces, "held_out_set", broken)
    monkeypatch.delenv("LILICORR_DEBUG", raising=False)
    assert _fit(tmp_path, sets) == 2
    err = capsys.readouterr().err
    named = f"internal error in fit, reading RUN {tmp_path / 'run'}, --target {TARGET}, --data {train}, --val {held}"
    assert named in err and "ValueError: boom" in err and "Traceback" not in err, err
    drafter = tmp_path / "drafter"
    argv = ["heldout", str(drafter), "--target", TARGET, "--val", str(held), "--device", "cpu"]
    assert _code(pieces.main, argv) == 2
    err = capsys.readouterr().err
    assert f"internal error in heldout, reading DRAFTER {drafter}, --target {TARGET}, --val {held}" in err, (
        err
    )


def test_heldout_refuses_a_drafter_made_for_another_target_naming_both(sets, capsys):
    """The bundled SmolLM2 drafter against the tiny target: the held-out τ's forward failed on the feature width
    (a ValueError from project_context, an internal error, exit 2); refused now, exit 1, before its weights load,
    with validate's findings for the pair (widths, taps, vocabulary)."""
    drafter = str(REPO / "examples" / "smollm2-lilicorr")
    argv = ["heldout", drafter, "--target", TARGET, "--val", str(sets[1]), "--device", "cpu"]
    assert _code(pieces.main, argv) == 1
    err = capsys.readouterr().err
    assert "pieces: refused:" in err and "internal error" not in err, err
    assert f"DRAFTER {drafter} was not made for --target {TARGET}" in err, err
    assert (
        "draft hidden_size 576 != target" in err and "target_layer_ids [8, 14, 21, 28] are not layers" in err
    )


@pytest.mark.parametrize("kind", ["file", "symlink loop", "log is a directory"])
def test_fit_refuses_a_run_that_is_no_directory_or_whose_log_is_none_before_loading(
    tmp_path, sets, capsys, monkeypatch, kind
):
    """RUN a file or a symlink loop: `pieces fit` loaded the data and the target, then failed on mkdir with
    "error: File exists" (exit 2; train refuses it at once, exit 4); a directory at RUN/log.jsonl was found only
    when the log was first appended to. Both are named now before anything loads, as train names them."""
    run = tmp_path / "run"
    if kind == "file":
        run.write_text("precious")
    elif kind == "symlink loop":
        (tmp_path / "other").symlink_to(run)
        run.symlink_to(tmp_path / "other")
    else:
        (run / "log.jsonl").mkdir(parents=True)

    def no_target(*args, **kwargs):
        raise AssertionError("the target loaded")

    monkeypatch.setattr(pieces, "load_target_or_say", no_target)
    code = _fit(tmp_path, sets)
    err = capsys.readouterr().err
    if kind == "log is a directory":
        assert code == 2 and f"{run / 'log.jsonl'} is a directory, not a regular file" in err, err
    else:
        assert code == 4 and f"usage error: RUN {run} is not a directory" in err, err
        assert kind != "file" or run.read_text() == "precious"
