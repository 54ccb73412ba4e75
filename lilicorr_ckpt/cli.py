"""The `lilicorr-ckpt` command line.

Exit codes (every command): 0 clean, 1 findings (errors, or warnings with --strict),
2 unreadable input, I/O error or internal error, 4 usage error, 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM).
"""

from __future__ import annotations

import os
import sys

try:  # Ctrl-C while the command line is still importing (its first ~50 ms) ends as cleanly as later on
    import click

    from lilicorr_ckpt import __version__
    from lilicorr_ckpt.errors import InputError, UsageError
    from lilicorr_ckpt.exits import EXIT_INTERRUPTED, run_command
    from lilicorr_ckpt.outfile import Inputs, check_output_path, resolved, write_output
    from lilicorr_ckpt.report import formats
    from lilicorr_ckpt.runtime_option import RUNTIME, runtime_help
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None  # EXIT_INTERRUPTED (exits.py), not imported yet

EPILOG_EXIT = (
    "Exit codes: 0 clean, 1 findings, 2 unreadable input or I/O error, 4 usage error, "
    "130 interrupted, 143 terminated."
)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG_EXIT + " `lilicorr-ckpt COMMAND --help` explains each command.",
)
@click.version_option(__version__, prog_name="lilicorr-ckpt")
def cli() -> None:
    """Check, convert and smoke-test LiLiCorr / DFlash-family drafter checkpoints before you publish them.

    \b
    Typical flow, on the bundled examples (run from the repository root):
      lilicorr-ckpt convert  examples/tiny-modelopt-nvfp4 my-drafter -r all  # ModelOpt export -> what all load
      lilicorr-ckpt inspect  my-drafter                                # what is this checkpoint?
      lilicorr-ckpt validate my-drafter --target examples/tiny-target  # would SGLang/vLLM/TRT-LLM load it right?
      lilicorr-ckpt smoke    examples/tiny-lilicorr --target examples/tiny-target  # does the head work? (CPU)
      lilicorr-ckpt rules                                              # every check, with its id

    A line under `# template: ...` names files of yours (a Hub repo, a waiver file, a server): replace them.
    """


@cli.command(epilog=EPILOG_EXIT)
@click.argument("path")
@click.option(
    "--target",
    "-t",
    metavar="DIR|REPO_ID|FILE.gguf",
    help="The target model: a local HF directory, a repo id in the local HF cache (offline), or a GGUF file. "
    "Adds hidden-size, layer-id, vocabulary and mask-token checks.",
)
@click.option(
    "--runtime",
    "-r",
    type=RUNTIME,
    default="all",
    show_default=True,
    help=runtime_help("The engine releases to judge against, a verdict each:"),
)
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(list(formats.VALIDATE)),
    default="text",
    show_default=True,
    help="Report format. " + formats.describe(formats.VALIDATE),
)
@click.option("--output", "-o", metavar="FILE", help="Write the --format report to FILE instead of stdout.")
@click.option("--json", "json_file", metavar="FILE", help="Also write the JSON report to FILE.")
@click.option("--junit", "junit_file", metavar="FILE", help="Also write a JUnit XML report to FILE.")
@click.option(
    "--sarif", "sarif_file", metavar="FILE", help="Also write a SARIF 2.1.0 report to FILE (code scanning)."
)
@click.option("--markdown", "markdown_file", metavar="FILE", help="Also write the Markdown summary to FILE.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option(
    "--deep",
    is_flag=True,
    help="Also read tensor data (memory-mapped, chunked): NaN/Inf and all-zero weights. Slower.",
)
@click.option("--verbose", "-v", is_flag=True, help="Show info-level findings in the text report.")
@click.option(
    "--quiet", "-q", is_flag=True, help="Text report: the verdict line only; no summary line on stderr."
)
@click.option(
    "--revision",
    metavar="REV",
    help="For a Hub repo id: the branch, tag or commit to read (default main; `org/name@REV` says the same).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0, 86400, min_open=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="For a Hub repo id: the most seconds the whole remote read may take (model "
    "info, JSON files, headers); past it validate exits 2 and says so. Each "
    "request also gives up after HF_HUB_DOWNLOAD_TIMEOUT seconds (default 10).",
)
@click.option(
    "--ignore",
    metavar="RULES",
    help="Waive these rule ids or prefixes (LC314,LC015): still reported, "
    "marked waived, not counted. Waivers with reasons: lilicorr.toml or "
    "[tool.lilicorr-ckpt] in pyproject.toml, in the checkpoint directory or "
    "above it up to its git work tree's root (docs/ci.md).",
)
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="Apply the waivers of FILE (lilicorr.toml form, or a pyproject.toml with [tool.lilicorr-ckpt]) "
    "instead of searching for one; the way to use a waiver file outside the checkpoint's work tree, "
    "or for a Hub repo.",
)
@click.option(
    "--select",
    metavar="RULES",
    help="Only these rule ids or prefixes (LC1,LC2) count; other findings are left out.",
)
def validate(
    path: str,
    target: str | None,
    runtime: str,
    fmt: str,
    output: str | None,
    json_file: str | None,
    junit_file: str | None,
    sarif_file: str | None,
    markdown_file: str | None,
    strict: bool,
    deep: bool,
    verbose: bool,
    quiet: bool,
    revision: str | None,
    timeout: float,
    ignore: str | None,
    config_file: str | None,
    select: str | None,
) -> None:
    """Check a drafter checkpoint the way SGLang, vLLM and TensorRT-LLM load it, from headers only.

    PATH is a checkpoint directory (config.json + *.safetensors) or a Hugging Face repo id,
    org/name[@REV]. A repo is read from the Hub at one resolved commit (recorded in the report): its JSON
    files, and each safetensors header by HTTP range reads, never the weights (HF_ENDPOINT and HF_TOKEN
    apply). With HF_HUB_OFFLINE=1 it must be in the local Hugging Face cache. torch is never imported.

    \b
    Checks: config geometry (the eight lilicorr_* keys, top-k, head width, block size, target layer ids,
    mask token, convolution keys), head / backbone / convolution tensor coverage in both directions,
    shapes and dtypes, NVFP4/FP8 scales and exclusions as each runtime matches them, the owned lm_head,
    shard and index integrity, and (with --target) compatibility with the target model.
    `lilicorr-ckpt rules` lists every check.

    \b
    Examples (from the repository root):
      lilicorr-ckpt validate examples/tiny-lilicorr
      lilicorr-ckpt validate examples/tiny-lilicorr --target examples/tiny-target --runtime sglang
      lilicorr-ckpt validate examples/tiny-lilicorr -f junit -o validate.xml --strict   # a CI gate
      lilicorr-ckpt validate examples/tiny-lilicorr --strict --sarif v.sarif --junit v.xml  # log + report files
      lilicorr-ckpt validate examples/tiny-lilicorr --strict --ignore LC314,LC015       # waived, still reported
      # template: acme/my-drafter@v1.0 is your Hub repo and its revision
      lilicorr-ckpt validate acme/my-drafter@v1.0                       # a Hub repo, headers only
      # template: ci/lilicorr.toml is your waiver file (docs/ci.md)
      lilicorr-ckpt validate examples/tiny-lilicorr --strict --config ci/lilicorr.toml  # waivers, with reasons
    """
    from lilicorr_ckpt.checks.run import error_report, validate_spec
    from lilicorr_ckpt.report.validate import summary_line

    asked = (
        ("--output", fmt, output),
        ("--json", "json", json_file),
        ("--junit", "junit", junit_file),
        ("--sarif", "sarif", sarif_file),
        ("--markdown", "markdown", markdown_file),
    )
    files = [(f, p, o) for o, f, p in asked if p]
    seen: dict[str, str] = {}
    inputs = (
        Inputs().add(path, "the checkpoint").add(target, "the target").add(config_file, "the --config file")
    )
    if config_file is None:  # the waiver file found beside the checkpoint is read too
        from lilicorr_ckpt.checks.waivers import waiver_candidates

        for candidate in waiver_candidates(path):
            inputs.add(candidate, "a waiver file validate reads")
    for option, f, p in asked:
        if not p:
            continue
        check_output_path(p, option, formats.VALIDATE[f].example_file, inputs)
        key = resolved(p)
        if key in seen:
            raise UsageError(f"{option} {p}: {seen[key]} writes that file too; give each report its own file")
        seen[key] = option
    try:
        report = validate_spec(
            path,
            runtime=runtime,
            target=target,
            deep=deep,
            strict=strict,
            revision=revision,
            ignore=ignore,
            select=select,
            config=config_file,
            timeout=timeout,
        )
    except InputError as exc:
        # unreadable input: every report asked for still says why (the next CI step finds its file)
        failed = error_report(path, str(exc), target=target, strict=strict)
        for f, p, o in files:
            write_output(formats.render_validate(failed, f), p, inputs=inputs, option=o)
        if output is None and fmt != "text":
            click.echo(formats.render_validate(failed, fmt), nl=False)
        raise
    color = fmt == "text" and output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    for f, p, o in files:
        write_output(
            formats.render_validate(report, f, formats.Style(verbose=verbose)), p, inputs=inputs, option=o
        )
    if output is None:
        text = formats.render_validate(report, fmt, formats.Style(color=color, verbose=verbose))
        if quiet and fmt == "text":  # validate's --quiet shortens the text report only
            text = formats.verdict_line(text)
        click.echo(text, nl=False)
    if not quiet and (output is not None or fmt != "text"):
        click.echo(summary_line(report), err=True)  # the log says why, whatever went to the files
    sys.exit(report.exit_code)


@cli.command(
    epilog="Exit codes: 0 summarised (whatever the verdicts say: `validate` is the gate), 2 unreadable "
    "input, 4 usage error."
)
@click.argument("path")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people; json for scripts (the same fields, machine-readable).",
)
@click.option("--output", "-o", metavar="FILE", help="Write the summary to FILE instead of stdout.")
@click.option("--quiet", "-q", is_flag=True, help="Text: the runtime verdicts line only.")
def inspect(path: str, fmt: str, output: str | None, quiet: bool) -> None:
    """Summarise a checkpoint: geometry, parameters per component, dtypes, quantization, runtime verdicts.

    PATH is a checkpoint directory or a repo id in the local Hugging Face cache; only headers are read.
    The runtime verdicts are a one-line digest of `validate` (run it for the findings behind them).

    \b
    Examples (from the repository root):
      lilicorr-ckpt inspect examples/tiny-lilicorr
      lilicorr-ckpt inspect examples/tiny-lilicorr -f json | jq .geometry.candidate_topk
    """
    import json

    import msgspec

    from lilicorr_ckpt.report.inspect import inspect_checkpoint, render_inspection

    inputs = Inputs().add(path, "the checkpoint")
    if output:
        check_output_path(output, "--output", "inspect.json" if fmt == "json" else "inspect.txt", inputs)
    ins = inspect_checkpoint(path)
    if fmt == "json":
        text = json.dumps(msgspec.to_builtins(ins), indent=2) + "\n"
    else:
        text = render_inspection(ins)
        if quiet:
            text = "".join(
                line.strip() + "\n" for line in text.splitlines() if line.lstrip().startswith("runtimes")
            )
    if output:
        write_output(text, output, inputs=inputs)
    else:
        click.echo(text, nl=False)


@cli.command(epilog="Exit codes: 0 printed, 4 unknown rule id.")
@click.argument("rule_id", required=False, metavar="[ID]")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="text: one line per rule (with ID: its long form); markdown: the table "
    "in docs/rules.md (with ID: its section there); json: every field, including "
    "the fix and the long form.",
)
def rules(rule_id: str | None, fmt: str) -> None:
    """List every validate rule: id, severity, what it catches and how to fix it. With ID, print that rule's
    long form: what it checks, why it breaks a loader, an example and the fix (a retired ID: what replaced it).

    \b
    Examples:
      lilicorr-ckpt rules                        # one line per rule
      lilicorr-ckpt rules LC314                  # its long form
      lilicorr-ckpt rules LC403                  # a retired id: what replaced it
      lilicorr-ckpt rules -f json | jq '.[] | select(.severity == "error") | .id'
    """
    import json

    import msgspec

    from lilicorr_ckpt.checks import RULES
    from lilicorr_ckpt.checks.findings import RETIRED, retired_long_doc, retired_markdown

    if rule_id is not None:
        wanted = rule_id.upper()
        found = RULES.get(wanted)
        if found is None and wanted in RETIRED:
            click.echo(
                json.dumps({"id": wanted, "retired": RETIRED[wanted]}, indent=2)
                if fmt == "json"
                else retired_markdown(wanted)
                if fmt == "markdown"
                else retired_long_doc(wanted),
                nl=fmt == "json",
            )
            return
        if found is None:
            raise UsageError(f"no rule {rule_id!r}; `lilicorr-ckpt rules` lists them")
        click.echo(
            json.dumps(msgspec.to_builtins(found), indent=2)
            if fmt == "json"
            else found.markdown()
            if fmt == "markdown"
            else found.long_doc(),
            nl=fmt == "json",
        )
        return
    if fmt == "json":
        click.echo(json.dumps([msgspec.to_builtins(r) for r in RULES.values()], indent=2))
        return
    if fmt == "markdown":
        click.echo(rules_markdown(), nl=False)
        return
    for r in RULES.values():
        click.echo(f"{r.id}  {r.severity:<7}  {r.name:<28} {r.summary}")


@cli.command(epilog="Exit codes: 0 printed, 4 unknown engine or release.")
@click.argument("selection", required=False, default="every", metavar="[RUNTIME]")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "markdown", "json"]),
    default="text",
    show_default=True,
    help="text: a line per release and its changes; markdown: the table in docs/validate.md; json: every field "
    "of each release's profile.",
)
def runtimes(selection: str, fmt: str) -> None:
    """List the engine releases validate models (all of them, or a --runtime selection): where each one's loader
    code comes from, and what each release changed from the one before that decides a verdict.

    \b
    Examples:
      lilicorr-ckpt runtimes                     # every supported release
      lilicorr-ckpt runtimes sglang              # what --runtime sglang judges for: its newest release
      lilicorr-ckpt runtimes 'vllm>=0' -f json | jq -r '.[].head_coverage'
    """
    import json

    import msgspec

    from lilicorr_ckpt.runtimes import RELEASES, select_profiles

    chosen = select_profiles(selection)
    if fmt == "json":
        click.echo(json.dumps([msgspec.to_builtins(p) for p in chosen], indent=2))
        return
    if fmt == "markdown":
        click.echo(releases_markdown([p.release_id for p in chosen]), nl=False)
        return
    for p in chosen:
        newest = RELEASES[p.engine_id][-1] is p or RELEASES[p.engine_id][-1].version == p.version
        click.echo(f"{p.display}{'  (newest: --runtime ' + p.engine_id + ')' if newest else ''}")
        click.echo(f"  source: {p.source}")
        if not p.changes:
            click.echo("  the first release modelled")
        for change in p.changes:
            click.echo(f"  - {change}")


@cli.command(epilog="Exit codes: 0 printed, 4 unknown name.")
@click.argument(
    "name", required=False, type=click.Choice(["validate-report", "inspect", "smoke-profile", "smoke-engine"])
)
def schema(name: str | None) -> None:
    """Print the JSON Schema (draft 2020-12) of a machine-readable output, or list their names.

    \b
    validate-report  validate -f json
    inspect          inspect -f json
    smoke-profile    smoke -f json and smoke --out
    smoke-engine     smoke --engine ... -f json and --out

    \b
    Example:
      lilicorr-ckpt schema validate-report > validate-report.schema.json
    """
    from lilicorr_ckpt.report.schemas import all_schemas, render

    schemas = all_schemas()
    if name is None:
        for file_name in schemas:
            click.echo(file_name.removesuffix(".schema.json"))
        return
    click.echo(render(schemas[f"{name}.schema.json"]), nl=False)


def releases_markdown(only: list[str] | None = None) -> str:
    """The table of supported engine releases (docs/validate.md): release, the --runtime that names it, and what
    it changed from the release before it."""
    from lilicorr_ckpt.runtimes import EVERY_RELEASE

    lines = [
        "| release | `--runtime` | changed from the release before (what decides a verdict) |",
        "|---|---|---|",
    ]
    for p in EVERY_RELEASE:
        if only is not None and p.release_id not in only:
            continue
        changes = "<br>".join(c.replace("|", "\\|") for c in p.changes) or "the first release modelled"
        lines.append(f"| {p.display} | `{p.release_id}` | {changes} |")
    return "\n".join(lines) + "\n"


def rules_markdown() -> str:
    from lilicorr_ckpt.checks import RULES

    lines = ["| id | name | severity | area | what it catches |", "|---|---|---|---|---|"]
    for r in RULES.values():
        lines.append(f"| {r.id} | `{r.name}` | {r.severity} | {r.area} | {r.summary} |")
    return "\n".join(lines) + "\n"


def rules_page() -> str:
    """docs/rules.md: every rule's long form under an anchor of its id (SARIF helpUri points here), then the
    retired ids."""
    from lilicorr_ckpt.checks import RULES
    from lilicorr_ckpt.checks.findings import RETIRED, retired_markdown

    lines = [
        "# Rules",
        "",
        "Generated from the rule catalogue by `python scripts/sync_docs.py` (a test keeps it in sync);",
        "`lilicorr-ckpt rules ID` prints the same text. Each rule: what it checks, why it breaks or silently",
        "degrades a loader (per runtime where they differ), an example that triggers it, and the fix.",
        "",
    ]
    ordered = [RULES[rule_id] for rule_id in sorted(RULES)]
    areas: dict[str, list[str]] = {}
    for r in ordered:
        areas.setdefault(r.area, []).append(f"[{r.id}](#{r.id.lower()})")
    lines += [f"- **{area}**: {', '.join(ids)}" for area, ids in areas.items()]
    lines += ["- **retired**: " + ", ".join(f"[{i}](#{i.lower()})" for i in sorted(RETIRED)), ""]
    lines += ["## Every rule at a glance", "", rules_markdown()]  # `rules -f markdown`; the README links here
    for r in ordered:
        lines.append(r.markdown())
    lines += ["## Retired ids", ""]
    for rule_id in sorted(RETIRED):
        lines.append(retired_markdown(rule_id))
    return "\n".join(lines)


def _register_optional() -> None:
    """Commands that live in other modules register themselves here (convert, smoke)."""
    for module in (
        "lilicorr_ckpt.convert.cli",
        "lilicorr_ckpt.smoke.cli",
        "lilicorr_ckpt.report.ci",
        "lilicorr_ckpt.report.card",
    ):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name == module or (exc.name and module.startswith(exc.name)):
                continue
            raise
        mod.register(cli)


def _interrupted_while_starting() -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(EXIT_INTERRUPTED) from None


try:
    _register_optional()
except KeyboardInterrupt:
    _interrupted_while_starting()


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="lilicorr-ckpt")  # every exception a message and an exit code (exits.py)


if __name__ == "__main__":  # pragma: no cover
    try:
        main()
    except KeyboardInterrupt:  # between the import and main's own handler
        _interrupted_while_starting()
