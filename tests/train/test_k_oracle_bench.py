"""bench/k_oracle.py: the oracle's acceptance at each candidate count K, against the drafter's own walks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lilicorr_runtime.ops import topk_lse
from lilicorr_runtime.target.load import load_target
from lilicorr_train.export import DrafterShape, build_drafter, drafter_config, export_modelopt
from lilicorr_train.loop import init_from_target
from lilicorr_train.mixes import Shard, write_npz

from helpers import REPO, load_script

TARGET = str(REPO / "examples" / "tiny-target")
PROG = "python bench/k_oracle.py:"


def _bench():
    return load_script("bench/k_oracle.py", "k_oracle_bench")


def _shard(seqs: list[list[int]], prompt_lengths: list[int]) -> Shard:
    return Shard(
        tokens=np.concatenate(seqs).astype(np.uint16),
        offsets=np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        prompt_lengths=np.array(prompt_lengths, dtype=np.int32),
        category=np.array([i % 3 for i in range(len(seqs))], dtype=np.uint8),
        source=np.zeros(len(seqs), dtype=np.uint8),
    )


def _edited(src, dst, **dflash):
    """A copy of the checkpoint `src` at `dst` with its config's dflash_config entries replaced."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["dflash_config"].update(dflash)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


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
    write_npz(tmp / "val.npz", _shard(seqs, [len(p) for p in prompts]).arrays())
    # every sequence all prompt: no answer position to anchor a block at
    write_npz(tmp / "no_answers.npz", _shard(seqs, [len(s) for s in seqs]).arrays())
    return tmp / "drafter", tmp / "val.npz", config["dflash_config"]["lilicorr_candidate_topk"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = _bench().main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_oracle_rises_with_k_from_the_control_and_bounds_the_head(inputs, capsys):
    drafter, val, trained_k = inputs
    ks = sorted({1, 2, trained_k, 2 * trained_k})
    argv = [str(drafter), "--target", TARGET, "--val", str(val), "--device", "cpu", "--json"]
    code, out, _ = _run([*argv, "--ks", ",".join(map(str, ks)), "--batch", "3"], capsys)
    assert code == 0
    result = json.loads(out)
    assert result["sequences"] == 8 and result["anchors"] > 0 and result["trained_k"] == trained_k
    oracle = {int(k): v for k, v in result["oracle_tau"].items()}
    coverage = {int(k): v for k, v in result["coverage"].items()}
    assert sorted(oracle) == ks
    # K = 1's oracle is the argmax walk: the same blocks, counted by another path
    assert oracle[1] == pytest.approx(result["tau_control"], abs=1e-4)
    assert all(oracle[a] <= oracle[b] for a, b in zip(ks, ks[1:], strict=False))
    assert oracle[ks[-1]] > oracle[1]  # an untrained drafter's top candidate is often not the truth
    assert all(0.0 <= c <= 1.0 for k in ks for c in coverage[k])
    assert all(
        x <= y + 1e-9
        for a, b in zip(ks, ks[1:], strict=False)
        for x, y in zip(coverage[a], coverage[b], strict=True)
    )
    # a head walks the trained K's candidates: it can accept no more than the oracle does there
    assert 1.0 <= result["tau_head"] <= oracle[trained_k] + 1e-9
    rank = result["ranking"]
    blocks = rank["blocks"]
    assert blocks[0] > 0 and all(x >= y for x, y in zip(blocks, blocks[1:], strict=False))  # a prefix shrinks
    # the prefix's blocks at slot 1 are those whose truth is among the trained K there
    assert blocks[0] <= round(coverage[trained_k][0] * result["anchors"]) + 1
    assert all(0.0 <= r <= 1.0 for r in rank["head_first"] + rank["argmax_first"])
    # the batch does not change what is measured (each sequence keeps its fixed anchors)
    code, out, _ = _run([*argv, "--ks", ",".join(map(str, ks)), "--batch", "8"], capsys)
    again = json.loads(out)
    for key in ("anchors", "tau_control", "tau_head", "oracle_tau", "coverage"):
        assert again[key] == result[key], key
    # the trained K is measured even when --ks leaves it out (its row is the head's ceiling); with the whole
    # vocabulary as candidates every true token is covered: each slot's coverage counts the blocks that reach it
    code, out, _ = _run([*argv, "--ks", "1,512", "--limit", "3"], capsys)
    every = json.loads(out)
    assert code == 0 and sorted(map(int, every["oracle_tau"])) == [1, trained_k, 512]
    assert every["coverage"]["512"] == [1.0] * (len(coverage[1]))
    code, out, _ = _run([*argv[:-1], "--ks", "1", "--limit", "3"], capsys)
    assert code == 0 and f"| {trained_k} (trained) |" in out and "of its K = " in out


def test_the_ranks_are_the_candidates_order_ties_included():
    """rank < K is exactly "the truth is among topk_lse's K candidates", on logits full of ties (column order
    among equal values, as decoding takes them): torch.topk's order of equal values is unspecified."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 6, (64, 40), generator=g).float()  # ~7 columns share each value
    truth = torch.randint(0, 40, (64,), generator=g)
    rank = _bench().true_ranks(logits, truth)
    for k in (1, 2, 5, 8, 17, 40):
        _, ids, _ = topk_lse(logits, k)
        assert torch.equal(rank < k, (ids == truth[:, None]).any(-1)), k
    assert torch.equal(rank == 0, topk_lse(logits, 1)[1][:, 0] == truth)


def test_a_drafter_without_a_head_has_the_control_only(inputs, tmp_path, capsys):
    drafter, val, _ = inputs
    headless = _edited(drafter, tmp_path / "headless", lilicorr_enabled=False)
    options = ["--device", "cpu", "--ks", "1,4", "--limit", "4"]
    argv = [str(headless), "--target", TARGET, "--val", str(val), *options]
    code, out, _ = _run([*argv, "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["trained_k"] is None and result["tau_head"] is None
    assert result["oracle_tau"]["1"] == pytest.approx(result["tau_control"], abs=1e-4)
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "| 4 |" in out and "head" not in out.split("\n")[1]


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(PROG)]
    assert len(lines) == 1, err
    return lines[0]


def _exit_code(argv: list[str]) -> int:
    """main's exit code, argparse's included (it exits)."""
    try:
        return _bench().main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize(
    "change, code, words",
    [
        ({"--ks": "0,4"}, 4, "at least 1"),
        ({"--ks": "4096"}, 4, "past the target's vocabulary"),
        ({"--limit": "0"}, 4, "--limit"),
        ({"--batch": "0"}, 4, "--batch"),
        ({"--device": "foo"}, 4, "give cpu, cuda"),
        ({"--val": "<tmp>/missing.npz"}, 2, "missing.npz"),
        ({"--val": "<tmp>/no_answers.npz"}, 2, "no sequence has an answer token"),
        ({"drafter": "<tmp>/missing"}, 2, "does not exist"),
        ({"drafter": "<tmp>/taps_past_the_target"}, 4, "reach past the target's 4 layers"),
        ({"drafter": str(REPO / "examples" / "tiny-lilicorr")}, 4, "full-attention drafter"),
    ],
)
def test_bad_inputs_are_one_line_errors(inputs, capsys, change, code, words):
    drafter, val, _ = inputs
    folder = drafter.parent
    if not (folder / "taps_past_the_target").exists():
        _edited(drafter, folder / "taps_past_the_target", target_layer_ids=[1, 7])
    options = {
        "drafter": str(drafter),
        "--target": TARGET,
        "--val": str(val),
        "--device": "cpu",
        "--limit": "2",
    }
    options.update({key: value.replace("<tmp>", str(folder)) for key, value in change.items()})
    argv = [options.pop("drafter")] + [x for pair in options.items() for x in pair]
    got = _exit_code(argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert words in _one_error_line(err)


def test_the_ranking_conditions_each_slot_on_the_true_previous_candidate():
    """Slot 1: the truth is candidate 1, the head's start scores prefer 0 (wrong), the argmax is 0 (wrong). Slot 2:
    the truth is candidate 0; from the true previous candidate (1) the head's pair row prefers 0 (right), from its
    own wrong pick (0) it would prefer 1. Slot 3: the truth is no candidate, so the block leaves the prefix."""
    ids = torch.tensor([[[[5, 6], [7, 8], [9, 10]]]])
    truth = torch.tensor([[[6, 7, 11]]])
    start = torch.tensor([[1.0, 0.0]])
    pairs = torch.tensor([[[[0.0, 5.0], [2.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]])
    valid = torch.ones(1, 1, 3, dtype=torch.bool)
    inside, head, argmax = _bench().ranking(ids, start, pairs, truth, valid)
    assert inside.tolist() == [1, 1, 0]
    assert head.tolist() == [0, 1, 0]
    assert argmax.tolist() == [0, 1, 0]
    # a slot outside the sequence ends the prefix as a missed candidate does
    inside, _, _ = _bench().ranking(ids, start, pairs, torch.tensor([[[6, 7, 9]]]), valid.clone().fill_(True))
    assert inside.tolist() == [1, 1, 1]
    inside, _, _ = _bench().ranking(
        ids, start, pairs, torch.tensor([[[6, 7, 9]]]), torch.tensor([[[1, 0, 1]]]).bool()
    )
    assert inside.tolist() == [1, 0, 0]
