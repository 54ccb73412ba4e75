"""NaN passes every comparison, so a range check alone takes it: the recipe's number options refuse NaN and the
infinities as usage errors (exit 4) before any work. Before, `--code-share nan` and `--plan-seconds nan` ended
as internal errors blaming --target, `--time-budget nan` never ran out, and `pieces fit --lr-head -1` trained
with a negative learning rate."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lilicorr_train import pieces
from lilicorr_train.__main__ import main as train_cli

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")
TRAIN = [
    "train",
    "run",
    "--target",
    TARGET,
    "--device",
    "cpu",
    "--data",
    "data.npz",
    "--mask-token-id",
    "511",
]


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--target", TARGET, "--out", "g.npz", "--prompts", "4", "--code-share", "nan"],
        [*TRAIN, "--init-layer", "3", "--plan-seconds", "nan"],
        [*TRAIN, "--init-layer", "3", "--plan-seconds", "inf"],
        [*TRAIN, "--init-layer", "3", "--time-budget", "nan"],
        [*TRAIN, "--init-layer", "3", "--lr-drafter", "nan"],
        [*TRAIN, "--init-layer", "3", "--lr-head", "nan"],
    ],
    ids=lambda a: " ".join(a[-2:]),
)
def test_train_and_generate_refuse_non_finite_numbers(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.npz").write_bytes(b"never read: the options are checked first")
    result = CliRunner().invoke(train_cli, args)
    assert result.exit_code == 4, result.output
    assert "is not a finite number" in result.output and "internal error" not in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["data.npz"]  # refused before any work


@pytest.mark.parametrize("option", ["--lr-drafter", "--lr-head"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "2"])
def test_fit_refuses_a_learning_rate_out_of_range(tmp_path, capsys, option, value):
    argv = ["fit", str(tmp_path / "run"), "--target", TARGET, "--data", "d.npz", "--val", "v.npz"]
    with pytest.raises(SystemExit) as ended:  # argparse's usage error, as the script's Parser ends it
        pieces.main([*argv, option, value])
    assert ended.value.code == 4
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "from 0 to 1" in err, err
    assert list(tmp_path.iterdir()) == []
