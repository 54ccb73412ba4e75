"""`lilicorr-ckpt card PATH --target T [--profile smoke.json]`: the drafter's README.md (Hub model card).

Metadata (YAML front matter): `base_model` = the target's repo id when it is known (a repo id as --target, the
target config's `_name_or_path` when it is one, or --base-model), `license` (--license, else the README's own),
tags `speculative-decoding`, `draft-model`, `dflash`, the head kind (`lilicorr`), the runtimes whose verdict is
"accepts" and the quantization (`nvfp4`, `fp8`). No `pipeline_tag` / `library_name`: the Hub would show "use
this model" snippets that load the drafter as a standalone LM, which it is not; existing ones are removed.

Body: a section between `<!-- lilicorr-ckpt card:begin -->` and `<!-- lilicorr-ckpt card:end -->` with the
target, method papers and licence, the geometry, the verdicts, serving commands for each runtime that accepts
the checkpoint, the training (from training logs or flags), the smoke profile's acceptance per benchmark and
per position with its hardware and versions, and the citation. An existing README keeps its other metadata
and prose; the section is replaced in place, or appended. The building is report/modelcard.py; this module
is the command line, imported at start-up, so it imports nothing heavy until the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lilicorr_ckpt.errors import Refused, UsageError
from lilicorr_ckpt.report.escape import printable

EPILOG = (
    "Exit codes: 0 written (whatever the verdicts: `validate` is the gate); 1 refused, nothing written (a "
    "profile from a failed, CPU or other drafter's run without --allow-unverified, a read-only README, "
    "section markers that do not pair up); 2 unreadable input (PATH, --target, --profile, --training-log, "
    "the README) or a failed write; 4 usage error."
)


def register(cli: Any) -> None:
    import click

    from lilicorr_ckpt.runtime_option import RUNTIME, runtime_help

    @cli.command(epilog=EPILOG)
    @click.argument("path")
    @click.option(
        "--target",
        "-t",
        required=True,
        metavar="DIR|REPO_ID|FILE.gguf",
        help="The target model. A Hub repo id (or a directory whose config.json names one in "
        "_name_or_path) becomes base_model and the serving commands' model.",
    )
    @click.option(
        "--profile",
        "-p",
        metavar="PROFILE.json",
        help="A `smoke --gpu --output` profile: acceptance per benchmark and per draft position, with "
        "the hardware and versions it was measured with. A profile whose gates failed, that was "
        "measured on the CPU or measured another drafter is refused unless --allow-unverified.",
    )
    @click.option(
        "--allow-unverified",
        is_flag=True,
        help="Publish such a profile anyway, under a visible 'unverified measurement' warning.",
    )
    @click.option(
        "--repo-id",
        metavar="ORG/NAME",
        help="The drafter's own Hub repo id, for the serving commands (without it they name PATH's "
        "directory, with a warning).",
    )
    @click.option(
        "--base-model", metavar="ORG/NAME", help="base_model when the target is a local directory or file."
    )
    @click.option(
        "--license",
        "license_",
        metavar="ID",
        help="The drafter's licence, as a Hub licence id (apache-2.0, mit, llama3.1, other, ...). "
        "Default: the README's own `license`; without either the card says it is not stated.",
    )
    @click.option(
        "--training-log",
        "training_logs",
        multiple=True,
        metavar="RUN/log.jsonl",
        help="A log.jsonl written by `python -m lilicorr_train train`: steps, sessions, training "
        "time and the first and last training metrics. Repeat it for stages (a fine-tune after a "
        "first run), in order.",
    )
    @click.option("--training-data", metavar="TEXT", help="What the drafter was trained on (plain text).")
    @click.option("--training-recipe", metavar="TEXT", help="How it was trained (plain text).")
    @click.option(
        "--runtime",
        "-r",
        type=RUNTIME,
        default="all",
        show_default=True,
        help=runtime_help("The runtimes to judge (their verdicts, tags and serving commands):"),
    )
    @click.option(
        "--output",
        "-o",
        metavar="FILE",
        help="Write the updated card here instead of PATH/README.md ('-' for stdout); PATH/README.md "
        "is still the card it updates.",
    )
    @click.option("--quiet", "-q", is_flag=True, help="No 'wrote' line or notes on stderr (warnings still).")
    def card(
        path: str,
        target: str,
        profile: str | None,
        allow_unverified: bool,
        repo_id: str | None,
        base_model: str | None,
        license_: str | None,
        training_logs: tuple[str, ...],
        training_data: str | None,
        training_recipe: str | None,
        runtime: str,
        output: str | None,
        quiet: bool,
    ) -> None:
        """Write or update the drafter's README.md: Hub metadata, geometry, verdicts, serving, training, acceptance.

        The metadata is what the Hub reads: base_model (the target), license, tags (speculative-decoding,
        draft-model, dflash, the head kind, the runtimes that accept it, the quantization), and no pipeline_tag
        or library_name (they would advertise snippets that run the drafter as a standalone model). An existing
        README keeps its other metadata and text; only the generated section is replaced, and a rerun on the
        same inputs writes the same bytes. Text from the checkpoint, the profile and the logs is printed as
        text: it cannot add HTML, Markdown or shell syntax to the card.

        \b
        Examples (from the repository root; -o card.md leaves the bundled example's directory as it is):
          lilicorr-ckpt card examples/tiny-lilicorr --target examples/tiny-target --repo-id me/tiny-lilicorr \\
              --license apache-2.0 -o card.md
          lilicorr-ckpt smoke examples/tiny-lilicorr --target examples/tiny-target --gpu --output profile.json
          lilicorr-ckpt card examples/tiny-lilicorr --target examples/tiny-target --profile profile.json \\
              --training-log examples/train_smollm2/log.jsonl --training-data "answers the target wrote" -o card.md
        """
        from lilicorr_ckpt.checkpoint.load import NotADrafter, load_checkpoint
        from lilicorr_ckpt.checks.run import validate
        from lilicorr_ckpt.checks.waivers import waive_report, waiver_candidates
        from lilicorr_ckpt.families import is_drafter
        from lilicorr_ckpt.outfile import Inputs, check_output_path, resolved, write_output
        from lilicorr_ckpt.report import modelcard
        from lilicorr_ckpt.report.chart import CHART_FILE

        try:
            root = Path(path).expanduser()
            if not root.is_dir():
                from lilicorr_ckpt.checkpoint.source import resolve_path

                resolve_path(path)  # the error for a missing or mistyped directory
                raise UsageError(
                    f"card writes into a checkpoint directory; {path!r} is not one (download it first)"
                )
            readme = root / "README.md"
            dest = readme if output is None else (None if output == "-" else Path(output).expanduser())
            mode = None
            inputs = Inputs().add(root, "the checkpoint").add(target, "the target").own(readme)
            inputs.add(profile, "the --profile file")
            for log in training_logs:
                inputs.add(log, "the --training-log file")
            for candidate in waiver_candidates(root):  # the waivers the card's verdicts apply
                inputs.add(candidate, "a waiver file card reads")
            # with a profile, its chart goes beside the card (report/chart.py) and the card links it; a card on
            # stdout has no directory to link from, so it goes without
            chart = dest.parent / CHART_FILE if profile and dest is not None else None
            if chart is not None:
                check_output_path(str(chart), "--profile (its chart)", CHART_FILE, inputs)
                if dest is not None and resolved(chart) == resolved(dest):
                    raise UsageError(
                        f"--output {output}: the chart of --profile is written there; name the card otherwise"
                    )
            if dest is not None:
                check_output_path(str(dest), "--output", "README.md", inputs)
                if dest.exists():
                    mode = dest.stat().st_mode & 0o7777
                    if not mode & 0o200 or not os.access(dest, os.W_OK):
                        raise Refused(
                            f"{printable(str(dest))} is read-only (mode {mode:04o}); card leaves it as it is",
                            [
                                "make it writable (chmod u+w) to update it, or write the card "
                                "elsewhere with -o FILE (or -o - to print it)"
                            ],
                        )
            repo = modelcard.hub_repo_id(repo_id, "--repo-id") if repo_id else root.resolve().name
            base = modelcard.base_model_of(target, base_model)
            licence = modelcard.license_id(license_) if license_ else None
            prof = modelcard.load_profile(profile) if profile else None
            stages = [modelcard.load_training_log(p) for p in training_logs]
            existing = modelcard.read_readme(readme)

            ckpt = load_checkpoint(path)
            if not is_drafter(ckpt.parsed.raw):
                raise NotADrafter(
                    f"{path} is not a drafter checkpoint (no dflash_config, no DFlash-family architecture); "
                    "card describes drafters"
                )
            report = waive_report(
                validate(path, runtime=runtime, target=target, checkpoint=ckpt), checkpoint_dir=root
            )
            unverified: list[str] = []
            if prof is not None:
                unverified = modelcard.profile_problems(prof, report, base)
                if unverified and not allow_unverified:
                    raise Refused(
                        f"--profile {profile} is not a verified measurement of this drafter",
                        [
                            *unverified,
                            "measure it with `lilicorr-ckpt smoke PATH --target T --gpu --output "
                            "profile.json`, or pass --allow-unverified to publish it under a warning",
                        ],
                    )
            opts = modelcard.CardOptions(
                repo=repo,
                base=base,
                quant_algo=ckpt.quant.quant_algo if ckpt.quant else None,
                license=licence,
                profile=prof,
                unverified=unverified,
                stages=stages,
                training_data=training_data,
                training_recipe=training_recipe,
                # the compatibility matrix: every supported release, whatever --runtime selects for the verdicts
                releases=waive_report(
                    validate(path, runtime="every", target=target, checkpoint=ckpt), checkpoint_dir=root
                ),
                chart=CHART_FILE if chart is not None else None,
            )
            text, notes = modelcard.build_card(existing, report, opts, what=printable(str(readme)))
            warnings = []
            if repo_id is None:
                warnings.append(
                    f"no --repo-id: the serving commands name the drafter {repo!r} (PATH's directory "
                    "name); pass --repo-id ORG/NAME, the repo it will be published as"
                )
            if unverified:
                warnings.append("publishing an unverified profile: " + "; ".join(unverified))
            if dest is None:
                click.echo(text, nl=False)
            else:
                if chart is not None and prof is not None:
                    from lilicorr_ckpt.report.chart import acceptance_svg

                    write_output(
                        acceptance_svg(prof), str(chart), inputs=inputs, option="--profile (its chart)"
                    )
                    if not quiet:
                        click.echo(f"wrote {printable(str(chart))}", err=True)
                write_output(text, str(dest), mode=mode, inputs=inputs)
                if not quiet:
                    verb = "updated" if existing is not None and dest == readme else "wrote"
                    click.echo(f"{verb} {printable(str(dest))}", err=True)
            for warning in warnings:
                click.echo(f"warning: {warning}", err=True)
            for note in notes if not quiet else ():
                click.echo(f"note: {note}", err=True)
        except Refused as exc:
            click.echo(f"lilicorr-ckpt card: refused: {exc}\n  Nothing was written.", err=True)
            raise SystemExit(1) from None
