"""Reference outputs of a drafter on fixed synthetic inputs, for comparing two checkpoints of one geometry
(the converter's `--verify` runs it on the source and on the converted checkpoint)."""

from __future__ import annotations

import torch

from ..arguments import known
from ..decode.speculative import draft_block
from .drafter import Drafter

CONTEXT_ROWS = 12
LM_HEAD_RANK = 32  # the synthetic lm_head is low-rank so that a 150k x 4096 table is never materialized


def _rows(ids: torch.Tensor, width: int, seed: int) -> torch.Tensor:
    """A synthetic embedding row per id, a pure function of (seed, id): no [V, M] table is built."""
    flat = ids.flatten().tolist()
    table = {
        i: torch.randn(width, generator=torch.Generator().manual_seed(seed * 1_000_003 + i + 1))
        for i in set(flat)
    }
    return torch.stack([table[i] for i in flat]).view(*ids.shape, width)


@torch.inference_mode()
def reference_outputs(drafter: Drafter, seed: int = 0) -> dict[str, torch.Tensor]:
    """Draft logits and head scores (start, pairs) for one full block on seeded synthetic target data.

    Synthetic target: features [12, T·M] ~ N(0, 1), embedding rows ~ N(0, 1) per token id, and an
    lm_head U·Vᵀ of rank 32 over the drafter's vocabulary (used unless the drafter owns its head).
    Everything returned is fp32 on the CPU.
    """
    g = drafter.geometry
    M, V = known(g.hidden_size, "hidden_size"), known(g.vocab_size, "vocab_size")
    device = drafter.fc.weight.device
    dtype = drafter.fc.weight.dtype
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(1, CONTEXT_ROWS, len(drafter.target_layer_ids) * M, generator=gen)
    head_u = torch.randn(V, LM_HEAD_RANK, generator=gen) / LM_HEAD_RANK**0.5
    head_v = torch.randn(M, LM_HEAD_RANK, generator=gen)
    anchor = torch.randint(0, V, (1,), generator=gen)

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return _rows(ids.cpu(), M, seed).to(device=device, dtype=dtype)

    head_u, head_v = head_u.to(device), head_v.to(device)

    def lm_head(hidden: torch.Tensor) -> torch.Tensor:
        return (hidden.float() @ head_v) @ head_u.T

    cache = drafter.new_cache(batch=1)
    context = drafter.project_context(features.to(device))
    drafter.append_context(cache, context)
    proposal = draft_block(
        drafter, cache, anchor.to(device), context[:, -1], drafter.block_size - 1, embed, lm_head, score=True
    )
    out = {"context": context[0], "draft_hidden": proposal.hidden[0], "draft_logits": proposal.logits[0]}
    if (
        proposal.start is not None
    ):  # scored: the candidates, their log-probs and the pairs come with the start
        assert proposal.candidate_ids is not None and proposal.candidate_log_probs is not None
        assert proposal.pairs is not None
        out.update(
            candidate_ids=proposal.candidate_ids[0],
            candidate_log_probs=proposal.candidate_log_probs[0],
            start=proposal.start[0],
            pairs=proposal.pairs[0],
        )
    return {k: v.float().cpu() if v.is_floating_point() else v.cpu() for k, v in out.items()}
