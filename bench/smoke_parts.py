"""`lilicorr-ckpt smoke ARGS`, with the time since the process started on every progress line, so that the
parts of a smoke run's wall time (imports, loading the drafter and the target, warm-up, each arm, the
losslessness check, kernel parity, the report) can be read off one run.

    python bench/smoke_parts.py smoke examples/smollm2-lilicorr -t GGUF -r vllm --gpu --limit 0 [--batch 1]

Progress lines go to stderr as smoke writes them (one line per note, steps at most every 10 s), each prefixed
with `[  12.3 s]`; at the end a table of the parts, each from one note to the next, and the whole wall time.
"""

from __future__ import annotations

import sys
import time

BEGIN = time.perf_counter()


def main() -> None:
    from lilicorr_ckpt import console

    marks: list[tuple[float, str]] = [(0.0, "start")]
    write = console.Progress._write

    def stamped(self, text: str) -> None:
        now = time.perf_counter() - BEGIN
        line = text.strip()
        if line.endswith("...") and "/" not in line.split(":")[-1][:12]:  # a note, not a step line
            marks.append((now, line.removeprefix("smoke: ").removesuffix("...")))
        sys.stderr.write(f"[{now:7.1f} s] ")
        write(self, text)

    console.Progress._write = stamped
    start = console.Progress.start

    def started(self, total: int, *args, **kwargs) -> None:  # a counted part begins
        marks.append((time.perf_counter() - BEGIN, f"{kwargs.get('unit') or self.unit} ({total})"))
        start(self, total, *args, **kwargs)

    console.Progress.start = started
    console.Progress.for_terminal = classmethod(  # lines, not a self-overwriting bar, whatever stderr is
        lambda cls, quiet, *, total=0, name="", log_interval=None, unit="steps": cls(
            total, enabled=not quiet, name=name, interval=10.0, lines=True, unit=unit
        )
    )
    from lilicorr_ckpt.cli import main as cli

    code = 0
    try:
        cli(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    end = time.perf_counter() - BEGIN
    marks.append((end, "end"))
    print(f"\nsmoke parts ({' '.join(sys.argv[1:])}):", file=sys.stderr)
    for (t0, name), (t1, _) in zip(marks, marks[1:], strict=False):
        print(f"  {name:<50} {t1 - t0:7.1f} s", file=sys.stderr)
    print(f"  {'whole process':<50} {end:7.1f} s (exit {code})", file=sys.stderr)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
