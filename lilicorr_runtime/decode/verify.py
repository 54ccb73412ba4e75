"""Verification of a drafted block against the target's logits: greedy (the longest prefix equal to the target's
argmax) and exact rejection sampling, and the inverse-CDF draw they sample with. Torch only: a block's worth of
elementwise work, captured with the rest of the block in the device loop's graph."""

from __future__ import annotations

import torch

from ..ops.dispatch import is_integer, shape_error


def categorical(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from unnormalized rows. probs [b, V] >= 0, uniforms [b] in [0, 1) -> ids [b].

    The pick is the number of CDF entries <= u * total, so a zero-probability entry is never drawn.
    """
    if probs.dim() != 2 or probs.shape[1] < 1 or uniforms.shape != probs.shape[:1]:
        raise shape_error(
            "categorical", "probs [b, V] (V >= 1), uniforms [b]", probs=probs, uniforms=uniforms
        )
    cdf = probs.float().cumsum(dim=-1)
    threshold = uniforms.float() * cdf[:, -1]
    return (cdf <= threshold[:, None]).sum(dim=-1).clamp_max(probs.shape[-1] - 1)


def verify_greedy(
    target_logits: torch.Tensor, draft_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of one block per row.

    target_logits [b, n+1, V] (row j predicts the token after block position j), draft_tokens [b, n]
    -> accepted [b] (longest prefix equal to the target's argmax), next_token [b] (the target's
    argmax right after the accepted prefix).
    """
    if (
        draft_tokens.dim() != 2
        or not is_integer(draft_tokens)
        or target_logits.dim() != 3
        or target_logits.shape[:2] != (draft_tokens.shape[0], draft_tokens.shape[1] + 1)
    ):
        raise shape_error(
            "verify_greedy",
            "target_logits [b, n+1, V], draft_tokens [b, n] (integer ids)",
            target_logits=target_logits,
            draft_tokens=draft_tokens,
        )
    choice = target_logits.float().argmax(dim=-1)  # [b, n+1]
    n = draft_tokens.shape[1]
    match = (choice[:, :n] == draft_tokens).long()
    accepted = match.cumprod(dim=1).sum(dim=1)  # [b]
    return accepted, choice.gather(1, accepted[:, None]).squeeze(1)


def verify_sampled(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_q: torch.Tensor,
    accept_uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of one block per row (Leviathan et al.; Chen et al.).

    target_probs [b, n+1, V], draft_tokens [b, n], draft_q [b, n, V] (the realized proposal each
    token was drawn from, over the vocabulary), accept_uniforms [b, n], residual_uniforms [b]
    -> accepted [b], next_token [b]. Token j is kept with probability min(1, p_j(d_j) / q_j(d_j));
    after the first rejection the next token is drawn from norm(max(0, p_j - q_j)), and after a fully
    accepted block from p_n. The emitted tokens are then distributed exactly as the target's.
    """
    if (
        draft_tokens.dim() != 2
        or not is_integer(draft_tokens)
        or target_probs.dim() != 3
        or target_probs.shape[:2] != (draft_tokens.shape[0], draft_tokens.shape[1] + 1)
        or draft_q.shape != (*draft_tokens.shape, target_probs.shape[2])
        or accept_uniforms.shape != draft_tokens.shape
        or residual_uniforms.shape != draft_tokens.shape[:1]
    ):
        raise shape_error(
            "verify_sampled",
            "target_probs [b, n+1, V], draft_tokens [b, n] (integer ids), "
            "draft_q [b, n, V], accept_uniforms [b, n], residual_uniforms [b]",
            target_probs=target_probs,
            draft_tokens=draft_tokens,
            draft_q=draft_q,
            accept_uniforms=accept_uniforms,
            residual_uniforms=residual_uniforms,
        )
    b, n = draft_tokens.shape
    p = target_probs.float()
    q = draft_q.float()
    p_draft = p[:, :n].gather(2, draft_tokens[..., None]).squeeze(-1)  # [b, n]
    q_draft = q.gather(2, draft_tokens[..., None]).squeeze(-1)
    keep = (accept_uniforms.float() * q_draft < p_draft).long()  # u < p/q without dividing by q
    accepted = keep.cumprod(dim=1).sum(dim=1)  # [b]
    # q padded with a zero row, so a fully accepted block samples from p_n itself
    q_padded = torch.cat([q, q.new_zeros(b, 1, q.shape[-1])], dim=1)  # [b, n+1, V]
    index = accepted[:, None, None].expand(-1, 1, p.shape[-1])
    p_row = p.gather(1, index).squeeze(1)  # [b, V]
    residual = (p_row - q_padded.gather(1, index).squeeze(1)).clamp_min(0.0)
    # p == q leaves no residual mass, and then a rejection cannot happen; fall back to p for safety
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_row, residual)
    return accepted, categorical(residual, residual_uniforms)
