#!/usr/bin/env python3
"""Draw a training curve (SVG, no plotting library) from the log.jsonl files that `python -m lilicorr_train train`
and `python -m lilicorr_train.pieces fit` write.

    python scripts/plot_training.py RUN/log.jsonl [LABEL=OTHER/log.jsonl ...] --out docs/curve.svg

Left: tau on the training batches (1 + accepted tokens per block, the metrics averaged between log lines,
thin) and on the held-out set (the `heldout_step` lines, dots), head (solid) and control (dashed), per log.
Right: L_dflash on the training batches and on the held-out set. The x axis is the step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 460, 320  # one panel
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 30, 44


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records) of a log: lines with `step` and lines with `heldout_step`."""
    train, held = [], []
    for line in path.read_text("utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("step"), int) and "control_accept" in record:
            train.append(record)
        elif isinstance(record.get("heldout_step"), int) and "val_tau_control" in record:
            held.append(record)
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


def draw(logs: Sequence[tuple[str, Path]], title: str = "") -> str:
    series = [(label, *read_log(path)) for label, path in logs]
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
            pts = [(r["heldout_step"], r[key]) for r in held]
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="log.jsonl, or LABEL=log.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="the .svg to write")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    logs = []
    for spec in args.logs:
        label, sep, path = spec.partition("=")
        logs.append((label, Path(path)) if sep else (Path(spec).parent.name or spec, Path(spec)))
    missing = [str(p) for _, p in logs if not p.is_file()]
    if missing:
        print(f"plot_training: no such log: {', '.join(missing)}", file=sys.stderr)
        return 2
    svg = draw(logs, args.title)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg, "utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
