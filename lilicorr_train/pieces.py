"""Training in pieces of at most ten minutes, with the held-out tau of every piece in the run's log.

\b
  python -m lilicorr_train.pieces fit RUN --target T --data train.npz --val val.npz \\
      --taps 1,8,15,22,28 --init-layer 29 --steps 20000 --budget 240
  python -m lilicorr_train.pieces fit RUN --target T --data train.npz --val val.npz --budget 540   # resume
  python -m lilicorr_train.pieces heldout DRAFTER --target T --val val.npz     # a converted drafter

`fit` starts the run in RUN (a new one: the drafter's taps, K, head width and depth from the options) or resumes
it, exactly as `python -m lilicorr_train train` does (the same state file, loop and objective), and logs the
held-out tau (`lilicorr_train.heldout`) before the first step and after the piece. The training curve is then
`python scripts/plot_training.py RUN/log.jsonl --out curve.svg`. On a resume the run keeps its drafter and
settings: a "new run:" option given with the run's own value is ignored with a warning, with another value it
is a usage error (exit 4) naming both values; --init-layer, --init-from and --fresh-head are ignored with a
warning.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from msgspec import structs

from lilicorr_ckpt.checkpoint import load_checkpoint
from lilicorr_ckpt.checkpoint.target import read_target
from lilicorr_ckpt.errors import InputError, SmokeRefused, UsageError
from lilicorr_ckpt.outfile import Inputs
from lilicorr_ckpt.smoke.fit import loaded_info, require_fit
from lilicorr_runtime.model.load import build_drafter

from .data import DataError, Dataset
from .export import DrafterShape, drafter_config
from .heldout import HeldOut, heldout_tau
from .loop import LOG, TrainConfig, checkpoint_taps, fit, mask_token_in, open_run, resume_options
from .mixes import Shard
from .script import (
    Parser,
    device_name,
    load_target_or_say,
    real_number,
    run_script,
    seconds,
    whole_number,
)
from .state import (
    HEAD_LIMITS,
    MAX_TAPS,
    SETTINGS,
    STATE,
    StateError,
    check_log,
    open_log,
    read_state,
    state_path,
)

TAP = re.compile(r"-?[0-9]+")  # ASCII digits only: int() also reads 1_0 as 10 and other scripts' digits


def parse_taps(text: str) -> tuple[int, ...]:
    """--taps: target layers, comma-separated whole numbers >= 0 in ASCII digits (blanks around each allowed),
    each once (checked against the target's layers once it is loaded); an empty item (`1,,2`, a trailing comma,
    blanks) is refused, not skipped, and so is an item int() alone would read (`1_0`, `+1`, `١`)."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r} names no layer: give target layers, e.g. 3,9,15,21,27")
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item: give target layers separated by single commas, e.g. 3,9,15,21,27"
        )
    wrong = [x for x in items if not TAP.fullmatch(x)]
    if wrong:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {wrong[0]!r} is not a whole number; give target layers as whole numbers in the digits "
            "0-9, e.g. 3,9,15,21,27"
        )
    taps = tuple(int(x) for x in items)
    if any(t < 0 for t in taps):
        raise argparse.ArgumentTypeError(f"{text!r}: a layer is a whole number from 0")
    if len(set(taps)) != len(taps):
        raise argparse.ArgumentTypeError(f"{text!r} names a layer twice")
    if len(taps) > MAX_TAPS:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_TAPS} taps")
    return taps


def _rate(name: str) -> Callable[[str], float]:
    _, low, high = SETTINGS[name]
    return real_number(name.replace("_", " "), float(low), float(high))


def _setting(name: str) -> Callable[[str], int]:
    _, low, high = SETTINGS[name]
    return whole_number(name.replace("_", " "), int(low), int(high))


def _power_of_two(text: str) -> int:
    value = whole_number("K", 1, int(HEAD_LIMITS["lilicorr_candidate_topk"][1]))(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value}: K (the head's top-k) is a power of two")
    return value


def check_new_run(args: argparse.Namespace, target: Any) -> None:
    """A new run's options against the loaded target, before anything is built: every tap and --init-layer a
    layer of it, --mask-token-id inside its vocabulary (UsageError naming the option otherwise). A tap of the
    last layer is allowed (vLLM and TensorRT-LLM capture it) with a warning: SGLang cannot serve it (LC148)."""
    layers, vocab = target.num_layers, target.vocab_size
    if args.fresh_head and args.init_from is None:
        raise UsageError("--fresh-head starts a head on --init-from's backbone: give --init-from")
    past = [t for t in args.taps if t >= layers]
    if past:
        raise UsageError(f"--taps {past} past the target's layers (0 to {layers - 1})")
    if layers - 1 in args.taps:
        print(
            f"{PROG}: warning: --taps {layers - 1} is the target's last layer, which SGLang cannot capture: "
            f"`lilicorr-ckpt validate --strict` refuses the drafter for SGLang (LC148)",
            file=sys.stderr,
        )
    if args.init_layer is not None and args.init_layer >= layers:
        raise UsageError(f"--init-layer {args.init_layer} past the target's layers (0 to {layers - 1})")
    if args.mask_token_id >= vocab:
        raise UsageError(f"--mask-token-id {args.mask_token_id} past the target's vocabulary ({vocab} ids)")
    if args.k > vocab:
        raise UsageError(f"--k {args.k} is more candidates than the target's vocabulary ({vocab} ids)")
    heads = DrafterShape().head_num_heads
    if args.head_width % heads:
        raise UsageError(
            f"--head-width {args.head_width}: the head's {heads} attention heads need a multiple of {heads}"
        )


def refuse(message: str) -> NoReturn:
    """Exit 1, refused: the inputs do not fit together."""
    print(f"{PROG}: refused: {message}", file=sys.stderr)
    raise SystemExit(1)


def check_vocabulary(held: HeldOut, path: Path, vocab: int) -> None:
    """A held-out set written by another target (a token id past this one's vocabulary) is refused (exit 1)."""
    tokens = held.data.tokens
    if tokens.size and int(tokens.max()) >= vocab:
        refuse(
            f"--val {path} holds token id {int(tokens.max())}, past the target's vocabulary of {vocab}: a "
            "held-out set another target wrote"
        )


def held_out_set(path: Path) -> HeldOut:
    """--val: a held-out set `mixes build` wrote, with at least one sequence."""
    try:
        shard = Shard.load(path)
    except DataError as exc:
        raise DataError(f"{exc} (--val takes the held-out set `mixes build` writes)") from None
    if len(shard) == 0:
        raise InputError(f"--val {path} holds no sequence: `mixes build` held none out (too few shards?)")
    return HeldOut.of(shard)


def log_heldout(run_dir: Path, step: int, record: dict[str, Any], note: str = "") -> None:
    line = {"heldout_step": step, **record}
    if note:
        line["note"] = note
    with open_log(run_dir / LOG) as f:
        f.write(json.dumps(line) + "\n")


# a new run's options and their defaults; a resumed run keeps its own (loop.resume_options judges those given)
NEW_RUN: dict[str, Any] = {
    "taps": (),
    "init_layer": None,
    "init_from": None,
    "fresh_head": False,
    "mask_token_id": 16,
    "layers": 1,
    "k": 8,
    "head_width": 256,
    "head_layers": 2,
    "batch_size": 32,
    "anchors": 48,
    "lr_drafter": 6e-4,
    "lr_head": 3e-4,
}


def fit_piece(args: argparse.Namespace) -> dict[str, Any]:
    begin = time.perf_counter()
    if (
        args.run.exists() or args.run.is_symlink()
    ) and not args.run.is_dir():  # a file, a dangling link, a loop
        raise UsageError(f"RUN {args.run} is not a directory: give the run's directory (a new one is made)")
    # RUN's state and log must be none of the inputs (exit 4, before anything loads)
    inputs = Inputs().add(args.target, "the target").add(args.init_from, "the --init-from drafter")
    inputs.add(args.val, "the --val file")
    for path in args.data:
        inputs.add(path, "the --data file")
    for name in (STATE, LOG):
        inputs.refuse(args.run / name, "RUN's", fix="give the run a directory of its own")
    check_log(args.run / LOG)  # a directory or a FIFO there: named before anything loads
    found = state_path(args.run)
    # a state that is not ours is refused, and a resume's options judged, before the data and the target load
    state = read_state(found) if found is not None else None
    given = {name: getattr(args, name) for name in NEW_RUN if getattr(args, name) is not None}
    if state is not None:  # a new run's options on a resume: the run's own values ignored, others refused
        options = {"--" + name.replace("_", "-"): value for name, value in given.items()}
        warning = resume_options(args.run, state, options)
        if warning is not None:
            print(f"{PROG}: warning: {warning}", file=sys.stderr)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    data = Dataset.concat([Dataset.load(p) for p in args.data])
    held = held_out_set(args.val)
    target = load_target_or_say(
        args.target, dtype="bfloat16" if device.startswith("cuda") else "float32", device=device, fast=True
    )
    for name, default in NEW_RUN.items():  # a new run's defaults (None in the parser: to tell what was given)
        if getattr(args, name) is None:
            setattr(args, name, default)
    config = None
    if found is None and args.init_from is not None and "taps" not in given:
        try:  # a run from a trained drafter reads the layers its fc projection learned
            args.taps = checkpoint_taps(args.init_from, target.num_layers)
        except (InputError, ValueError, OSError) as exc:
            raise InputError(f"--init-from {args.init_from}: {exc}") from None
    if found is None:
        check_new_run(args, target)
        if bool((data.tokens == args.mask_token_id).any()):
            raise SystemExit(f"--mask-token-id {args.mask_token_id} occurs in the training data")
        shape = DrafterShape(
            num_layers=args.layers,
            target_layer_ids=args.taps,
            mask_token_id=args.mask_token_id,
            candidate_topk=args.k,
            head_hidden_size=args.head_width,
            head_num_layers=args.head_layers,
        )
        config = drafter_config(target.config, shape)
    settings = TrainConfig(
        batch_size=args.batch_size, anchors=args.anchors, lr_drafter=args.lr_drafter, lr_head=args.lr_head
    )
    try:
        run = open_run(
            args.run,
            config,
            settings,
            target,
            args.init_layer if found is None else None,
            args.steps,
            init_from=args.init_from if found is None else None,
            fresh_head=bool(args.fresh_head) and found is None,
            state=state,
        )
    except ValueError as exc:  # --init-from a drafter of another shape (StateError is one, already worded)
        if isinstance(exc, StateError) or args.init_from is None:
            raise
        raise InputError(f"--init-from {args.init_from}: {exc}") from None
    # after open_run, so that a resumed run's own target check comes first
    check_vocabulary(held, args.val, target.vocab_size)
    mask = mask_token_in(run, data.tokens)
    if mask is not None:
        refuse(
            f"--data holds token {mask}, the run's mask token: a resumed run keeps its mask, so train it on data "
            "without that id"
        )
    if args.steps is not None and run.step >= args.steps:
        print(
            f"{PROG}: warning: --steps {args.steps} is not past the run's step {run.step}: nothing to train "
            "(give a larger --steps to extend it)",
            file=sys.stderr,
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
    held = held_out_set(args.val)
    check_vocabulary(held, args.val, target.vocab_size)
    checkpoint = load_checkpoint(str(args.drafter))
    try:  # validate's --target rules (LC5xx) on the pair, as smoke runs them: before the drafter is built
        info = loaded_info(read_target(args.target), target)
        require_fit(checkpoint, info, path=str(args.drafter), spec=args.target, runtime="all", loaded=True)
    except SmokeRefused as exc:
        refuse(f"DRAFTER {args.drafter} was not made for --target {args.target}: {exc}")
    drafter = build_drafter(checkpoint, dtype=torch.float32, device=device)
    if not drafter.trains_on_blocks:
        raise UsageError(
            f"{args.drafter}: the held-out τ runs the training forward, which supports full-attention drafters "
            "without convolution; measure this one with `lilicorr-ckpt smoke`"
        )
    record = {"drafter": str(args.drafter), **heldout_tau(drafter, target, held)}
    print(json.dumps(record), flush=True)
    return record


PROG = "python -m lilicorr_train.pieces"


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog=PROG,
        description="\n\n".join(__doc__.replace("\b\n", "").split("\n\n")[:3]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train (or resume) RUN for one piece; log the held-out tau")
    f.add_argument("run", type=Path, metavar="RUN")
    f.add_argument("--target", required=True)
    f.add_argument("--data", type=Path, action="append", required=True)
    f.add_argument("--val", type=Path, required=True, help="the held-out set `mixes build` wrote (its --val)")
    f.add_argument(
        "--budget", type=seconds, default=540.0, help="seconds for the whole piece, loads included"
    )
    f.add_argument(
        "--reserve", type=seconds, default=15.0, help="seconds kept for the last save and held-out tau"
    )
    f.add_argument(
        "--steps", type=_setting("steps"), default=None, help="total steps (new run: 4000; resume: extend)"
    )
    f.add_argument(
        "--taps",
        type=parse_taps,
        help="new run: target layers tapped, whole numbers separated by commas, e.g. 3,9,15,21,27 (no empty "
        "item; each below the target's layer count, once; "
        "the last layer draws a warning: SGLang cannot capture it); default --init-from's own layers, else "
        "spread over the target",
    )
    f.add_argument("--init-layer", type=whole_number("--init-layer", 0, 1 << 20),
                   help="new run: the draft layers start from this target layer")  # fmt: skip
    f.add_argument("--init-from", type=Path, help="new run: start from this drafter's weights")
    f.add_argument("--fresh-head", action="store_const", const=True, default=None,
                   help="new run, with --init-from: only its backbone; the head starts afresh, of the shape --k, "
                   "--head-width and --head-layers give (to compare head shapes on one trained backbone)")  # fmt: skip
    f.add_argument("--mask-token-id", type=whole_number("--mask-token-id", 0, int(HEAD_LIMITS["mask_token_id"][1])),
                   help="new run: the block's mask token, absent from the data (default 16)")  # fmt: skip
    f.add_argument("--layers", type=whole_number("--layers", 1, 64), help="new run: draft layers (default 1)")
    f.add_argument("--k", type=_power_of_two, help="new run: the head's top-k, a power of two (default 8)")
    f.add_argument("--head-width", type=whole_number("--head-width", 1, 1 << 16),
                   help="new run: the head's width (default 256)")  # fmt: skip
    f.add_argument("--head-layers", type=whole_number("--head-layers", 1, 64),
                   help="new run: the head's layers (default 2)")  # fmt: skip
    f.add_argument("--batch-size", type=_setting("batch_size"), help="new run: sequences a step (default 32)")
    f.add_argument("--anchors", type=_setting("anchors"), help="new run: blocks a sequence (default 48)")
    f.add_argument(
        "--lr-drafter", type=_rate("lr_drafter"), help="new run: the drafter's learning rate (default 6e-4)"
    )
    f.add_argument(
        "--lr-head", type=_rate("lr_head"), help="new run: the head's learning rate (default 3e-4)"
    )
    f.add_argument("--device", type=device_name, help="cuda or cpu (default cuda where there is one)")
    h = sub.add_parser(
        "heldout",
        help="the held-out tau of a converted drafter (one made for another target is refused, exit 1, with "
        "validate's --target findings)",
    )
    h.add_argument("drafter", type=Path, metavar="DRAFTER")
    h.add_argument("--target", required=True)
    h.add_argument("--val", type=Path, required=True, help="the held-out set `mixes build` wrote (its --val)")
    h.add_argument("--device", type=device_name, help="cuda or cpu (default cuda where there is one)")
    args = parser.parse_args(argv)
    if args.command == "fit":
        inputs = {"RUN": args.run, "--target": args.target, "--data": args.data, "--val": args.val}
        inputs["--init-from"] = args.init_from
    else:
        inputs = {"DRAFTER": args.drafter, "--target": args.target, "--val": args.val}
    return run_script(PROG, lambda: _run(args), command=args.command, inputs=inputs)


def _run(args: argparse.Namespace) -> int:
    if args.command == "fit":
        fit_piece(args)
    else:
        heldout_drafter(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
