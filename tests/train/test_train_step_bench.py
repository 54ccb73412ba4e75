"""bench/train_step.py: one fit step's phases timed apart, on the tiny target."""

from __future__ import annotations

import re

import numpy as np

from helpers import REPO, load_script


def _bench():
    return load_script("bench/train_step.py", "train_step_bench")


def test_random_data_never_holds_the_mask_token_and_marks_a_quarter_prompt():
    data = _bench().random_data(vocab=512, mask_token_id=7, count=5, length=40)
    assert len(data) == 5 and data.lengths().tolist() == [40] * 5
    assert not (data.tokens == 7).any() and data.tokens.max() < 512
    assert data.prompt_lengths.tolist() == [10] * 5


def test_the_table_times_every_phase_of_a_fit_step(capsys):
    args = "--target {} --device cpu --batch-size 2 --anchors 3 --length 40 --steps 2 --warmup 1"
    assert _bench().main(args.format(REPO / "examples" / "tiny-target").split()) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (\w+) \| ([\d.]+) \|", out, re.M))
    assert set(rows) == {"batch", "target", "forward", "backward", "optimizer", "step"}
    assert all(float(v) > 0 for v in rows.values())
    assert abs(sum(float(rows[p]) for p in rows if p != "step") - float(rows["step"])) < 0.05
    assert "2 sequences x 3 anchors" in out and "tokens/s" in out


def test_padding_compares_the_fits_batches_with_random_ones():
    bench = _bench()
    assert bench.padding(np.full(50, 40), 8, seed=0) == (1.0, 1.0)  # equal lengths: nothing to pad
    lengths = np.random.default_rng(1).integers(20, 600, 300)
    cut, drawn = bench.padding(lengths, 8, seed=0)
    assert 1.0 < cut < 1.15 < 1.4 < drawn, (cut, drawn)
