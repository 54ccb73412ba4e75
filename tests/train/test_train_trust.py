"""The training CLI against inputs that are not its own: a run state or data file from someone else is refused
with a message naming it (no code runs, no traceback), and every failure has an exit code. Plus its help, its
usage errors, its start from random weights and the modes of what it writes."""

from __future__ import annotations

import os
import pickle
import runpy
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from lilicorr_train.__main__ import main as train_cli
from lilicorr_train.state import LEGACY_STATE, STATE, read_state

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")
MASK = "511"


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(train_cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


def _synthetic_data(path: Path, offsets: list[int] | None = None) -> Path:
    """Token ids of the tiny target's vocabulary (MASK excluded), 6 sequences of 24 with prompts of 8."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 500, 6 * 24).astype(np.uint16)
    np.savez(
        path,
        tokens=tokens,
        offsets=np.asarray(offsets or list(range(0, 6 * 24 + 1, 24)), dtype=np.int64),
        prompt_lengths=np.full(6, 8, dtype=np.int32),
    )
    return path


TRAIN = ["--target", TARGET, "--device", "cpu", "--batch-size", "2", "--anchors", "4", "--time-budget", "600"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _synthetic_data(tmp_path_factory.mktemp("data") / "data.npz")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data) -> Path:
    """A real run of one step (its state.safetensors)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    code, out = invoke(
        "train", run, "--data", data, *TRAIN, "--mask-token-id", MASK, "--init-layer", "3", "--steps", "1"
    )
    assert code == 0 and "random weights" not in out, out  # a start from a target layer: no warning
    return run


def _copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


class _Payload:
    """Unpickling this runs code: it writes a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def _hostile_state(run: Path, kind: str, tmp_path: Path) -> Path:
    """RUN/<state file> replaced by something that is not a state this tool wrote."""
    for name in (STATE, LEGACY_STATE):
        target = run / name
        if target.is_dir():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
    legacy, current = run / LEGACY_STATE, run / STATE
    marker = tmp_path / "pwned"
    if kind == "pickle-in-torch-zip":  # what torch.save writes, with a code payload inside
        torch.save({"model": _Payload(marker)}, legacy)
    elif kind == "plain-pickle":
        legacy.write_bytes(pickle.dumps(_Payload(marker)))
    elif kind == "random-bytes":
        legacy.write_bytes(np.random.default_rng(1).bytes(4096))
    elif kind == "random-bytes-safetensors":
        current.write_bytes(np.random.default_rng(1).bytes(4096))
    elif kind == "directory":
        (legacy / "data.pkl").mkdir(parents=True)
    elif kind == "fifo":
        os.mkfifo(current)
    elif kind == "huge-sparse":  # a 64 GiB hole: nothing may read it whole
        with current.open("wb") as f:
            f.truncate(64 << 30)
    elif kind == "corrupt-zip":
        torch.save({"model": {}}, legacy)
        raw = legacy.read_bytes()
        legacy.write_bytes(raw[: len(raw) // 2])
    elif kind == "zip-of-something-else":
        with zipfile.ZipFile(legacy, "w") as z:
            z.writestr("hello.txt", "not a state")
    elif kind == "another-safetensors":  # a checkpoint's weights, not a training state
        save_file({"w": torch.zeros(2, 2)}, str(current), metadata={"format": "pt"})
    elif kind == "a-claim-of-a-huge-tensor":  # a state header whose shapes are not the drafter's
        shutil.copy(tmp_path / "good" / STATE, current)
        state = read_state(current)
        state.model["fc.weight"] = torch.zeros(1, 1).expand(40000, 4000).contiguous()[:1]
        from lilicorr_train.state import save_state

        save_state(run, state)
    return marker


HOSTILE = [
    "pickle-in-torch-zip",
    "plain-pickle",
    "random-bytes",
    "random-bytes-safetensors",
    "directory",
    "fifo",
    "huge-sparse",
    "corrupt-zip",
    "zip-of-something-else",
    "another-safetensors",
    "a-claim-of-a-huge-tensor",
]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_state_that_is_not_ours_is_refused_by_name_and_runs_no_code(trained, data, tmp_path, kind):
    shutil.copytree(trained, tmp_path / "good")
    run = _copy_run(trained, tmp_path)
    marker = _hostile_state(run, kind, tmp_path)
    for args in (["export", run, "--out", tmp_path / "export"], ["train", run, "--data", data, *TRAIN]):
        code, out = invoke(*args)
        assert code == 2, (args[0], out)
        assert str(run) in out and (
            "is not a training state this tool can resume" in out or "cannot read" in out
        ), out
        assert "Traceback" not in out and out.count("\n") <= 2, out
        assert not marker.exists(), "unpickling ran the payload"
    assert not (tmp_path / "export").exists()


def test_a_code_payload_is_named_as_refused_by_the_restricted_unpickler(trained, tmp_path):
    run = _copy_run(trained, tmp_path)
    marker = _hostile_state(run, "pickle-in-torch-zip", tmp_path)
    code, out = invoke("export", run, "--out", tmp_path / "export")
    assert code == 2 and "torch.load(weights_only=True) refused it" in out, out
    assert not marker.exists()


def _save_without_training(monkeypatch) -> None:
    """`fit` replaced by its final save: what a command does before and after training, without the steps."""
    import lilicorr_train.__main__ as cli
    from lilicorr_train.loop import save_run

    def fit(run, run_dir, *args, **kwargs):
        save_run(run, run_dir)
        return False

    monkeypatch.setattr(cli, "fit", fit)


def test_a_run_saved_by_the_earlier_pickle_format_still_resumes_and_exports(
    trained, data, tmp_path, monkeypatch
):
    run = _copy_run(trained, tmp_path)
    state = read_state(run / STATE)
    (run / STATE).unlink()
    torch.save(
        {
            "model": state.model,
            "optimizer": {"state": state.optimizer["state"], "param_groups": state.optimizer["param_groups"]},
            "step": state.step,
            "rng": state.rng,
            "config": state.config,
            "train": state.train,
        },
        run / LEGACY_STATE,
    )  # as save_run wrote it before
    code, out = invoke("export", run, "--out", tmp_path / "export")
    assert code == 0, out
    _save_without_training(monkeypatch)
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 0 and "fit: step 1/2" in out, out  # resumed: its weights, moments and random state loaded
    assert not (run / LEGACY_STATE).exists()  # rewritten as safetensors
    again = read_state(run / STATE)
    assert again.step == 1 and again.train["steps"] == 2
    assert all(torch.equal(again.model[k], v) for k, v in state.model.items())


def test_the_state_is_safetensors_with_a_json_header(trained):
    raw = (trained / STATE).read_bytes()
    header = raw[8 : 8 + int.from_bytes(raw[:8], "little")]
    assert header.startswith(b"{") and b"lilicorr-train-state" in header
    assert not (trained / LEGACY_STATE).exists()
    assert stat.S_IMODE((trained / STATE).stat().st_mode) & 0o044  # readable like any other file, not 0600


@pytest.mark.parametrize(
    "problem",
    [
        "offsets-1e12",
        "offsets-out-of-order",
        "fifo",
        "random-bytes",
        "object-array",
        "claims-more-than-it-holds",
        "missing-array",
    ],
)
def test_data_that_is_not_ours_is_refused_by_name(data, tmp_path, problem):
    path = tmp_path / "data.npz"
    if problem == "offsets-1e12":
        _synthetic_data(path, offsets=[0, 24, 48, 72, 96, 120, int(1e12)])
    elif problem == "offsets-out-of-order":
        _synthetic_data(path, offsets=[0, 48, 24, 72, 96, 120, 144])
    elif problem == "fifo":
        os.mkfifo(path)
    elif problem == "random-bytes":
        path.write_bytes(np.random.default_rng(2).bytes(1000))
    elif problem == "object-array":
        np.savez(path, tokens=np.array([object()] * 3), offsets=np.zeros(2), prompt_lengths=np.zeros(1))
    elif problem == "claims-more-than-it-holds":
        shutil.copy(data, path)
        with zipfile.ZipFile(data) as src, zipfile.ZipFile(path, "w") as dst:
            for info in src.infolist():
                payload = src.read(info)
                if info.filename == "tokens.npy":  # the header says 10^12 values
                    payload = payload.replace(b"(144,)", b"(1000000000000,)")
                dst.writestr(info.filename, payload)
    elif problem == "missing-array":
        np.savez(path, tokens=np.zeros(3, dtype=np.uint16))
    code, out = invoke(
        "train", tmp_path / "run", "--data", path, *TRAIN, "--mask-token-id", MASK, "--init-layer", "3"
    )
    assert code == 2, out
    assert f"{path} is not training data this tool can read" in out and "Traceback" not in out, out
    assert not (tmp_path / "run").exists()


def test_a_fifo_for_the_log_is_refused_not_waited_on(trained, data, tmp_path):
    run = _copy_run(trained, tmp_path)
    (run / "log.jsonl").unlink()
    os.mkfifo(run / "log.jsonl")
    code, out = invoke("train", run, "--data", data, *TRAIN, "--steps", "2")
    assert code == 2 and f"{run / 'log.jsonl'} is a FIFO (named pipe), not a regular file" in out, out


def test_data_of_another_vocabulary_is_refused(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(
        path,
        tokens=np.full(48, 60000, dtype=np.uint16),
        offsets=np.array([0, 24, 48]),
        prompt_lengths=np.array([8, 8], dtype=np.int32),
    )
    code, out = invoke("train", tmp_path / "run", "--data", path, *TRAIN, "--mask-token-id", MASK)
    assert code == 1 and "token id 60000" in out and "vocabulary of 512" in out, out


def test_an_unexpected_error_names_the_inputs_and_is_no_traceback(data, tmp_path, monkeypatch):
    import lilicorr_train.__main__ as cli

    def broken(*args, **kwargs):
        raise TypeError("something unforeseen")

    monkeypatch.setattr(cli, "open_run", broken)
    code, out = invoke(
        "train", tmp_path / "run", "--data", data, *TRAIN, "--mask-token-id", MASK, "--init-layer", "3"
    )
    assert code == 2, out
    assert f"internal error while reading RUN {tmp_path / 'run'}, --data {data}, --target {TARGET}" in out
    assert "TypeError: something unforeseen" in out and "Traceback" not in out


def test_help_teaches_and_names_only_real_commands():
    for flag in ("-h", "--help"):
        # a fresh process: the help is what a user's first call prints, whatever earlier tests left in this one
        ran = subprocess.run(
            [sys.executable, "-m", "lilicorr_train", flag], capture_output=True, text=True, timeout=120
        )
        out = ran.stdout
        assert ran.returncode == 0 and "Usage: python -m lilicorr_train" in out, ran.stdout + ran.stderr
    listed = [
        line.split()[0] for line in out.split("Commands:")[1].split("\n\n")[0].splitlines() if line.strip()
    ]
    steps = out.split("The steps, in order:")[1].split("\n\n")[0]
    named = [line.split()[0] for line in steps.splitlines() if line[4:5].isalpha()]  # a step's first word
    assert named == ["generate", "train", "export", "then"]  # `fit` named no command that exists
    assert listed == named[:3] == list(train_cli.commands)
    assert "Exit codes: 0 done, 1 refused" in out
    for command in train_cli.commands:
        code, text = invoke(command, "-h")
        assert code == 0 and "Example" in text and "Exit codes" in text, text
        assert "\n\n" in text.split("Options:")[0].strip()  # paragraphs, not one run-together block


def _run_old_name(monkeypatch, *args: str) -> int:
    """`python -m lilicorr_runtime.train ARGS` in this process: the exit code."""
    monkeypatch.setattr(sys, "argv", ["lilicorr_runtime.train", *args])
    monkeypatch.delitem(sys.modules, "lilicorr_runtime.train.__main__", raising=False)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("lilicorr_runtime.train", run_name="__main__", alter_sys=True)
    return exited.value.code


def test_the_old_name_forwards_to_the_recipe(monkeypatch, capsys):
    assert _run_old_name(monkeypatch, "--help") == 0
    assert "Usage: python -m lilicorr_train" in capsys.readouterr().out


class _NoRecipe:
    """A finder before every other that has no lilicorr_train, as an install from the wheel has none."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] == "lilicorr_train":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_the_old_name_without_the_recipe_says_where_it_is(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.split(".")[0] == "lilicorr_train"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoRecipe(), *sys.meta_path])
    assert _run_old_name(monkeypatch, "--help") == 4
    err = capsys.readouterr().err
    assert "the training recipe is not installed" in err and "python -m lilicorr_train" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["train", "RUN", "--data", "DATA", *TRAIN],  # a new run without --mask-token-id
        [
            "train",
            "RUN",
            "--data",
            "DATA",
            *TRAIN,
            "--mask-token-id",
            MASK,
            "--init-layer",
            "9",
        ],  # the target has 4
        ["train", "RUN", "--data", "DATA", *TRAIN, "--mask-token-id", "5000"],  # past the vocabulary
        ["train", "RUN", "--data", "DATA", *TRAIN, "--bogus"],
        ["fit", "RUN"],
        ["export"],
    ],
)
def test_usage_errors_exit_4(data, tmp_path, args):
    args = [str(tmp_path / "run") if a == "RUN" else str(data) if a == "DATA" else a for a in args]
    code, out = invoke(*args)
    assert code == 4, out
    assert "Traceback" not in out and not (tmp_path / "run").exists()


def test_a_start_from_random_weights_is_warned_about(data, tmp_path, monkeypatch):
    _save_without_training(monkeypatch)
    code, out = invoke(
        "train", tmp_path / "cold", "--data", data, *TRAIN, "--mask-token-id", MASK, "--steps", "1"
    )
    assert (
        code == 0 and "warning: the drafter starts from random weights" in out and "--init-layer 3" in out
    ), out


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_writes_files_with_the_users_umask(trained, tmp_path, umask):
    old = os.umask(umask)
    try:
        code, out = invoke("export", trained, "--out", tmp_path / "export")
    finally:
        os.umask(old)
    assert code == 0, out
    for name in ("config.json", "model.safetensors"):
        assert stat.S_IMODE((tmp_path / "export" / name).stat().st_mode) == 0o666 & ~umask, name


def test_export_replaces_an_earlier_export_and_nothing_else(trained, tmp_path):
    out_dir = tmp_path / "export"
    assert invoke("export", trained, "--out", out_dir)[0] == 0
    assert invoke("export", trained, "--out", out_dir)[0] == 0  # an earlier export: replaced
    (out_dir / "README.md").write_text("mine")
    code, out = invoke("export", trained, "--out", out_dir)
    assert code == 4 and "README.md, which an export did not write" in out, out
    assert (out_dir / "README.md").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_without_torch_the_cli_says_what_to_install(tmp_path):
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)  # shadows the installed torch: importing it fails as if it were missing
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(REPO)])}
    for args in (["--help"], ["export", "run", "--out", "x"]):
        result = subprocess.run(
            [sys.executable, "-m", "lilicorr_train", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert result.returncode == 4, result.stderr
        assert "lilicorr_runtime needs torch" in result.stderr and "pip install '.[runtime]'" in result.stderr
        assert "Traceback" not in result.stderr
    imported = subprocess.run(
        [sys.executable, "-c", "import lilicorr_runtime"], capture_output=True, text=True, env=env, timeout=60
    )  # as a library: an ImportError that says the same
    assert imported.returncode == 1 and "ModuleNotFoundError: lilicorr_runtime needs torch" in imported.stderr
