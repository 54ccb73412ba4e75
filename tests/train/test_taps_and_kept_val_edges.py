"""Edge cases of a run from a trained drafter's taps and of a kept held-out set (found by a review):

- `train --init-from D` takes D's target_layer_ids, so a drafter of a deeper target (a tap past this one's
  layers) is refused, naming the layers, before a run would train on features no layer wrote;
- `pieces fit --init-from D` (no --taps) refuses it naming --init-from, not --taps, which was not given;
- `mixes build --keep-val V` with none of V's prompts in the shards (another --dir, another target) is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from lilicorr_runtime.target.load import load_target
from lilicorr_train import mixes, pieces
from lilicorr_train.__main__ import main as train_cli
from lilicorr_train.data import Dataset
from lilicorr_train.export import DrafterShape, build_drafter, drafter_config, export_modelopt
from lilicorr_train.mixes import Shard, write_npz

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")  # 4 layers, 512 ids


@pytest.fixture
def deeper_drafter(tmp_path: Path) -> Path:
    """A drafter whose taps (0, 9) name a layer past tiny-target's four: trained for a deeper target."""
    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    assert target.num_layers <= 9
    config = drafter_config(target.config, DrafterShape(target_layer_ids=(0, 9), mask_token_id=511))
    torch.manual_seed(0)
    export_modelopt(build_drafter(config), config, tmp_path / "deeper", dtype=torch.float32)
    return tmp_path / "deeper"


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 500, 6 * 40).astype(np.uint16)
    offsets = np.arange(7, dtype=np.int64) * 40
    prompts = np.full(6, 10, dtype=np.int32)
    Dataset(tokens, offsets, prompts).save(tmp_path / "train.npz")
    six = Shard(tokens, offsets, prompts, np.arange(6, dtype=np.uint8) % 3, np.zeros(6, dtype=np.uint8))
    write_npz(tmp_path / "val.npz", six.arrays())
    return tmp_path / "train.npz", tmp_path / "val.npz"


def test_train_init_from_refuses_a_drafter_tapping_past_the_targets_layers(tmp_path, deeper_drafter, data):
    result = CliRunner().invoke(
        train_cli,
        [
            "train", str(tmp_path / "run"), "--target", TARGET, "--data", str(data[0]), "--device", "cpu",
            "--batch-size", "2", "--anchors", "2", "--mask-token-id", "511", "--steps", "1",
            "--init-from", str(deeper_drafter),
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "[9] are not layers of this target (0 to 3)" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "state.safetensors").exists()


def test_fit_init_from_names_init_from_not_taps_for_a_drafter_of_a_deeper_target(
    tmp_path, deeper_drafter, data, capsys
):
    argv = [
        "fit", str(tmp_path / "run"), "--target", TARGET, "--data", str(data[0]), "--val", str(data[1]),
        "--device", "cpu", "--mask-token-id", "511", "--steps", "1", "--init-from", str(deeper_drafter),
    ]  # fmt: skip
    try:
        code = pieces.main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert "--init-from" in err and "[9] are not layers of this target" in err and "--taps" not in err, err


def test_keep_val_with_none_of_its_prompts_in_the_shards_is_not_silent(tmp_path, capsys):
    rng = np.random.default_rng(1)
    shards = tmp_path / "shards"
    shards.mkdir()
    n, length = 40, 20
    for index in range(2):
        shard = Shard(
            rng.integers(3, 500, n * length).astype(np.uint16),
            np.arange(n + 1, dtype=np.int64) * length,
            np.full(n, 8, np.int32),
            (np.arange(n) % 3).astype(np.uint8),
            np.zeros(n, np.uint8),
        )
        write_npz(shards / f"shard-{index:04d}.npz", shard.arrays())
        (shards / f"shard-{index:04d}.json").write_text("{}\n")
    # a held-out set of another target's vocabulary: none of its prompts is in these shards
    k = 5
    other = Shard(
        rng.integers(40_000, 60_000, k * length).astype(np.uint16),
        np.arange(k + 1, dtype=np.int64) * length,
        np.full(k, 8, np.int32),
        np.zeros(k, np.uint8),
        np.zeros(k, np.uint8),
    )
    write_npz(tmp_path / "other-val.npz", other.arrays())
    code = mixes.main(
        [
            "build", "--dir", str(shards), "--train", str(tmp_path / "t.npz"), "--val", str(tmp_path / "v.npz"),
            "--keep-val", str(tmp_path / "other-val.npz"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "none of the 5 prompts of --keep-val" in err, err
    assert not (tmp_path / "t.npz").exists() and not (tmp_path / "v.npz").exists()
