"""Make a LiLiCorr drafter for a target, in resumable pieces (docs/training.md).

\b
The steps, in order:
  generate  the target answers prompts greedily -> DATA.npz (token ids)
  train     joint DFlash + LiLiCorr training of RUN on DATA; stops at --time-budget and saves
            RUN/state.safetensors, and the same command resumes it
  export    RUN -> a checkpoint in ModelOpt's LiLiCorr export layout
  then      lilicorr-ckpt convert EXPORT DRAFTER; lilicorr-ckpt validate DRAFTER --target T

\b
A tiny run on the CPU, in seconds (the bundled 4-layer target; docs/training.md has the same):
  python -m lilicorr_train generate --target examples/tiny-target --out data.npz \\
      --prompts 8 --max-new-tokens 12 --device cpu
  python -m lilicorr_train train run --target examples/tiny-target --data data.npz \\
      --mask-token-id 511 --init-layer 3 --steps 2 --batch-size 2 --anchors 4 --device cpu
  python -m lilicorr_train export run --out export

`python -m lilicorr_train COMMAND --help` explains each command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import click
import torch
from click.core import ParameterSource
from msgspec import structs

from lilicorr_ckpt.errors import InputError, Terminated, UsageError, sigterm_unwinds
from lilicorr_ckpt.outfile import Inputs, check_output_name, check_output_path
from lilicorr_runtime.target.fast import FastTarget
from lilicorr_runtime.target.load import load_target

from .data import DataError, Dataset, generate_dataset, self_written_prompts
from .export import DrafterShape, OutputExists, drafter_config, export_modelopt
from .loop import (
    LOG,
    TrainConfig,
    checkpoint_taps,
    fit,
    load_run_drafter,
    mask_token_in,
    open_run,
    resume_options,
)
from .prompts import request_openers, stdlib_code_prompts, training_prompts
from .script import device_name
from .state import (
    CONFIG_LIMITS,
    SETTINGS,
    STATE,
    StateError,
    StateMisfit,
    check_log,
    read_state,
    state_path,
)

PROG = "python -m lilicorr_train"
EXIT_REFUSED, EXIT_INPUT, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 4, 130, 143
EPILOG = (
    "Exit codes: 0 done, 1 refused (the inputs do not fit together, or a run state a field of which does not "
    "fit: its optimizer's settings, its mask token, its taps), 2 unreadable input (target, data, run state) or "
    "internal error, 4 usage error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM); an interrupted or "
    "terminated command leaves no temporary file."
)
_reading: dict[str, str] = {}  # what the running command reads, for the catch-all's message


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing NaN too (it passes every comparison, so FloatRange takes it) and infinities."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class InputFailure(click.ClickException):
    """An input that cannot be read at all (exit 2)."""

    exit_code = EXIT_INPUT


class TrainGroup(click.Group):
    """The command group, whose `main` turns every failure into a message and an exit code (CliRunner and
    `python -m` alike): usage errors 4, refusals 1, unreadable inputs 2, anything unexpected 2 with the inputs
    named, never a traceback (LILICORR_DEBUG=1 shows it)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they are run, as the help's list of steps

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _reading.clear()
        try:
            with sigterm_unwinds():  # SIGTERM unwinds like Ctrl-C: the temporaries' cleanups run
                rv = super().main(
                    args, PROG, complete_var, standalone_mode=False, **extra
                )  # as `python -m` shows it
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            exc.show()
            sys.exit(EXIT_USAGE)
        except UsageError as exc:  # the output rule (lilicorr_ckpt.outfile): an output over an input
            click.echo(f"{PROG}: usage error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except click.exceptions.Abort as exc:  # click turns Ctrl-C (and SIGTERM's Terminated) into Abort
            terminated = isinstance(exc.__cause__, Terminated)
            click.echo("terminated" if terminated else "interrupted", err=True)
            sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
        except click.ClickException as exc:
            click.echo(
                f"{PROG}: {'error' if exc.exit_code == EXIT_INPUT else 'refused'}: {exc.format_message()}",
                err=True,
            )
            sys.exit(exc.exit_code)
        except StateMisfit as exc:  # a run state that reads, but a field of which does not fit
            click.echo(f"{PROG}: refused: {exc}", err=True)
            sys.exit(EXIT_REFUSED)
        except (StateError, DataError, InputError) as exc:
            click.echo(f"{PROG}: error: {exc}", err=True)
            sys.exit(EXIT_INPUT)
        except FloatingPointError as exc:  # objective.training_step: the loss is NaN or infinite
            click.echo(
                f"{PROG}: error: the run diverged ({str(exc)[:300]}); the state saved before it is kept: "
                "start a new run with lower --lr-drafter / --lr-head",
                err=True,
            )
            sys.exit(EXIT_INPUT)
        except KeyboardInterrupt as exc:
            terminated = isinstance(exc, Terminated)
            click.echo("terminated" if terminated else "interrupted", err=True)
            sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
        except OSError as exc:  # the environment: a full disk, a permission, a vanished file
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"{PROG}: error: {exc.strerror or exc}{where}", err=True)
            sys.exit(EXIT_INPUT)
        except Exception as exc:
            if _out_of_memory(exc):
                click.echo(
                    f"{PROG}: error: out of memory ({(str(exc).splitlines() or [''])[0][:200]}); lower "
                    "--batch-size or --anchors for train, --batch-size for generate",
                    err=True,
                )
                sys.exit(EXIT_INPUT)
            if os.environ.get("LILICORR_DEBUG"):
                raise
            inputs = ", ".join(f"{k} {v}" for k, v in _reading.items()) or "the command line"
            click.echo(
                f"{PROG}: internal error while reading {inputs}: {type(exc).__name__}: {exc}\n"
                "  This is a bug; rerun with LILICORR_DEBUG=1 for a traceback and report it.",
                err=True,
            )
            sys.exit(EXIT_INPUT)
        sys.exit(rv if isinstance(rv, int) else 0)


def _out_of_memory(exc: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA) or its CPU allocator's refusal (a RuntimeError)."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _target(spec: str, device: str) -> FastTarget:
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    try:
        target = load_target(spec, dtype=dtype, device=device, fast=True)
    except Exception as exc:  # a missing or unreadable target: its loader's own message, not a traceback
        raise InputFailure(f"--target {spec}: {(str(exc).splitlines() or [type(exc).__name__])[0]}") from None
    if not isinstance(target, FastTarget):
        raise click.ClickException(
            f"--target {spec}: training needs the fast target path ({target.path_note})"
        )
    return target


def _check_run_outputs(
    run_dir: Path, target_spec: str, data_paths: tuple[Path, ...], init_from: Path | None
) -> None:
    """The files train writes in RUN (its state and its log) must not be any of its inputs: the data, the
    target's files or the --init-from drafter's (exit 4, before anything loads)."""
    inputs = Inputs().add(target_spec, "the target").add(init_from, "the --init-from drafter")
    for path in data_paths:
        inputs.add(path, "the --data file")
    for name in (STATE, LOG):
        inputs.refuse(run_dir / name, "RUN's", fix="give the run a directory of its own")


def _device(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--device, checked as the scripts check it (a usage error, exit 4)."""
    if value is None:
        return None
    try:
        return device_name(value)
    except argparse.ArgumentTypeError as exc:
        raise click.BadParameter(str(exc)) from None


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@click.group(
    cls=TrainGroup,
    help=__doc__,
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
def main() -> None:
    pass


SOURCES = ("templates", "stdlib", "self")


def _parse_mix(text: str) -> dict[str, float]:
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in SOURCES:
            raise click.BadParameter(
                f"unknown source {name!r} (choose from {', '.join(SOURCES)})", param_hint="--mix"
            )
        try:
            shares[name] = float(value) if value else 1.0
        except ValueError:
            raise click.BadParameter(
                f"{part!r}: a share must be a number, as in templates=0.5", param_hint="--mix"
            ) from None
        if not 0 <= shares[name] < float("inf"):
            raise click.BadParameter(f"{part!r}: a share must be >= 0", param_hint="--mix")
    if sum(shares.values()) <= 0:
        raise click.BadParameter("the shares add up to 0")
    return shares


def _split(count: int, shares: dict[str, float]) -> dict[str, int]:
    """`count` prompts split by `shares`, summing to `count` exactly (largest remainders get the rest)."""
    total = sum(shares.values())
    exact = {name: count * share / total for name, share in shares.items()}
    counts = {name: int(value) for name, value in exact.items()}
    for name in sorted(exact, key=lambda n: exact[n] - counts[n], reverse=True)[
        : count - sum(counts.values())
    ]:
        counts[name] += 1
    return counts


GENERATE_HELP = """Generate training data: the target answers --prompts prompts greedily.

--mix picks where the prompts come from: templates (word lists), stdlib (this interpreter's documented
standard-library functions: complete, explain, rewrite) and self (the target writes the request itself from an
opener, sampled at T=0.9). The bundled probe sets are never used: they stay held out for `lilicorr-ckpt smoke`.

\b
Examples:
  # template: ./SmolLM2-135M-Instruct and T are your target (a directory, a cached repo id or a .gguf)
  python -m lilicorr_train generate --target ./SmolLM2-135M-Instruct --out data.npz
  python -m lilicorr_train generate --target T --out data.npz --mix templates=0.35,stdlib=0.3,self=0.35
"""


@main.command(help=GENERATE_HELP, short_help="the target answers prompts greedily -> DATA.npz", epilog=EPILOG)
@click.option(
    "--target",
    "target_spec",
    required=True,
    metavar="DIR|REPO_ID|FILE.gguf",
    help="The target: HF directory, cached repo id or .gguf.",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Output .npz.")
@click.option(
    "--prompts",
    "count",
    type=click.IntRange(1, 10_000_000),
    default=16384,
    show_default=True,
    help="Prompts to answer (duplicates are answered once).",
)
@click.option("--max-new-tokens", type=click.IntRange(1, 8192), default=256, show_default=True)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 4096),
    default=512,
    show_default=True,
    help="Prompts answered at once.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--code-share",
    type=FiniteFloatRange(0, 1),
    default=0.35,
    show_default=True,
    help="Of the template prompts, the share that is code.",
)
@click.option(
    "--mix",
    default="templates",
    show_default=True,
    help="Prompt sources and their shares, e.g. templates=0.4,stdlib=0.3,self=0.3.",
)
@click.option("--device", default=None, callback=_device, help="cuda or cpu (default: cuda when available).")
def generate(
    target_spec: str,
    out: Path,
    count: int,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
    code_share: float,
    mix: str,
    device: str | None,
) -> None:
    _reading.update({"--target": target_spec})
    shares = _parse_mix(mix)
    # before the target loads: an --out over one of the target's files (or a bad path) costs nothing
    check_output_path(str(out), "--out", "data.npz", Inputs().add(target_spec, "the target"))
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
            written = self_written_prompts(
                target, request_openers(rng, counts["self"]), seed=seed, batch_size=batch_size
            )
        except ValueError as exc:  # no tokenizer or no chat template
            raise click.ClickException(f"--mix self: {exc}") from None
        click.echo(f"generate: the target wrote {len(written)} usable requests of {counts['self']}", err=True)
        prompts += written
    if not prompts:
        raise click.ClickException(
            "no prompts to answer: every source gave none (the target wrote no usable "
            "request?); raise --prompts or add a source to --mix"
        )
    rng.shuffle(prompts)
    try:
        data = generate_dataset(target, prompts, max_new_tokens, batch_size=batch_size, progress=progress)
    except ValueError as exc:  # a target without a tokenizer
        raise click.ClickException(f"--target {target_spec}: {exc}") from None
    check_output_path(str(out), "--out", "data.npz", Inputs().add(target_spec, "the target"))
    data.save(out)
    answer = int(data.lengths().sum() - data.prompt_lengths.sum())
    click.echo(
        f"wrote {out}: {len(data)} sequences, {int(data.offsets[-1])} tokens ({answer} answer tokens) "
        f"in {time.perf_counter() - begin:.0f} s"
    )


def _int_range(name: str) -> click.IntRange:
    _, low, high = SETTINGS[name]
    return click.IntRange(int(low), int(high))


def _float_range(name: str) -> click.FloatRange:
    _, low, high = SETTINGS[name]
    return FiniteFloatRange(low, high)


TRAIN_HELP = """Train the run in RUN on DATA (or resume it) until --steps or --time-budget seconds.

A new run needs --mask-token-id and a start: --init-layer N (the draft layers start from the target's layer N:
the recipe uses the last) or --init-from DRAFTER (fine-tuning a converted drafter of the same shape); with
neither, the drafter starts from random weights and a warning says so. The state is saved in
RUN/state.safetensors (weights, AdamW moments, step, random state: tensors and JSON, never a pickle) at the end
and every two minutes; the same command resumes it with the run's own settings, and --steps on a resume extends
or shortens the run.

On a resume the run keeps its drafter and settings: a new run's option given with the run's own value (--layers,
--block-size, --mask-token-id, --batch-size, --anchors, --lr-drafter, --lr-head) is ignored with a warning, with
another value it is a usage error (exit 4) naming both values; --init-layer, --init-from and --plan-seconds, which
only start a run, are ignored with a warning.

\b
Examples:
  # template: T is your target, data.npz what generate wrote (training takes hours on a GPU)
  python -m lilicorr_train train run --target T --data data.npz --mask-token-id 16 --init-layer 29
  python -m lilicorr_train train run --target T --data data.npz --steps 7000     # resume, extend
"""


@main.command(
    help=TRAIN_HELP, short_help="train (or resume) RUN on DATA; stops at --time-budget", epilog=EPILOG
)
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--target",
    "target_spec",
    required=True,
    metavar="DIR|REPO_ID|FILE.gguf",
    help="The target the data was generated with.",
)
@click.option(
    "--data",
    "data_paths",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    required=True,
    help="Training data (.npz from `generate`); repeat to concatenate.",
)
@click.option(
    "--steps",
    type=_int_range("steps"),
    default=None,
    help="Total steps (default 4000; on resume: the run's).",
)
@click.option(
    "--time-budget",
    type=FiniteFloatRange(1),
    default=540.0,
    show_default=True,
    help="Seconds of training in this piece; the state is saved and the next call resumes.",
)
@click.option(
    "--batch-size", type=_int_range("batch_size"), default=16, show_default=True, help="Sequences per step."
)
@click.option(
    "--anchors", type=_int_range("anchors"), default=48, show_default=True, help="Blocks per sequence."
)
@click.option("--lr-drafter", type=_float_range("lr_drafter"), default=6e-4, show_default=True)
@click.option("--lr-head", type=_float_range("lr_head"), default=3e-4, show_default=True)
@click.option(
    "--block-size",
    type=click.IntRange(*map(int, CONFIG_LIMITS["block_size"])),
    default=8,
    show_default=True,
)
@click.option(
    "--layers",
    type=click.IntRange(*map(int, CONFIG_LIMITS["num_hidden_layers"])),
    default=1,
    show_default=True,
    help="Draft layers.",
)
@click.option(
    "--mask-token-id",
    type=click.IntRange(0),
    required=False,
    help="New run: a special token id that never occurs in the data.",
)
@click.option(
    "--init-layer",
    type=click.IntRange(0),
    default=None,
    help="New run: start the draft layers from this target layer.",
)
@click.option(
    "--init-from",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="New run: start from this drafter checkpoint's weights (a converted LiLiCorr drafter of the "
    "same shape, or of fewer draft layers than --layers: the extra layers grow from its last, their output "
    "projections zeroed, so the run starts drafting exactly as it does), e.g. to fine-tune it on new data.",
)
@click.option(
    "--plan-seconds",
    type=FiniteFloatRange(1),
    default=None,
    help="New run: time ten steps and set --steps to what fits in this many seconds of training.",
)
@click.option("--device", default=None, callback=_device, help="cuda or cpu (default: cuda when available).")
def train(
    run_dir: Path,
    target_spec: str,
    data_paths: tuple[Path, ...],
    steps: int | None,
    time_budget: float,
    batch_size: int,
    anchors: int,
    lr_drafter: float,
    lr_head: float,
    block_size: int,
    layers: int,
    mask_token_id: int | None,
    init_layer: int | None,
    init_from: Path | None,
    plan_seconds: float | None,
    device: str | None,
) -> None:
    _reading.update({"RUN": str(run_dir), "--data": ", ".join(map(str, data_paths)), "--target": target_spec})
    if (run_dir.exists() or run_dir.is_symlink()) and not run_dir.is_dir():
        raise click.BadParameter(f"{run_dir} is not a directory", param_hint="RUN")
    _check_run_outputs(run_dir, target_spec, data_paths, init_from)
    found = state_path(run_dir)
    resuming = found is not None
    if init_from is not None and init_layer is not None:
        raise click.UsageError("--init-from and --init-layer both say where a new run starts: give one")
    if not resuming and mask_token_id is None:
        raise click.UsageError("a new run needs --mask-token-id (a special token id absent from the data)")
    state = (
        read_state(found) if found is not None else None
    )  # a state that is not ours: refused before the target
    if state is not None:  # a new run's options on a resume: the run's own values ignored, others refused
        ctx = click.get_current_context()
        options = {
            "mask_token_id": mask_token_id,
            "layers": layers,
            "block_size": block_size,
            "batch_size": batch_size,
            "anchors": anchors,
            "lr_drafter": lr_drafter,
            "lr_head": lr_head,
            "init_layer": init_layer,
            "init_from": init_from,
            "plan_seconds": plan_seconds,
        }
        given = {
            "--" + name.replace("_", "-"): value
            for name, value in options.items()
            if ctx.get_parameter_source(name)
            not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
        }
        warning = resume_options(run_dir, state, given)
        if warning is not None:
            click.echo(f"warning: {warning}", err=True)
    check_log(run_dir / LOG)
    data = Dataset.concat([Dataset.load(p) for p in data_paths])
    target = _target(target_spec, device or _default_device())
    top = int(data.tokens.max()) if len(data.tokens) else -1
    if top >= target.vocab_size:
        raise click.ClickException(
            f"--data holds token id {top}, but the target {target_spec} has a vocabulary of "
            f"{target.vocab_size}: the data was generated with another target"
        )
    config = None
    if not resuming:
        assert mask_token_id is not None
        if mask_token_id >= target.vocab_size:
            raise click.BadParameter(
                f"{mask_token_id} is past the target's vocabulary ({target.vocab_size} ids)",
                param_hint="--mask-token-id",
            )
        if bool((data.tokens == mask_token_id).any()):  # a refusal (exit 1), as the epilog says
            raise click.ClickException(
                f"--mask-token-id {mask_token_id} occurs in the training data: give an id the data never holds"
            )
        if init_layer is not None and init_layer >= target.num_layers:
            raise click.BadParameter(
                f"the target has {target.num_layers} layers (0 to {target.num_layers - 1})",
                param_hint="--init-layer",
            )
        taps: tuple[int, ...] = ()  # spread over the target; a run from a trained drafter reads its layers
        if init_from is not None:
            try:
                taps = checkpoint_taps(init_from, target.num_layers)
            except (InputError, ValueError, OSError) as exc:
                raise click.ClickException(f"--init-from {init_from}: {exc}") from None
        shape = DrafterShape(
            block_size=block_size, num_layers=layers, mask_token_id=mask_token_id, target_layer_ids=taps
        )
        config = drafter_config(target.config, shape)
        if init_layer is None and init_from is None:
            click.echo(
                f"warning: the drafter starts from random weights (neither --init-layer nor --init-from); "
                f"--init-layer {target.num_layers - 1} starts its layers from the target's last layer, "
                "as the recipe does, and trains far faster",
                err=True,
            )
    settings = TrainConfig(batch_size=batch_size, anchors=anchors, lr_drafter=lr_drafter, lr_head=lr_head)
    try:
        run = open_run(run_dir, config, settings, target, init_layer, steps, init_from=init_from, state=state)
    except StateError:
        raise
    except ValueError as exc:  # a drafter of another shape, a config the tooling refuses
        raise click.ClickException(str(exc)) from None
    mask = mask_token_in(run, data.tokens)
    if mask is not None:
        raise click.ClickException(
            f"--data holds token {mask}, the run's mask token: a resumed run keeps its mask, so train it on data "
            "without that id (or start a new run with another --mask-token-id)"
        )
    if steps is not None and run.step >= steps:
        click.echo(
            f"warning: --steps {steps} is not past the run's step {run.step}: nothing to train "
            "(give a larger --steps to extend it)",
            err=True,
        )
    click.echo(
        f"fit: step {run.step}/{run.train.steps}, {len(data)} sequences, settings "
        f"{json.dumps(structs.asdict(run.train))}",
        err=True,
    )
    planning = None if resuming else plan_seconds
    run_dir.mkdir(parents=True, exist_ok=True)
    done = fit(
        run,
        run_dir,
        target,
        data,
        time_budget_s=time_budget,
        plan_seconds=planning,
        log=lambda r: click.echo(json.dumps(r), err=True),
    )
    click.echo(
        f"{'finished' if done else 'paused'} at step {run.step}/{run.train.steps} (log: {run_dir / LOG})"
    )


EXPORT_HELP = """Export RUN's drafter in the layout NVIDIA ModelOpt's LiLiCorr exporter writes, to OUT.

OUT gets config.json and model.safetensors (bf16), replaced atomically; an OUT that holds anything else is
refused. Next: lilicorr-ckpt convert OUT DRAFTER, which renames the head's tensors to the layout the serving
stacks load.

\b
Example:
  # template: run is a training run directory (train's RUN)
  python -m lilicorr_train export run --out export && lilicorr-ckpt convert export drafter
"""


@main.command(
    help=EXPORT_HELP, short_help="RUN -> a checkpoint in ModelOpt's LiLiCorr export layout", epilog=EPILOG
)
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The export directory (new, or an earlier export of this command).",
)
def export(run_dir: Path, out: Path) -> None:
    _reading.update({"RUN": str(run_dir)})
    check_output_name(str(out), "--out", "directory name")  # a name too long: a usage error, before loading
    drafter, config, step = load_run_drafter(run_dir)
    try:
        export_modelopt(drafter, config, out)
    except OutputExists as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    click.echo(f"wrote {out} (step {step}); next: lilicorr-ckpt convert {out} DST")


if __name__ == "__main__":
    main()
