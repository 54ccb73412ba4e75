"""The `lilicorr-ckpt` console script: a module small enough that a Ctrl-C in the command line's first
milliseconds (while click, msgspec and the commands are imported) lands inside its handler and ends as
`interrupted` (exit 130) instead of a traceback from the entry script."""

import sys


def main() -> None:
    try:
        from lilicorr_ckpt.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    try:
        run()
    except KeyboardInterrupt:  # between the import and run's own handler
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
