"""The v3 data pipeline on the CPU with the tiny target: resumable shards (skipped when done), the build into a
training set and a held-out set that never share a prompt, the held-out tau logged per training piece, and the
training curve drawn from the log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lilicorr_ckpt.errors import InputError
from lilicorr_runtime.target.load import load_target
from lilicorr_train import mixes, prompts
from lilicorr_train.data import Dataset
from lilicorr_train.mixes import Plan, Shard, build, cut_stub, generate, prompt_hash, shard_counts, write_npz

from helpers import REPO

TARGET = str(REPO / "examples" / "tiny-target")
PLAN = Plan(
    name="tiny",
    shards=3,
    prompts_per_shard=24,
    pool_slice=10,
    template_draws=60,
    max_new_tokens=10,
    request_tokens=12,
    stub_tokens=16,
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prompts, "STDLIB_FILES", 150)
        target = load_target(TARGET, dtype="float32", device="cpu", fast=True)
        out = tmp_path_factory.mktemp("mix") / "shards"
        lines: list[str] = []
        made = generate(target, out, plan=PLAN, budget_s=600, last=1, batch_size=8, log=lines.append)
        assert made == [0, 1]
        # a second call finds both done and makes only the one missing
        again = generate(target, out, plan=PLAN, budget_s=600, batch_size=8, log=lines.append)
        assert again == [2]
    return out


def test_shard_counts_fill_every_shard():
    for index in (0, 5, 500):
        counts = shard_counts(mixes.PLAN, index, 90_000)
        assert sum(counts.values()) == mixes.PLAN.prompts_per_shard
    assert shard_counts(mixes.PLAN, 0, 90_000)["pool"] == mixes.PLAN.pool_slice
    assert shard_counts(mixes.PLAN, 500, 90_000)["pool"] == 0  # past the pool: all self-written


def test_shards_are_compact_and_described(shards):
    for index in range(3):
        info = json.loads((shards / f"shard-{index:04d}.json").read_text())
        shard = Shard.load(shards / f"shard-{index:04d}.npz")
        assert info["sequences"] == len(shard) > 0 and info["fingerprint"] == PLAN.fingerprint()
        assert shard.tokens.dtype == np.uint16
        assert (shard.prompt_lengths < np.diff(shard.offsets)).all()
        assert set(shard.category.tolist()) <= {0, 1, 2} and set(shard.source.tolist()) <= {0, 1, 2, 3}
        assert info["probe_dropped"] == []


def test_build_splits_by_prompt_and_drops_repeats(shards, tmp_path):
    summary = build(shards, tmp_path / "train.npz", tmp_path / "val.npz", per_mille=300, val_per_category=4)
    train, val = Dataset.load(tmp_path / "train.npz"), Shard.load(tmp_path / "val.npz")
    assert summary["train_sequences"] == len(train) and summary["val_sequences"] == len(val) > 0
    train_prompts = {prompt_hash(train.sequence(i)[: train.prompt_lengths[i]]) for i in range(len(train))}
    val_prompts = {prompt_hash(val.prompt(i)) for i in range(len(val))}
    assert not train_prompts & val_prompts
    assert len(train_prompts) == len(train)  # no prompt twice
    assert all(h % 1000 < 300 for h in val_prompts)
    # deterministic
    again = build(shards, tmp_path / "t2.npz", tmp_path / "v2.npz", per_mille=300, val_per_category=4)
    assert again == summary
    assert (Dataset.load(tmp_path / "t2.npz").tokens == train.tokens).all()


def test_cut_stub_keeps_a_parsing_signature_and_its_docstring():
    text = 'import math\n\n\ndef area(r: float) -> float:\n    """Area of a circle of radius r."""\n    return 1\n'
    assert (
        cut_stub(text)
        == 'import math\n\n\ndef area(r: float) -> float:\n    """Area of a circle of radius r."""\n'
    )
    assert cut_stub("def count_down(self, n):\n        return n\n") == "def count_down(self, n):\n"
    assert cut_stub("def 2000_x::add(x):\n    return x") is None
    assert cut_stub("def f(x)\n    return x") is None
    assert cut_stub('def f(x):\n    """never closed') is None
    assert cut_stub("print(1)") is None


def test_pieces_log_the_heldout_tau_and_the_curve_draws(shards, tmp_path):
    build(shards, tmp_path / "train.npz", tmp_path / "val.npz", per_mille=300, val_per_category=4)
    run = tmp_path / "run"
    common = [
        sys.executable,
        "-m",
        "lilicorr_train.pieces",
        "fit",
        str(run),
        "--target",
        TARGET,
        "--data",
        str(tmp_path / "train.npz"),
        "--val",
        str(tmp_path / "val.npz"),
        "--batch-size",
        "2",
        "--anchors",
        "4",
        "--device",
        "cpu",
    ]
    first = [*common, "--taps", "1,2", "--init-layer", "3", "--mask-token-id", "511", "--steps", "3"]
    subprocess.run(first, check=True, cwd=REPO, capture_output=True)
    subprocess.run([*common, "--steps", "5"], check=True, cwd=REPO, capture_output=True)
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    held = [r for r in records if "heldout_step" in r]
    assert [r["heldout_step"] for r in held] == [0, 3, 5]
    for r in held:
        assert r["val_anchors"] > 0 and r["val_tau_control"] >= 1 and r["val_tau_head"] >= 1
        assert r["val_walk_sequences"] > 0 and r["val_walk_tau_control"] >= 1 and r["val_walk_tau_head"] >= 1
        assert "step" not in r  # training-record readers (the card) skip it
    state = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else None
    assert state is None  # the run holds its state, not an export
    svg = tmp_path / "curve.svg"
    subprocess.run(
        [sys.executable, "scripts/plot_training.py", f"tiny={run / 'log.jsonl'}", "--out", str(svg)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    text = svg.read_text()
    assert text.startswith("<svg") and "polyline" in text and "tiny" in text
    assert 'stroke-dasharray="1,3"' in text  # the held-out decode walk's line


def test_cut_stub_keeps_code_that_only_warns_and_says_nothing(recwarn):
    """The target writes `1if` (a SyntaxWarning, "invalid decimal literal"): the stub is kept as before, and the
    generation log stays free of the warning."""
    text = "def pick(x=1if True else 2):\n    return x\n"
    assert cut_stub(text) == "def pick(x=1if True else 2):\n"
    assert not [w for w in recwarn if issubclass(w.category, SyntaxWarning)]


def test_build_keeps_an_earlier_held_out_set_whatever_the_shards_order(shards, tmp_path, capsys):
    """--keep-val: a build over other shards (here the last one first, which alone would pick another held-out
    set) writes the earlier held-out set again, and none of its prompts reaches the training set, even one the
    hash would not hold out; an input it would overwrite, or an empty set, is refused."""
    build(shards, tmp_path / "t0.npz", tmp_path / "v0.npz", shards=[0, 1], per_mille=300, val_per_category=4)
    first = Shard.load(tmp_path / "v0.npz")
    kept = {prompt_hash(first.prompt(i)) for i in range(len(first))}
    moved = build(
        shards, tmp_path / "t1.npz", tmp_path / "v1.npz", shards=[2, 1, 0], per_mille=300, val_per_category=4
    )
    other = Shard.load(tmp_path / "v1.npz")
    assert {prompt_hash(other.prompt(i)) for i in range(len(other))} != kept  # the order alone moves it

    report = build(
        shards, tmp_path / "t2.npz", tmp_path / "v2.npz", shards=[2, 1, 0], per_mille=300,
        val_per_category=4, keep_val=tmp_path / "v0.npz",
    )  # fmt: skip
    again = Shard.load(tmp_path / "v2.npz")
    assert np.array_equal(again.tokens, first.tokens) and np.array_equal(again.offsets, first.offsets)
    assert report["val_sequences"] == len(first) and report["kept_val_found"] == len(first)
    train = Dataset.load(tmp_path / "t2.npz")
    train_prompts = {prompt_hash(train.sequence(i)[: train.prompt_lengths[i]]) for i in range(len(train))}
    assert not train_prompts & kept
    # the kept prompts are among the hash's held-out ones here, so the training set is the one without --keep-val
    assert report["train_sequences"] == moved["train_sequences"]

    # a kept prompt the hash would not hold out (a held-out rule of another build) still stays out of training
    report = build(
        shards, tmp_path / "t3.npz", tmp_path / "v3.npz", shards=[0, 1, 2], per_mille=0,
        keep_val=tmp_path / "v0.npz",
    )  # fmt: skip
    train = Dataset.load(tmp_path / "t3.npz")
    assert not {prompt_hash(train.sequence(i)[: train.prompt_lengths[i]]) for i in range(len(train))} & kept
    assert report["val_sequences"] == len(first)

    # refusals, through the command line: the kept set as an output, and an empty one
    argv = ["build", "--dir", str(shards), "--train", str(tmp_path / "t4.npz")]
    before = (tmp_path / "v0.npz").read_bytes()
    assert mixes.main([*argv, "--val", str(tmp_path / "v0.npz"), "--keep-val", str(tmp_path / "v0.npz")]) == 4
    assert "--keep-val" in capsys.readouterr().err
    assert (tmp_path / "v0.npz").read_bytes() == before and not (tmp_path / "t4.npz").exists()
    with pytest.raises(InputError, match="more than a held-out set's 3 .1 a category.: a shard"):
        build(
            shards,
            tmp_path / "t7.npz",
            tmp_path / "v7.npz",
            val_per_category=1,
            keep_val=shards / "shard-0001.npz",
        )
    empty = build(shards, tmp_path / "t5.npz", tmp_path / "v5.npz", per_mille=0)
    assert empty["val_sequences"] == 0
    code = mixes.main([*argv, "--val", str(tmp_path / "v6.npz"), "--keep-val", str(tmp_path / "v5.npz")])
    assert code == 2 and "holds no sequence" in capsys.readouterr().err


def test_a_shard_short_of_memory_halves_its_batch_and_the_next_tries_the_full_one_again(
    tmp_path, monkeypatch
):
    """generate: an out-of-memory halves the batch until the shard fits; the next shard starts at the asked size
    again (one long batch), and only two shards short in a row keep the smaller batch; other errors, and memory
    short at 64 prompts, are raised."""
    limits = {1: 512, 3: 256, 4: 256}  # the largest batch each shard fits (others: any)
    tried: dict[int, list[int]] = {}

    def fake_shard(target, plan, index, pool, probes, size):
        tried.setdefault(index, []).append(size)
        if size > limits.get(index, size):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return None, {"probe_dropped": []}

    monkeypatch.setattr(mixes, "cpu_pool", lambda plan, probes, cache=None: ([], 0))
    monkeypatch.setattr(mixes, "ProbeIndex", lambda: None)
    monkeypatch.setattr(mixes, "generate_shard", fake_shard)
    monkeypatch.setattr(mixes, "save_shard", lambda directory, index, shard, info: None)
    lines: list[str] = []
    six = Plan(
        name="oom", shards=6, prompts_per_shard=4, pool_slice=1, template_draws=1, max_new_tokens=1,
        request_tokens=1, stub_tokens=1,
    )  # fmt: skip
    made = generate(None, tmp_path, plan=six, budget_s=600, batch_size=1024, log=lines.append)
    assert made == [0, 1, 2, 3, 4, 5]
    assert tried == {
        0: [1024],
        1: [1024, 512],
        2: [1024],  # one short shard: the next tries the full batch
        3: [1024, 512, 256],
        4: [1024, 512, 256],  # two in a row: the smaller batch from now on
        5: [256],
    }
    assert sum('"out_of_memory": true' in line for line in lines) == 5
    assert any('"batch_size_from_now": 256' in line for line in lines)

    limits.clear()
    limits[0] = 32
    tried.clear()
    with pytest.raises(InputError, match="shard 0: out of GPU memory at a batch of 64 prompts"):
        generate(None, tmp_path, plan=PLAN, budget_s=600, batch_size=128, log=lines.append)
    assert tried == {0: [128, 64]}

    def broken(*args):
        raise RuntimeError("device-side assert triggered")

    monkeypatch.setattr(mixes, "generate_shard", broken)
    with pytest.raises(RuntimeError, match="device-side assert"):
        generate(None, tmp_path, plan=PLAN, budget_s=600, batch_size=1024, log=lines.append)


def test_keep_val_with_none_of_its_prompts_in_the_shards_is_refused(tmp_path, capsys):
    """A --keep-val set of another --dir or target (none of its prompts in these shards) is refused, nothing
    written."""
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


def test_build_refuses_sets_named_as_shards_of_its_own_dir(shards, tmp_path, capsys):
    """`--train D/shard-0009.npz --val D/shard-0009.json` wrote a training set and a held-out set that the next
    build (and `generate`) took for a done shard 9; such names in --dir are refused, nothing written, and the same
    names elsewhere, or other names in --dir, are still written."""
    before = sorted(p.name for p in shards.iterdir())
    for train, val in (("shard-0009.npz", "shard-0009.json"), ("t.npz", "shard-0009.json")):
        argv = ["build", "--dir", str(shards), "--train", str(shards / train), "--val", str(shards / val)]
        assert mixes.main(argv) == 4
        err = capsys.readouterr().err
        assert "named as a shard of --dir" in err and "Traceback" not in err, err
        assert sorted(p.name for p in shards.iterdir()) == before
    argv = ["build", "--dir", str(shards), "--train", str(tmp_path / "shard-0009.npz")]
    assert mixes.main([*argv, "--val", str(shards / "val.npz")]) == 0, capsys.readouterr().err
    assert (tmp_path / "shard-0009.npz").is_file() and (shards / "val.npz").is_file()
    (shards / "val.npz").unlink()  # the module's shards stay as they were for the other tests
