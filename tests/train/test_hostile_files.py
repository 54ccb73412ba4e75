"""The training recipe's files against a hostile file system (issue 40): its outputs never write over its inputs
(exit 4), never go through a planted symlink or a predictable temporary, its log is appended only to a regular
file of its own; its data, state and log are read under the guarded reader's checks, a deflate bomb is refused
before it inflates, a resumed state's settings are bounded before anything is built from them, and no Python
exception name reaches the user."""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from lilicorr_train import pieces
from lilicorr_train import state as state_module
from lilicorr_train.__main__ import main as train_cli
from lilicorr_train.data import DataError, Dataset
from lilicorr_train.mixes import Shard, write_npz
from lilicorr_train.state import LEGACY_STATE, STATE, StateError, read_state, save_state

from helpers import REPO, raised_within

TARGET = REPO / "examples" / "tiny-target"
MASK = "511"
TRAIN = ["--target", TARGET, "--device", "cpu", "--batch-size", "2", "--anchors", "4", "--time-budget", "600"]


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(train_cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


def _data(path: Path, compressed: bool = False, tokens: np.ndarray | None = None) -> Path:
    rng = np.random.default_rng(0)
    if tokens is None:
        tokens = rng.integers(3, 500, 6 * 24).astype(np.uint16)
    n = len(tokens) // 24
    arrays = {
        "tokens": tokens,
        "offsets": np.asarray([i * len(tokens) // n for i in range(n + 1)], dtype=np.int64),
        "prompt_lengths": np.full(n, 8, dtype=np.int32),
    }
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _data(tmp_path_factory.mktemp("data") / "data.npz")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    code, out = invoke(
        "train", run, "--data", data, *TRAIN, "--mask-token-id", MASK, "--init-layer", "3", "--steps", "1"
    )
    assert code == 0, out
    return run


def _copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _no_exception_names(out: str) -> None:
    for name in (
        "Traceback",
        "Error:",
        "internal error",
        "MemoryError",
        "ZeroDivision",
        "Overflow",
        "Storage size",
    ):
        assert name not in out, out


# ---- outputs never write over inputs -------------------------------------------------------------------------


def test_generate_refuses_an_out_over_the_targets_files_before_loading_it(tmp_path):
    target = tmp_path / "T"
    shutil.copytree(TARGET, target)
    before = _digest(target)
    for out in (target / "model.safetensors", target / ".." / "T" / "config.json"):
        code, text = invoke(
            "generate", "--target", target, "--out", out, "--prompts", "2", "--max-new-tokens", "2"
        )
        assert code == 4 and "an input of this command" in text and "of the target" in text, text
    (tmp_path / "link.npz").symlink_to(target / "tokenizer.json")
    code, text = invoke(
        "generate",
        "--target",
        target,
        "--out",
        tmp_path / "link.npz",
        "--prompts",
        "2",
        "--max-new-tokens",
        "2",
    )
    assert code == 4 and "resolves to tokenizer.json of the target" in text, text
    assert _digest(target) == before


def test_train_refuses_a_run_whose_files_are_its_inputs(data, tmp_path):
    target = tmp_path / "T"
    shutil.copytree(TARGET, target)
    before = _digest(target)
    code, out = invoke(
        "train", target, "--data", data, *TRAIN[2:], "--target", target, "--mask-token-id", MASK
    )
    assert code == 4 and "state.safetensors of the target" in out, out  # RUN = the target's own directory
    assert _digest(target) == before
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(data, run / "log.jsonl")  # the data, where the run's log goes
    saved = (run / "log.jsonl").read_bytes()
    code, out = invoke("train", run, "--data", run / "log.jsonl", *TRAIN, "--mask-token-id", MASK)
    assert code == 4 and "is the --data file" in out, out
    assert (run / "log.jsonl").read_bytes() == saved


def test_generated_data_is_saved_through_no_symlink_and_no_predictable_temporary(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "data.npz"
    for planted in ("data.npz.tmp.npz", "data.npz.tmp"):  # the old fixed temporary, and a guess
        (tmp_path / planted).symlink_to(victim)
    data = Dataset.load(_data(tmp_path / "src.npz"))
    data.save(out)
    assert victim.read_text() == "keep"
    assert Dataset.load(out).tokens.tolist() == data.tokens.tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.npz",
        "data.npz.tmp",
        "data.npz.tmp.npz",
        "src.npz",
        "victim",
    ]


def test_the_state_is_saved_through_no_symlink_and_no_predictable_temporary(trained, tmp_path):
    run = _copy(trained, tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (run / f".{STATE}.{os.getpid()}.tmp").symlink_to(victim)  # the old temporary's name
    state = read_state(run / STATE)
    save_state(run, state)
    assert victim.read_text() == "keep"
    again = read_state(run / STATE)
    assert again.step == state.step and all(torch.equal(again.model[k], v) for k, v in state.model.items())
    assert {p.name for p in run.iterdir()} == {STATE, "log.jsonl", f".{STATE}.{os.getpid()}.tmp"}


def test_export_is_not_stopped_or_redirected_by_planted_temporaries(trained, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in (f".export.export-{os.getpid()}", f".export.old-{os.getpid()}"):
        (tmp_path / name).symlink_to(victim)
    for _ in range(2):  # a new export, then one replacing it
        code, out = invoke("export", trained, "--out", tmp_path / "export")
        assert code == 0, out
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["config.json", "model.safetensors"]
    assert list(victim.iterdir()) == []


# ---- the log ---------------------------------------------------------------------------------------------------


def test_the_log_is_never_appended_through_a_symlink(trained, data, tmp_path):
    run = _copy(trained, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (run / "log.jsonl").unlink()
    (run / "log.jsonl").symlink_to(victim)
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 2 and f"{run / 'log.jsonl'} is a symlink" in out, out
    assert victim.read_text() == "keep\n"
    _no_exception_names(out)


def test_open_log_uses_no_follow_and_refuses_what_is_not_a_regular_file(tmp_path):
    open_log = state_module.open_log
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (tmp_path / "link.jsonl").symlink_to(victim)
    with pytest.raises(StateError, match="is a symlink"):
        open_log(tmp_path / "link.jsonl")  # the check and the open are one step: O_NOFOLLOW
    os.mkfifo(tmp_path / "fifo.jsonl")
    raised = raised_within(10, open_log, tmp_path / "fifo.jsonl")
    assert isinstance(raised, StateError) and "FIFO" in str(raised), raised
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(StateError):
        open_log(tmp_path / "dir.jsonl")
    with open_log(tmp_path / "new.jsonl") as f:
        f.write("{}\n")
    with open_log(tmp_path / "new.jsonl") as f:
        f.write("{}\n")
    assert (tmp_path / "new.jsonl").read_text() == "{}\n{}\n" and victim.read_text() == "keep\n"


# ---- data: npz members -----------------------------------------------------------------------------------------


def test_a_deflate_bomb_is_refused_before_it_inflates(tmp_path):
    path = _data(tmp_path / "bomb.npz", compressed=True, tokens=np.zeros(48 << 20, dtype=np.uint16))  # 96 MiB
    info = zipfile.ZipFile(path).getinfo("tokens.npy")
    assert info.file_size > 500 * info.compress_size  # a bomb: a few hundred kB that inflate to 96 MiB
    raised = raised_within(30, Dataset.load, path)
    assert isinstance(raised, DataError), raised
    assert "deflate bomb" in str(raised) and "tokens" in str(raised), raised


def test_compressed_data_of_real_tokens_still_loads(tmp_path):
    path = _data(tmp_path / "small.npz", compressed=True)
    assert len(Dataset.load(path)) == 6


def test_a_member_with_another_compression_or_a_lying_size_is_refused(data, tmp_path):
    bz = tmp_path / "bz.npz"
    with zipfile.ZipFile(data) as src, zipfile.ZipFile(bz, "w", compression=zipfile.ZIP_BZIP2) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    with pytest.raises(DataError, match="zip method 12"):
        Dataset.load(bz)
    padded = tmp_path / "padded.npz"
    with zipfile.ZipFile(data) as src, zipfile.ZipFile(padded, "w") as dst:
        for info in src.infolist():
            dst.writestr(
                info.filename, src.read(info) + (b"\0" * 64 if info.filename == "offsets.npy" else b"")
            )
    with pytest.raises(DataError, match="offsets array claims 7 values"):
        Dataset.load(padded)


def test_a_legacy_state_with_a_compressed_member_is_refused(trained, tmp_path):
    run = _copy(trained, tmp_path)
    (run / STATE).unlink()
    with zipfile.ZipFile(run / LEGACY_STATE, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * (1 << 20))
    with pytest.raises(StateError, match="is compressed"):
        read_state(run / LEGACY_STATE)
    # a small deflated member whose declared size fits inside the file: refused for its compression alone
    with zipfile.ZipFile(run / LEGACY_STATE, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * 64)
    (info,) = zipfile.ZipFile(run / LEGACY_STATE).infolist()
    assert info.header_offset + info.file_size <= (run / LEGACY_STATE).stat().st_size
    with pytest.raises(StateError) as raised:
        read_state(run / LEGACY_STATE)
    said = str(raised.value)
    assert "its member 'archive/data.pkl' is compressed" in said and "torch.load" not in said, said


# ---- a resumed state's settings --------------------------------------------------------------------------------


def _state_with(trained: Path, tmp_path: Path, train: dict | None = None, config: dict | None = None) -> Path:
    run = _copy(trained, tmp_path)
    state = read_state(run / STATE)
    state = copy.copy(state)
    state.train = {**state.train, **(train or {})}
    merged = copy.deepcopy(state.config)
    for key, value in (config or {}).items():
        if key == "dflash_config":
            merged["dflash_config"].update(value)
        else:
            merged[key] = value
    state.config = merged
    save_state(run, state)
    return run


@pytest.mark.parametrize(
    ("train", "config", "named"),
    [
        (
            {"batch_size": 10**9},
            None,
            "batch_size is 1000000000; a run's batch_size is an integer from 1 to 1024",
        ),
        ({"anchors": 0}, None, "anchors is 0"),
        ({"log_every": 0}, None, "log_every is 0"),  # ZeroDivisionError (a modulo by zero) in fit
        ({"steps": -5}, None, "steps is -5"),
        ({"lr_head": float("nan")}, None, "lr_head is nan"),
        ({"seed": -1}, None, "seed is -1"),
        ({"beta": 0.0}, None, "beta is 0.0"),  # a NaN loss: 0/0 in the slot decay
        ({"max_length": 2**62}, None, "max_length is"),
        (
            None,
            {"num_hidden_layers": 200_000, "layer_types": ["full_attention"] * 200_000},
            "num_hidden_layers is 200000",
        ),
        (
            None,
            {"hidden_size": 2**40, "head_dim": 2**30},
            "hidden_size is 1099511627776",
        ),  # torch: Storage size
        (None, {"intermediate_size": 2**62}, "intermediate_size is"),
        (None, {"dflash_config": {"lilicorr_hidden_size": 2**50}}, "dflash_config.lilicorr_hidden_size is"),
        (
            None,
            {"dflash_config": {"target_layer_ids": list(range(100_000))}},
            "target_layer_ids lists 100000",
        ),
        (  # each tap a layer of the target, but one tap more than a drafter may have
            None,
            {"dflash_config": {"target_layer_ids": [i % 4 for i in range(state_module.MAX_TAPS + 1)]}},
            f"target_layer_ids lists {state_module.MAX_TAPS + 1} layers",
        ),
    ],
)
def test_a_resumed_states_settings_are_bounded_before_anything_is_built(
    trained, tmp_path, train, config, named
):
    run = _state_with(trained, tmp_path, train, config)
    raised = raised_within(30, read_state, run / STATE)
    assert isinstance(raised, StateError), raised
    assert named in str(raised) and str(run / STATE) in str(raised), raised


def test_a_state_with_a_negative_step_or_a_misshapen_optimizer_moment_is_refused(trained, tmp_path):
    """A stored step below 0, and an AdamW moment (`optimizer.N.exp_avg`) of another shape than its parameter:
    refused when read, naming the file and what is wrong."""
    run = _copy(trained, tmp_path)
    state = copy.copy(read_state(run / STATE))
    state.step = -1
    save_state(run, state)
    with pytest.raises(StateError, match="its step is -1, not a count of steps"):
        read_state(run / STATE)

    state = copy.copy(read_state(trained / STATE))
    moments = {index: dict(values) for index, values in state.optimizer["state"].items()}
    first = moments[0]["exp_avg"]
    moments[0]["exp_avg"] = torch.zeros(first.numel() + 1)
    state.optimizer = {**state.optimizer, "state": moments}
    save_state(run, state)
    raised = raised_within(30, read_state, run / STATE)
    assert isinstance(raised, StateError), raised
    said = f"its drafter does not have in that shape (first: optimizer.0.exp_avg [{first.numel() + 1}])"
    assert said in str(raised) and str(run / STATE) in str(raised), raised


def test_the_command_names_the_setting_and_its_bound(trained, data, tmp_path):
    run = _state_with(trained, tmp_path, {"batch_size": 10**9})
    code, out = invoke("train", run, "--data", data, *TRAIN)
    assert code == 2 and "batch_size is 1000000000" in out and "from 1 to 1024" in out, out
    _no_exception_names(out)
    code, out = invoke("export", run, "--out", tmp_path / "export")
    assert code == 2 and "batch_size" in out, out


@pytest.mark.parametrize("option", ["--batch-size", "--anchors", "--layers"])
def test_a_new_run_takes_the_same_bounds(data, tmp_path, option):
    code, out = invoke(
        "train", tmp_path / "run", "--data", data, *TRAIN, "--mask-token-id", MASK, option, "1000000000"
    )
    assert code == 4 and option in out, out


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (MemoryError(), "out of memory"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "out of memory"),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 469762048 bytes"),
            "out of memory",
        ),
        (FloatingPointError("non-finite training loss: {'dflash': nan}"), "the run diverged"),
    ],
)
def test_running_out_of_memory_or_diverging_is_a_message_not_an_internal_error(
    trained, data, tmp_path, monkeypatch, raised, said
):
    import lilicorr_train.__main__ as cli

    def fit(*args, **kwargs):
        raise raised

    monkeypatch.setattr(cli, "fit", fit)
    run = _copy(trained, tmp_path)
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 2 and said in out, out
    _no_exception_names(out)


def test_an_export_under_a_file_is_refused_by_name(tmp_path):
    """--out data.npz/x, where data.npz is a file: refused naming the file (exit 4 on the command line), where
    before the directory's creation failed with "File exists: data.npz" (exit 2)."""
    import json

    from lilicorr_train.export import OutputExists, build_drafter, export_modelopt

    config = json.loads((REPO / "examples" / "tiny-lilicorr" / "config.json").read_text())
    (tmp_path / "data.npz").write_bytes(b"a data set")
    for out in (tmp_path / "data.npz" / "x", tmp_path / "data.npz" / "x" / "y"):
        with pytest.raises(OutputExists, match="data.npz is a file, not a directory"):
            export_modelopt(build_drafter(config), config, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz"]
    assert (tmp_path / "data.npz").read_bytes() == b"a data set"


@pytest.mark.parametrize("where", ["here", "under a missing directory", "under a symlink loop"])
def test_an_export_whose_name_the_file_system_cannot_take_is_a_usage_error(trained, tmp_path, where):
    """--out with a name too long for the file system (300 bytes) failed once the drafter was loaded, with
    "File name too long" (exit 2), after making the missing directories above it: refused now before anything
    loads, as every other command's output is (exit 4), naming the option and the path."""
    long = "x" * 300
    if where == "here":
        out, said = tmp_path / long, "a name of 300 bytes is longer than the file system takes"
    elif where == "under a missing directory":
        out, said = tmp_path / "missing" / long, "a name of 300 bytes is longer than the file system takes"
    else:
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        out, said = tmp_path / "loop" / "export", "Too many levels of symbolic links"
    code, text = invoke("export", trained, "--out", out)
    assert code == 4 and f"usage error: --out {out}: {said}" in text, text
    _no_exception_names(text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if where != "under a symlink loop" else ["loop"])


@pytest.mark.parametrize(
    ("offsets", "prompts", "said"),
    [
        ([0, 0, 0, 12], [0, 0, 4], "sequence 0 is empty (2 empty in all)"),  # crashed the fit's reshape
        ([0, 4, 12], [4, 8], "no sequence has an answer token"),  # trained with loss 0 and NaN metrics logged
    ],
)
def test_data_with_empty_sequences_or_no_answer_is_refused_when_read(tmp_path, offsets, prompts, said):
    tokens = np.arange(3, 3 + offsets[-1], dtype=np.uint16)
    Dataset(tokens, np.array(offsets, dtype=np.int64), np.array(prompts, dtype=np.int32)).save(
        tmp_path / "d.npz"
    )
    with pytest.raises(DataError, match=said.replace("(", r"\(").replace(")", r"\)")):
        Dataset.load(tmp_path / "d.npz")


# ---- a resumed state's optimizer groups and mask token ------------------------------------------------------------


def _state_with_group(trained: Path, tmp_path: Path, key: str, value: object) -> Path:
    """The trained run with its optimizer's first parameter group's `key` set to `value` (deleted for DELETE)."""
    run = _copy(trained, tmp_path)
    state = copy.copy(read_state(run / STATE))
    groups = copy.deepcopy(state.optimizer["param_groups"])
    if value is DELETE:
        del groups[0][key]
    else:
        groups[0][key] = value
    state.optimizer = {**state.optimizer, "param_groups": groups}
    save_state(run, state)
    return run


DELETE = object()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("betas", [0.9], "parameter group 0 has betas [0.9]"),  # "not enough values to unpack"
        ("betas", [0.9, 1.5], "parameter group 0 has betas [0.9, 1.5]"),  # a complex power
        (
            "betas",
            [0.9, 1.0],
            "parameter group 0 has betas [0.9, 1.0]",
        ),  # the bias correction 1 - beta2**t is 0
        ("base_lr", None, "parameter group 0 has base_lr None"),  # None * float
        ("base_lr", DELETE, "parameter group 0 has no base_lr"),  # KeyError: 'base_lr'
        ("weight_decay", DELETE, "parameter group 0 has no weight_decay"),
        ("eps", None, "parameter group 0 has eps None"),
        ("amsgrad", True, "parameter group 0 has amsgrad True"),  # KeyError: 'max_exp_avg_sq'
        ("capturable", True, "parameter group 0 has capturable True"),  # an assertion on the CPU
    ],
)
def test_a_state_with_edited_optimizer_groups_is_refused_naming_the_file_and_field(
    trained, data, tmp_path, key, value, named
):
    """A hand-edited parameter group ended in an internal error (exit 2, the exception's own words) when the run
    resumed: refused now, exit 1, naming the state file and the field."""
    run = _state_with_group(trained, tmp_path, key, value)
    before = (run / STATE).read_bytes()
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 1 and "refused" in out and str(run / STATE) in out and named in out, out
    _no_exception_names(out)
    assert (run / STATE).read_bytes() == before  # not trained


def _val_set(data: Path, out: Path) -> Path:
    """The data as a held-out set (`pieces fit --val`): every sequence of category 0, source 0."""
    ds = Dataset.load(data)
    none = np.zeros(len(ds), np.uint8)
    write_npz(out, Shard(ds.tokens, ds.offsets, ds.prompt_lengths, none, none).arrays())
    return out


def _fit_argv(run, data, tmp_path) -> list[str]:
    """`pieces fit` resuming `run` on the CPU, with a held-out set cut from `data`."""
    val = _val_set(data, tmp_path / "val.npz")
    return [
        "fit",
        str(run),
        "--target",
        str(TARGET),
        "--data",
        str(data),
        "--val",
        str(val),
        "--device",
        "cpu",
    ]


@pytest.mark.parametrize("mask", [9999, 512])  # 512: the first id past the vocabulary
def test_a_state_whose_mask_token_is_past_the_vocabulary_is_refused(trained, data, tmp_path, capsys, mask):
    """A stored mask token of 9999 for a vocabulary of 512 failed in the embedding lookup (an IndexError, an
    internal error): `train`, `pieces fit` and `export` refuse it, exit 1, naming the file and the key. The
    vocabulary's last id (511, the trained run's) is a mask token."""
    assert read_state(trained / STATE).config["dflash_config"]["mask_token_id"] == 511
    run = _state_with(trained, tmp_path, config={"dflash_config": {"mask_token_id": mask}})
    said = f"dflash_config.mask_token_id is {mask}, past its vocabulary of 512 ids"
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 1 and str(run / STATE) in out and said in out, out
    _no_exception_names(out)
    code, out = invoke("export", run, "--out", tmp_path / "export")
    assert code == 1 and said in out, out
    assert pieces.main(_fit_argv(run, data, tmp_path)) == 1
    err = capsys.readouterr().err
    assert "pieces: refused:" in err and str(run / STATE) in err and said in err, err


@pytest.mark.parametrize("past", [7, 4], ids=["tap 7", "tap 4"])  # 4: the first layer past the target's
@pytest.mark.parametrize("declared", [True, False], ids=["num_target_layers 4", "no num_target_layers"])
def test_a_state_tapping_past_the_targets_layers_is_refused_on_resume_and_export(
    trained, data, tmp_path, capsys, declared, past
):
    """Taps past the target's layers resumed and exported (the target's pass fills such a tap's features from no
    layer), and only `lilicorr-ckpt convert` refused the export (LC113). `train` and `pieces fit` refuse it once the
    target is known, `export` when the state's config says how many layers its target has; exit 1."""
    run = _copy(trained, tmp_path)
    state = copy.copy(read_state(run / STATE))
    state.config = copy.deepcopy(state.config)
    state.config["dflash_config"]["target_layer_ids"] = [1, past]
    if not declared:
        del state.config["num_target_layers"]
    save_state(run, state)
    said = f"its drafter taps target layers [1, {past}], and [{past}] are not layers of its target (4 layers, 0 to 3)"
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 1 and str(run / STATE) in out and said in out, out
    _no_exception_names(out)
    assert pieces.main(_fit_argv(run, data, tmp_path)) == 1
    err = capsys.readouterr().err
    assert "pieces: refused:" in err and said in err, err
    if declared:
        code, out = invoke("export", run, "--out", tmp_path / "export")
        assert code == 1 and said in out and not (tmp_path / "export").exists(), out


# ---- a new run's options on a resume -------------------------------------------------------------------------


def test_train_resumed_with_other_new_run_options_is_a_usage_error_and_with_its_own_a_warning(
    trained, data, tmp_path
):
    """`train` on a run to resume ignored every new-run option silently (--layers 2 resumed the one-layer drafter);
    one rule now, as `pieces fit` has it: another value than the run's is a usage error (exit 4) naming the option
    and both values; the run's own value, or an option only a new run's start reads, is named in a warning."""
    run = _copy(trained, tmp_path)
    before = (run / STATE).read_bytes()
    code, out = invoke("train", run, "--data", data, *TRAIN, "--layers", "2", "--lr-head", "0.001")
    assert code == 4 and "--layers 2 (the run's: 1), --lr-head 0.001 (the run's: 0.0003)" in out, out
    assert (run / STATE).read_bytes() == before
    code, out = invoke("train", run, "--data", data, *TRAIN, "--batch-size", "3")  # the last one given counts
    assert code == 4 and "--batch-size 3 (the run's: 2)" in out, out
    code, out = invoke("train", run, "--data", data, *TRAIN, "--mask-token-id", MASK, "--init-layer", "3")
    assert code == 0, out
    assert (
        "resumes at step 1 with its own drafter and settings; ignored: --mask-token-id 511 (the run's own), "
        "--batch-size 2 (the run's own), --anchors 4 (the run's own), --init-layer 3 (a new run's start only)"
    ) in out, out
    (tmp_path / "drafter").mkdir()
    code, out = invoke(
        "train", run, "--data", data, *TRAIN, "--init-from", tmp_path / "drafter", "--steps", "2"
    )
    assert code == 0 and f"--init-from {tmp_path / 'drafter'} (a new run's start only)" in out, (
        out
    )  # was exit 4
    assert read_state(run / STATE).step == 2


# each option a resumed run keeps (loop.kept_options), the trained run's value and another; `train` takes the
# drafter's block size, `pieces fit` the taps and the head's shape, both the rest
FIT, TRAIN_CMD = "pieces fit", "train"
KEPT = [
    ("--taps", "0,1", "1,2", [FIT]),
    ("--mask-token-id", "510", "511", [TRAIN_CMD, FIT]),
    ("--layers", "2", "1", [TRAIN_CMD, FIT]),
    ("--block-size", "4", "8", [TRAIN_CMD]),
    ("--k", "4", "8", [FIT]),
    ("--head-width", "128", "256", [FIT]),
    ("--head-layers", "3", "2", [FIT]),
    ("--batch-size", "3", "2", [TRAIN_CMD, FIT]),
    ("--anchors", "5", "4", [TRAIN_CMD, FIT]),
    ("--lr-drafter", "0.001", "0.0006", [TRAIN_CMD, FIT]),
    ("--lr-head", "0.001", "0.0003", [TRAIN_CMD, FIT]),
]


def test_the_kept_options_table_names_every_option_a_resumed_run_keeps(trained):
    from lilicorr_train.loop import kept_options

    assert sorted(kept_options(read_state(trained / STATE))) == sorted(option for option, *_ in KEPT)


@pytest.mark.parametrize(
    ("command", "option", "other", "own"),
    [(command, option, other, own) for option, other, own, commands in KEPT for command in commands],
)
def test_each_kept_option_resumed_with_another_value_is_refused_and_with_its_own_a_warning(
    trained, data, tmp_path, capsys, command, option, other, own
):
    """A resume with another value of an option the run keeps is a usage error (exit 4) naming the option, the
    value given and the run's, the state untouched; with the run's own value it resumes, a warning naming it."""
    run = _copy(trained, tmp_path)
    before = (run / STATE).read_bytes()

    def resume(value: str) -> tuple[int, str]:
        if command == TRAIN_CMD:
            return invoke("train", run, "--data", data, *TRAIN, option, value, "--steps", "1")
        code = pieces.main([*_fit_argv(run, data, tmp_path), option, value, "--steps", "1"])
        return code, capsys.readouterr().err

    code, out = resume(other)
    assert code == 4 and f"{option} {other} (the run's: {own}) would change them" in out, out
    assert (run / STATE).read_bytes() == before
    code, out = resume(own)
    assert code == 0 and "ignored: " in out and f"{option} {own} (the run's own)" in out, out
