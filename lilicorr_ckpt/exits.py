"""How a console script ends: every exception a command raises becomes one line on stderr and an exit code, never
a traceback. `lilicorr-ckpt` (cli.main) and `lilicorr-ckpt-pre-commit` (precommit.main) run their click command
through run_command; another entry point does the same with its own program name.

Exit codes: 0 clean, 1 findings or a refusal (the command's own), 2 unreadable input, I/O error or internal error,
4 usage error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

A message that is not the input's own (an internal error, memory or recursion exhausted, an OSError with no file
name) names the command line it came from, so a CI log that runs several commands says which input did it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import warnings
from collections.abc import Callable
from typing import NoReturn, TextIO

import click

from lilicorr_ckpt.errors import InputError, Terminated, UsageError, sigterm_unwinds
from lilicorr_ckpt.report.escape import printable

EXIT_OK, EXIT_FINDINGS, EXIT_INPUT, EXIT_USAGE = 0, 1, 2, 4
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
SHOWN_COMMAND_CHARS = 300  # a hook given a thousand files names the first few


def shown_command(prog_name: str, argv: list[str] | None) -> str:
    """The command line as a shell would take it, cut to SHOWN_COMMAND_CHARS."""
    args = sys.argv[1:] if argv is None else argv
    text = shlex.join([prog_name, *args])
    return text if len(text) <= SHOWN_COMMAND_CHARS else text[:SHOWN_COMMAND_CHARS] + " ..."


def shown_message(message: str) -> str:
    """An error message as stderr shows it: each of its lines with every control, bidi control and non-character
    written as an escape (report/escape.py printable), so text quoted from an input (a config value, a file name,
    a server's reply) cannot colour the terminal, move the cursor or reorder the line around it."""
    return "\n".join(printable(line) for line in message.split("\n"))


def _plain_warning(prog_name: str) -> Callable[..., None]:
    """warnings.showwarning for a console script: `PROG: warning: MESSAGE`, one line, escaped; never the source file,
    line and the warning class's name, which are the program's internals, not the user's."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split("\n"))
        with contextlib.suppress(OSError, ValueError):  # stderr closed: a warning is not worth a failure
            click.echo(f"{prog_name}: warning: {shown_message(text)}", err=True)

    return show


def _stdout_closed() -> bool:
    """click swaps in its flush-pacifying wrapper when a write to stdout hit a closed pipe (`| head`)."""
    return type(sys.stdout).__name__.endswith("PacifyFlushWrapper")  # by name: click made the class private


def _stdout_write_failed(exc: OSError) -> bool:
    """Whether the OSError came from writing standard output: click.echo is the innermost frame (the write itself
    is C), so a full disk or a file-size limit on `> report.txt` is named as standard output."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    code = last.tb_frame.f_code
    return code.co_name == "echo" and os.path.basename(os.path.dirname(code.co_filename)) == "click"


def _silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's final flush does not print a
    second error ("Exception ignored ...") after ours."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (
        OSError,
        ValueError,
        AttributeError,
    ):  # no real descriptor (captured by a test, or already closed)
        pass


def _buffered_stdout() -> None:
    """Under `python -u` or PYTHONUNBUFFERED stdout writes straight to its descriptor, and a short write (a full disk,
    `ulimit -f`) silently drops the rest of the report. A buffered writer over the same descriptor retries a short
    write and raises on the failure, which run_command reports; line buffering keeps the output as prompt."""
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and isinstance(stream.buffer, io.FileIO):
        # a FileIO of our own that never closes the descriptor: the wrapper is dropped when the command ends, and
        # closing the caller's FileIO with it would close the caller's standard output (or a test's capture file)
        raw = io.FileIO(stream.buffer.fileno(), "w", closefd=False)
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True
        )


def run_command(
    command: click.Command,
    argv: list[str] | None = None,
    *,
    prog_name: str,
    debug_env: str = "LILICORR_DEBUG",
) -> NoReturn:
    """Run `command` with argv (None: sys.argv[1:]) and exit with its code; every exception ends as a message.
    Standard output is flushed before the exit, so a report cut short by a full disk or `ulimit -f` is exit 2,
    never a silent 0. With `debug_env` set in the environment an internal error re-raises (a traceback for a bug
    report)."""
    original = (
        sys.stdout
    )  # kept referenced: the wrapper _buffered_stdout replaces must not close the descriptor
    _buffered_stdout()
    shown_warning = warnings.showwarning
    warnings.showwarning = _plain_warning(prog_name)
    try:
        code = _outcome(command, argv, prog_name, debug_env)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            code = EXIT_OK
        except OSError as exc:
            _silence_stdout()
            click.echo(f"{prog_name}: error: cannot write standard output: {exc.strerror or exc}", err=True)
            code = EXIT_INPUT
        except ValueError:  # stdout already closed by the caller: nothing left to flush
            pass
        if _stdout_closed():
            code = EXIT_OK
    finally:
        sys.stdout = original
        warnings.showwarning = shown_warning
    sys.exit(code)


def _outcome(
    command: click.Command, argv: list[str] | None, prog_name: str, debug_env: str
) -> int | str | None:
    """The command's exit code, every exception turned into its message on stderr and its code."""

    def fail(message: str, code: int) -> int:
        click.echo(f"{prog_name}: {shown_message(message)}", err=True)
        return code

    try:
        with sigterm_unwinds():
            rv = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort as exc:  # click turns Ctrl-C (and our SIGTERM) into Abort
        terminated = isinstance(exc.__cause__, Terminated)
        click.echo("terminated" if terminated else "interrupted", err=True)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except UsageError as exc:
        return fail(f"usage error: {exc}", EXIT_USAGE)
    except InputError as exc:
        return fail(f"error: {exc}", EXIT_INPUT)
    except click.ClickException as exc:
        exc.show()
        return EXIT_INPUT
    except Terminated:
        click.echo("terminated", err=True)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    except (
        SystemExit
    ) as exc:  # the command's own sys.exit(code); a reader that stopped early is handled above
        return exc.code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except OSError as exc:  # the environment, not the checkpoint: a full disk, a permission, a vanished file
        if _stdout_write_failed(exc):
            _silence_stdout()
            return fail(f"error: cannot write standard output: {exc.strerror or exc}", EXIT_INPUT)
        where = (
            f": {exc.filename}" if exc.filename else f" (while running `{shown_command(prog_name, argv)}`)"
        )
        return fail(f"error: {exc.strerror or exc}{where}", EXIT_INPUT)
    except MemoryError:
        return fail(
            f"error: out of memory while running `{shown_command(prog_name, argv)}`; the input is larger "
            "than this machine can read",
            EXIT_INPUT,
        )
    except RecursionError:
        return fail(
            f"error: the input of `{shown_command(prog_name, argv)}` is nested too deeply to read", EXIT_INPUT
        )
    except Exception as exc:
        if os.environ.get(debug_env):
            raise
        return fail(
            f"internal error: {type(exc).__name__}: {str(exc)[:500]} (while running "
            f"`{shown_command(prog_name, argv)}`)\n  This is a bug in {prog_name}; rerun with {debug_env}=1 "
            "for a traceback and report it.",
            EXIT_INPUT,
        )
