"""A drafter's acceptance on the bundled probes, teacher-forced at every answer position: the decode walk (the τ
`lilicorr-ckpt smoke` measures), the uniform τ (what held-out anchors drawn at random read), and each drafted
position's acceptance for the head and the control on the same anchors.

    python bench/walk_probes.py DRAFTER --target T [--probes code,chat,math] [--limit 0] [--device cpu|cuda]
    python bench/walk_probes.py examples/smollm2-lilicorr --target .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

The target writes each probe's greedy answer (the lossless arms of smoke write exactly these tokens) of up to
--max-new-tokens tokens, and a block more past its end (past eos too), so that the last block's drafts have the
target's tokens to meet, as they do in decoding. For every
answer position the drafter drafts a block from the target's taps of the positions before it (the training
objective's forward, `lilicorr_train.heldout.answer_acceptance`), and the accepted length is counted for the
control (argmax per slot) and the head (its greedy walk). Then:

    walk τ        the blocks greedy decoding commits, each anchored after the last one's tokens
                  (`lilicorr_train.heldout.decode_walk`): smoke's τ and block count
    uniform τ     1 + the mean accepted length over every answer position
    per position  for each drafted position s, over the anchors where both arms accepted the s - 1 before it:
                  the share each arm accepts at s (paired: the same anchors for both arms, so neither arm's
                  rate is taken over spans only it reached), and beside it each arm's conditional rate over its
                  own anchors (what smoke's "cond" column reads, there over decoded blocks)

The paired column answers whether the head accepts less than the control at a late position or only reaches
it on harder spans: a conditional rate over each arm's own blocks compares different anchors.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # lilicorr_train: the repository's, not the wheel's

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.smoke.probes import load_probes
from lilicorr_ckpt.smoke.tokenize import tokenize_probes
from lilicorr_runtime.model.load import build_drafter
from lilicorr_runtime.target.load import load_target
from lilicorr_train.heldout import WALK_BATCH, answer_acceptance, decode_walk
from lilicorr_train.script import run_script


def measure(args: argparse.Namespace) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cpu":
        torch.set_num_threads(max(1, args.threads))
    begin = time.perf_counter()
    target = load_target(args.target, dtype=dtype, device=device, fast=True)
    drafter = build_drafter(load_checkpoint(args.drafter), dtype=torch.float32, device=device).eval()
    if drafter.lilicorr is None:
        raise SystemExit(f"{args.drafter}: no LiLiCorr head to compare with the control")
    slots = drafter.block_size - 1
    probes = load_probes(args.probes, args.limit)
    eos = list(target.eos_token_ids)
    prompts, _ = tokenize_probes(target.tokenizer, probes, eos)
    # past eos too: decoding checks the eos block's drafts against the target's tokens after it, so the truth
    # runs on; the answer itself ends at its first eos (inclusive), where decoding stops
    answers = target.generate_batch(prompts, args.max_new_tokens + slots, eos_token_ids=(), batch_size=64)
    print(f"{len(prompts)} answers in {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)
    accepted: dict[str, list[np.ndarray]] = {"control": [], "head": []}
    walked: list[int] = []
    categories: list[str] = []
    kept = []  # (probe, prompt, answer, answer tokens decoding writes): those with a draft after the prefill's
    for probe, prompt, answer in zip(probes, prompts, answers, strict=True):
        ends = [i for i, token in enumerate(answer) if token in eos]
        count = min(ends[0] + 1 if ends else len(answer), args.max_new_tokens)
        if count >= 2:
            kept.append((probe, prompt, answer, count))
    for first in range(0, len(kept), WALK_BATCH):
        chunk = kept[first : first + WALK_BATCH]
        control, head = answer_acceptance(
            drafter, target, [np.array(p + a) for _, p, a, _ in chunk], [len(p) for _, p, _, _ in chunk],
            [c for *_, c in chunk],
        )  # fmt: skip
        assert head is not None
        for r, (probe, _, _, count) in enumerate(chunk):
            accepted["control"].append(control[r, : count - 1])
            accepted["head"].append(head[r, : count - 1])
            walked.append(count)
            categories.append(probe.category)
        if first % 24 == 0:
            print(f"{first}/{len(kept)} {time.perf_counter() - begin:.0f} s", file=sys.stderr, flush=True)
    result: dict = {"answers": len(walked), "seconds": round(time.perf_counter() - begin, 1)}
    for arm in ("control", "head"):
        blocks = [b for a, w in zip(accepted[arm], walked, strict=True) for b in decode_walk(a, w)]
        every = np.concatenate(accepted[arm])
        result[arm] = {
            "walk_tau": sum(blocks) / len(blocks),
            "blocks": len(blocks),
            "uniform_tau": 1 + float(every.mean()),
        }
        by_category = {}
        for category in sorted(set(categories)):
            picked = [b for a, w, c in zip(accepted[arm], walked, categories, strict=True) if c == category
                      for b in decode_walk(a, w)]  # fmt: skip
            by_category[category] = sum(picked) / len(picked)
        result[arm]["walk_tau_by_category"] = by_category
    c, h = np.concatenate(accepted["control"]), np.concatenate(accepted["head"])
    result["positions"] = []
    for s in range(1, slots + 1):
        both = (c >= s - 1) & (h >= s - 1)
        result["positions"].append(
            {
                "position": s,
                "anchors": int(both.sum()),
                "paired_head": float((h[both] >= s).mean()) if both.any() else None,
                "paired_control": float((c[both] >= s).mean()) if both.any() else None,
                "own_head": float((h >= s).sum() / max(int((h >= s - 1).sum()), 1)),
                "own_control": float((c >= s).sum() / max(int((c >= s - 1).sum()), 1)),
            }
        )
    return result


def print_table(result: dict) -> None:
    print(f"{result['answers']} answers, {result['seconds']} s")
    print("| arm | walk τ (smoke's) | blocks | uniform τ | walk τ by category |")
    print("|---|---:|---:|---:|---|")
    for arm in ("head", "control"):
        r = result[arm]
        cats = ", ".join(f"{k} {v:.3f}" for k, v in r["walk_tau_by_category"].items())
        print(f"| {arm} | {r['walk_tau']:.4f} | {r['blocks']:,} | {r['uniform_tau']:.4f} | {cats} |")
    gain = result["head"]["walk_tau"] / result["control"]["walk_tau"] - 1
    print(f"\nhead gain (walk): {gain:+.1%}\n")
    print("| position | anchors both reached | paired head | paired control | own head | own control |")
    print("|---:|---:|---:|---:|---:|---:|")
    for p in result["positions"]:
        cells = [
            "-" if p[k] is None else f"{p[k]:.3f}"
            for k in ("paired_head", "paired_control", "own_head", "own_control")
        ]
        print(f"| {p['position']} | {p['anchors']:,} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter")
    parser.add_argument("--target", required=True)
    parser.add_argument("--probes", default="code,chat,math")
    parser.add_argument("--limit", type=int, default=0, help="prompts per category (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    args = parser.parse_args(argv)
    return run_script("bench/walk_probes.py", lambda: print_table(measure(args)) or 0)


if __name__ == "__main__":
    sys.exit(main())
