"""Charts and tables of the alerting-strategy comparison: a Rich table and a self-contained page.

The page carries its own CSS and inline SVG (no scripts, no external files), so it can be mailed,
attached to a ticket or opened offline. Rendering is pure: each function returns a value and the
caller decides where it goes.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

from rich.markup import escape
from rich.table import Table

from firedrill.detect.compare import (
    CLASS_TITLES,
    INCIDENT_CLASSES,
    SIGNIFICANT_BUDGET_FRACTION,
    CompareResult,
    IncidentClass,
    StrategyScore,
)

# One colour per incident class / measure, readable on white and distinguishable in grey.
PALETTE = ("#c0392b", "#e67e22", "#2e86c1", "#7f8c8d", "#27ae60", "#8e44ad")
# The classes an alert should catch (blips should not alert).
_DETECTED: tuple[IncidentClass, ...] = ("total_outage", "partial", "slow_burn")


def format_duration(seconds: float | None) -> str:
    """'15s', '5m 52s', '35h 57m', '2d 10h'; '—' for never."""
    if seconds is None:
        return "—"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 2 * 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def format_tick(seconds: float) -> str:
    """An axis label: '10s', '10m', '6h', '4d'."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def nice_ticks(top: float, *, most: int = 5) -> list[float]:
    """Ticks from 0 in a 1-2-2.5-5 step, up to the first one at or above ``top``."""
    exp = math.floor(math.log10(top / most)) if top > 0 else 0
    step = next(
        m * 10.0**e
        for e in (exp, exp + 1)
        for m in (1.0, 2.0, 2.5, 5.0)
        if top / (m * 10.0**e) <= most
    )
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def format_share(x: float | None) -> str:
    """A share as a percentage; '—' when there is none."""
    if x is None:
        return "—"
    return f"{x * 100:.1f}%" if x >= 0.001 else f"{x * 100:.2f}%"


def _detected_cell(s: StrategyScore, kind: IncidentClass) -> str:
    got, n = s.detected(kind)
    if n == 0:
        return "n/a"
    text = format_duration(s.detection_time_s[kind])
    return text if got == n else f"{text} ({got}/{n})"


def _budget_cell(s: StrategyScore) -> str:
    b = s.budget_consumed_before_firing
    return " / ".join(format_share(b[k]) for k in INCIDENT_CLASSES if k in _DETECTED)


def render_table(result: CompareResult) -> Table:
    """One row per strategy with the measures the workbook compares them by."""
    table = Table(
        title=escape(  # names from the spec are text, never Rich markup
            f"Alerting strategies on {result.objective.name} "
            f"({result.objective.target:.3%} over {format_duration(result.period_s)}), "
            f"cell {result.cell}, seed {result.seed}"
        ),
        caption=(
            "Detection: mean time to the first alert (detected/all when some were missed). "
            "Reset: mean time from the end of a significant incident until every alert resolved. "
            f"Budget: share of the budget spent before the first alert. Significant: "
            f"≥ {SIGNIFICANT_BUDGET_FRACTION:.0%} of the budget."
        ),
    )
    table.add_column("#", justify="right")
    table.add_column("Strategy")
    for kind in _DETECTED:
        table.add_column(f"Detect {CLASS_TITLES[kind]}", justify="right")
    table.add_column("Blips alerted", justify="right")
    table.add_column("Reset", justify="right")
    table.add_column("Budget before alert\n(total / partial / slow)", justify="right")
    table.add_column("Precision", justify="right")
    table.add_column("Recall", justify="right")
    for s in result.strategies:
        got, n = s.detected("blip")
        table.add_row(
            str(s.strategy.number),
            escape(s.strategy.title),
            *(_detected_cell(s, k) for k in _DETECTED),
            f"{got}/{n}",
            format_duration(s.mean_reset_time_s),
            _budget_cell(s),
            "—" if s.precision is None else f"{s.precision:.2f}",
            "—" if s.recall is None else f"{s.recall:.2f}",
        )
    return table


# ----------------------------------------------------------------------------------------------
# SVG


def bar_chart(
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    title: str,
    ticks: Sequence[float],
    fmt: Callable[[float], str],
    tick_fmt: Callable[[float], str] | None = None,
    log: bool = False,
    missing: str = "never",
    width: int = 900,
    marks: Sequence[tuple[str, float]] = (),
) -> str:
    """Horizontal grouped bars: one group per category, one bar per series; inline SVG.

    The axis runs from the first to the last tick (log10 when ``log``); values outside are
    clipped to it and ``None`` is written as ``missing``. ``marks`` are labelled vertical
    reference lines (a budget, a target) drawn over the bars.
    """
    label_w, right_pad, bar_h, gap, top = 290, 70, 11, 10, 46  # px; right_pad holds values
    plot_w = width - label_w - right_pad
    lo, hi = ticks[0], ticks[-1]

    def x(v: float) -> float:
        v = min(max(v, lo), hi)
        if log:
            frac = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            frac = (v - lo) / (hi - lo)
        return label_w + frac * plot_w

    group_h = len(series) * bar_h + gap
    height = top + len(categories) * group_h + 30
    e = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
        f'<text x="0" y="16" class="title">{e(title)}</text>',
    ]
    for i, (name, _) in enumerate(series):  # legend
        lx = label_w + i * 150
        out.append(
            f'<rect x="{lx}" y="26" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{lx + 14}" y="35">{e(name)}</text>'
        )
    axis_y = top + len(categories) * group_h
    label = tick_fmt or fmt
    for t in ticks:
        tx = x(t)
        out.append(
            f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{axis_y}" class="grid"/>'
            f'<text x="{tx:.1f}" y="{axis_y + 14}" text-anchor="middle">{e(label(t))}</text>'
        )
    for ci, cat in enumerate(categories):
        gy = top + ci * group_h
        mid = gy + len(series) * bar_h / 2 + 4
        out.append(f'<text x="{label_w - 8}" y="{mid:.1f}" text-anchor="end">{e(cat)}</text>')
        for si, (name, values) in enumerate(series):
            v = values[ci]
            by = gy + si * bar_h
            if v is None:
                out.append(
                    f'<text x="{label_w + 4}" y="{by + bar_h - 2}" class="missing">'
                    f"{e(name)}: {e(missing)}</text>"
                )
                continue
            bw = max(x(v) - label_w, 1.0)
            colour = PALETTE[si % len(PALETTE)]
            out.append(
                f'<rect x="{label_w}" y="{by}" width="{bw:.1f}" height="{bar_h - 2}" '
                f'fill="{colour}"><title>{e(name)}: {e(fmt(v))}</title></rect>'
                f'<text x="{label_w + bw + 4:.1f}" y="{by + bar_h - 2}" class="value">'
                f"{e(fmt(v))}</text>"
            )
    for name, v in marks:
        mx = x(v)
        out.append(
            f'<line x1="{mx:.1f}" y1="{top - 8}" x2="{mx:.1f}" y2="{axis_y}" stroke="#c0392b" '
            f'stroke-width="1.5" stroke-dasharray="6 3" class="mark"/>'
            f'<text x="{mx + 4:.1f}" y="{axis_y + 26}" class="mark-label">'
            f"{e(name)} {e(fmt(v))}</text>"
        )
    out.append("</svg>")
    return "".join(out)


_TIME_TICKS = (10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 36 * 3600.0, 4 * 86400.0)

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 980px; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:nth-child(2), td:nth-child(2) { text-align: left; }
.muted { color: #666; } svg { display: block; margin: 1rem 0; }
svg text { font: 11px system-ui, sans-serif; fill: #222; }
svg .title { font-size: 13px; font-weight: 600; } svg .grid { stroke: #ddd; }
svg .missing { fill: #999; font-style: italic; } svg .value { fill: #444; }
"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(result: CompareResult) -> str:
    """The comparison as one self-contained HTML page (tables and inline SVG charts)."""
    e = html.escape
    names = [f"{s.strategy.number}. {s.strategy.title}" for s in result.strategies]
    o = result.objective
    strategies_rows = [
        [
            str(s.strategy.number),
            escape(s.strategy.title),
            *(_detected_cell(s, k) for k in _DETECTED),
            "{}/{}".format(*s.detected("blip")),
            format_duration(s.mean_reset_time_s),
            _budget_cell(s),
            "—" if s.precision is None else f"{s.precision:.2f}",
            "—" if s.recall is None else f"{s.recall:.2f}",
        ]
        for s in result.strategies
    ]
    incidents_rows = [
        [
            r.incident.id,
            CLASS_TITLES[r.incident.kind],
            format_duration(r.incident.start_s),
            format_duration(r.incident.duration_s),
            f"{r.incident.fraction:.2%}",
            format_share(r.budget_consumed),
            "yes" if r.significant else "no",
        ]
        for r in result.incidents
    ]
    rules_rows = [
        [
            str(s.strategy.number),
            escape(s.strategy.title),
            "; ".join(
                f"{r.severity}: {r.name}" + (f" for {r.for_}" if r.for_s else "")
                for r in s.strategy.rules
            ),
        ]
        for s in result.strategies
    ]
    detection = bar_chart(
        names,
        [
            (CLASS_TITLES[k], [s.detection_time_s[k] for s in result.strategies])
            for k in INCIDENT_CLASSES
            if any(r.incident.kind == k for r in result.incidents)
        ],
        title="Detection time per incident class (log scale; blips should not alert)",
        ticks=_TIME_TICKS,
        fmt=format_duration,
        tick_fmt=format_tick,
        log=True,
        missing="no alert",
    )
    reset = bar_chart(
        names,
        [("mean reset time", [s.mean_reset_time_s for s in result.strategies])],
        title="Reset time: incident end to every alert resolved (log scale)",
        ticks=_TIME_TICKS,
        fmt=format_duration,
        tick_fmt=format_tick,
        log=True,
        missing="no alert",
    )
    quality = bar_chart(
        names,
        [
            ("precision", [s.precision for s in result.strategies]),
            ("recall", [s.recall for s in result.strategies]),
        ],
        title="Precision and recall",
        ticks=(0.0, 0.25, 0.5, 0.75, 1.0),
        fmt=lambda v: f"{v:.2f}",
        missing="no alert",
    )
    spent = [
        (
            CLASS_TITLES[k],
            [s.budget_consumed_before_firing[k] for s in result.strategies],
        )
        for k in _DETECTED
        if any(r.incident.kind == k for r in result.incidents)
    ]
    top = max([v for _, vs in spent for v in vs if v is not None] + [0.05])
    budget = bar_chart(
        names,
        spent,
        title="Error budget consumed before the first alert",
        ticks=nice_ticks(top),
        fmt=format_share,
        tick_fmt=lambda v: f"{v:.0%}",
        missing="no alert",
    )
    header = [
        "#",
        "Strategy",
        *(f"Detect {CLASS_TITLES[k]}" for k in _DETECTED),
        "Blips alerted",
        "Reset",
        "Budget before alert (total / partial / slow)",
        "Precision",
        "Recall",
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Alerting strategies — {e(o.name)} — seed {result.seed}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>Alerting on SLOs: six strategies on {e(o.name)}</h1>",
            f'<p class="muted">Objective {e(o.name)} ({e(o.product)} on {e(result.model)}): '
            f"{o.target:.3%} of requests succeed over {format_duration(result.period_s)}. "
            f"Cell {e(result.cell)}, seed {result.seed}, "
            f"{result.simulated_s / 3600:.1f} simulated hours at "
            f"{result.mean_rps:.0f} requests/s (budget {result.budget_errors:,.0f} errors). "
            f"An incident is significant when it consumes at least "
            f"{SIGNIFICANT_BUDGET_FRACTION:.0%} of the budget. "
            f"SLO spec {e(result.slo_digest)}.</p>",
            "<h2>Strategies</h2>",
            _html_table(header, strategies_rows),
            detection,
            reset,
            quality,
            budget,
            "<h2>Alert rules</h2>",
            _html_table(["#", "Strategy", "Rules"], rules_rows),
            "<h2>Incidents</h2>",
            _html_table(
                ["id", "class", "start", "duration", "failing", "budget", "significant"],
                incidents_rows,
            ),
            "</body></html>",
            "",
        ]
    )
