"""The joint DFlash + LiLiCorr training objective (LiLiCorr paper, section 3.3 and appendix A).

One batch of sequences, many blocks each. For an anchor at position a (the token x_a, slot 0), the block
[x_a, mask x S] attends to the projected target features of positions < a and to itself (non-causally), at
rotary positions a..a+S, exactly as decoding drafts it; slot s predicts x_{a+s}. All the blocks of a batch run
in one drafter pass, with a mask that gives each block its own context prefix.

    L = L_dflash + gamma * (L_ce + lambda * L_dist)

L_dflash: per-slot cross-entropy of the drafter's full-vocabulary marginals, slot s weighted exp(-(s-1)/beta).
The head scores the drafter's top-K candidates per slot; on the oracle prefix (the leading slots whose true
token is among the candidates) each slot's row is conditioned on the true previous candidate: start for slot 1,
pairs[s-1, true(s-1)] after. L_ce: cross-entropy of that row at the true candidate. L_dist: the expected
target-relative cost sum_k P(k) ReLU(log q(true) - log q(k)) under the head's row, q the target's own
probabilities of the candidates at that position. The candidate set is fixed (no gradient through top-K), but
gradients reach the backbone through the candidates' log-probabilities and the slot hidden states.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from msgspec import Struct

from lilicorr_runtime.model.drafter import Drafter
from lilicorr_runtime.ops import topk_lse
from lilicorr_runtime.ops.core import use_triton


class LossWeights(Struct, frozen=True):
    beta: float = 7.0  # decay of the per-slot DFlash cross-entropy
    gamma: float = 0.25  # weight of the reranker objective
    lam: float = 1.0  # weight of the distractor penalty within it


class TrainBatch(Struct):
    tokens: torch.Tensor  # [b, L] int64 (right-padded)
    lengths: torch.Tensor  # [b] int64
    anchors: torch.Tensor  # [b, m] int64 anchor positions (sorted), each in [1, length - 2]
    anchor_valid: torch.Tensor  # [b, m] bool (rows with fewer usable positions than m)


def sample_anchors(
    lengths: torch.Tensor, prompt_lengths: torch.Tensor, per_sequence: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `per_sequence` distinct anchors per sequence among the answer positions [prompt_length, length-2]
    (the first drafted block of a request is anchored at the first answer token). -> anchors [b, m] (sorted),
    valid [b, m]."""
    b = lengths.shape[0]
    anchors = torch.ones(b, per_sequence, dtype=torch.long)
    valid = torch.zeros(b, per_sequence, dtype=torch.bool)
    for row in range(b):
        low = max(int(prompt_lengths[row]), 1)
        high = int(lengths[row]) - 2
        count = high - low + 1
        if count <= 0:
            continue
        take = min(count, per_sequence)
        picked = torch.randperm(count, generator=generator)[:take].sort().values + low
        anchors[row, :take] = picked
        valid[row, :take] = True
    return anchors, valid


class StepOutput(Struct):
    loss: torch.Tensor
    metrics: dict[str, float]


def draft_blocks(
    drafter: Drafter, features: torch.Tensor, block_embeddings: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """features [b, L, T·M] (target taps of every position), block_embeddings [b, m, B, M] of
    [x_a, mask x S], anchors [b, m] -> (final-normed block hidden [b, m, B, M], context rows [b, L, M]): the
    drafter's own forward (Drafter.forward_blocks), the one decoding runs."""
    context = drafter.project_context(features)  # [b, L, M]
    return drafter.forward_blocks(context, block_embeddings, anchors), context


class Drafted(Struct):
    """One batch's blocks drafted teacher-forced: what the losses and the acceptance measures read. The
    vocabulary-wide logits themselves are not kept: only what is read of them."""

    truth: torch.Tensor  # [b, m, S] x_{a+s}
    slot_valid: torch.Tensor  # [b, m, S] inside the sequence, of a valid anchor
    pass_hidden: torch.Tensor  # [b, m, S, M] final-normed hidden of the mask slots
    context: torch.Tensor  # [b, L, M] projected context rows
    argmax: torch.Tensor  # [b, m, S] the drafter's most likely token (the control's draft)
    truth_log_prob: torch.Tensor  # [b, m, S] fp32 log-probability of x_{a+s}
    ids: torch.Tensor | None  # [b, m, S, K] the top-K candidates, rank 0 = best (None without a head)
    candidate_log_probs: torch.Tensor | None  # [b, m, S, K] fp32 their log-probabilities


class _LogProbsAt(torch.autograd.Function):
    """log p(index) = logits[index] - lse, with lse the logits' log-partition computed beside them (no graph
    of its own): the forward reads the few columns asked for; the backward is the softmax's, scatter(g) -
    softmax(logits) * sum(g), from the logits kept in their own dtype (bf16 under autocast), so that no fp32
    tensor of their size lives between the forward and the backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(logits, index)
        ctx.dtype = lse.dtype
        return logits.gather(-1, index).to(lse.dtype) - lse[..., None]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        logits, index = ctx.saved_tensors
        grad = grad.to(ctx.dtype)
        # the softmax in lse's dtype (fp32), one fused pass over the bf16 logits; the scatter before the cast, so
        # that 1 - p of a confident truth is not lost to bf16 rounding
        out = torch.softmax(logits, dim=-1, dtype=ctx.dtype).mul_(-grad.sum(-1, keepdim=True))
        out.scatter_add_(-1, index, grad)  # an index named twice (the truth among the candidates) adds twice
        return out.to(logits.dtype), None, None


def log_probs_at(logits: torch.Tensor, index: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """logits [..., V] (any float dtype, with or without a graph), index [..., n] int64, lse [...] their
    log-partition -> [..., n] log-probabilities in fp32 (float64 for float64 logits), differentiable with respect
    to the logits."""
    dtype = torch.promote_types(logits.dtype, torch.float32)  # fp32, or float64 for float64 logits
    return _LogProbsAt.apply(logits, index, lse.detach().to(dtype))


def vocabulary_top(logits: torch.Tensor, k: int, exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V] (detached) -> (ids [n, k] int64, best first; lse [n] fp32): the runtime's `topk_lse`,
    decoding's own (ties in column order; on CUDA one Triton pass over the logits) where it runs as a kernel or
    on the CPU, or always with `exact`; elsewhere (CUDA without the kernel, k above 16) `torch.topk` and a
    logsumexp: the reference's tie handling costs a pass per tied row, and bf16 logits tie often."""
    if exact or (k <= 16 and (use_triton(logits) or not logits.is_cuda)):
        _, ids, lse = topk_lse(logits, k)
        return ids, lse
    return logits.topk(k, dim=-1).indices, torch.logsumexp(logits.float(), dim=-1)


def draft_teacher_forced(
    drafter: Drafter, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, features: torch.Tensor,
    batch: TrainBatch, exact: bool = False,
) -> Drafted:  # fmt: skip
    """Every anchor's block [x_a, mask x S] drafted from the target's taps of the positions before it.

    The candidates (and the control's argmax, the first of them) and the log-partition come from one pass over
    the logits (`vocabulary_top`: decoding's `topk_lse`, always with `exact`); the log-probabilities of the true
    token and the candidates are read from the logits and that log-partition as decoding computes them, with the
    softmax's gradient (`log_probs_at`). The vocabulary-wide work of a training step is then that pass, the
    lm_head product and one backward pass, where torch ran a sort-based top-K, an fp32 copy of the logits, a
    logsumexp of six passes and their backward."""
    tokens, anchors, anchor_valid = batch.tokens, batch.anchors, batch.anchor_valid
    b, m = anchors.shape
    block = drafter.block_size
    offsets = torch.arange(block, device=tokens.device)
    positions = anchors[:, :, None] + offsets  # [b, m, B]
    in_sequence = positions < batch.lengths[:, None, None]
    gathered = tokens.gather(1, positions.clamp(max=tokens.shape[1] - 1).view(b, -1)).view(b, m, block)
    block_ids = torch.full_like(gathered, drafter.mask_token_id)
    block_ids[:, :, 0] = gathered[:, :, 0]
    block_embeddings = F.embedding(block_ids, embed_weight)  # [b, m, B, M] frozen
    hidden, context = draft_blocks(drafter, features, block_embeddings, anchors)
    pass_hidden = hidden[:, :, 1:]  # [b, m, S, M]
    truth = gathered[:, :, 1:]
    logits = F.linear(pass_hidden, lm_head_weight)  # [b, m, S, V] in the product's dtype
    head = drafter.lilicorr
    k = head.candidate_topk if head is not None else 1
    top, lse = vocabulary_top(logits.detach().reshape(-1, logits.shape[-1]), k, exact)
    top = top.view(*truth.shape, k)
    ids = top if head is not None else None
    index = truth[..., None] if ids is None else torch.cat([truth[..., None], ids], dim=-1)
    picked = log_probs_at(logits, index, lse.view(truth.shape))
    return Drafted(
        truth=truth,
        slot_valid=in_sequence[:, :, 1:] & anchor_valid[:, :, None],
        pass_hidden=pass_hidden,
        context=context,
        argmax=top[..., 0],
        truth_log_prob=picked[..., 0],
        ids=ids,
        candidate_log_probs=None if ids is None else picked[..., 1:],
    )


def head_lattice(
    drafter: Drafter, embed_weight: torch.Tensor, drafted: Drafted, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head over each block's top-K candidates: (ids [b, m, S, K], start [b*m, K], pairs [b*m, S-1, K, K]);
    the anchor row is the context row of the position before it. Gradients reach the backbone through the
    candidates' log-probabilities."""
    head = drafter.lilicorr
    assert head is not None and drafted.ids is not None and drafted.candidate_log_probs is not None
    ids = drafted.ids
    b, m, slots, k = ids.shape
    context = drafted.context
    anchor_rows = context.gather(1, (anchors - 1).clamp(min=0)[..., None].expand(-1, -1, context.shape[2]))
    rows = b * m
    start, pairs = head(
        F.embedding(ids, embed_weight).reshape(rows, slots, k, -1),
        drafted.candidate_log_probs.reshape(rows, slots, k),
        drafted.pass_hidden.reshape(rows, slots, -1),
        anchor_rows.reshape(rows, -1),
    )
    return ids, start, pairs


@torch.no_grad()
def accepted_lengths(
    drafter: Drafter, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, features: torch.Tensor,
    batch: TrainBatch,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Each anchor's accepted draft length, teacher-forced, as greedy decoding would accept that block: the
    control's argmax walk [b, m] and the head's greedy walk [b, m] (None without a head); 0 where not valid."""
    drafted = draft_teacher_forced(drafter, embed_weight, lm_head_weight, features, batch, exact=True)
    hits = (drafted.argmax == drafted.truth) & drafted.slot_valid
    control = hits.long().cumprod(-1).sum(-1)
    if drafter.lilicorr is None:
        return control, None
    b, m, slots = drafted.truth.shape
    ids, start, pairs = head_lattice(drafter, embed_weight, drafted, batch.anchors)
    head = _walk_accept(
        start, pairs, ids.reshape(b * m, slots, -1), drafted.truth.reshape(-1, slots),
        drafted.slot_valid.reshape(-1, slots),
    )  # fmt: skip
    return control, head.long().view(b, m)


def truth_conditioned(
    ids: torch.Tensor, start: torch.Tensor, pairs: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head's lattice read teacher-forced: ids [b, m, S, K] (the candidates, best first), start [b·m, K], pairs
    [b·m, S-1, K, K] (`head_lattice`), truth and valid [b, m, S] -> (true_index [b·m, S]: the true candidate's
    rank, 0 where it is no candidate; prefix [b·m, S]: the oracle prefix, the true token among the candidates at
    every valid slot up to s; scores [b·m, S, K]: each slot's row conditioned on the true previous candidate,
    start for slot 1, the pair row from the true candidate of slot s-1 after it)."""
    b, m, slots, k = ids.shape
    matches = (ids == truth[..., None]).reshape(b * m, slots, k)
    covered = matches.any(-1) & valid.reshape(b * m, slots)
    true_index = matches.float().argmax(-1)  # 0 where uncovered: masked by the prefix
    prefix = covered.long().cumprod(-1).bool()
    previous = true_index[:, :-1]
    conditioned = pairs.gather(2, previous[:, :, None, None].expand(-1, -1, 1, k))[:, :, 0]
    return true_index, prefix, torch.cat([start[:, None], conditioned], dim=1)


def training_step(
    drafter: Drafter,
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    features: torch.Tensor,
    target_hidden: torch.Tensor | None,
    batch: TrainBatch,
    weights: LossWeights,
) -> StepOutput:
    """The loss of one batch and its metrics. features [b, L, T·M]: the target's taps; target_hidden
    [b, L, M]: its final-normed hidden (position p predicts p+1), or None to leave out L_dist;
    embed_weight [V, M] / lm_head_weight [V, M]: the target's (frozen)."""
    anchors, anchor_valid = batch.anchors, batch.anchor_valid
    b, m = anchors.shape
    slots = drafter.block_size - 1
    device = batch.tokens.device
    offsets = torch.arange(drafter.block_size, device=device)
    drafted = draft_teacher_forced(drafter, embed_weight, lm_head_weight, features, batch)
    truth, slot_valid = drafted.truth, drafted.slot_valid
    ce = -drafted.truth_log_prob  # [b, m, S]
    decay = torch.exp(-torch.arange(slots, device=device, dtype=torch.float32) / weights.beta)  # slot 1 -> 1
    slot_weight = decay * slot_valid
    dflash_loss = (ce * slot_weight).sum() / slot_weight.sum().clamp(min=1)

    metrics = {"dflash": float(dflash_loss.detach())}
    argmax_hit = (drafted.argmax == truth) & slot_valid
    metrics["control_accept"] = float(argmax_hit.long().cumprod(-1).sum(-1).float()[anchor_valid].mean())
    metrics["slot1_top1"] = float(argmax_hit[:, :, 0][anchor_valid].float().mean())
    head = drafter.lilicorr
    if head is None:
        return StepOutput(dflash_loss, metrics)

    k = head.candidate_topk
    ids, start, pairs = head_lattice(drafter, embed_weight, drafted, anchors)
    rows = b * m
    truth_flat, valid_flat = truth.reshape(rows, slots), slot_valid.reshape(rows, slots)
    true_index, prefix, scores = truth_conditioned(ids, start, pairs, truth, slot_valid)
    log_p = torch.log_softmax(scores, dim=-1)
    supervised = prefix.float()
    count = supervised.sum().clamp(min=1)
    head_ce = -(log_p.gather(-1, true_index[..., None])[..., 0] * supervised).sum() / count
    loss_terms = head_ce
    metrics["head_ce"] = float(head_ce.detach())
    if target_hidden is not None:
        # q at slot s is the target's distribution at position a+s-1: the row that predicts x_{a+s}
        with torch.no_grad():
            q_positions = (anchors[:, :, None] + offsets[:slots]).clamp(max=target_hidden.shape[1] - 1)
            q_hidden = target_hidden.gather(
                1, q_positions.reshape(b, -1, 1).expand(-1, -1, target_hidden.shape[2])
            )
            target_logits = F.linear(q_hidden, lm_head_weight)  # [b, m*S, V]
            _, q_lse = vocabulary_top(target_logits.reshape(-1, target_logits.shape[-1]), 1)
            log_q = log_probs_at(target_logits.view(b, m, slots, -1), ids, q_lse.view(b, m, slots))
            log_q = log_q.reshape(rows, slots, k)
        log_q_true = log_q.gather(-1, true_index[..., None])
        cost = torch.relu(log_q_true - log_q)  # [rows, S, K]
        distractor = ((log_p.exp() * cost).sum(-1) * supervised).sum() / count
        loss_terms = loss_terms + weights.lam * distractor
        metrics["distractor"] = float(distractor.detach())
    with torch.no_grad():
        metrics["coverage1"] = float(prefix[:, 0][anchor_valid.reshape(-1)].float().mean())  # slot 1: covered
        metrics["oracle_prefix"] = float(prefix.sum(-1).float()[anchor_valid.reshape(-1)].mean())
        metrics["head_accept"] = float(
            _walk_accept(start, pairs, ids.reshape(rows, slots, k), truth_flat, valid_flat)[
                anchor_valid.reshape(-1)
            ].mean()
        )
    loss = dflash_loss + weights.gamma * loss_terms
    if not math.isfinite(float(loss.detach())):
        raise FloatingPointError(f"non-finite training loss: {metrics}")
    return StepOutput(loss, metrics)


def _walk_accept(
    start: torch.Tensor, pairs: torch.Tensor, ids: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Accepted length of the greedy walk against the true tokens, per lattice: [rows] float."""
    pick = start.argmax(-1)  # [rows]
    chosen = [ids[:, 0].gather(1, pick[:, None])[:, 0]]
    for s in range(1, ids.shape[1]):
        row = pairs[:, s - 1].gather(1, pick[:, None, None].expand(-1, 1, pairs.shape[-1]))[:, 0]
        pick = row.argmax(-1)
        chosen.append(ids[:, s].gather(1, pick[:, None])[:, 0])
    hits = (torch.stack(chosen, dim=1) == truth) & valid
    return hits.long().cumprod(-1).sum(-1).float()
