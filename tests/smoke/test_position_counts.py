"""The counts behind every published acceptance rate (`position_counts`), so a model card can show
"0.352 (88/250)" instead of a bare rate."""

from __future__ import annotations

from lilicorr_ckpt.smoke.profile import PositionCount, position_counts


def test_counts_follow_the_rate_definitions():
    # (drafted, accepted) per block: a block near the end of a request drafts fewer positions
    blocks = [(3, 3), (3, 1), (3, 0), (2, 2), (1, 0)]
    assert position_counts(blocks, 3) == [
        PositionCount(drafted=5, reached=5, accepted=3),  # every block drafted position 1
        PositionCount(drafted=4, reached=3, accepted=2),  # (1, 0) drafted one position only
        PositionCount(drafted=3, reached=1, accepted=1),
    ]
    assert position_counts([], 2) == [PositionCount(drafted=0, reached=0, accepted=0)] * 2


def test_the_profile_carries_counts_that_reproduce_its_rates(zero_head_report):
    for arm, stats in zero_head_report.arms.items():
        if arm == "ar":
            assert stats.position_counts == []
            continue
        counts = stats.position_counts
        assert len(counts) == len(stats.conditional_accept_rates) == zero_head_report.num_speculative_tokens
        assert counts[0].drafted == stats.blocks
        for c, cond, marg in zip(
            counts, stats.conditional_accept_rates, stats.marginal_accept_rates, strict=True
        ):
            assert round(c.accepted / c.reached, 6) == cond if c.reached else cond == 0.0
            assert round(c.accepted / c.drafted, 6) == marg if c.drafted else marg == 0.0
    for category in zero_head_report.per_category.values():
        assert category.arms["head"].position_counts[0].drafted == category.arms["head"].blocks
