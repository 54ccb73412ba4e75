"""bench/k_oracle.py: the oracle's acceptance at each candidate count K, against the drafter's own walks."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from lilicorr_runtime.target.load import load_target
from lilicorr_train.export import DrafterShape, build_drafter, drafter_config, export_modelopt
from lilicorr_train.loop import init_from_target
from lilicorr_train.mixes import Shard, write_npz

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")


def _bench():
    spec = importlib.util.spec_from_file_location("k_oracle_bench", REPO / "bench" / "k_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A drafter started from the tiny target's layer 3 (untrained: its candidates are often wrong, so the K rows
    differ) and a held-out set of the target's own greedy answers to eight prompts."""
    tmp = tmp_path_factory.mktemp("k_oracle")
    torch.manual_seed(0)
    target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
    shape = DrafterShape(target_layer_ids=(1, 2), mask_token_id=511, head_hidden_size=32, head_num_heads=2)
    config = drafter_config(target.config, shape)
    drafter = build_drafter(config)
    init_from_target(drafter, target, 3)
    export_modelopt(drafter, config, tmp / "drafter")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 14, 20, 7, 11, 6, 8)]
    answers = target.generate_batch(prompts, 40, eos_token_ids=(), batch_size=8)
    seqs = [p + a for p, a in zip(prompts, answers, strict=True)]
    shard = Shard(
        tokens=np.concatenate(seqs).astype(np.uint16),
        offsets=np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        prompt_lengths=np.array([len(p) for p in prompts], dtype=np.int32),
        category=np.array([0, 1, 2] * 2 + [0, 1], dtype=np.uint8),
        source=np.zeros(len(seqs), dtype=np.uint8),
    )
    write_npz(tmp / "val.npz", shard.arrays())
    return tmp / "drafter", tmp / "val.npz", config["dflash_config"]["lilicorr_candidate_topk"]


def test_the_oracle_rises_with_k_from_the_control_and_bounds_the_head(inputs, capsys):
    drafter, val, trained_k = inputs
    ks = sorted({1, 2, trained_k, 2 * trained_k})
    argv = [str(drafter), "--target", TARGET, "--val", str(val), "--device", "cpu", "--json"]
    assert _bench().main([*argv, "--ks", ",".join(map(str, ks)), "--batch", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sequences"] == 8 and result["anchors"] > 0 and result["trained_k"] == trained_k
    oracle = {int(k): v for k, v in result["oracle_tau"].items()}
    coverage = {int(k): v for k, v in result["coverage"].items()}
    # K = 1's oracle is the argmax walk: the same blocks, counted by another path
    assert oracle[1] == pytest.approx(result["tau_control"], abs=1e-4)
    assert all(oracle[a] <= oracle[b] for a, b in zip(ks, ks[1:], strict=False))
    assert oracle[ks[-1]] > oracle[1]  # an untrained drafter's top candidate is often not the truth
    assert all(
        x <= y + 1e-9
        for a, b in zip(ks, ks[1:], strict=False)
        for x, y in zip(coverage[a], coverage[b], strict=True)
    )
    # a head walks the trained K's candidates: it can accept no more than the oracle does there
    assert 1.0 <= result["tau_head"] <= oracle[trained_k] + 1e-9
    # the batch does not change what is measured
    assert _bench().main([*argv, "--ks", ",".join(map(str, ks)), "--batch", "8"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["oracle_tau"] == result["oracle_tau"] and again["tau_head"] == result["tau_head"]


def test_bad_options_are_one_line_errors(inputs, capsys):
    drafter, val, _ = inputs
    with pytest.raises(SystemExit) as exc:
        _bench().main([str(drafter), "--target", TARGET, "--val", str(val), "--ks", "0,4"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err
    assert _bench().main([str(drafter), "--target", TARGET, "--val", str(val), "--ks", "4096"]) != 0
    assert "past the target's vocabulary" in capsys.readouterr().err
