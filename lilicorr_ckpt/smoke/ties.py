"""Where a greedy reference generation stops being reproducible token for token by another stack.

An engine that serves the same target (`smoke --engine`) runs other kernels, other reduction orders and often
tensor parallelism: at a position where the target's two best tokens nearly tie it may pick either, and
everything after that follows another path. So a reference profile records, per greedy request, the first
emitted token whose target logit gap to the runner-up is within bfloat16 round-off (the dtype engines serve in),
and engine outputs are compared with the reference's tokens up to that position only.

Imports torch: smoke.run's greedy_checks calls it after decoding, on the logits of its reference forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# the relative gap (to max(1, |top logit|)) below which two tokens count as tied: bfloat16's round-off as the
# lossless gate reckons it, since engines serve in bfloat16 whatever dtype the reference ran in
ENGINE_TIE_RELATIVE = 2.0**-5


def first_near_tie(logits: torch.Tensor, tokens: Sequence[int]) -> int | None:
    """The first position i whose emitted token tokens[i] (the argmax of logits[i], [len(tokens), V]) is within
    ENGINE_TIE_RELATIVE of the runner-up; None when no position is."""
    if not len(tokens):
        return None
    top2 = logits.float().topk(2, dim=-1).values  # [T, 2]
    gap = top2[:, 0] - top2[:, 1]
    scale = top2[:, 0].abs().clamp(min=1.0)
    near = (gap <= ENGINE_TIE_RELATIVE * scale).nonzero()
    return int(near[0, 0]) if len(near) else None
