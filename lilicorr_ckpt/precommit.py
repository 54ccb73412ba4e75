"""The pre-commit hook: validate every drafter checkpoint a commit touches.

    lilicorr-ckpt-pre-commit [OPTIONS] FILE...        (hook id lilicorr-ckpt-validate)
    lilicorr-ckpt-pre-commit --dir [OPTIONS] DIR...   (hook id lilicorr-ckpt-validate-dir)

With files (what pre-commit passes: changed config.json, *.safetensors, model.safetensors.index.json,
hf_quant_config.json), each file stands for the directory that holds it; every directory is validated once.
A directory is skipped, with a note, when it is not a drafter: its config.json has no dflash_config and
names no DFlash-family architecture (a target model kept next to the drafter), or it has a config.json but no
weights. With --dir the arguments are checkpoint directories, validated whatever they hold.

Exit code: 0 when every checkpoint passes, otherwise the worst validate exit code (1 findings, 2 unreadable).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import click

WATCHED = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
DRAFTER_MARKERS = ("dflash", "lilicorr", "dspark", "domino")


def checkpoint_dirs(files: Iterable[str]) -> list[Path]:
    """The directories holding the watched files, in order of first appearance, without duplicates."""
    seen: dict[Path, None] = {}
    for name in files:
        path = Path(name)
        if path.name in WATCHED or path.name.endswith(".safetensors"):
            seen.setdefault(path.parent if str(path.parent) else Path("."), None)
    return list(seen)


def skip_reason(directory: Path) -> str | None:
    """Why directory is not a drafter checkpoint to validate, or None to validate it."""
    config = directory / "config.json"
    has_weights = any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").exists()
    if not directory.is_dir():
        return "removed in this commit"
    if not config.exists():
        return None if has_weights else "no config.json and no weights"
    try:
        doc = json.loads(config.read_text(errors="replace"))
    except (OSError, ValueError):
        return None  # an unreadable config is validate's to report
    if not isinstance(doc, dict):
        return None
    archs = doc.get("architectures")
    names = " ".join(a for a in archs if isinstance(a, str)).lower() if isinstance(archs, list) else ""
    if "dflash_config" not in doc and not any(m in names for m in DRAFTER_MARKERS):
        shown = ", ".join(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else "none"
        return f"not a drafter (no dflash_config; architectures: {shown or 'none'})"
    if not has_weights:
        return "a drafter config.json without weights next to it"
    return None


def validate_dir(directory: Path, *, runtime: str, target: str | None, strict: bool, deep: bool,
                 ignore: str | None, select: str | None, verbose: bool) -> tuple[int, str]:
    """(exit code, text report) for one directory; unreadable input is exit 2 with its reason."""
    from lilicorr_ckpt.checks.run import validate
    from lilicorr_ckpt.errors import InputError, UsageError
    from lilicorr_ckpt.report.validate import render

    try:
        report = validate(str(directory), runtime=runtime, target=target, strict=strict, deep=deep)
        report = _apply_waivers(report, directory, ignore=ignore, select=select, strict=strict)
    except InputError as exc:
        return 2, f"{directory}: error: {exc}\n"
    except UsageError as exc:
        return 4, f"{directory}: usage error: {exc}\n"
    return report.exit_code, render(report, "text", verbose=verbose)


def _apply_waivers(report, directory: Path, *, ignore: str | None, select: str | None, strict: bool):  # noqa: ANN001
    from lilicorr_ckpt.checks.waivers import waive_report

    return waive_report(report, checkpoint_dir=directory, ignore=ignore, select=select, strict=strict)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog="Exit codes: 0 every checkpoint passes, 1 findings, 2 unreadable input, 4 usage error.")
@click.argument("paths", nargs=-1, metavar="FILE...|DIR...")
@click.option("--dir", "as_dirs", is_flag=True,
              help="The arguments are checkpoint directories (hook id lilicorr-ckpt-validate-dir).")
@click.option("--runtime", "-r", default="all", show_default=True, help="sglang, vllm, trtllm or all.")
@click.option("--target", "-t", metavar="DIR|REPO_ID|FILE.gguf", help="The target model, for the compatibility checks.")
@click.option("--strict", is_flag=True, help="Warnings fail the hook too.")
@click.option("--deep", is_flag=True, help="Also read tensor data (NaN/Inf, all-zero weights). Slower.")
@click.option("--ignore", metavar="RULES", help="Rule ids to waive, comma-separated (e.g. LC314,LC403).")
@click.option("--select", metavar="RULES", help="Only these rule ids (or prefixes, e.g. LC3) count.")
@click.option("--verbose", "-v", is_flag=True, help="Show info-level findings too.")
def hook(paths: tuple[str, ...], as_dirs: bool, runtime: str, target: str | None, strict: bool, deep: bool,
         ignore: str | None, select: str | None, verbose: bool) -> None:
    """Validate the drafter checkpoints that hold the given files (or, with --dir, the given directories).

    \b
    .pre-commit-config.yaml in a drafter repo:
      - repo: <url of lilicorr-ckpt>
        rev: <tag>
        hooks:
          - id: lilicorr-ckpt-validate          # every checkpoint a commit touches
            args: [--strict]
          - id: lilicorr-ckpt-validate-dir      # or: one directory, on every commit
            args: [./drafter, --target, ./target]
    """
    from lilicorr_ckpt.checks.waivers import check_rule_options
    from lilicorr_ckpt.errors import UsageError
    from lilicorr_ckpt.runtimes import RUNTIME_CHOICES

    try:
        check_rule_options(ignore, select)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    if runtime not in RUNTIME_CHOICES:
        raise click.BadParameter(f"{runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}", param_hint="--runtime")
    if as_dirs:
        if not paths:
            raise click.UsageError("--dir needs at least one checkpoint directory (args: [./drafter] in the hook)")
        dirs = [Path(p) for p in paths]
    else:
        dirs = checkpoint_dirs(paths)
    worst = 0
    checked = 0
    for directory in dirs:
        reason = None if as_dirs else skip_reason(directory)
        if reason:
            click.echo(f"lilicorr-ckpt: skipped {directory}: {reason}")
            continue
        code, text = validate_dir(directory, runtime=runtime, target=target, strict=strict, deep=deep,
                                  ignore=ignore, select=select, verbose=verbose)
        checked += 1
        click.echo(text, nl=False, err=code >= 2)
        worst = max(worst, code)
    if checked == 0 and not as_dirs:
        click.echo("lilicorr-ckpt: no drafter checkpoint among the changed files")
    sys.exit(worst)


def main(argv: list[str] | None = None) -> None:
    try:
        hook.main(args=argv, prog_name="lilicorr-ckpt-pre-commit", standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        sys.exit(4)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
