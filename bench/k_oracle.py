"""How much a LiLiCorr head could gain at each candidate count K: the oracle's acceptance, on held-out data.

    python bench/k_oracle.py DRAFTER --target T --val val.npz [--ks 1,2,4,8,16,32] [--limit N] [--device cpu]
    python bench/k_oracle.py examples/smollm2-lilicorr --target .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --val .cache/v3/d/val.npz

The head walks a lattice of each slot's top-K drafter candidates, so a block can accept at most the prefix of
slots whose true token is among their K candidates: the oracle prefix (a head that always picks the true
candidate). For every K of --ks (and the head's trained K) this prints that ceiling (oracle τ = 1 + the mean
oracle prefix) beside what the drafter itself reaches: the head-free control (the argmax walk, K = 1's oracle) and
the trained head (its greedy walk at the K it was trained with). The candidates are taken in decoding's order
(`topk_lse`: equal logits in column order), so K = 1's oracle is the control exactly and the trained K's bounds
the head. The blocks are the held-out set's fixed uniform anchors (`lilicorr_train`'s held-out measure, the
training objective's teacher-forced drafting: the training log's `val_tau_*`, to round-off, as its batches are
grouped otherwise), which read about a fifth above what `lilicorr-ckpt smoke` measures (docs/training.md):
compare the rows with each other, not with smoke.

What the table decides: a K above the trained one raises the ceiling by the gap between the rows; the head
already reaches only part of its own K's ceiling, so a larger K is worth training only where the head closes
most of that part. The per-slot coverage (the true token among the K candidates at slot s, given the block's
anchor only; of the blocks whose slot s lies inside the sequence) shows where the candidates, rather than the
ranking, limit the walk; the ranking table shows the other side: on the blocks whose true tokens are among the
candidates up to slot s, how often the head (given the true previous candidate) ranks the true one first, beside
how often the drafter's own first candidate is the true one (what a head that always kept the argmax would get).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lilicorr_train: the repository's

from lilicorr_ckpt.checkpoint import load_checkpoint  # noqa: E402
from lilicorr_ckpt.errors import InputError, UsageError  # noqa: E402
from lilicorr_runtime.model.load import CheckpointRefused, build_drafter  # noqa: E402
from lilicorr_train.heldout import MAX_LENGTH, _autocast, _measuring, padded_rows  # noqa: E402
from lilicorr_train.loop import target_pass  # noqa: E402
from lilicorr_train.objective import (  # noqa: E402
    TrainBatch,
    accepted_lengths,
    draft_teacher_forced,
    head_lattice,
    truth_conditioned,
)
from lilicorr_train.pieces import held_out_set  # noqa: E402
from lilicorr_train.script import Parser, device_name, load_target_or_say, run_script, whole_number  # noqa: E402


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(k) for k in text.split(",") if k.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ks takes whole numbers separated by commas, not {text!r}"
        ) from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"--ks takes candidate counts of at least 1, not {text!r}")
    return ks


def true_ranks(logits: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """logits [..., V], truth [...] -> the true token's rank [...] (0 = best) in the order the drafter's candidates
    are taken in (`topk_lse`: greater logits first, equal ones in column order), so that `rank < K` is exactly
    "the true token is among the K candidates", ties included (bf16 logits tie often on CUDA), and rank 0 is the
    control's argmax."""
    value = logits.gather(-1, truth[..., None])
    columns = torch.arange(logits.shape[-1], device=logits.device)
    return (logits > value).sum(-1) + ((logits == value) & (columns < truth[..., None])).sum(-1)


def load_pair(args: argparse.Namespace, device: torch.device) -> tuple:
    """(target, drafter), the drafter built and checked against the target (UsageError or InputError naming what
    does not fit, never a traceback)."""
    target = load_target_or_say(
        args.target, dtype="bfloat16" if device.type == "cuda" else "float32", device=str(device), fast=True
    )
    checkpoint = load_checkpoint(str(args.drafter))
    try:
        drafter = build_drafter(checkpoint, dtype=torch.float32, device=str(device))
    except CheckpointRefused as exc:
        raise InputError(str(exc)) from None
    except (KeyError, ValueError, RuntimeError) as exc:  # tensors its files lack, or of another shape
        raise InputError(
            f"{args.drafter}: its drafter cannot be built ({type(exc).__name__}: {str(exc)[:200]}); "
            "`lilicorr-ckpt validate` says why"
        ) from None
    if not drafter.trains_on_blocks:
        raise UsageError(f"{args.drafter}: the teacher-forced forward needs a full-attention drafter")
    problems = []
    if drafter.geometry.hidden_size != target.hidden_size:
        problems.append(
            f"draft hidden_size {drafter.geometry.hidden_size} != the target's {target.hidden_size}"
        )
    if max(drafter.target_layer_ids) >= target.num_layers:
        problems.append(
            f"target_layer_ids {list(drafter.target_layer_ids)} reach past the target's {target.num_layers} layers"
        )
    if drafter.mask_token_id >= target.vocab_size:
        problems.append(f"mask_token_id {drafter.mask_token_id} is past the target's vocabulary")
    if drafter.lilicorr is not None and drafter.lilicorr.candidate_topk > target.vocab_size:
        problems.append(f"candidate_topk {drafter.lilicorr.candidate_topk} is past the target's vocabulary")
    if problems:
        raise UsageError(f"{args.drafter} does not fit the target {args.target}: " + "; ".join(problems))
    return target, drafter


def ranking(
    ids: torch.Tensor, start: torch.Tensor, pairs: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head's ranking at each slot, teacher-forced: ids [b, m, S, K] (the candidates, best first), start
    [b·m, K], pairs [b·m, S-1, K, K] (`head_lattice`), truth [b, m, S], valid [b, m, S] -> per slot [S], over the
    blocks whose true tokens are among the candidates at every slot up to s (the oracle prefix, where the walk
    can still accept slot s): their count, how many the head ranks the true candidate first at (slot 1 by its
    start scores, slot s by its pair scores from the true candidate of slot s-1, ties to the lower index as the
    walk breaks them), and how many the drafter's own first candidate (the control's argmax) is the true one at."""
    true_index, inside, scores = truth_conditioned(ids, start, pairs, truth, valid)
    head_right = (scores.argmax(-1) == true_index) & inside
    argmax_right = (true_index == 0) & inside
    return (
        inside.double().sum(0).cpu(),
        head_right.double().sum(0).cpu(),
        argmax_right.double().sum(0).cpu(),
    )


@torch.no_grad()
def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    held = held_out_set(args.val)
    target, drafter = load_pair(args, device)
    vocab = target.vocab_size
    trained_k = drafter.lilicorr.candidate_topk if drafter.lilicorr is not None else None
    # the trained K's row is the head's own ceiling: always measured
    ks = tuple(sorted({*args.ks, trained_k} if trained_k is not None else set(args.ks)))
    if ks[-1] > vocab:
        raise UsageError(f"--ks {ks[-1]} is past the target's vocabulary ({vocab})")
    embed_w, head_w = target.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    data = held.data
    count = len(data) if args.limit is None else min(args.limit, len(data))
    end = int(data.offsets[count])
    if end and int(data.tokens[:end].max()) >= vocab:
        raise InputError(
            f"--val {args.val} holds token ids past the target's vocabulary ({vocab}): another tokenizer's set?"
        )
    if not bool(held.valid[:count].any()):
        raise InputError(
            f"--val {args.val}: no answer position to anchor a block at in its first {count} sequences "
            f"(every answer shorter than 2 tokens, or past the first {MAX_LENGTH} tokens)"
        )
    slots = drafter.block_size - 1
    prefix_sum = dict.fromkeys(ks, 0.0)
    covered_sum = {k: torch.zeros(slots, dtype=torch.float64) for k in ks}
    slots_total = torch.zeros(slots, dtype=torch.float64)  # blocks whose slot s lies inside the sequence
    control_sum = head_sum = anchors_total = 0.0
    # the ranking at each slot, on the blocks whose true tokens are among the candidates up to it: how often the
    # head, given the true previous candidate, ranks the true one first, and how often the drafter's argmax is it
    ranked = torch.zeros(slots, dtype=torch.float64)
    head_first = torch.zeros(slots, dtype=torch.float64)
    argmax_first = torch.zeros(slots, dtype=torch.float64)
    begin = time.perf_counter()
    with _measuring(drafter):
        for first in range(0, count, args.batch):
            rows = np.arange(first, min(first + args.batch, count))
            tokens, lengths = padded_rows(data, rows)
            batch = TrainBatch(
                tokens.to(device),
                lengths.to(device),
                held.anchors[rows].to(device),
                held.valid[rows].to(device),
            )
            if not bool(batch.anchor_valid.any()):
                continue
            _, features = target_pass(target, batch.tokens, drafter.target_layer_ids)
            with _autocast(device):
                # the blocks' logits as draft_teacher_forced computes them (the same product of the same hidden
                # states, in autocast's dtype): the candidates the head walks are the first K of their order
                drafted = draft_teacher_forced(drafter, embed_w, head_w, features, batch, exact=True)
                rank = true_ranks(F.linear(drafted.pass_hidden, head_w), drafted.truth)  # [b, m, S]
                control, head = accepted_lengths(drafter, embed_w, head_w, features, batch)
                if trained_k is not None:
                    lattice = head_lattice(drafter, embed_w, drafted, batch.anchors)
            valid = batch.anchor_valid
            slot_valid = drafted.slot_valid  # [b, m, S]: inside the sequence, of a valid anchor
            for k in ks:
                covered = (rank < k) & slot_valid  # counted as accepted_lengths counts the control's hits
                prefix_sum[k] += float(covered.long().cumprod(-1).sum(-1)[valid].sum())
                covered_sum[k] += covered[valid].double().sum(0).cpu()
            slots_total += slot_valid[valid].double().sum(0).cpu()
            if trained_k is not None:
                inside, first_head, first_argmax = ranking(
                    *lattice, drafted.truth, slot_valid & valid[..., None]
                )
                ranked += inside
                head_first += first_head
                argmax_first += first_argmax
            control_sum += float(control[valid].sum())
            if head is not None:
                head_sum += float(head[valid].sum())
            anchors_total += float(valid.sum())
            if args.progress:
                print(f"k_oracle: {rows[-1] + 1}/{count} sequences", file=sys.stderr, flush=True)
    n = anchors_total  # > 0: a valid anchor was checked for above
    per_slot = slots_total.clamp(min=1)
    return {
        "drafter": str(args.drafter),
        "device": str(device),
        "sequences": count,
        "anchors": int(anchors_total),
        "trained_k": trained_k,
        "tau_control": round(1 + control_sum / n, 4),
        "tau_head": round(1 + head_sum / n, 4) if trained_k is not None else None,
        "oracle_tau": {k: round(1 + prefix_sum[k] / n, 4) for k in ks},
        "coverage": {k: [round(float(c), 4) for c in covered_sum[k] / per_slot] for k in ks},
        "ranking": None
        if trained_k is None
        else {
            "blocks": [int(c) for c in ranked],
            "head_first": [round(float(c), 4) for c in head_first / ranked.clamp(min=1)],
            "argmax_first": [round(float(c), 4) for c in argmax_first / ranked.clamp(min=1)],
        },
        "s": round(time.perf_counter() - begin, 1),
    }


def table(result: dict) -> str:
    k_trained = result["trained_k"]
    lines = [
        f"{result['drafter']}: {result['sequences']} held-out sequences, {result['anchors']} blocks "
        f"(uniform anchors), {result['device']}, {result['s']} s",
        f"control (argmax walk): tau {result['tau_control']:.3f}"
        + (f"; head (K = {k_trained}): tau {result['tau_head']:.3f}" if k_trained is not None else ""),
        "",
        "| K | oracle tau | coverage by slot (true token among the K candidates, of the blocks that reach it) |",
        "|---:|---:|---|",
    ]
    for k, tau in result["oracle_tau"].items():
        mark = " (trained)" if k == k_trained else ""
        cover = " ".join(f"{c:.3f}" for c in result["coverage"][k])
        lines.append(f"| {k}{mark} | {tau:.3f} | {cover} |")
    if k_trained is not None and k_trained in result["oracle_tau"]:
        ceiling = result["oracle_tau"][k_trained] - result["tau_control"]
        reached = result["tau_head"] - result["tau_control"]
        share = f"{reached / ceiling:.0%}" if ceiling > 0 else "none"
        lines.append(
            f"\nthe head reaches {share} of its K = {k_trained} ceiling over the control "
            f"({reached:+.3f} of {ceiling:+.3f} tokens a block)"
        )
    rank = result.get("ranking")
    if rank is not None:
        lines += [
            "",
            f"ranking at K = {k_trained}, on the blocks whose true tokens are among the candidates up to the slot "
            "(the head given the true previous candidate):",
            "| slot | blocks | head ranks the true candidate first | the drafter's argmax is it |",
            "|---:|---:|---:|---:|",
        ]
        for s, (n, h, a) in enumerate(
            zip(rank["blocks"], rank["head_first"], rank["argmax_first"], strict=True)
        ):
            lines.append(f"| {s + 1} | {n} | {h:.3f} | {a:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python bench/k_oracle.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("drafter", type=Path, help="the drafter checkpoint (a folder with config.json)")
    p.add_argument("--target", required=True, help="the target (GGUF file, checkpoint folder or repo id)")
    p.add_argument("--val", type=Path, required=True, help="the held-out set (`mixes build`'s val.npz)")
    p.add_argument(
        "--ks",
        type=parse_ks,
        default=(1, 2, 4, 8, 16, 32),
        help="candidate counts (1,2,4,8,16,32); the head's trained K is always added",
    )
    p.add_argument(
        "--limit",
        type=whole_number("--limit", 1, 10**9),
        default=None,
        help="only the first N held-out sequences",
    )
    p.add_argument(
        "--batch", type=whole_number("--batch", 1, 4096), default=8, help="sequences a forward (8)"
    )
    p.add_argument(
        "--device", type=device_name, default=None, help="cpu or cuda[:N] (default cuda where there is one)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    p.add_argument("--progress", action="store_true", help="a line on stderr after each batch")
    args = p.parse_args(argv)

    def run() -> int:
        result = measure(args)
        print(json.dumps(result) if args.json else table(result))
        return 0

    return run_script("python bench/k_oracle.py", run)


if __name__ == "__main__":
    raise SystemExit(main())
