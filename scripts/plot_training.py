#!/usr/bin/env python3
"""Draw a training curve (SVG, no plotting library) from the log.jsonl files that `python -m lilicorr_train train`
and `python -m lilicorr_train.pieces fit` write.

    python scripts/plot_training.py RUN/log.jsonl [LABEL=OTHER/log.jsonl ...] --out docs/curve.svg

Left: tau on the training batches (1 + accepted tokens per block, the metrics averaged between log lines,
thin) and on the held-out set (the `heldout_step` lines, dots), head (solid) and control (dashed), per log.
Right: L_dflash on the training batches and on the held-out set. The x axis is the step.

Exit codes as the recipe's other commands (lilicorr_train.script): 0 written, 1 refused (a log that holds no
training or held-out record), 2 a log that cannot be read (missing, not a regular file, not UTF-8), 4 usage error
(an --out that is a directory, not .svg, in a missing directory, or one of the logs); 130/143 interrupted. The SVG
is written atomically. Lines that are not JSON records are skipped with a warning, and values that are not
finite numbers (NaN, Infinity, text) are not drawn.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # lilicorr_train: the repository's, not installed

from lilicorr_ckpt.checkpoint.readfile import read_regular_text  # noqa: E402
from lilicorr_ckpt.errors import UsageError  # noqa: E402
from lilicorr_ckpt.outfile import Inputs, check_output_path, write_output  # noqa: E402
from lilicorr_train.script import Parser, run_script  # noqa: E402

PROG = "python scripts/plot_training.py"

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 460, 320  # one panel
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 30, 44


LOG_LIMIT = 1 << 30  # bytes of a log: a line of ~300 bytes every 25 steps, far below for any run


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """The record without the values that are not finite numbers (NaN, Infinity, text, null): never drawn."""
    return {
        k: v
        for k, v in record.items()
        if k in ("step", "heldout_step")
        or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))
    }


def _step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records) of a log: lines with `step` and lines with `heldout_step` (InputError
    when it cannot be read). Lines that are not JSON objects are skipped with a warning naming the first."""
    what = f"log {path}"
    text = read_regular_text(path, what=what, max_bytes=LOG_LIMIT)
    train, held = [], []
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            bad.append(number)
            continue
        record = _finite(record)
        if _step(record.get("step")) and "control_accept" in record:
            train.append(record)
        elif _step(record.get("heldout_step")) and "val_tau_control" in record:
            held.append(record)
    if bad:
        print(
            f"{PROG}: warning: {what}: {len(bad)} lines are not JSON records (skipped; the first: line {bad[0]})",
            file=sys.stderr,
        )
    return train, held


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    span = high - low or 1.0
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    first = math.ceil(low / step) * step
    out = []
    value = first
    while value <= high + 1e-9:
        out.append(round(value, 10))
        value += step
    return out


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 or v == int(v) else f"{v:.2f}".rstrip("0").rstrip(".")


class Panel:
    def __init__(self, x0: float, title: str, ylabel: str, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.x0, self.title, self.ylabel = x0, title, ylabel
        self.xmin, self.xmax = 0.0, max(xs or [1.0])
        lo, hi = min(ys or [0.0]), max(ys or [1.0])
        margin = (hi - lo) * 0.06 or 0.5
        self.ymin, self.ymax = lo - margin, hi + margin

    def x(self, v: float) -> float:
        return self.x0 + PAD_L + (v - self.xmin) / ((self.xmax - self.xmin) or 1) * (W - PAD_L - PAD_R)

    def y(self, v: float) -> float:
        return PAD_T + (self.ymax - v) / ((self.ymax - self.ymin) or 1) * (H - PAD_T - PAD_B)

    def frame(self) -> list[str]:
        out = [
            f'<rect x="{self.x0 + PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
            'fill="none" stroke="#444"/>',
            f'<text x="{self.x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">{escape(self.title)}</text>',
            f'<text x="{self.x0 + W / 2}" y="{H - 8}" text-anchor="middle">step</text>',
            f'<text transform="translate({self.x0 + 14},{H / 2}) rotate(-90)" text-anchor="middle">'
            f"{escape(self.ylabel)}</text>",
        ]
        for t in _ticks(self.xmin, self.xmax):
            out.append(
                f'<text x="{self.x(t):.1f}" y="{H - PAD_B + 16}" text-anchor="middle" font-size="10">{_fmt(t)}</text>'
            )
        for t in _ticks(self.ymin, self.ymax):
            out.append(
                f'<line x1="{self.x0 + PAD_L}" x2="{self.x0 + W - PAD_R}" y1="{self.y(t):.1f}" y2="{self.y(t):.1f}" '
                'stroke="#ddd"/>'
            )
            out.append(
                f'<text x="{self.x0 + PAD_L - 4}" y="{self.y(t) + 3:.1f}" text-anchor="end" font-size="10">'
                f"{_fmt(t)}</text>"
            )
        return out

    def line(
        self, points: Sequence[tuple[float, float]], colour: str, *, dash: str = "", width: float = 1.2
    ) -> str:
        if not points:
            return ""
        d = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in points)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="{width}"{extra}/>'

    def dots(self, points: Sequence[tuple[float, float]], colour: str, *, hollow: bool = False) -> list[str]:
        fill = "white" if hollow else colour
        return [
            f'<circle cx="{self.x(a):.1f}" cy="{self.y(b):.1f}" r="3.2" fill="{fill}" stroke="{colour}"/>'
            for a, b in points
        ]


# held-out: the decode walk's tau (lilicorr_train.heldout)
WALK = ("val_walk_tau_head", "val_walk_tau_control")


def draw(series: Sequence[tuple[str, list[dict], list[dict]]], title: str = "") -> str:
    """The SVG of (label, training records, held-out records) per log (read_log's)."""
    steps = [r["step"] for _, t, _ in series for r in t] + [
        r["heldout_step"] for _, _, h in series for r in h
    ]
    taus = [1 + r[k] for _, t, _ in series for r in t for k in ("control_accept", "head_accept") if k in r]
    taus += [
        r[k] for _, _, h in series for r in h for k in ("val_tau_control", "val_tau_head") + WALK if k in r
    ]
    losses = [r["dflash"] for _, t, _ in series for r in t if "dflash" in r]
    losses += [r["val_dflash"] for _, _, h in series for r in h if "val_dflash" in r]
    left = Panel(0, "tau (1 + accepted per block)", "tau", steps, taus)
    right = Panel(W, "L_dflash", "loss", steps, losses)
    body = left.frame() + right.frame()
    legend = []
    for n, (label, train, held) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        for key, dash in (("head_accept", ""), ("control_accept", "5,3")):
            pts = [(r["step"], 1 + r[key]) for r in train if key in r]
            body.append(left.line(pts, colour, dash=dash, width=0.8))
        for key, hollow, dash in (("val_tau_head", False, ""), ("val_tau_control", True, "5,3")):
            pts = [(r["heldout_step"], r[key]) for r in held if key in r]
            body.append(left.line(pts, colour, dash=dash, width=2.0))
            body += left.dots(pts, colour, hollow=hollow)
        for key, dash in zip(WALK, ("1,3", "1,3,6,3"), strict=True):  # the decode walk, where the log has it
            pts = [(r["heldout_step"], r[key]) for r in held if key in r]
            body.append(left.line(pts, colour, dash=dash, width=2.0))
        body.append(right.line([(r["step"], r["dflash"]) for r in train if "dflash" in r], colour, width=0.8))
        pts = [(r["heldout_step"], r["val_dflash"]) for r in held if "val_dflash" in r]
        body.append(right.line(pts, colour, width=2.0))
        body += right.dots(pts, colour)
        legend.append((label, colour))
    y = H + 14
    items = [
        f'<text x="{PAD_L}" y="{y}" font-size="11">thin: training batches; thick with dots: held-out set; '
        "solid / filled: LiLiCorr head; dashed / hollow: head-free control; dotted: held-out decode walk "
        "(head; control dot-dash), the tau smoke measures</text>"
    ]
    for n, (label, colour) in enumerate(legend):
        x = PAD_L + n * 220
        items.append(f'<rect x="{x}" y="{y + 10}" width="14" height="4" fill="{colour}"/>')
        items.append(f'<text x="{x + 20}" y="{y + 16}" font-size="11">{escape(label)}</text>')
    total_h = H + 40
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{total_h}" viewBox="0 0 {2 * W} {total_h}" '
        'font-family="sans-serif" font-size="12">'
    )
    heading = f"<title>{escape(title)}</title>" if title else ""
    return (
        "\n".join([head, heading, '<rect width="100%" height="100%" fill="white"/>', *body, *items, "</svg>"])
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1])
    parser.add_argument("logs", nargs="+", help="log.jsonl, or LABEL=log.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="the .svg to write (never one of the logs)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    logs = []
    for spec in args.logs:
        label, sep, path = spec.partition("=")
        if sep and not Path(spec).is_file():  # a log whose own name holds "=" is a log, not LABEL=LOG
            logs.append((label, Path(path)))
        else:
            logs.append((Path(spec).parent.name or spec, Path(spec)))
    return run_script(PROG, lambda: _plot(logs, args.out, args.title), inputs={"LOG": [p for _, p in logs]})


def _plot(logs: Sequence[tuple[str, Path]], out: Path, title: str) -> int:
    inputs = Inputs()
    for _, path in logs:
        inputs.add(path, "a log")
    check_output_path(str(out), "--out", "curve.svg", inputs)  # before the logs are read
    if out.suffix.lower() != ".svg":
        raise UsageError(f"--out {out} is written as SVG: give a file name ending in .svg")
    series = []
    for label, path in logs:
        train, held = read_log(path)
        series.append((label, train, held))
        if not train and not held:
            print(
                f"{PROG}: refused: log {path} holds no training or held-out record (the lines `train` and "
                "`pieces fit` write): nothing to draw; give the run's log.jsonl",
                file=sys.stderr,
            )
            return 1
    write_output(draw(series, title), str(out), inputs=inputs, option="--out")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
