"""How the recipe's argparse scripts (`python -m lilicorr_train.mixes`, `python -m lilicorr_train.pieces`) end, as
`python -m lilicorr_train` does: a usage error is exit 4 with the usage line, an input that cannot be read exit 2
naming it, a run state a field of which does not fit exit 1 (refused), an interrupt 130 (Ctrl-C) or 143 (SIGTERM,
which unwinds like Ctrl-C so that no temporary file is left), and anything unexpected exit 2 with one line naming
the command and its inputs (LILICORR_DEBUG=1 shows the traceback); never a traceback by default."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from lilicorr_ckpt.errors import InputError, Terminated, UsageError, sigterm_unwinds
from lilicorr_ckpt.exits import shown_message
from lilicorr_runtime.target.load import load_target

from .data import DataError
from .state import StateError, StateMisfit

EXIT_REFUSED, EXIT_INPUT, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 4, 130, 143


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error exit 4 (argparse's own is 2, which means unreadable input here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: usage error: {shown_message(message)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def seconds(text: str) -> float:
    """A time budget: a finite number of seconds >= 0 (NaN never ran out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds >= 0")
    return value


def whole_number(name: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high; `name` says what it is in the refusal."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: {name} is from {low:,} to {high:,}")
        return value

    return parse


def real_number(name: str, low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number from low to high (NaN passes every comparison, so it is named here)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is out of range: {name} is a number from {low:g} to {high:g}"
            )
        return value

    return parse


def device_name(text: str) -> str:
    """--device: cpu, cuda or cuda:N, CUDA only where there is one (argparse.ArgumentTypeError otherwise)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r}: give cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: give cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device; give cpu")
    return text


def load_target_or_say(spec: str, **kwargs: Any) -> Any:
    """load_target, its failure an InputError naming --target and the loader's own first line."""
    try:
        return load_target(spec, **kwargs)
    except (InputError, UsageError):
        raise
    except Exception as exc:  # a missing or unreadable target: its loader's own message, not a traceback
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise InputError(f"--target {spec}: {first}") from None


READING_CHARS = 400  # of the inputs an internal-error line names


def reading(inputs: Mapping[str, Any]) -> str:
    """The inputs a command reads, for its internal-error line: `RUN run, --data a.npz, b.npz` (those not given
    left out, at most READING_CHARS characters)."""
    parts = []
    for name, value in inputs.items():
        values = value if isinstance(value, list | tuple) else [value]
        if any(v is not None for v in values):
            parts.append(f"{name} {', '.join(str(v) for v in values if v is not None)}")
    text = ", ".join(parts)
    return text if len(text) <= READING_CHARS else text[: READING_CHARS - 3] + "..."


def run_script(
    prog: str, body: Callable[[], int], *, command: str = "", inputs: Mapping[str, Any] | None = None
) -> int:
    """body's exit code, every failure turned into one message on stderr and its code. `command` and `inputs`
    (option or argument name -> path, or a list of paths) are named in the line of an unexpected failure."""

    def fail(message: str, code: int) -> int:
        print(f"{prog}: {shown_message(message)}", file=sys.stderr)
        return code

    try:
        with sigterm_unwinds():
            return body()
    except UsageError as exc:
        return fail(f"usage error: {exc}", EXIT_USAGE)
    except StateMisfit as exc:  # a run state that reads, but a field of which does not fit
        return fail(f"refused: {exc}", EXIT_REFUSED)
    except (InputError, DataError, StateError) as exc:
        return fail(f"error: {exc}", EXIT_INPUT)
    except KeyboardInterrupt as exc:  # Terminated (SIGTERM) is one
        terminated = isinstance(exc, Terminated)
        print("terminated" if terminated else "interrupted", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except OSError as exc:
        return fail(f"error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", EXIT_INPUT)
    except MemoryError:
        return fail("error: out of memory; lower --batch-size", EXIT_INPUT)
    except Exception as exc:
        if os.environ.get("LILICORR_DEBUG"):
            raise
        where = f" in {command}" if command else ""
        read = reading(inputs or {})
        where += f", reading {read}" if read else ""
        return fail(
            f"internal error{where}: {type(exc).__name__}: {str(exc)[:300]}\n"
            "  This is a bug; rerun with LILICORR_DEBUG=1 for a traceback and report it.",
            EXIT_INPUT,
        )
