"""Held-out acceptance of a drafter: tau on validation sequences the training never draws, per training piece.

tau = 1 + the drafted tokens accepted per block (the token the target adds to every verify step included, as
`lilicorr-ckpt smoke` counts it), for the head-free control (the argmax walk) and the LiLiCorr head (its greedy
walk), teacher-forced: blocks anchored at answer positions of the held-out sequences, drafted from the target's
own taps, exactly as the training objective scores them. The anchors are drawn once from a fixed seed, so every
piece of a run (and every drafter) is measured on the same blocks.

It is cheap (a few thousand blocks, a second or two on a GPU), so the piece runner (`lilicorr_train.pieces`) logs
it after every piece: a line {"heldout_step": N, "val_tau_control": ..., "val_tau_head": ..., ...} in the run's
log.jsonl (no `step` key, so readers of the training records, `lilicorr-ckpt card` among them, skip it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from msgspec import Struct

from lilicorr_runtime.model.drafter import Drafter
from lilicorr_runtime.target.fast import FastTarget

from .loop import target_pass
from .mixes import CATEGORIES, Shard
from .objective import LossWeights, TrainBatch, sample_anchors, training_step

ANCHORS = 8  # per held-out sequence
BATCH = 32  # sequences per forward
MAX_LENGTH = 640  # as training cuts them


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
def heldout_tau(drafter: Drafter, target: FastTarget, held: HeldOut, *, batch: int = BATCH) -> dict[str, Any]:
    """{"val_tau_control", "val_tau_head", "val_dflash", "val_anchors", "val_by_category": {...}}."""

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
