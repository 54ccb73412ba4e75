"""Held-out acceptance of a drafter: tau on validation sequences the training never draws, per training piece.

tau = 1 + the drafted tokens accepted per block (the token the target adds to every verify step included, as
`lilicorr-ckpt smoke` counts it), for the head-free control (the argmax walk) and the LiLiCorr head (its greedy
walk), teacher-forced: blocks anchored at answer positions of the held-out sequences, drafted from the target's
own taps, exactly as the training objective scores them. The anchors are drawn once from a fixed seed, so every
piece of a run (and every drafter) is measured on the same blocks.

Anchors drawn uniformly over the answer overstate what decoding reaches: decoding anchors each block right
after the last one's accepted drafts, so it visits the positions where a draft just failed more often than a
uniform draw does. On 12 bundled probes with the SmolLM2 drafter (CPU, fp32) the uniform measure read 1.87 / 2.01
(control / head) where `lilicorr-ckpt smoke` measured 1.576 / 1.690. So the held-out set is also walked
(`walk_tau`): the accepted length at every answer position of the first WALK_TOKENS tokens, then the blocks greedy
decoding commits over them (`decode_walk`). On those 12 probes' answers the walk read 1.574 / 1.690, with smoke's
759 head blocks: the teacher-forced drafter is the drafter decoding runs, and the walk predicts smoke's τ.

Both are cheap (the walk is a few ten thousand blocks, seconds on a GPU), so the piece runner
(`lilicorr_train.pieces`) logs them after every piece: a line {"heldout_step": N, "val_tau_control": ...,
"val_tau_head": ..., "val_walk_tau_control": ..., ...} in the run's log.jsonl (no `step` key, so readers of the
training records, `lilicorr-ckpt card` among them, skip it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from msgspec import Struct

from lilicorr_runtime.model.drafter import Drafter
from lilicorr_runtime.target.fast import FastTarget

from .loop import target_pass
from .mixes import CATEGORIES, Shard
from .objective import LossWeights, TrainBatch, accepted_lengths, sample_anchors, training_step

ANCHORS = 8  # per held-out sequence
BATCH = 32  # sequences per forward
MAX_LENGTH = 640  # as training cuts them
WALK_PER_CATEGORY = 48  # held-out sequences walked per category (the first of each)
WALK_TOKENS = 128  # answer tokens walked per sequence: smoke's default --max-new-tokens
WALK_BATCH = 4  # sequences per forward in the walk (every answer position is an anchor: [b, m, S, V] logits)


class HeldOut(Struct, frozen=True):
    """The validation sequences and their fixed anchors."""

    data: Shard
    anchors: torch.Tensor  # [n, ANCHORS]
    valid: torch.Tensor  # [n, ANCHORS]

    @classmethod
    def of(cls, data: Shard, anchors: int = ANCHORS, seed: int = 0) -> HeldOut:
        lengths = torch.from_numpy(np.minimum(np.diff(data.offsets), MAX_LENGTH).astype(np.int64))
        prompts = torch.from_numpy(data.prompt_lengths.astype(np.int64))
        a, v = sample_anchors(lengths, prompts, anchors, torch.Generator().manual_seed(seed))
        return cls(data, a, v)


def _autocast(device: torch.device) -> Any:
    """bf16 autocast on CUDA, as training runs; nothing on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@contextmanager
def _measuring(drafter: Drafter) -> Iterator[None]:
    """The drafter in eval mode with its head's derived tensors fresh, back in its own mode after."""
    was_training = drafter.training
    drafter.eval()
    if drafter.lilicorr is not None:
        drafter.lilicorr.invalidate_derived()
    try:
        yield
    finally:
        if was_training:
            drafter.train()


@torch.no_grad()
def heldout_tau(
    drafter: Drafter, target: FastTarget, held: HeldOut, *, batch: int = BATCH, walk: bool = True
) -> dict[str, Any]:
    """{"val_tau_control", "val_tau_head", "val_dflash", "val_anchors", "val_by_category": {...}} at the fixed
    uniform anchors, and with `walk` the decode walk's keys (`walk_tau`)."""

    with _measuring(drafter):
        record = _uniform_tau(drafter, target, held, batch)
        if walk:
            record.update(walk_tau(drafter, target, held.data))
    return record


def padded_rows(data: Shard, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences `rows` of a held-out set, cut to MAX_LENGTH as training cuts them: (tokens [n, longest]
    int64, right-padded with 0; lengths [n])."""
    seqs = [data.tokens[data.offsets[i] : data.offsets[i + 1]][:MAX_LENGTH].astype(np.int64) for i in rows]
    tokens = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    for r, s in enumerate(seqs):
        tokens[r, : len(s)] = torch.from_numpy(s)
    return tokens, torch.tensor([len(s) for s in seqs])


def _uniform_tau(drafter: Drafter, target: FastTarget, held: HeldOut, batch: int) -> dict[str, Any]:
    """The uniform measure: the training objective's metrics at the held-out set's fixed anchors."""
    device = target.device
    embed_w = target.embed_tokens.weight.detach()
    head_w = target.lm_head.weight.detach()
    data = held.data
    sums: dict[int, dict[str, float]] = {}
    for first in range(0, len(data), batch):
        rows = np.arange(first, min(first + batch, len(data)))
        tokens, lengths = padded_rows(data, rows)
        for category in np.unique(data.category[rows]):
            pick = np.nonzero(data.category[rows] == category)[0]
            sub = torch.from_numpy(pick)
            tb = TrainBatch(
                tokens[sub].to(device),
                lengths[sub].to(device),
                held.anchors[rows[pick]].to(device),
                held.valid[rows[pick]].to(device),
            )
            if not bool(tb.anchor_valid.any()):
                continue
            hidden, features = target_pass(target, tb.tokens, drafter.target_layer_ids)
            with _autocast(device):
                out = training_step(drafter, embed_w, head_w, features, hidden, tb, LossWeights())
            n = int(tb.anchor_valid.sum())
            acc = sums.setdefault(int(category), {"n": 0.0, "control": 0.0, "head": 0.0, "dflash": 0.0})
            acc["n"] += n
            acc["control"] += out.metrics["control_accept"] * n
            acc["head"] += out.metrics.get("head_accept", out.metrics["control_accept"]) * n
            acc["dflash"] += out.metrics["dflash"] * n
    total = sum(a["n"] for a in sums.values()) or 1.0

    def tau(key: str, acc: dict[str, float]) -> float:
        return round(1 + acc[key] / max(acc["n"], 1.0), 4)

    return {
        "val_tau_control": round(1 + sum(a["control"] for a in sums.values()) / total, 4),
        "val_tau_head": round(1 + sum(a["head"] for a in sums.values()) / total, 4),
        "val_dflash": round(sum(a["dflash"] for a in sums.values()) / total, 4),
        "val_anchors": int(total),
        "val_by_category": {
            CATEGORIES[c]: {
                "tau_control": tau("control", a),
                "tau_head": tau("head", a),
                "anchors": int(a["n"]),
            }
            for c, a in sorted(sums.items())
        },
    }


def decode_walk(accepted: Sequence[int], new_tokens: int) -> list[int]:
    """The tokens each block commits when greedy decoding writes `new_tokens` answer tokens and its block anchored
    at answer position j would accept accepted[j] drafts: the prefill writes token 0; a block anchored at j
    commits accepted[j] + 1 tokens and the next block is anchored at the last of them, until the answer has
    `new_tokens`. The last block's tokens are counted whole, as the decoder's records (and smoke's τ) count them,
    although the answer keeps only what it had room for."""
    committed: list[int] = []
    j = 0
    while j < new_tokens - 1:
        step = int(accepted[j]) + 1
        committed.append(step)
        j += step
    return committed


def walk_rows(data: Shard, per_category: int = WALK_PER_CATEGORY) -> np.ndarray:
    """The held-out sequences the walk reads: the first `per_category` of each category with an answer of at
    least two tokens, in the set's order."""
    answers = np.diff(data.offsets) - data.prompt_lengths
    rows: list[int] = []
    for category in np.unique(data.category):
        mine = np.nonzero((data.category == category) & (answers >= 2))[0]
        rows.extend(int(i) for i in mine[:per_category])
    return np.array(sorted(rows), dtype=np.int64)


@torch.no_grad()
def answer_acceptance(
    drafter: Drafter,
    target: FastTarget,
    seqs: Sequence[np.ndarray],
    prompts: Sequence[int],
    walked: Sequence[int],
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each sequence's accepted draft length at its answer positions 0 .. walked - 2 (a block anchored at each),
    teacher-forced against the sequence's own next tokens: (control [n, max(walked) - 1], head or None), 0 past
    a sequence's own anchors. seqs: prompt + answer token ids (the answer may run past what is walked, so that
    the last blocks' drafts meet true tokens); prompts: the prompt lengths."""
    device = target.device
    most = max(walked) - 1
    tokens = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    anchors = torch.ones(len(seqs), most, dtype=torch.long)
    valid = torch.zeros(len(seqs), most, dtype=torch.bool)
    for r, (seq, prompt, count) in enumerate(zip(seqs, prompts, walked, strict=True)):
        tokens[r, : len(seq)] = torch.from_numpy(np.asarray(seq, dtype=np.int64))
        anchors[r, : count - 1] = torch.arange(prompt, prompt + count - 1)
        valid[r, : count - 1] = True
    lengths = torch.tensor([len(s) for s in seqs])
    batch = TrainBatch(tokens.to(device), lengths.to(device), anchors.to(device), valid.to(device))
    _, features = target_pass(target, batch.tokens, drafter.target_layer_ids)
    with _autocast(device):
        control, head = accepted_lengths(
            drafter, target.embed_tokens.weight.detach(), target.lm_head.weight.detach(), features, batch
        )
    return control.cpu().numpy(), None if head is None else head.cpu().numpy()


@torch.no_grad()
def walk_tau(
    drafter: Drafter,
    target: FastTarget,
    data: Shard,
    *,
    per_category: int = WALK_PER_CATEGORY,
    new_tokens: int = WALK_TOKENS,
    batch: int = WALK_BATCH,
) -> dict[str, Any]:
    """The τ greedy decoding reaches on held-out answers, teacher-forced: the accepted length at every answer
    position (`answer_acceptance`) of the first `new_tokens` answer tokens of `walk_rows` (the drafts checked
    against the answer's next tokens, up to a block past them), walked block by block (`decode_walk`) for the
    control and for the head.

    {"val_walk_tau_control", "val_walk_tau_head", "val_walk_blocks_control", "val_walk_blocks_head",
    "val_walk_cond_control", "val_walk_cond_head": conditional acceptance per drafted position over the blocks
    walked (blocks with a true token for every draft), "val_walk_sequences"}.

    An answer that ends at eos has no tokens past it, so the drafts of the block that commits the eos count as
    rejected past it where decoding may accept the target's tokens after eos: a slight undercount, at most one
    block per answer (bench/walk_probes.py generates past eos and has none)."""
    slots = drafter.block_size - 1
    arms = ("control", "head") if drafter.lilicorr is not None else ("control",)
    committed: dict[str, list[int]] = {arm: [] for arm in arms}
    reached = {arm: np.zeros(slots + 1, dtype=np.int64) for arm in arms}  # blocks accepting >= s drafts
    rows = walk_rows(data, per_category)
    with _measuring(drafter):
        for first in range(0, len(rows), batch):
            seqs, prompts, walked = [], [], []
            for i in rows[first : first + batch]:
                prompt = int(data.prompt_lengths[i])
                seqs.append(data.tokens[data.offsets[i] : data.offsets[i + 1]][: prompt + new_tokens + slots])
                prompts.append(prompt)
                walked.append(min(len(seqs[-1]) - prompt, new_tokens))  # answer tokens decoding writes
            control, head = answer_acceptance(drafter, target, seqs, prompts, walked)
            for arm, accepted in (("control", control), ("head", head)):
                if accepted is None:
                    continue
                for r, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True)):
                    j = 0
                    for step in decode_walk(accepted[r], walked[r]):
                        committed[arm].append(step)
                        if prompt + j + slots < len(seq):  # a true token for every draft: not cut short
                            reached[arm][: int(accepted[r][j]) + 1] += 1
                        j += step
    record: dict[str, Any] = {"val_walk_sequences": len(rows)}
    if not len(rows):  # nothing to walk: no tau rather than a made-up one
        return record
    for arm in arms:
        blocks = committed[arm]
        record[f"val_walk_tau_{arm}"] = round(sum(blocks) / max(len(blocks), 1), 4)
        record[f"val_walk_blocks_{arm}"] = len(blocks)
        counts = reached[arm]
        record[f"val_walk_cond_{arm}"] = [
            round(float(counts[s]) / float(counts[s - 1]), 4) if counts[s - 1] else None
            for s in range(1, slots + 1)
        ]
    return record
