"""The `lilicorr-ckpt smoke` command (registered by lilicorr_ckpt.cli). Torch is imported only when it runs."""

from __future__ import annotations

import os
import sys

import click

from lilicorr_ckpt.console import LOG_INTERVAL, Progress
from lilicorr_ckpt.errors import SmokeRefused
from lilicorr_ckpt.outfile import check_output_path, resolved, write_output
from lilicorr_ckpt.report import formats
from lilicorr_ckpt.runtime_option import RUNTIME, runtime_help

HELP = """Measure a drafter's acceptance against its target on bundled probe prompts, and gate on it.

PATH is the drafter checkpoint (as for validate); it is loaded only if validate accepts it for --runtime.
--target is a local HF model directory, a repo id already in the local HF cache, or a .gguf file.

\b
Three arms decode the same prompts in one process:
  head     the LiLiCorr head commits a path through the top-K candidates
  control  the same checkpoint with the head bypassed (per-slot argmax: plain DFlash)
  ar       the target alone: the speed-up denominator and the losslessness reference

\b
Gates (exit 1 when one fails):
  lossless       greedy tokens of every arm equal the target-only tokens (a mismatch is a runtime bug)
  head-loaded    tau(head) / tau(control) >= 1 + --min-head-gain at the low end of its 95% interval over prompts
                 (fails as inconclusive, naming the prompts needed, when the interval straddles it)
  min-tau, min-accept-rates, baseline   when asked for
  kernel-parity  with --gpu: Triton and torch references give the same candidates and paths

\b
Examples (from the repository root):
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target   # the bundled tiny pair, CPU, seconds
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --output profile.json --html smoke.html
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --baseline profile.json --format junit
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --gpu   # on a CUDA GPU
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --sweep 1,4,8   # speed-up per batch size
  lilicorr-ckpt smoke examples/smollm2-lilicorr -t .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --probes math --limit 4 --max-new-tokens 64   # after scripts/fetch_smollm2.sh
  # template: my_prompts.jsonl is your probe file (its format is below)
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --probes my_prompts.jsonl --temperature 0.7 \\
      --seeds 0,1,2
  # template: a server you started with the drafter (smoke prints the command that starts one)
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --engine sglang=http://localhost:30000
  lilicorr-ckpt smoke examples/tiny-lilicorr -t examples/tiny-target --engine vllm=http://localhost:8000 -c 8

With --engine the probes go, as token ids, to a server the user started with the drafter (smoke prints its
launch command); acceptance is read as that engine counts it and compared with a reference profile
(--baseline, or --reference to decode it here too). Torch is not needed: only the target's tokenizer.

On the CPU smoke runs torch with one intra-op thread (small models decode token by token: more threads only
contend, and on a shared 2-core machine the bundled pair took 210 s with torch's default and 24 s with one);
set OMP_NUM_THREADS to choose another count. Progress goes to stderr: a self-overwriting line on a terminal, and a
line every 10 s when stderr is a file or a CI log; --quiet silences it. The report's `time (s):` line says where
the run's time went, phase by phase; with --gpu its `kernels:` line says what the Triton kernels cost before they
ran. A first --gpu run on a GPU and Triton version compiles them and tunes the step GEMMs (it says so as it
starts); later runs there reuse both, from Triton's cache and from the tables in $XDG_CACHE_HOME/lilicorr
(~/.cache/lilicorr; or LILICORR_TILE_CACHE and LILICORR_KERNEL_CACHE).

A probe file has one JSON object per line: {"id": "...", "category": "...", "prompt": "...", "chat": true}
(chat: true wraps the prompt in the target's chat template with thinking disabled; false feeds it raw).
"""

EPILOG = (
    "Exit codes: 0 every gate passed; 1 a gate failed, or validate refused the checkpoint, or the drafter does "
    "not fit the target; 2 unreadable input or I/O error (missing target, bad probe or baseline file, --gpu "
    "without CUDA, --output could not be written); 4 usage error (a bad option value, or an --output path whose "
    "directory is missing or read-only: checked before any model loads); 130 interrupted; 143 terminated. With "
    "--engine: 1 also when the server does not serve this drafter; 2 when it is unreachable, misconfigured or "
    "answers nonsense."
)


def _ints(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _floats(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...]:
    if not value:
        return ()
    try:
        return tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None


def register(group: click.Group) -> None:
    group.add_command(smoke)


@click.command(help=HELP, epilog=EPILOG)
@click.argument("path")
@click.option(
    "--target",
    "-t",
    required=True,
    metavar="DIR|REPO_ID|FILE.gguf",
    help="The target model the drafter was trained for: a local HF directory (with its tokenizer), a repo "
    "id already in the local HF cache (offline), or a GGUF file.",
)
@click.option(
    "--gpu", is_flag=True, help="Run on CUDA (Triton draft-step kernels, bfloat16) and check kernel parity."
)
@click.option(
    "--probes",
    "-p",
    default="code,chat,math",
    show_default=True,
    metavar="CATEGORIES|FILE.jsonl",
    help="Bundled categories (code: HumanEval, chat: MT-Bench turn 1, math: GSM8K CoT questions) or a "
    "JSONL file of your own.",
)
@click.option(
    "--limit",
    "-n",
    type=int,
    default=8,
    show_default=True,
    metavar="N",
    help="At most N prompts per category, in file order (0: all).",
)
@click.option(
    "--max-new-tokens",
    type=int,
    default=128,
    show_default=True,
    metavar="N",
    help="Stop each generation after N new tokens (>= 2), or earlier at the target's eos.",
)
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    metavar="T",
    help="0 decodes greedily; above 0 samples (exact rejection sampling) and skips the lossless gate.",
)
@click.option(
    "--seeds",
    default="0",
    show_default=True,
    callback=_ints,
    metavar="S1,S2,...",
    help="Sampling seeds; every prompt runs once per seed (needs --temperature > 0 for more than one).",
)
@click.option(
    "--num-speculative-tokens",
    "-k",
    type=int,
    default=None,
    metavar="N",
    help="Tokens drafted per block, at most block_size - 1.  [default: block_size - 1]",
)
@click.option(
    "--min-tau",
    type=float,
    default=None,
    metavar="X",
    help="Fail when tau of the head (or of the control, for a head-free checkpoint) is below X.",
)
@click.option(
    "--min-accept-rates",
    callback=_floats,
    default=None,
    metavar="R1,R2,...",
    help="Fail when the marginal acceptance at position i (all of drafts 1..i accepted) is below Ri.",
)
@click.option(
    "--min-head-gain",
    type=float,
    default=0.05,
    show_default=True,
    metavar="G",
    help="Required relative tau gain of the head over the control (-1 disables the gate in effect).",
)
@click.option(
    "--baseline", metavar="PROFILE.json", help="A profile from an earlier `smoke --out` to compare against."
)
@click.option(
    "--tolerance",
    type=float,
    default=0.05,
    show_default=True,
    metavar="R",
    help="With --baseline: the relative tau drop that fails. With --engine: the relative tau difference "
    "allowed between engine and reference (default there: derived from the prompts).",
)
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(list(formats.SMOKE)),
    default="text",
    show_default=True,
    help="Report on stdout. " + formats.describe(formats.SMOKE),
)
@click.option(
    "--output",
    "-o",
    "out",
    metavar="PROFILE.json",
    help="Also write the JSON profile to this file, whatever --format (its directory must exist).",
)
@click.option(
    "--html",
    "html_out",
    metavar="REPORT.html",
    help="Also write a page with the acceptance chart (by draft position, head and control, overall and per "
    "category, plain SVG) and the gates.",
)
@click.option(
    "--out",
    "out_alias",
    metavar="PROFILE.json",
    hidden=True,
    help="The old spelling of --output (hidden; still accepted).",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="Target and drafter dtype  [default: float32 on the CPU, bfloat16 with --gpu]",
)
@click.option(
    "--runtime",
    "-r",
    type=RUNTIME,
    default="all",
    show_default=True,
    help=runtime_help("The engine releases whose validate verdict the drafter must pass to load:"),
)
@click.option(
    "--batch",
    "-b",
    type=int,
    default=None,
    metavar="N",
    help="Decode N probes side by side in each arm (one CUDA graph per block for all of them; a finished "
    "probe's slot takes the next). tau stays per request; tok/s and the speed-up are then the whole "
    "arm's at batch N.  [default: as many as fit with --gpu, 1 on the CPU]",
)
@click.option(
    "--sweep",
    default="",
    callback=_ints,
    metavar="B1,B2,...",
    help="After the measured run, time every arm again at each of these batch sizes (the same prompts, the "
    "first seed) and report tok/s and the speed-up per batch size: what one request sees at 1, what a loaded "
    "server sees at 32. Sizes above 1 need a target on the fast path (Llama, Qwen2, Qwen3), and at most as "
    "many as the prompts run.",
)
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up generation of each arm.")
@click.option("--quiet", "-q", is_flag=True, help="No progress line on stderr.")
@click.option(
    "--engine",
    "-e",
    "engine",
    metavar="sglang=URL|vllm=URL",
    help="Measure against a running SGLang or vLLM server started with this drafter, instead of the "
    "reference runtime (torch not needed). See 'Against a running engine' in docs/smoke.md.",
)
@click.option(
    "--api-key",
    envvar="LILICORR_ENGINE_API_KEY",
    show_envvar=True,
    metavar="KEY",
    help="With --engine: the server's API key (sent as a Bearer token, never printed). Prefer the "
    "environment variable: a command line is visible to other users.",
)
@click.option(
    "--concurrency",
    "-c",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="With --engine: requests in flight at once. vLLM gives per-request acceptance only at 1.",
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="With --engine: the longest one request may take, answer included.",
)
@click.option(
    "--served-drafter",
    metavar="NAME",
    help="With --engine: the name the server gives the drafter, when its copy goes by another name.",
)
@click.option(
    "--reference",
    is_flag=True,
    help="With --engine: also decode the probes with the reference runtime here (with --gpu on CUDA) "
    "and compare, instead of --baseline.",
)
@click.pass_context
def smoke(
    ctx: click.Context,
    path: str,
    target: str,
    gpu: bool,
    probes: str,
    limit: int,
    max_new_tokens: int,
    temperature: float,
    seeds: tuple[int, ...],
    num_speculative_tokens: int | None,
    min_tau: float | None,
    min_accept_rates: tuple[float, ...],
    min_head_gain: float,
    baseline: str | None,
    tolerance: float,
    fmt: str,
    out: str | None,
    html_out: str | None,
    out_alias: str | None,
    dtype: str | None,
    runtime: str,
    batch: int | None,
    sweep: tuple[int, ...],
    no_warmup: bool,
    quiet: bool,
    engine: str | None,
    api_key: str | None,
    concurrency: int,
    timeout: float,
    served_drafter: str | None,
    reference: bool,
) -> None:
    from lilicorr_ckpt.smoke.options import SmokeOptions, check_options, runner, smoke_inputs
    from lilicorr_ckpt.smoke.phases import process_age
    from lilicorr_ckpt.smoke.profile import encode

    if out and out_alias and out != out_alias:
        raise click.UsageError("--output and --out (its old spelling) name different files; give one")
    option = "--output" if out else "--out"  # errors name the spelling the user typed
    out = out or out_alias
    inputs = smoke_inputs(path, target, baseline, probes)
    if out:
        check_output_path(
            out, option, "profile.json", inputs
        )  # before any model loads: a bad path must not cost a whole run
    if html_out:
        check_output_path(html_out, "--html", "smoke.html", inputs)
        if out and resolved(out) == resolved(html_out):
            raise click.UsageError(
                f"--html {html_out}: {option} writes that file too; give each its own file"
            )
    options = SmokeOptions(
        path=path,
        target=target,
        gpu=gpu,
        probes=probes,
        limit=limit,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seeds=seeds,
        num_speculative_tokens=num_speculative_tokens,
        min_tau=min_tau,
        min_accept_rates=min_accept_rates,
        min_head_gain=min_head_gain,
        baseline=baseline,
        tolerance=tolerance,
        dtype=dtype,
        runtime=runtime,
        warmup=not no_warmup,
        batch=batch,
        sweep=sweep,
    )
    check_options(options)  # usage errors before the runtime is imported
    if engine is not None:
        from lilicorr_ckpt.smoke.engine.cli import run_engine_command

        if html_out:
            raise click.UsageError(
                "--html draws the reference runtime's profile; it does not apply with --engine"
            )
        if sweep:
            raise click.UsageError(
                "--sweep times the reference runtime; with --engine, run once per --concurrency instead"
            )

        given = ctx.get_parameter_source("tolerance") is not click.core.ParameterSource.DEFAULT
        run_engine_command(
            options,
            engine=engine,
            api_key=api_key,
            concurrency=concurrency,
            timeout=timeout,
            served_drafter=served_drafter,
            reference=reference,
            tolerance=tolerance if given else None,
            fmt=fmt,
            out=out,
            quiet=quiet,
        )
    elif reference or concurrency != 1 or served_drafter:
        raise click.UsageError("--reference, --concurrency and --served-drafter apply with --engine only")
    run_smoke = runner()
    started = (
        process_age()
    )  # the interpreter and the imports (torch, triton, the runtime), the report's first phase
    progress = Progress.for_terminal(quiet, name="smoke", log_interval=LOG_INTERVAL, unit="generations")
    try:
        report = run_smoke(options, progress, started=started)
    except SmokeRefused as exc:
        progress.finish()
        click.echo(f"lilicorr-ckpt smoke: {exc}", err=True)
        refused = formats.SMOKE[fmt].refused
        if refused is not None:
            click.echo(refused(path, str(exc)), nl=False)
        sys.exit(1)
    finally:
        progress.finish()
    # the report goes to stdout first, so a failed --output write loses no measurement
    color = fmt == "text" and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    click.echo(formats.render_smoke(report, fmt, formats.Style(color=color)), nl=False)
    if out:
        write_output(encode(report), out, inputs=inputs, option=option)
    if html_out:
        from lilicorr_ckpt.report.chart import smoke_html

        write_output(smoke_html(report), html_out, inputs=inputs, option="--html")
    sys.exit(0 if report.passed else 1)
