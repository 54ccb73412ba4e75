"""Every report format by name, mapped to its renderer: the one table each `--format` choice is built from.

`VALIDATE` holds the formats of a validate Report (`validate --format`, `report --format`, the pre-commit hook's
text); `SMOKE` those of a smoke profile (`smoke --format`). A new format is one renderer function (beside its
kin in report/validate.py, report/ci.py or report/smoke.py) and its row below; the command lines, their --help
and the renderers' dispatch all read these tables.

Cheap to import (the command line imports it at start-up): no renderer module here imports the rule catalogue,
the checkpoint reader or numpy at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from lilicorr_ckpt.report import ci, smoke, validate
from lilicorr_ckpt.results import Report
from lilicorr_ckpt.smoke.profile import SmokeReport, encode


class Style(msgspec.Struct, frozen=True, kw_only=True):
    """How a person reads it: the renderers that have no colour or verbosity ignore it."""

    color: bool = False  # ANSI colours (a terminal)
    verbose: bool = False  # info-level findings too (validate's text)


PLAIN = Style()


class ValidateFormat(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    render: Callable[[Report, Style], str]
    help: str  # what --format's help says of it
    example_file: str  # the file name an --output error suggests
    quiet: Callable[[str], str] | None = (
        None  # what `report --quiet` keeps of the rendering (None: all of it)
    )


class SmokeFormat(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    render: Callable[[SmokeReport, Style], str]
    help: str
    refused: Callable[[str, str], str] | None = (
        None  # (path, reason) -> stdout when validate refused the drafter
    )


def verdict_line(text: str) -> str:
    """The text report's last line: PASS/FAIL, the counts and each runtime's verdict."""
    return text.rstrip("\n").rpartition("\n")[2] + "\n"


def annotations_only(text: str) -> str:
    """The workflow commands of the github format, without its summing-up line."""
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("::"))


def _validate_text(report: Report, style: Style) -> str:
    return validate.render_text(report, color=style.color, verbose=style.verbose)


def _smoke_text(report: SmokeReport, style: Style) -> str:
    return smoke.render_text(report, color=style.color)


def _smoke_json(report: SmokeReport, style: Style) -> str:
    return encode(report).decode()  # the bytes `smoke --output` writes


R = TypeVar("R", Report, SmokeReport)


def plain(render: Callable[[R], str]) -> Callable[[R, Style], str]:
    """A renderer that has no style to take."""
    return lambda report, style: render(report)


VALIDATE: dict[str, ValidateFormat] = {
    f.name: f
    for f in (
        ValidateFormat(
            name="text",
            render=_validate_text,
            help="for people (the default)",
            example_file="report.txt",
            quiet=verdict_line,
        ),
        ValidateFormat(
            name="json",
            render=plain(validate.render_json),
            help="the schema `lilicorr-ckpt schema validate-report` prints",
            example_file="report.json",
        ),
        ValidateFormat(
            name="junit",
            render=plain(validate.render_junit),
            help="a testcase per runtime",
            example_file="report.xml",
        ),
        ValidateFormat(
            name="sarif",
            render=plain(validate.render_sarif),
            help="SARIF 2.1.0 for code scanning",
            example_file="report.sarif",
        ),
        ValidateFormat(
            name="github",
            render=plain(ci.render_github),
            help="::error/::warning annotations (file and line)",
            example_file="report.txt",
            quiet=annotations_only,
        ),
        ValidateFormat(
            name="markdown",
            render=plain(ci.render_markdown),
            help="the verdict table for a step summary",
            example_file="summary.md",
        ),
        ValidateFormat(
            name="github-output",
            render=plain(ci.render_github_output),
            help="key=value lines for $GITHUB_OUTPUT",
            example_file="report.txt",
        ),
    )
}

SMOKE: dict[str, SmokeFormat] = {
    f.name: f
    for f in (
        SmokeFormat(name="text", render=_smoke_text, help="the arms' table and the gates (the default)"),
        SmokeFormat(
            name="json", render=_smoke_json, help="the schema `lilicorr-ckpt schema smoke-profile` prints"
        ),
        SmokeFormat(
            name="junit",
            render=plain(smoke.render_junit),
            help="a testcase per gate",
            refused=smoke.junit_refusal,
        ),
    )
}


def describe(table: dict[str, ValidateFormat] | dict[str, SmokeFormat]) -> str:
    """Each format and what it is, for --format's help."""
    return "; ".join(f"{f.name}: {f.help}" for f in table.values()) + "."


def render_validate(report: Report, fmt: str, style: Style = PLAIN) -> str:
    """A validate Report in any of its formats."""
    if fmt not in VALIDATE:
        raise ValueError(f"unknown validate format {fmt!r} (known: {', '.join(VALIDATE)})")
    return VALIDATE[fmt].render(report, style)


def render_smoke(report: SmokeReport, fmt: str, style: Style = PLAIN) -> str:
    """A smoke profile in any of its formats."""
    if fmt not in SMOKE:
        raise ValueError(f"unknown smoke format {fmt!r} (known: {', '.join(SMOKE)})")
    return SMOKE[fmt].render(report, style)
