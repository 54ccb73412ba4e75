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

from collections.abc import Sequence
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


@torch.no_grad()
def heldout_tau(
    drafter: Drafter, target: FastTarget, held: HeldOut, *, batch: int = BATCH, walk: bool = True
) -> dict[str, Any]:
    """{"val_tau_control", "val_tau_head", "val_dflash", "val_anchors", "val_by_category": {...}} at the fixed
    uniform anchors, and with `walk` the decode walk's keys (`walk_tau`)."""

    device = target.device
    was_training = drafter.training
    drafter.eval()
    if drafter.lilicorr is not None:
        drafter.lilicorr.invalidate_derived()
    embed_w = target.embed_tokens.weight.detach()
    head_w = target.lm_head.weight.detach()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    data = held.data
    sums: dict[int, dict[str, float]] = {}
    for first in range(0, len(data), batch):
        rows = np.arange(first, min(first + batch, len(data)))
        seqs = [
            data.tokens[data.offsets[i] : data.offsets[i + 1]][:MAX_LENGTH].astype(np.int64) for i in rows
        ]
        width = max(len(s) for s in seqs)
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            tokens[r, : len(s)] = torch.from_numpy(s)
        lengths = torch.tensor([len(s) for s in seqs])
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
            with autocast:
                out = training_step(drafter, embed_w, head_w, features, hidden, tb, LossWeights())
            n = int(tb.anchor_valid.sum())
            acc = sums.setdefault(int(category), {"n": 0.0, "control": 0.0, "head": 0.0, "dflash": 0.0})
            acc["n"] += n
            acc["control"] += out.metrics["control_accept"] * n
            acc["head"] += out.metrics.get("head_accept", out.metrics["control_accept"]) * n
            acc["dflash"] += out.metrics["dflash"] * n
    if was_training:
        drafter.train()
    total = sum(a["n"] for a in sums.values()) or 1.0

    def tau(key: str, acc: dict[str, float]) -> float:
        return round(1 + acc[key] / max(acc["n"], 1.0), 4)

    record = {
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
    if walk:
        record.update(walk_tau(drafter, target, data))
    return record


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
    position (`accepted_lengths`) of the first `new_tokens` answer tokens of `walk_rows` (the drafts checked
    against the answer's next tokens, up to a block past them), walked block by block (`decode_walk`) for the
    control and for the head. An answer that ends at eos has no tokens past it, so the drafts of the block that
    commits the eos count as rejected past it where decoding may accept the target's tokens after eos: a
    slight undercount, at most one block per answer (bench/walk_probes.py generates past eos and has none). {"val_walk_tau_control", "val_walk_tau_head",
    "val_walk_blocks_control", "val_walk_blocks_head", "val_walk_cond_control", "val_walk_cond_head": conditional
    acceptance per drafted position over the blocks walked (blocks with room for every draft), "val_walk_sequences"}.
    """
    device = target.device
    was_training = drafter.training
    drafter.eval()
    if drafter.lilicorr is not None:
        drafter.lilicorr.invalidate_derived()
    embed_w = target.embed_tokens.weight.detach()
    head_w = target.lm_head.weight.detach()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    slots = drafter.block_size - 1
    arms = ("control", "head") if drafter.lilicorr is not None else ("control",)
    committed: dict[str, list[int]] = {arm: [] for arm in arms}
    reached = {arm: np.zeros(slots + 1, dtype=np.int64) for arm in arms}  # blocks accepting >= s drafts
    rows = walk_rows(data, per_category)
    for first in range(0, len(rows), batch):
        chunk = rows[first : first + batch]
        seqs, prompts, walked = [], [], []
        for i in chunk:
            prompt = int(data.prompt_lengths[i])
            seq = data.tokens[data.offsets[i] : data.offsets[i + 1]][: prompt + new_tokens + slots]
            seqs.append(seq.astype(np.int64))
            prompts.append(prompt)
            walked.append(min(len(seq) - prompt, new_tokens))  # answer tokens decoding writes
        width = max(len(s) for s in seqs)
        most = max(walked) - 1  # anchors: answer positions 0 .. walked - 2
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        anchors = torch.ones(len(seqs), most, dtype=torch.long)
        valid = torch.zeros(len(seqs), most, dtype=torch.bool)
        for r, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
            tokens[r, : len(s)] = torch.from_numpy(s)
            count = walked[r] - 1
            anchors[r, :count] = torch.arange(p, p + count)
            valid[r, :count] = True
        lengths = torch.tensor([len(s) for s in seqs])
        tb = TrainBatch(tokens.to(device), lengths.to(device), anchors.to(device), valid.to(device))
        _, features = target_pass(target, tb.tokens, drafter.target_layer_ids)
        with autocast:
            control, head = accepted_lengths(drafter, embed_w, head_w, features, tb)
        by_arm = {"control": control.cpu().numpy(), "head": head.cpu().numpy() if head is not None else None}
        for arm in arms:
            accepted = by_arm[arm]
            assert accepted is not None
            for r, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
                blocks = decode_walk(accepted[r], walked[r])
                committed[arm].extend(blocks)
                j = 0
                for step in blocks:
                    if p + j + slots < len(s):  # every draft has a true token: its length is not cut short
                        reached[arm][: int(accepted[r][j]) + 1] += 1
                    j += step
    if was_training:
        drafter.train()
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
