"""Pictures of a smoke profile: acceptance by draft position for the head and the control, overall and per
category, and the gates, as plain SVG (no plotting library); `smoke --html` wraps it in a page, and `card
--profile` writes it beside the card.

Each bar is a `<rect class="bar">` carrying what it shows (data-scope, data-arm, data-position, data-value, and a
<title> with the counts), so a reader (or a test) can check the picture against the profile's numbers. The rate
drawn is the marginal one: draft position i accepted together with every earlier one (accepted / drafted), whose
sum plus one is τ. Imported only by the commands that draw (stdlib only): validate never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lilicorr_ckpt.smoke.profile import ArmStats, Gate, SmokeReport

CHART_FILE = "acceptance.svg"  # card's name for it, beside the card
WIDTH = 760
PLOT_HEIGHT = 110  # px for a rate of 1.0
PANEL_HEIGHT = PLOT_HEIGHT + 54
LEFT = 52
RIGHT = 16
ARM_COLORS = {"head": "#2563eb", "control": "#9ca3af"}
ARM_LABELS = {"head": "LiLiCorr head", "control": "DFlash control (head off)"}
GATE_COLORS = {"pass": "#16a34a", "fail": "#dc2626", "skip": "#9ca3af", "inconclusive": "#d97706"}
# what one picture draws: the panels of the first MAX_CATEGORIES categories and the first MAX_POSITIONS draft
# positions (a bar is under 10 px wide there already); the rest is named in a note, not drawn, so a profile of
# 18,000 categories or 100,000 positions is a picture of a few hundred kB, not of hundreds of MB
MAX_CATEGORIES = 24
MAX_POSITIONS = 64


def escape(text: str, quote: bool = True) -> str:
    """Text for XML/HTML, element content or a quoted attribute (html.escape's rule, without importing it)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;").replace("'", "&#x27;") if quote else text


def _a(value: object) -> str:
    """An attribute value, escaped (quotes included)."""
    return escape(str(value))


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _gate_state(gate: Gate) -> str:
    return "inconclusive" if gate.status == "fail" and gate.inconclusive else gate.status


def _tau(stats: ArmStats | None) -> str:
    return "–" if stats is None else f"{stats.mean_accept_length:.3f}"


def _arms(profile: SmokeReport) -> list[str]:
    return [a for a in ("head", "control") if a in profile.arms]


def _panel(
    y0: float, scope: str, title: str, arms: dict[str, ArmStats], shown: list[str], width: int
) -> list[str]:
    """One panel: grouped bars per draft position, an axis from 0 to 1, the title with τ per arm."""
    out = [f'<g class="panel" data-scope="{_a(scope)}">']
    taus = ", ".join(f"τ {a} {_tau(arms.get(a))}" for a in shown)
    out.append(
        f'<text x="{LEFT}" y="{y0 + 14}" class="title">{escape(title)}'
        f'<tspan class="note"> — {escape(taus)}</tspan></text>'
    )
    top = y0 + 24
    base = top + PLOT_HEIGHT
    right = WIDTH - RIGHT
    for tick in (0.0, 0.5, 1.0):
        y = base - tick * PLOT_HEIGHT
        out.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.2f}" y2="{y:.2f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.2f}" class="tick" text-anchor="end">{_num(tick)}</text>')
    slots = max(width, 1)
    group = (right - LEFT) / slots
    bar = min(28.0, group * 0.8 / max(len(shown), 1))
    for i in range(width):
        gx = LEFT + i * group + (group - bar * len(shown)) / 2
        for j, arm in enumerate(shown):
            stats = arms.get(arm)
            if stats is None:
                continue
            rates = stats.marginal_accept_rates
            value = float(rates[i]) if i < len(rates) else 0.0
            h = round(max(0.0, min(1.0, value)) * PLOT_HEIGHT, 2)  # y + height is the baseline exactly
            counts = ""
            if i < len(stats.position_counts):
                c = stats.position_counts[i]
                counts = f" ({c.accepted}/{c.drafted} blocks)"
            out.append(
                f'<rect class="bar" data-scope="{_a(scope)}" data-arm="{arm}" data-position="{i + 1}" '
                f'data-value="{value:.6g}" x="{gx + j * bar:.2f}" y="{base - h:.2f}" width="{bar:.2f}" '
                f'height="{h:.2f}" fill="{ARM_COLORS[arm]}">'
                f"<title>{escape(f'{scope}, {arm}, position {i + 1}: {value:.3f}{counts}')}</title></rect>"
            )
        out.append(
            f'<text x="{LEFT + i * group + group / 2:.2f}" y="{base + 14}" class="tick" '
            f'text-anchor="middle">{i + 1}</text>'
        )
    out.append("</g>")
    return out


def acceptance_svg(profile: SmokeReport) -> str:
    """The chart of one profile: a legend, one panel for all prompts and one per category, then the gates."""
    shown = _arms(profile)
    positions = max((len(profile.arms[a].marginal_accept_rates) for a in shown), default=0)
    width = min(positions, MAX_POSITIONS)
    scopes: list[tuple[str, str, dict[str, ArmStats]]] = [
        ("all", f"all prompts ({len(profile.requests)})", dict(profile.arms))
    ]
    for name, entry in list(profile.per_category.items())[:MAX_CATEGORIES]:
        scopes.append((name, f"{name} ({entry.requests})", dict(entry.arms)))
    left_out = []
    if positions > width:
        left_out.append(f"draft positions {width + 1}-{positions}")
    if len(profile.per_category) > MAX_CATEGORIES:
        left_out.append(f"{len(profile.per_category) - MAX_CATEGORIES} more categories")
    gates_y = 62 + PANEL_HEIGHT * len(scopes) + (16 if left_out else 0)
    height = gates_y + 44
    cond = profile.measurement_conditions
    heading = (
        f"{profile.draft_checkpoint.id} on {profile.target_model.id}: {cond.device}, {cond.dtype}, "
        f"lilicorr-ckpt smoke {profile.version}"
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="sans-serif" font-size="12">',
        f"<title>{escape('Acceptance by draft position: ' + heading)}</title>",
        "<style>.title{font-weight:bold}.note{font-weight:normal;fill:#374151}.tick{fill:#4b5563;"
        "font-size:10px}.grid{stroke:#e5e7eb;stroke-width:1}.gate{fill:#fff;font-size:11px}</style>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
        f'<text x="{LEFT}" y="16" class="title">{escape(heading)}</text>',
        f'<text x="{LEFT}" y="32" class="note">marginal acceptance by draft position (x): the position '
        "accepted together with every earlier one</text>",
    ]
    for k, arm in enumerate(shown):
        kx = LEFT + 190 * k
        out.append(f'<rect x="{kx}" y="39" width="12" height="12" fill="{ARM_COLORS[arm]}"/>')
        out.append(f'<text x="{kx + 16}" y="49" class="note">{escape(ARM_LABELS[arm])}</text>')
    for n, (scope, title, arms) in enumerate(scopes):
        out += _panel(58 + PANEL_HEIGHT * n, scope, title, arms, shown, width)
    if left_out:
        out.append(
            f'<text x="{LEFT}" y="{58 + PANEL_HEIGHT * len(scopes) + 4}" class="note left-out">not drawn: '
            f"{escape(', '.join(left_out))} (the profile holds them)</text>"
        )
    out.append(f'<g class="gates"><text x="{LEFT}" y="{gates_y + 8}" class="title">gates</text>')
    x = LEFT + 44.0
    for gate in profile.gates:
        state = _gate_state(gate)
        label = f"{state.upper()} {gate.name}"
        w = 12 + 6.6 * len(label)
        out.append(
            f'<g class="gate-box" data-gate="{_a(gate.name)}" data-status="{state}">'
            f'<rect x="{x:.1f}" y="{gates_y - 6}" width="{w:.1f}" height="20" rx="4" '
            f'fill="{GATE_COLORS[state]}"><title>{escape(gate.summary)}</title></rect>'
            f'<text x="{x + 6:.1f}" y="{gates_y + 8}" class="gate">{escape(label)}</text></g>'
        )
        x += w + 8
    out += ["</g>", "</svg>"]
    return "\n".join(out) + "\n"


def smoke_html(profile: SmokeReport) -> str:
    """A page for one smoke run: the verdict, the chart, each gate's one line, and τ per category and arm."""
    verdict = "PASS" if profile.passed else "FAIL"
    cond = profile.measurement_conditions
    title = f"lilicorr-ckpt smoke {profile.draft_checkpoint.id}: {verdict}"
    rows = []
    for gate in profile.gates:
        state = _gate_state(gate)
        rows.append(
            f'<tr data-gate="{_a(gate.name)}"><td style="color:{GATE_COLORS[state]}"><b>{state.upper()}</b></td>'
            f"<td>{escape(gate.name)}</td><td>{escape(gate.summary)}</td></tr>"
        )
    shown = _arms(profile)
    taus = [
        "<tr><th>prompts</th><th>requests</th>" + "".join(f"<th>τ {escape(a)}</th>" for a in shown) + "</tr>"
    ]
    scopes = [("all", len(profile.requests), profile.arms)]
    scopes += [(name, e.requests, e.arms) for name, e in profile.per_category.items()]
    for name, requests, arms in scopes:
        taus.append(
            f"<tr><td>{escape(name)}</td><td>{requests}</td>"
            + "".join(f"<td>{_tau(arms.get(a))}</td>" for a in shown)
            + "</tr>"
        )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        "<style>body{font-family:sans-serif;max-width:800px;margin:1em auto}td,th{padding:2px 8px;"
        "text-align:left}</style></head><body>\n"
        f"<h1>{escape(title)}</h1>\n"
        f"<p>Target {escape(profile.target_model.id)} on {escape(cond.device)} ({escape(cond.dtype)}), "
        f"{len(profile.requests)} prompts, up to {cond.max_new_tokens} new tokens"
        f"{', ' + escape(cond.measured_at) if cond.measured_at else ''}.</p>\n"
        + acceptance_svg(profile)
        + "<h2>Gates</h2>\n<table>"
        + "".join(rows)
        + "</table>\n<h2>τ (tokens committed per verification)</h2>\n<table>"
        + "".join(taus)
        + "</table>\n</body></html>\n"
    )
