"""The command-line end of `smoke --engine`: options in, report out (stdout first, then --output), exit code."""

from __future__ import annotations

import os
import sys

import click

from lilicorr_ckpt.console import Progress
from lilicorr_ckpt.errors import SmokeRefused
from lilicorr_ckpt.outfile import write_output
from lilicorr_ckpt.report.escape import printable
from lilicorr_ckpt.report.smoke import junit_refusal
from lilicorr_ckpt.smoke.engine.profile import encode
from lilicorr_ckpt.smoke.engine.render import render_junit, render_text
from lilicorr_ckpt.smoke.engine.run import EngineOptions, Secret, check_engine_options, run_engine
from lilicorr_ckpt.smoke.engine.transport import parse_engine
from lilicorr_ckpt.smoke.options import SmokeOptions


def run_engine_command(
    options: SmokeOptions,
    *,
    engine: str,
    api_key: str | None,
    concurrency: int,
    timeout: float,
    served_drafter: str | None,
    reference: bool,
    tolerance: float | None,
    fmt: str,
    out: str | None,
    quiet: bool,
) -> None:
    engine_opts = EngineOptions(
        endpoint=parse_engine(engine),
        api_key=Secret(api_key),
        concurrency=concurrency,
        timeout=timeout,
        served_drafter=served_drafter,
        reference=reference,
        tolerance=tolerance,
    )
    check_engine_options(options, engine_opts)
    progress = Progress.for_terminal(quiet, name="smoke")

    def say(text: str) -> None:
        if quiet:
            return
        progress.finish()  # a progress line in the way is cleared first
        click.echo("\n".join(printable(line) for line in text.split("\n")), err=True)

    try:
        report = run_engine(options, engine_opts, progress, say)
    except SmokeRefused as exc:  # EngineRefused too: the server does not serve this drafter
        progress.finish()
        click.echo(f"lilicorr-ckpt smoke: refused: {exc}", err=True)
        if fmt == "junit":
            click.echo(junit_refusal(options.path, str(exc)), nl=False)
        sys.exit(1)
    finally:
        progress.finish()
    profile = encode(report)
    if fmt == "json":
        click.echo(profile.decode(), nl=False)
    elif fmt == "junit":
        click.echo(render_junit(report), nl=False)
    else:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        click.echo(render_text(report, color=color), nl=False)
    if out:
        write_output(profile, out)
    sys.exit(0 if report.passed else 1)
