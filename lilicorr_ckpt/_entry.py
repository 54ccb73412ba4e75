"""The `lilicorr-ckpt` console script: a module small enough that a Ctrl-C in the command line's first
milliseconds (while click, msgspec and the commands are imported) lands inside its handler and ends as
`interrupted` (exit 130) instead of a traceback from the entry script."""

import _thread  # builtins, loaded before any script runs: importing them adds no module
import sys
import time


def _interrupt_again(unraisable) -> None:
    """sys.unraisablehook: a Ctrl-C that lands inside a callback Python cannot raise from (importlib's module-lock
    weakref callback, during the first imports) would be printed as "Exception ignored ... Traceback" and then
    lost. Deliver it again instead, from a helper thread once this hook has returned (a signal sent from the
    hook itself would be raised inside the hook, and be unraisable again), so that it ends as `interrupted`."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _thread.start_new_thread(_interrupt_main_soon, ())
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_main_soon() -> None:
    time.sleep(0.001)
    _thread.interrupt_main()


def main() -> None:
    sys.unraisablehook = _interrupt_again
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
