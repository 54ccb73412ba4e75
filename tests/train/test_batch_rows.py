"""lilicorr_train.loop.batch_rows: the fit's batches, drawn uniformly as before but cut by length in pools."""

from __future__ import annotations

import numpy as np

from lilicorr_train.loop import POOL, batch_rows


def _lengths(n: int = 500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.gamma(2.0, 120.0, n), 20, 640).astype(np.int64)  # a long tail, as target answers have


def test_a_step_draws_the_same_rows_every_time_and_steps_differ():
    lengths = _lengths()
    first = [batch_rows(lengths, step, 8, seed=3) for step in range(2 * POOL)]
    again = [batch_rows(lengths, step, 8, seed=3) for step in range(2 * POOL)]
    assert all(
        np.array_equal(a, b) for a, b in zip(first, again, strict=True)
    )  # a resumed run: the same batches
    assert all(len(rows) == 8 for rows in first)
    assert len({tuple(rows) for rows in first}) == 2 * POOL
    other_seed = [batch_rows(lengths, step, 8, seed=4) for step in range(POOL)]
    assert any(not np.array_equal(a, b) for a, b in zip(first, other_seed, strict=False))


def test_a_pools_batches_are_cut_from_one_sorted_draw():
    lengths = _lengths()
    batches = [batch_rows(lengths, step, 8, seed=1) for step in range(POOL, 2 * POOL)]  # the second pool
    spans = sorted((lengths[rows].min(), lengths[rows].max()) for rows in batches)
    # sorted by their shortest, each batch's longest is at most the next one's shortest: no two overlap
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:], strict=False))
    # handed out in a drawn order, not shortest first
    firsts = [lengths[rows].min() for rows in batches]
    assert firsts != sorted(firsts)


def test_every_sequence_is_drawn_as_often_and_batches_pad_less():
    lengths = _lengths(n=20, seed=2)
    counts = np.zeros(len(lengths))
    widths, means = [], []
    for step in range(400 * POOL // 10):
        rows = batch_rows(lengths, step, 16, seed=0)
        np.add.at(counts, rows, 1)
        widths.append(lengths[rows].max())
        means.append(lengths[rows].mean())
    expected = counts.sum() / len(lengths)  # 640 draws of each
    assert np.all(np.abs(counts - expected) < 0.2 * expected), counts
    rng = np.random.default_rng(0)
    random = [lengths[rng.integers(0, len(lengths), 16)] for _ in range(640)]
    random_ratio = np.mean([r.max() for r in random]) / np.mean([r.mean() for r in random])
    pooled_ratio = np.mean(widths) / np.mean(means)
    assert pooled_ratio < 1.25 < random_ratio, (pooled_ratio, random_ratio)
