"""Training in pieces of at most ten minutes, with the held-out tau of every piece in the run's log.

\b
  python -m lilicorr_train.pieces fit RUN --target T --data train.npz --val val.npz \\
      --taps 1,8,15,22,28 --init-layer 29 --steps 20000 --budget 240
  python -m lilicorr_train.pieces fit RUN --target T --data train.npz --val val.npz --budget 540   # resume
  python -m lilicorr_train.pieces heldout DRAFTER --target T --val val.npz     # a converted drafter

`fit` starts the run in RUN (a new one: the drafter's taps, K, head width and depth from the options) or resumes
it, exactly as `python -m lilicorr_train train` does (the same state file, loop and objective), and logs the
held-out tau (`lilicorr_train.heldout`) before the first step and after the piece. The training curve is then
`python scripts/plot_training.py RUN/log.jsonl --out curve.svg`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from msgspec import structs

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.outfile import Inputs
from lilicorr_runtime.model.load import build_drafter

from .data import Dataset
from .export import DrafterShape, drafter_config
from .heldout import HeldOut, heldout_tau
from .loop import LOG, TrainConfig, fit, open_run
from .mixes import Shard
from .script import Parser, load_target_or_say, run_script, seconds
from .state import STATE, open_log, read_state, state_path


def _taps(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def log_heldout(run_dir: Path, step: int, record: dict[str, Any], note: str = "") -> None:
    line = {"heldout_step": step, **record}
    if note:
        line["note"] = note
    with open_log(run_dir / LOG) as f:
        f.write(json.dumps(line) + "\n")


def fit_piece(args: argparse.Namespace) -> dict[str, Any]:
    begin = time.perf_counter()
    # RUN's state and log must be none of the inputs (exit 4, before anything loads)
    inputs = Inputs().add(args.target, "the target").add(args.init_from, "the --init-from drafter")
    inputs.add(args.val, "the --val file")
    for path in args.data:
        inputs.add(path, "the --data file")
    for name in (STATE, LOG):
        inputs.refuse(args.run / name, "RUN's", fix="give the run a directory of its own")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = Dataset.concat([Dataset.load(p) for p in args.data])
    held = HeldOut.of(Shard.load(args.val))
    target = load_target_or_say(
        args.target, dtype="bfloat16" if device.startswith("cuda") else "float32", device=device, fast=True
    )
    found = state_path(args.run)
    config = None
    if found is None:
        if bool((data.tokens == args.mask_token_id).any()):
            raise SystemExit(f"--mask-token-id {args.mask_token_id} occurs in the training data")
        shape = DrafterShape(
            num_layers=args.layers,
            target_layer_ids=_taps(args.taps) if args.taps else (),
            mask_token_id=args.mask_token_id,
            candidate_topk=args.k,
            head_hidden_size=args.head_width,
            head_num_layers=args.head_layers,
        )
        config = drafter_config(target.config, shape)
    settings = TrainConfig(
        batch_size=args.batch_size, anchors=args.anchors, lr_drafter=args.lr_drafter, lr_head=args.lr_head
    )
    state = read_state(found) if found is not None else None
    run = open_run(
        args.run,
        config,
        settings,
        target,
        args.init_layer if found is None else None,
        args.steps,
        init_from=args.init_from if found is None else None,
        state=state,
    )
    args.run.mkdir(parents=True, exist_ok=True)
    print(
        json.dumps(
            {
                "run": str(args.run),
                "step": run.step,
                "steps": run.train.steps,
                "sequences": len(data),
                "taps": list(run.drafter.target_layer_ids),
                "settings": structs.asdict(run.train),
                "load_s": round(time.perf_counter() - begin, 1),
            }
        ),
        flush=True,
    )
    if run.step == 0:
        log_heldout(args.run, 0, heldout_tau(run.drafter, target, held), "before training")
    budget = args.budget - (time.perf_counter() - begin) - args.reserve
    done = fit(
        run,
        args.run,
        target,
        data,
        time_budget_s=max(budget, 1.0),
        log=lambda r: (
            print(json.dumps(r), flush=True) if "planned_steps" in r or r.get("step", 0) % 250 == 0 else None
        ),
    )
    record = heldout_tau(run.drafter, target, held)
    log_heldout(args.run, run.step, record)
    result = {
        "run": str(args.run),
        "step": run.step,
        "finished": done,
        **record,
        "s": round(time.perf_counter() - begin, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def heldout_drafter(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target = load_target_or_say(
        args.target, dtype="bfloat16" if device.startswith("cuda") else "float32", device=device, fast=True
    )
    drafter = build_drafter(load_checkpoint(str(args.drafter)), dtype=torch.float32, device=device)
    record = {"drafter": str(args.drafter), **heldout_tau(drafter, target, HeldOut.of(Shard.load(args.val)))}
    print(json.dumps(record), flush=True)
    return record


PROG = "python -m lilicorr_train.pieces"


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train (or resume) RUN for one piece; log the held-out tau")
    f.add_argument("run", type=Path, metavar="RUN")
    f.add_argument("--target", required=True)
    f.add_argument("--data", type=Path, action="append", required=True)
    f.add_argument("--val", type=Path, required=True)
    f.add_argument(
        "--budget", type=seconds, default=540.0, help="seconds for the whole piece, loads included"
    )
    f.add_argument(
        "--reserve", type=seconds, default=15.0, help="seconds kept for the last save and held-out tau"
    )
    f.add_argument("--steps", type=int, default=None, help="total steps (new run: 4000; resume: extend)")
    f.add_argument("--taps", default="", help="new run: target layers tapped, e.g. 1,8,15,22,28")
    f.add_argument("--init-layer", type=int, default=None)
    f.add_argument("--init-from", type=Path, default=None)
    f.add_argument("--mask-token-id", type=int, default=16)
    f.add_argument("--layers", type=int, default=1)
    f.add_argument("--k", type=int, default=8)
    f.add_argument("--head-width", type=int, default=256)
    f.add_argument("--head-layers", type=int, default=2)
    f.add_argument("--batch-size", type=int, default=32)
    f.add_argument("--anchors", type=int, default=48)
    f.add_argument("--lr-drafter", type=float, default=6e-4)
    f.add_argument("--lr-head", type=float, default=3e-4)
    f.add_argument("--device", default=None)
    h = sub.add_parser("heldout", help="the held-out tau of a converted drafter")
    h.add_argument("drafter", type=Path)
    h.add_argument("--target", required=True)
    h.add_argument("--val", type=Path, required=True)
    h.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    return run_script(PROG, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    if args.command == "fit":
        fit_piece(args)
    else:
        heldout_drafter(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
