"""The pre-commit hook: validate every drafter checkpoint a commit touches.

    lilicorr-ckpt-pre-commit [OPTIONS] FILE...        (hook id lilicorr-ckpt-validate)
    lilicorr-ckpt-pre-commit --dir [OPTIONS] DIR...   (hook id lilicorr-ckpt-validate-dir)

With files (what pre-commit passes: changed config.json, *.safetensors, model.safetensors.index.json,
hf_quant_config.json), each file stands for the directory that holds it; every directory is validated once.
pre-commit appends the file names after the hook's args; the manifest's default args are `[--]`, so they come
after `--` and a name such as `-rf/config.json` is a file. When a repo's own `args:` drop the `--`, an
argument that names a watched file (it ends in /config.json, .safetensors, ...) is still taken as a file,
whatever it starts with.
A directory is skipped, with a note, when it is not a drafter: its config.json has no dflash_config and
names no DFlash-family architecture (a target model kept next to the drafter), or it has a config.json but no
weights. With --dir the arguments are checkpoint directories, validated whatever they hold.

Exit code: 0 when every checkpoint passes, otherwise the worst validate exit code (1 findings, 2 unreadable
or an internal error, 4 usage error). Never a traceback: a failure of one directory is reported, naming it, and
the others are still validated.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from lilicorr_ckpt.checkpoint.readfile import read_regular_file
from lilicorr_ckpt.errors import InputError
from lilicorr_ckpt.exits import run_command
from lilicorr_ckpt.families import is_drafter

WATCHED = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
# the hook's options that take a value (the next argument is that value, never a file name)
_VALUE_OPTIONS = {"--runtime", "-r", "--target", "-t", "--ignore", "--select", "--config"}
_MAX_CONFIG_BYTES = 16 << 20  # the pre-read only sniffs config.json; a bigger one is validate's to refuse


def watched(name: str) -> bool:
    """Whether name is a file the hook watches (the manifest's `files` pattern)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return base in WATCHED or (base.endswith(".safetensors") and len(base) > len(".safetensors"))


def split_arguments(argv: list[str]) -> list[str]:
    """argv with every file name after `--`, for click: what follows a `--` already is; before it (a repo's
    `args:` without the `--`, then pre-commit's names), an argument that names a watched file and is not the
    value of an option is a file even when it starts with `-` (`-rf/config.json`)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut] + ["--"] + argv[cut + 1 :]
    options: list[str] = []
    files: list[str] = []
    expects_value = False
    for arg in argv:
        if expects_value:
            options.append(arg)
            expects_value = False
        elif arg in _VALUE_OPTIONS:
            options.append(arg)
            expects_value = True
        elif arg.startswith("-") and not watched(arg):
            options.append(arg)
        else:
            files.append(arg)
    return options + ["--"] + files


def checkpoint_dirs(files: Iterable[str]) -> list[Path]:
    """The directories holding the watched files, in order of first appearance, without duplicates."""
    seen: dict[Path, None] = {}
    for name in files:
        path = Path(name)
        if watched(name):
            seen.setdefault(path.parent if str(path.parent) else Path("."), None)
    return list(seen)


def skip_reason(directory: Path) -> str | None:
    """Why directory is not a drafter checkpoint to validate, or None to validate it."""
    config = directory / "config.json"
    has_weights = (
        any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").exists()
    )
    if not directory.is_dir():
        return "removed in this commit"
    if not config.exists():
        return None if has_weights else "no config.json and no weights"
    try:  # the guarded reader: a FIFO or /dev/zero named config.json is refused, never read (it would block the
        # commit); anything unreadable is validate's to report
        data = read_regular_file(config, what=str(config), max_bytes=_MAX_CONFIG_BYTES)
        doc = json.loads(data.decode(errors="replace"))
    except (InputError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    if not is_drafter(doc):
        archs = doc.get("architectures")
        shown = ", ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else "none"
        return f"not a drafter (no dflash_config; architectures: {shown or 'none'})"
    if not has_weights:
        return "a drafter config.json without weights next to it"
    return None


def validate_dir(
    directory: Path,
    *,
    runtime: str,
    target: str | None,
    strict: bool,
    deep: bool,
    ignore: str | None,
    select: str | None,
    verbose: bool,
    config: str | None = None,
) -> tuple[int, str]:
    """(exit code, text report) for one directory; unreadable input is exit 2 with its reason, and so is an
    unexpected failure (a bug), naming the directory: never a traceback, never exit 1 ("findings")."""
    from lilicorr_ckpt.checks.run import validate
    from lilicorr_ckpt.checks.waivers import waive_report
    from lilicorr_ckpt.errors import InputError, UsageError
    from lilicorr_ckpt.report.escape import printable
    from lilicorr_ckpt.report.validate import render_text

    shown = printable(str(directory))
    try:
        report = validate(str(directory), runtime=runtime, target=target, strict=strict, deep=deep)
        report = waive_report(
            report, checkpoint_dir=directory, ignore=ignore, select=select, strict=strict, config=config
        )
        return report.exit_code, render_text(report, verbose=verbose)
    except InputError as exc:
        return 2, f"{shown}: error: {printable(str(exc))}\n"
    except UsageError as exc:
        return 4, f"{shown}: usage error: {printable(str(exc))}\n"
    except (KeyboardInterrupt, SystemExit):
        raise
    except OSError as exc:  # the environment: a permission, a vanished file
        where = f": {exc.filename}" if exc.filename else ""
        return 2, f"{shown}: error: {exc.strerror or exc}{printable(where)}\n"
    except Exception as exc:
        if os.environ.get("LILICORR_DEBUG"):
            raise
        return 2, (
            f"{shown}: internal error: {type(exc).__name__}: {printable(str(exc))}\n"
            "  This is a bug in lilicorr-ckpt; rerun with LILICORR_DEBUG=1 for a traceback and report it.\n"
        )


@click.command(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Exit codes: 0 every checkpoint passes, 1 findings, 2 unreadable input, 4 usage error.",
)
@click.argument("paths", nargs=-1, metavar="FILE...|DIR...")
@click.option(
    "--dir",
    "as_dirs",
    is_flag=True,
    help="The arguments are checkpoint directories (hook id lilicorr-ckpt-validate-dir).",
)
@click.option(
    "--runtime",
    "-r",
    default="all",
    show_default=True,
    help="The engine releases to judge: all, an engine (its newest release), ENGINE==VERSION, ENGINE>=VERSION, "
    "every, or several comma-separated (as `lilicorr-ckpt validate --runtime`).",
)
@click.option(
    "--target", "-t", metavar="DIR|REPO_ID|FILE.gguf", help="The target model, for the compatibility checks."
)
@click.option("--strict", is_flag=True, help="Warnings fail the hook too.")
@click.option("--deep", is_flag=True, help="Also read tensor data (NaN/Inf, all-zero weights). Slower.")
@click.option("--ignore", metavar="RULES", help="Rule ids to waive, comma-separated (e.g. LC314,LC015).")
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="Apply this waiver file instead of the one found from each checkpoint up to the work tree root.",
)
@click.option("--select", metavar="RULES", help="Only these rule ids (or prefixes, e.g. LC3) count.")
@click.option("--verbose", "-v", is_flag=True, help="Show info-level findings too.")
def hook(
    paths: tuple[str, ...],
    as_dirs: bool,
    runtime: str,
    target: str | None,
    strict: bool,
    deep: bool,
    ignore: str | None,
    config_file: str | None,
    select: str | None,
    verbose: bool,
) -> None:
    """Validate the drafter checkpoints that hold the given files (or, with --dir, the given directories).

    \b
    .pre-commit-config.yaml in a drafter repo:
      - repo: <url of lilicorr-ckpt>
        rev: <tag>
        hooks:
          - id: lilicorr-ckpt-validate          # every checkpoint a commit touches
            args: [--strict, --]                # end your args with -- : the file names follow it
          - id: lilicorr-ckpt-validate-dir      # or: one directory, on every commit
            args: [./drafter, --target, ./target]

    \b
    Examples (what pre-commit runs; from the repository root):
      lilicorr-ckpt-pre-commit --strict -- examples/tiny-lilicorr/config.json examples/tiny-lilicorr/model.safetensors
      lilicorr-ckpt-pre-commit --dir examples/tiny-lilicorr --target examples/tiny-target
    """
    from lilicorr_ckpt.checks.waivers import check_rule_options, explicit_config, parse_config
    from lilicorr_ckpt.errors import UsageError
    from lilicorr_ckpt.report.escape import printable
    from lilicorr_ckpt.runtimes import select_profiles

    try:
        check_rule_options(ignore, select)
        if config_file is not None:
            parse_config(*explicit_config(config_file))
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        select_profiles(runtime)
    except UsageError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1], param_hint="--runtime") from None
    if as_dirs:
        if not paths:
            raise click.UsageError(
                "--dir needs at least one checkpoint directory (args: [./drafter] in the hook)"
            )
        dirs = [Path(p) for p in paths]
    else:
        dirs = checkpoint_dirs(paths)
    worst = 0
    checked = 0
    for directory in dirs:
        try:
            reason = None if as_dirs else skip_reason(directory)
        except OSError:  # an unlistable directory: validate says what is wrong with it
            reason = None
        if reason:
            click.echo(printable(f"lilicorr-ckpt: skipped {directory}: {reason}"))
            continue
        code, text = validate_dir(
            directory,
            runtime=runtime,
            target=target,
            strict=strict,
            deep=deep,
            ignore=ignore,
            select=select,
            verbose=verbose,
            config=config_file,
        )
        checked += 1
        click.echo(text, nl=False, err=code >= 2)
        worst = max(worst, code)
    if checked == 0 and not as_dirs:
        click.echo("lilicorr-ckpt: no drafter checkpoint among the changed files")
    sys.exit(worst)


def main(argv: list[str] | None = None) -> None:
    # every exception a message and an exit code (exits.py): an internal error is exit 2, never 1 ("findings")
    run_command(
        hook,
        split_arguments(list(sys.argv[1:] if argv is None else argv)),
        prog_name="lilicorr-ckpt-pre-commit",
    )


if __name__ == "__main__":  # pragma: no cover
    main()
