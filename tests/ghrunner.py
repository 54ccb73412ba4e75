"""How the GitHub Actions runner reads what a step writes, for tests that check nothing can be forged: the
$GITHUB_OUTPUT file (key=value and key<<DELIMITER entries) and workflow commands in the log (`::name k=v::msg`,
with ::stop-commands::TOKEN ... ::TOKEN:: pausing them). Written from the runner's documented behaviour
(docs.github.com, "Workflow commands for GitHub Actions"); strict where the runner is strict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_COMMAND = re.compile(r"^::([A-Za-z0-9_-]+)(?: ([^:]*))?::(.*)$")


def parse_github_output(text: str) -> dict[str, str]:
    """The outputs a step sets; a later entry of a key replaces an earlier one. An unterminated multiline
    entry is an error, as on the runner."""
    out: dict[str, str] = {}
    lines = re.split(r"\r?\n", text)
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line == "":
            continue
        eq, heredoc = line.find("="), line.find("<<")
        if eq >= 0 and (heredoc < 0 or eq < heredoc):
            key, value = line[:eq], line[eq + 1 :]
            assert key, f"empty output name in {line!r}"
            out[key] = value
            continue
        assert heredoc > 0, f"invalid output line {line!r}"
        key, delimiter = line[:heredoc], line[heredoc + 2 :]
        assert delimiter, f"empty delimiter in {line!r}"
        value = []
        while True:
            assert i < len(lines), f"output {key}: no closing {delimiter!r}"
            if lines[i] == delimiter:
                i += 1
                break
            value.append(lines[i])
            i += 1
        out[key] = "\n".join(value)
    return out


def _unescape_data(s: str) -> str:
    return s.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


def _unescape_property(s: str) -> str:
    return (
        s.replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
    )


@dataclass
class Command:
    name: str
    properties: dict[str, str] = field(default_factory=dict)
    message: str = ""


def obeyed_commands(log: str) -> list[Command]:
    """The workflow commands the runner would act on in this log (one stream), in order."""
    out: list[Command] = []
    stop_token: str | None = None
    for line in log.splitlines():
        m = _COMMAND.match(line.lstrip(" \t")) if line.lstrip(" \t").startswith("::") else None
        if m is None:
            continue
        name, props, message = m.group(1), m.group(2) or "", m.group(3)
        if stop_token is not None:
            if name == stop_token and not props:
                stop_token = None
            continue
        if name == "stop-commands":
            stop_token = message
            continue
        properties = {}
        for pair in filter(None, props.split(",")):
            key, _, value = pair.partition("=")
            properties[key] = _unescape_property(value)
        out.append(Command(name, properties, _unescape_data(message)))
    return out
