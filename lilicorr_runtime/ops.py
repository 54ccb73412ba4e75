"""Torch reference implementations of the per-block decoding ops (shared/docs/format.md §4-6).

These are the functions CPU runs and the oracle later Triton kernels are tested against, so they
stay pure torch, deterministic, and free of host syncs. Scores are fp32 throughout.
"""

from __future__ import annotations

import torch

MIN_TEMPERATURE = 1e-5


def topk_lse(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k of each row and the row's full-vocabulary log-partition.

    logits [n, V] -> values [n, k] fp32 descending, ids [n, k] int64, lse [n] fp32.
    `values - lse[:, None]` are the candidates' full-vocabulary log-probs.
    """
    x = logits.float()
    values, ids = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    row_max = x.amax(dim=-1, keepdim=True)  # [n, 1]
    lse = row_max.squeeze(-1) + torch.log(torch.exp(x - row_max).sum(dim=-1))
    return values, ids.long(), lse


def _pick_rows(pairs_s: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    # pairs_s [b, K, K], prev [b] -> the row of the previous pick [b, K]
    index = prev[:, None, None].expand(-1, 1, pairs_s.shape[-1])
    return pairs_s.gather(1, index).squeeze(1)


def greedy_walk(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Left-to-right greedy commit through the lattice (ties go to the lower candidate index).

    start [b, K], pairs [b, S-1, K, K], ids [b, S, K] -> tokens [b, S].
    """
    slots = ids.shape[1]
    row = start.float()
    picks = []
    for s in range(slots):
        pick = row.argmax(dim=-1)  # [b]; torch.argmax returns the first maximum
        picks.append(pick)
        if s + 1 < slots:
            row = _pick_rows(pairs[:, s].float(), pick)
    chosen = torch.stack(picks, dim=1)  # [b, S]
    return ids.gather(2, chosen[..., None]).squeeze(-1)


def sample_walk(start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor,
                temperatures: torch.Tensor, greedy_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled commit: each slot draws from softmax(row / T) over its K candidates by inverse CDF.

    start [b, K], pairs [b, S-1, K, K], ids [b, S, K], uniforms [b, S] in [0, 1), temperatures [b],
    greedy_mask [b] bool -> tokens [b, S], q [b, S, K] (the distribution each slot was drawn from).
    Greedy rows walk the same argmax path as greedy_walk and report a one-hot q, so verification
    treats them as the point mass they are.
    """
    slots, k = ids.shape[1], ids.shape[2]
    inv_t = 1.0 / temperatures.float().clamp_min(MIN_TEMPERATURE)  # [b]
    greedy = greedy_mask.bool()[:, None]  # [b, 1]
    row = start.float()
    picks, proposals = [], []
    for s in range(slots):
        probs = torch.softmax(row * inv_t[:, None], dim=-1)  # [b, K]
        cdf = probs.cumsum(dim=-1)
        sampled = (cdf <= uniforms[:, s, None].float()).sum(dim=-1).clamp_max(k - 1)
        argmax = row.argmax(dim=-1)
        pick = torch.where(greedy[:, 0], argmax, sampled)  # [b]
        one_hot = torch.nn.functional.one_hot(argmax, k).float()
        proposals.append(torch.where(greedy, one_hot, probs))
        picks.append(pick)
        if s + 1 < slots:
            row = _pick_rows(pairs[:, s].float(), pick)
    chosen = torch.stack(picks, dim=1)  # [b, S]
    return ids.gather(2, chosen[..., None]).squeeze(-1), torch.stack(proposals, dim=1)


def control_walk(logits: torch.Tensor) -> torch.Tensor:
    """DFlash without a head: the per-slot argmax of the draft logits. logits [b, S, V] -> tokens [b, S]."""
    return logits.float().argmax(dim=-1)


def categorical(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from unnormalized rows. probs [b, V] >= 0, uniforms [b] in [0, 1) -> ids [b].

    The pick is the number of CDF entries <= u * total, so a zero-probability entry is never drawn.
    """
    cdf = probs.float().cumsum(dim=-1)
    threshold = uniforms.float() * cdf[:, -1]
    return (cdf <= threshold[:, None]).sum(dim=-1).clamp_max(probs.shape[-1] - 1)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of one block per row.

    target_logits [b, n+1, V] (row j predicts the token after block position j), draft_tokens [b, n]
    -> accepted [b] (longest prefix equal to the target's argmax), next_token [b] (the target's
    argmax right after the accepted prefix).
    """
    choice = target_logits.float().argmax(dim=-1)  # [b, n+1]
    n = draft_tokens.shape[1]
    match = (choice[:, :n] == draft_tokens).long()
    accepted = match.cumprod(dim=1).sum(dim=1)  # [b]
    return accepted, choice.gather(1, accepted[:, None]).squeeze(1)


def verify_sampled(target_probs: torch.Tensor, draft_tokens: torch.Tensor, draft_q: torch.Tensor,
                   accept_uniforms: torch.Tensor, residual_uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of one block per row (Leviathan et al.; Chen et al.).

    target_probs [b, n+1, V], draft_tokens [b, n], draft_q [b, n, V] (the realized proposal each
    token was drawn from, over the vocabulary), accept_uniforms [b, n], residual_uniforms [b]
    -> accepted [b], next_token [b]. Token j is kept with probability min(1, p_j(d_j) / q_j(d_j));
    after the first rejection the next token is drawn from norm(max(0, p_j - q_j)), and after a fully
    accepted block from p_n. The emitted tokens are then distributed exactly as the target's.
    """
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
