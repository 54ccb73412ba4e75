"""One escaping rule per output format. What the reports print from a checkpoint, a Hub reply, a waiver file or
the command line (tensor names, config values, paths, commit ids, reasons) is shown, never obeyed: it cannot
start another report line, reach the terminal as an escape sequence, reorder the text around it (bidi
controls), make the JUnit XML invalid, run a GitHub workflow command, set a step output or add Markdown.

    text, JUnit text     printable(s)                    controls, bidi controls, non-characters -> \\x1b, \\u202e
    JUnit markup         xml_text(s), xml_attr(s)         & < > (and quotes, tab, CR, LF in an attribute)
    JSON, SARIF          json.dumps (ASCII-only)          plus printable() on the message texts people read
    Markdown             markdown_text(s), markdown_code(s), markdown_block(s)
    workflow commands    workflow_command(name, message, **properties)   (%, CR, LF; and : , in properties)
    $GITHUB_OUTPUT       output_entry(name, value)        name<<DELIMITER / value / DELIMITER, random delimiter
    a log of others' text  between stop_commands_token() lines: the runner obeys no command inside

The card (report/card.py) uses markdown_text / markdown_code too.
"""

from __future__ import annotations

import re
import secrets

__all__ = [
    "markdown_block",
    "markdown_cell",
    "markdown_code",
    "markdown_text",
    "output_entry",
    "printable",
    "stop_commands_token",
    "workflow_command",
    "workflow_property",
    "xml_attr",
    "xml_text",
]

# C0 and C1 controls, DEL, the Unicode line/paragraph separators (which some viewers break lines on), the bidi
# embedding/override/isolate controls and marks (which reorder what follows: "Trojan source"), lone surrogates,
# and the non-characters U+FFFE/U+FFFF (which XML 1.0 forbids, so a JUnit report carrying them is unreadable)
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """text with every control, bidi control and non-character written as a visible escape (`\\x0a`, `\\x1b`,
    `\\u202e`): one line, as the characters are stored, and valid in XML 1.0."""
    return _CONTROL.sub(_escape, text)


# --- Markdown (GitHub-flavoured: step summaries, the model card) ---------------------------------------------

# what starts an inline construct (code, emphasis, strikethrough, link or image, HTML or autolink, entity,
# math, a table cell's end); \ escapes each of them
_MD_INLINE = re.compile(r"([\\`*_\[\]<>!|~&$])")
# what makes a line a block (heading, list item, quote, setext underline, thematic break) when it starts one
_MD_BLOCK_START = re.compile(r"^(\s*)([#+=>-]|\d+(?=[.)]))")


def markdown_text(text: str) -> str:
    """text as literal Markdown text: one line (printable); every character that could start emphasis, a link,
    an HTML tag, an entity, code, math or a table cell backslash-escaped, and a leading heading or list marker
    too, so that it reads as written wherever it lands (a heading, a table cell, the start of a line)."""
    out = _MD_INLINE.sub(r"\\\1", printable(text))
    return _MD_BLOCK_START.sub(
        lambda m: m.group(1) + (m.group(2) + "\\" if m.group(2)[0].isdigit() else "\\" + m.group(2)),
        out,
        count=1,
    )


def markdown_code(text: str) -> str:
    """text as one inline code span: fenced by more backticks than any run inside it, on one line (printable),
    with `|` escaped (a pipe ends a table cell even inside a code span in GFM)."""
    body = printable(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def markdown_cell(text: str) -> str:
    """Literal text for a table cell (markdown_text: a `|` cannot end the cell)."""
    return markdown_text(text)


def markdown_block(text: str) -> str:
    """text as a fenced code block: a fence longer than any backtick run inside, every line printable."""
    lines = [printable(line) for line in text.splitlines()]
    longest = max((len(run) for line in lines for run in re.findall("`{3,}", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence, *lines, fence]) + "\n"


# --- GitHub Actions: workflow commands and step outputs ------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _command_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workflow_property(text: str) -> str:
    """A workflow-command property value (file=, title=): % CR LF : , encoded as the runner decodes them."""
    return _command_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: str | int | None) -> str:
    """`::command k=v,...::message` as one line. The message's own line breaks survive as %0A (the annotation
    shows them); nothing in message or properties can end the line or start another command. Properties are
    keyword arguments, snake_case for the runner's camelCase (end_line -> endLine); None leaves one out."""
    if not _NAME.fullmatch(command):
        raise ValueError(f"not a workflow command name: {command!r}")
    props = []
    for key, value in properties.items():
        if value is None:
            continue
        name = re.sub(r"_(\w)", lambda m: m.group(1).upper(), key)
        props.append(f"{name}={workflow_property(str(value))}")
    head = f"::{command} {','.join(props)}" if props else f"::{command}"
    return f"{head}::{_command_data(message)}"


def output_entry(name: str, value: str) -> str:
    """One $GITHUB_OUTPUT (or $GITHUB_ENV) entry in the multiline form, `name<<D`, the value, `D`, ending in a
    newline; D is random and checked not to occur in value, so no value can end early or set another key."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"not an output name: {name!r}")
    while True:
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
        if delimiter not in value:
            break
    return f"{name}<<{delimiter}\n{value}\n{delimiter}\n"


def stop_commands_token(avoid: str = "") -> str:
    """A fresh token for `::stop-commands::TOKEN` ... `::TOKEN::`: the runner obeys no workflow command in the
    lines between, so a log of text the tool does not control (stderr, smoke's output) is shown, not run."""
    while True:
        token = f"lilicorr-{secrets.token_hex(16)}"
        if token not in avoid:
            return token


# --- XML (JUnit) ----------------------------------------------------------------------------------------------
# Written here rather than taken from xml.sax.saxutils, whose import brings urllib.request, http.client, ssl and
# email (about 40 modules) to every start of the command line, which imports the renderers for --format.

_XML_TEXT = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_XML_ATTR = {**_XML_TEXT, "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
_XML_TEXT_RE = re.compile("[&<>]")
_XML_ATTR_RE = re.compile("[&<>\n\r\t]")


def xml_text(text: str) -> str:
    """text as XML character data: &, < and > as entities (printable() first, for what XML 1.0 cannot hold)."""
    return _XML_TEXT_RE.sub(lambda m: _XML_TEXT[m.group(0)], text)


def xml_attr(text: str) -> str:
    """text as a quoted XML attribute value, quotes included: double quotes unless the value holds one and no
    single quote (then single), else double with &quot;; tab, CR and LF as character references, so an XML
    reader's attribute normalisation keeps them."""
    body = _XML_ATTR_RE.sub(lambda m: _XML_ATTR[m.group(0)], text)
    if '"' not in body:
        return f'"{body}"'
    if "'" not in body:
        return f"'{body}'"
    return '"' + body.replace('"', "&quot;") + '"'
