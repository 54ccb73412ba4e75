"""Where a greedy reference generation stops being reproducible token for token by another stack.

An engine that serves the same target (`smoke --engine`) runs other kernels, other reduction orders and often
tensor parallelism: at a position where the target's two best tokens nearly tie it may pick either, and
everything after that follows another path. So a reference profile records, per greedy request, the first
emitted token whose target logit gap to the runner-up is within bfloat16 round-off (the dtype engines serve in),
and engine outputs are compared with the reference's tokens up to that position only.

Imports torch: smoke.run calls it after decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def reference_ties(
    target: Any, runs: Sequence[tuple[Any, int, list[int], dict[str, Any]]]
) -> dict[tuple[str, int], int | None]:
    """(probe id, seed) -> the first near-tie of the "ar" arm's greedy tokens, from one forward of the target over
    prompt + tokens per request (the logits at position p predict token p + 1)."""
    out: dict[tuple[str, int], int | None] = {}
    with torch.inference_mode():
        for probe, seed, ids, by_arm in runs:
            tokens = list(by_arm["ar"].tokens)
            if not tokens:
                out[(probe.id, seed)] = None
                continue
            target.reset()
            sequence = list(ids) + tokens[:-1]  # the last token predicts nothing emitted
            logits = target.forward(torch.tensor(sequence, device=target.device), None).logits  # [len, V]
            target.reset()
            out[(probe.id, seed)] = first_near_tie(logits[len(ids) - 1 :], tokens)
    return out
