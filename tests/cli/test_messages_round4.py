"""What stderr shows is the problem, never the terminal's or the program's: an error message quoting a config value
(a speculators config's `speculators_model_type`) wrote its escape sequences, newlines and bidi controls raw, so
the value could colour the terminal or start a forged `::error::` line in a CI log; and a warning (a retired
LILICORR_* switch) came as Python prints one: the source file, its line and `RuntimeWarning`."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from lilicorr_ckpt.cli import main
from lilicorr_ckpt.exits import shown_message

from helpers import REPO

SPEC = REPO / "tests" / "data" / "producers" / "speculators-0.9.0" / "dflash-bf16"
HOSTILE = "x\x1b[31mred\n::error::forged\r\u202e\u2066"


def _run(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code or 0), capsys.readouterr().err


def test_a_hostile_speculators_kind_is_shown_escaped_on_one_line(tmp_path, capsys):
    drafter = tmp_path / "d"
    shutil.copytree(SPEC, drafter)
    doc = json.loads((drafter / "config.json").read_text())
    doc["speculators_model_type"] = HOSTILE
    (drafter / "config.json").write_text(json.dumps(doc))
    code, err = _run(capsys, "validate", str(drafter), "-q")
    assert code == 2
    assert err.count("\n") == 1 and not any(c in err for c in "\x1b\r\u202e\u2066")
    assert "x\\x1b[31mred\\x0a::error::forged\\x0d\\u202e\\u2066" in err


def test_every_error_line_is_escaped_and_the_tools_own_lines_kept():
    shown = shown_message("ambiguous:\n  - a\x1bb\n  - \u202ec")
    assert shown == "ambiguous:\n  - a\\x1bb\n  - \\u202ec"


def test_a_warning_is_one_plain_line_without_python_internals(capsys):
    def warn_then_usage():
        warnings.warn("LILICORR_PDL is ignored\x1b[2J: retired", RuntimeWarning, stacklevel=1)

    with pytest.raises(SystemExit), warnings.catch_warnings():
        warnings.simplefilter("always")
        # a click command that warns, through the same run_command as the real entry points
        import click

        from lilicorr_ckpt.exits import run_command

        run_command(click.command()(warn_then_usage), [], prog_name="lilicorr-ckpt")
    err = capsys.readouterr().err
    assert err == "lilicorr-ckpt: warning: LILICORR_PDL is ignored\\x1b[2J: retired\n"
    assert "RuntimeWarning" not in err and ".py:" not in err
    assert warnings.showwarning.__module__ == "warnings"  # put back when the command ends
