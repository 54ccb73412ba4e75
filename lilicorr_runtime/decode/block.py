"""One speculative block, written once: draft -> verify -> accept -> commit.

Every loop runs these functions: the eager loop (decode/speculative.py, one request, a block at a time in Python),
its draft step replayed from a CUDA graph (decode/draft_step.py) and the device loop (decode/device_loop.py, a whole
block of up to `batch` requests as one graph replay). They are functions over tensors of static shapes (no host
sync, no data-dependent shape), so a loop can call them eagerly or capture them; the loops own their state, caches
and graphs. The verification math (greedy: the longest prefix equal to the target's argmax; exact rejection
sampling; the inverse-CDF draw they sample with) closes the file: torch only, a block's worth of elementwise work,
captured with the rest of the block in the device loop's graph.

    draft    [anchor, mask x n] embedded by the target, through the drafter's backbone over its context cache
             (`backbone`); the logits at block positions 1..n and, for the head, the top-K candidates of their
             full-vocabulary log-softmax and the LiLiCorr head's start / pair scores (`propose`); the walk that picks
             d_1..d_n (`walk`: greedy or sampled over the head's lattice, or the per-slot argmax for control)
    verify   one target forward over [anchor, d_1..d_n] (`verify`: the loop passes its target's forward)
    accept   a = the longest accepted prefix and the target's own token after it, greedy or by exact rejection
             sampling (`accept`); mode "ar" drafts nothing and takes the target's token (`target_token`)
    commit   d_1..d_a and that token to the output, and the verify rows' context for the next block: on the device
             loop's static per-slot state (`commit`), or the eager loop's host lists and growing cache
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch

from ..model.drafter import Drafter, DraftKVCache
from ..ops.core import control_walk, greedy_walk, is_integer, sample_walk, shape_error, topk_lse

Walk = Literal["greedy", "sample", "control"]
WALKS: tuple[Walk, ...] = ("greedy", "sample", "control")

Embed = Callable[[torch.Tensor], torch.Tensor]


def backbone(
    drafter: Drafter,
    embed: Embed,
    cache: DraftKVCache,
    length: torch.Tensor | None,
    anchor: torch.Tensor,
    masks: torch.Tensor,
) -> torch.Tensor:
    """The drafter's hidden states of the block [anchor, mask x n]: anchor [b], masks [b, n] (the mask token)
    -> [b, n+1, M], final-normed. `length` None: the eager forward over the cache's rows (it grows); a device
    tensor (a scalar, or [b] per row): the static forward over the cache's whole capacity, rows at or beyond the
    length masked (what a captured graph runs)."""
    embeddings = embed(torch.cat([anchor[:, None], masks], dim=1))  # [b, n+1, M]
    if length is None:
        return drafter(cache, embeddings)
    return drafter.forward_static(cache, length, embeddings)


def propose(
    drafter: Drafter,
    hidden: torch.Tensor,
    anchor_hidden: torch.Tensor,
    embed: Embed,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    score: bool,
) -> dict[str, torch.Tensor]:
    """What follows the backbone: logits at block positions 1..n and, with `score`, the top-K candidates of the
    full-vocabulary log-softmax and the head's lattice scores.

    hidden [b, n+1, M] (final-normed draft hidden of [anchor, masks]), anchor_hidden [b, M] -> logits
    [b, n, V] fp32 and, scored, candidate_ids [b, n, K], candidate_log_probs [b, n, K], start [b, K],
    pairs [b, n-1, K, K]."""
    b, n = hidden.shape[0], hidden.shape[1] - 1
    pass_hidden = hidden[:, 1:]  # [b, n, M]
    logits = drafter.logits(pass_hidden, lm_head)  # [b, n, V]
    if not score or drafter.lilicorr is None:
        return {"logits": logits}
    k = drafter.lilicorr.candidate_topk
    values, ids, lse = topk_lse(logits.flatten(0, 1), k)
    log_probs = (values - lse[:, None]).view(b, n, k)  # [b, n, K]
    ids = ids.view(b, n, k)
    start, pairs = drafter.lilicorr(embed(ids), log_probs, pass_hidden, anchor_hidden)
    return {
        "logits": logits,
        "candidate_ids": ids,
        "candidate_log_probs": log_probs,
        "start": start,
        "pairs": pairs,
    }


def walk(
    proposed: dict[str, torch.Tensor],
    how: Walk,
    uniforms: torch.Tensor | None = None,
    temperatures: torch.Tensor | None = None,
    greedy: torch.Tensor | None = None,
) -> None:
    """The draft tokens of a proposal, added to it: "tokens" [b, n] and, sampled, "q" [b, n, K] (the distribution
    over the candidates each token was drawn from). Sampled: uniforms [b, n], temperatures [b], greedy [b] bool
    (rows that walk the argmax path)."""
    if how == "control":
        proposed["tokens"] = control_walk(proposed["logits"])
    elif how == "greedy":
        proposed["tokens"] = greedy_walk(proposed["start"], proposed["pairs"], proposed["candidate_ids"])
    else:
        assert uniforms is not None and temperatures is not None and greedy is not None, "a sampled walk"
        proposed["tokens"], proposed["q"] = sample_walk(
            proposed["start"], proposed["pairs"], proposed["candidate_ids"], uniforms, temperatures, greedy
        )


def draft(
    drafter: Drafter,
    embed: Embed,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    cache: DraftKVCache,
    length: torch.Tensor | None,
    anchor: torch.Tensor,
    anchor_hidden: torch.Tensor,
    masks: torch.Tensor,
    how: Walk | None,
    *,
    score: bool | None = None,
    uniforms: torch.Tensor | None = None,
    temperatures: torch.Tensor | None = None,
    greedy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The draft step: `backbone`, `propose` and, unless `how` is None, `walk`. Returns (hidden [b, n+1, M], the
    proposal: logits, and candidate_ids / candidate_log_probs / start / pairs when scored, tokens / q when
    walked). `score` defaults to every walk but control's."""
    hidden = backbone(drafter, embed, cache, length, anchor, masks)
    proposed = propose(
        drafter, hidden, anchor_hidden, embed, lm_head, how != "control" if score is None else score
    )
    if how is not None:
        walk(proposed, how, uniforms, temperatures, greedy)
    return hidden, proposed


def verify(
    forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]],
    anchor: torch.Tensor,
    draft_tokens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One target forward over each row's [anchor, d_1..d_n]: anchor [b], draft_tokens [b, n] (None: the anchor
    alone, mode "ar"); `forward(ids [b, n+1])` -> (logits [b, n+1, V], tapped features or None), at the rows the
    loop keeps for the block. Returns (ids, logits, features)."""
    ids = anchor[:, None] if draft_tokens is None else torch.cat([anchor[:, None], draft_tokens], dim=1)
    logits, features = forward(ids)
    return ids, logits, features


def target_token(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor | None) -> torch.Tensor:
    """The target's own token from one row of logits per sequence: logits [b, V] -> ids [b]; its argmax at
    temperature 0, else an inverse-CDF draw (uniforms [b]) from softmax(logits / T)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    assert uniforms is not None, "a sampled token"
    return categorical(torch.softmax(logits / temperature, dim=-1), uniforms)


def accept(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: float,
    proposed: Mapping[str, torch.Tensor],
    accept_uniforms: torch.Tensor | None = None,
    residual_uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance of each row's drafted block: logits [b, n+1, V] (the verify forward's), draft_tokens [b, n],
    the proposal they were walked from (its "q" and "candidate_ids" when the walk sampled) -> accepted [b] (the
    longest accepted prefix), bonus [b] (the target's token after it). Greedy at temperature 0; else exact
    rejection sampling (accept_uniforms [b, n], residual_uniforms [b]) against the realized proposal: the walk's q
    over the candidates scattered onto the vocabulary, or a point mass on each token a greedy walk drafted."""
    if temperature <= 0:
        return verify_greedy(logits, draft_tokens)
    assert accept_uniforms is not None and residual_uniforms is not None, "sampled verification"
    b, n = draft_tokens.shape
    q = torch.zeros(b, n, logits.shape[-1], device=logits.device)
    if "q" not in proposed:  # a greedy proposal is a point mass on the drafted token
        q.scatter_(2, draft_tokens[..., None], 1.0)
    else:
        q.scatter_(2, proposed["candidate_ids"], proposed["q"])
    probs = torch.softmax(logits / temperature, dim=-1)
    return verify_sampled(probs, draft_tokens, q, accept_uniforms, residual_uniforms)


def emitted(draft_tokens: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """The tokens a block emits, at static width n+1: emitted[j] = d_{j+1} for j < a, the bonus at j = a (the
    columns past a are the bonus too, and are not written). draft_tokens [b, n], accepted [b], bonus [b]."""
    n = draft_tokens.shape[1]
    j = torch.arange(n + 1, device=draft_tokens.device)[None, :]
    return torch.where(
        j < accepted[:, None], torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1), bonus[:, None]
    )


def commit(
    state: dict[str, torch.Tensor],
    emitted_tokens: torch.Tensor,
    accepted: torch.Tensor,
    bonus: torch.Tensor,
    eos: torch.Tensor,
    drafter: Drafter | None = None,
    draft_cache: DraftKVCache | None = None,
    features: torch.Tensor | None = None,
) -> None:
    """The commit on per-slot device state (the device loop's; `DecodeLoop.state` names the tensors): for each
    active slot, emitted_tokens[:a+1] [b, n+1] written to its output at out_len, `accepted` [b] to its block log,
    the bonus [b] as the next anchor; an eos among the written tokens or the output reaching its limit ends it.
    With a drafter, the verify rows' features [b, n+1, T*M] become context rows whose K/V are written at
    length..length+n, and the row that predicted the bonus becomes the anchor's; the length advances by a+1, so
    the rest lie beyond it, masked, and are overwritten by the next block. Inactive slots change nothing."""
    active = state["active"]
    device = emitted_tokens.device
    width = emitted_tokens.shape[1]
    j = torch.arange(width, device=device)[None, :]
    written = active[:, None] & (j <= accepted[:, None])  # [b, n+1]
    trash = state["out"].shape[1] - 1
    state["out"].scatter_(1, torch.where(written, state["out_len"][:, None] + j, trash), emitted_tokens)
    hit_eos = ((emitted_tokens[:, :, None] == eos).any(dim=2) & written).any(dim=1)
    out_len = state["out_len"] + torch.where(active, accepted + 1, 0)
    done = hit_eos | (out_len >= state["limit"])
    log_trash = state["accepted"].shape[1] - 1
    state["accepted"].scatter_(1, torch.where(active, state["blocks"], log_trash)[:, None], accepted[:, None])
    state["blocks"].add_(active.long())
    if drafter is not None:
        assert features is not None and draft_cache is not None  # the drafter's taps and cache
        context = drafter.project_context(features)  # [b, n+1, M]
        drafter.append_context_static(draft_cache, context, state["length"])
        kept = context.gather(1, accepted[:, None, None].expand(-1, 1, context.shape[2]))[:, 0]
        state["anchor_hidden"].copy_(torch.where(active[:, None], kept, state["anchor_hidden"]))
    state["anchor"].copy_(torch.where(active, bonus, state["anchor"]))
    state["length"].add_(torch.where(active, accepted + 1, 0))
    state["out_len"].copy_(out_len)
    state["active"].copy_(active & ~done)


# -------------------- the verification math


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
