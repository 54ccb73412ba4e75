"""python -m lilicorr_runtime.train: make a LiLiCorr drafter for a target, in resumable pieces.

  generate  the target answers self-written prompts greedily -> data.npz (uint16 token ids)
  fit       joint DFlash + LiLiCorr training; stops at --time-budget and resumes from RUN/state.pt
  export    RUN -> a checkpoint in ModelOpt's LiLiCorr export layout (then: lilicorr-ckpt convert)
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import click
import torch
from msgspec import structs

from lilicorr_ckpt.checkpoint.readfile import open_regular_file

from ..fast_target import FastTarget
from ..target import load_target
from .data import Dataset, generate_dataset, self_written_prompts
from .export import DrafterShape, build_drafter, drafter_config, export_modelopt
from .loop import LOG, TrainConfig, fit, open_run
from .prompts import request_openers, stdlib_code_prompts, training_prompts


def _target(spec: str, device: str) -> FastTarget:
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    try:
        target = load_target(spec, dtype=dtype, device=device, fast=True)
    except Exception as exc:  # a missing or unreadable target: its loader's own message, not a traceback
        raise click.ClickException(f"--target {spec}: {str(exc).splitlines()[0]}") from None
    if not isinstance(target, FastTarget):
        raise click.ClickException(f"--target {spec}: training needs the fast target path ({target.path_note})")
    return target


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@click.group(help=__doc__)
def main() -> None:
    pass


SOURCES = ("templates", "stdlib", "self")


def _parse_mix(text: str) -> dict[str, float]:
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in SOURCES:
            raise click.BadParameter(f"unknown source {name!r} (choose from {', '.join(SOURCES)})")
        try:
            shares[name] = float(value) if value else 1.0
        except ValueError:
            raise click.BadParameter(f"{part!r}: a share must be a number, as in templates=0.5") from None
        if not 0 <= shares[name] < float("inf"):
            raise click.BadParameter(f"{part!r}: a share must be >= 0")
    if sum(shares.values()) <= 0:
        raise click.BadParameter("the shares add up to 0")
    return shares


def _split(count: int, shares: dict[str, float]) -> dict[str, int]:
    """`count` prompts split by `shares`, summing to `count` exactly (largest remainders get the rest)."""
    total = sum(shares.values())
    exact = {name: count * share / total for name, share in shares.items()}
    counts = {name: int(value) for name, value in exact.items()}
    for name in sorted(exact, key=lambda n: exact[n] - counts[n], reverse=True)[:count - sum(counts.values())]:
        counts[name] += 1
    return counts


@main.command(help="Generate training data: the target answers --prompts prompts greedily. --mix picks where the "
                   "prompts come from: templates (word lists), stdlib (this interpreter's documented standard-"
                   "library functions: complete, explain, rewrite) and self (the target writes the request "
                   "itself from an opener, sampled at T=0.9).")
@click.option("--target", "target_spec", required=True, help="Target: HF directory, cached repo id or .gguf.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Output .npz.")
@click.option("--prompts", "count", type=click.IntRange(1, 10_000_000), default=16384, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1, 8192), default=256, show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 4096), default=512, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--code-share", type=click.FloatRange(0, 1), default=0.35, show_default=True,
              help="Of the template prompts, the share that is code.")
@click.option("--mix", default="templates", show_default=True,
              help="Prompt sources and their shares, e.g. templates=0.4,stdlib=0.3,self=0.3.")
@click.option("--device", default=None, help="cuda or cpu (default: cuda when available).")
def generate(target_spec: str, out: Path, count: int, max_new_tokens: int, batch_size: int, seed: int,
             code_share: float, mix: str, device: str | None) -> None:
    shares = _parse_mix(mix)
    target = _target(target_spec, device or _default_device())
    begin = time.perf_counter()

    def progress(done: int, total: int) -> None:
        click.echo(f"generate: {done}/{total} prompts, {time.perf_counter() - begin:.0f} s", err=True)

    counts = _split(count, shares)
    rng = random.Random(seed)
    prompts = []
    if counts.get("templates"):
        prompts += training_prompts(counts["templates"], seed, code_share)
    if counts.get("stdlib"):
        prompts += stdlib_code_prompts(rng, counts["stdlib"])
    if counts.get("self"):
        try:
            written = self_written_prompts(target, request_openers(rng, counts["self"]), seed=seed,
                                           batch_size=batch_size)
        except ValueError as exc:  # no tokenizer or no chat template
            raise click.ClickException(f"--mix self: {exc}") from None
        click.echo(f"generate: the target wrote {len(written)} usable requests of {counts['self']}", err=True)
        prompts += written
    if not prompts:
        raise click.ClickException("no prompts to answer: every source gave none (the target wrote no usable "
                                   "request?); raise --prompts or add a source to --mix")
    rng.shuffle(prompts)
    data = generate_dataset(target, prompts, max_new_tokens, batch_size=batch_size, progress=progress)
    data.save(out)
    answer = int(data.lengths().sum() - data.prompt_lengths.sum())
    click.echo(f"wrote {out}: {len(data)} sequences, {int(data.offsets[-1])} tokens ({answer} answer tokens) "
               f"in {time.perf_counter() - begin:.0f} s")


@main.command(help="Train (or resume) the run in RUN on DATA until --steps or --time-budget seconds.")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", "target_spec", required=True)
@click.option("--data", "data_paths", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
              required=True, help="Training data (.npz from `generate`); repeat to concatenate.")
@click.option("--steps", type=click.IntRange(1), default=None, help="Total steps (default 4000; on resume: the run's).")
@click.option("--time-budget", type=click.FloatRange(1), default=540.0, show_default=True,
              help="Seconds of training in this piece; the state is saved and the next call resumes.")
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True)
@click.option("--anchors", type=click.IntRange(1), default=48, show_default=True, help="Blocks per sequence.")
@click.option("--lr-drafter", type=float, default=6e-4, show_default=True)
@click.option("--lr-head", type=float, default=3e-4, show_default=True)
@click.option("--block-size", type=click.IntRange(2, 16), default=8, show_default=True)
@click.option("--layers", type=click.IntRange(1), default=1, show_default=True, help="Draft layers.")
@click.option("--mask-token-id", type=int, required=False, help="A special id that never occurs in the data.")
@click.option("--init-layer", type=int, default=None, help="Start the draft layers from this target layer.")
@click.option("--init-from", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="New run: start from this drafter checkpoint's weights (a converted LiLiCorr drafter of the "
                   "same shape), e.g. to fine-tune it on new data.")
@click.option("--plan-seconds", type=click.FloatRange(1), default=None,
              help="New run: time ten steps and set --steps to what fits in this many seconds of training.")
@click.option("--device", default=None)
def train(run_dir: Path, target_spec: str, data_paths: tuple[Path, ...], steps: int | None, time_budget: float,
          batch_size: int, anchors: int, lr_drafter: float, lr_head: float, block_size: int, layers: int,
          mask_token_id: int | None, init_layer: int | None, init_from: Path | None, plan_seconds: float | None,
          device: str | None) -> None:
    target = _target(target_spec, device or _default_device())
    data = Dataset.concat([Dataset.load(p) for p in data_paths])
    config = None
    if not (run_dir / "state.pt").is_file():
        if mask_token_id is None:
            raise click.UsageError("a new run needs --mask-token-id (a special token id absent from the data)")
        if bool((data.tokens == mask_token_id).any()):
            raise click.UsageError(f"--mask-token-id {mask_token_id} occurs in the training data")
        config = drafter_config(target.config, DrafterShape(block_size=block_size, num_layers=layers,
                                                             mask_token_id=mask_token_id))
    settings = TrainConfig(batch_size=batch_size, anchors=anchors, lr_drafter=lr_drafter, lr_head=lr_head)
    if init_from is not None and config is None:
        raise click.UsageError(f"--init-from starts a new run, but {run_dir} holds one to resume")
    if init_from is not None and init_layer is not None:
        raise click.UsageError("--init-from and --init-layer both say where a new run starts: give one")
    try:
        run = open_run(run_dir, config, settings, target, init_layer, steps, init_from=init_from)
    except ValueError as exc:  # a drafter of another shape, a config the tooling refuses
        raise click.ClickException(str(exc)) from None
    run_dir.mkdir(parents=True, exist_ok=True)
    click.echo(f"fit: step {run.step}/{run.train.steps}, {len(data)} sequences, settings "
               f"{json.dumps(structs.asdict(run.train))}", err=True)
    planning = plan_seconds if run.step == 0 else None
    done = fit(run, run_dir, target, data, time_budget_s=time_budget, plan_seconds=planning,
               log=lambda r: click.echo(json.dumps(r), err=True))
    click.echo(f"{'finished' if done else 'paused'} at step {run.step}/{run.train.steps} "
               f"(log: {run_dir / LOG})")


@main.command(help="Export RUN's drafter in ModelOpt's LiLiCorr layout to OUT.")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def export(run_dir: Path, out: Path) -> None:
    with open_regular_file(run_dir / "state.pt", what=str(run_dir / "state.pt")) as f:  # a FIFO: refused
        state = torch.load(f, map_location="cpu", weights_only=False)
    drafter = build_drafter(state["config"])
    drafter.load_state_dict(state["model"])
    export_modelopt(drafter, state["config"], out)
    click.echo(f"wrote {out} (step {state['step']}); next: lilicorr-ckpt convert {out} DST")


if __name__ == "__main__":
    sys.exit(main())
