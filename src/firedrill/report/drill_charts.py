"""Inline SVG charts of a game day: time series with SLO/threshold lines and markers, the RTO
waterfall, and multi-panel charts (the hydrate curve on two axes of its own).

The charts are pieces of a self-contained page (see `firedrill.drill.report`): no scripts, no
external fonts or images, every label escaped. They share the palette, duration formats and tick
rules of the alerting comparison (`firedrill.report.charts`). Output is deterministic: numbers
are written with fixed precision, so the same values give the same bytes.

Every ``<svg>`` carries ``data-chart`` (which chart it is) and the drawn parts carry classes
(``series``, ``slo``, ``threshold``, ``marker marker-<kind>``, ``budget``, ``planned``,
``actual``), so a reader, a print stylesheet or a test can find them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from firedrill.report.charts import format_duration, format_tick, nice_ticks

# Series colours: the comparison's palette without its red, which here means SLO and budget.
SERIES_PALETTE = ("#2e86c1", "#e67e22", "#27ae60", "#7f8c8d", "#16a085", "#d4ac0d")
# Dash patterns by series, beside the colour: two regions stay apart where their lines overlap,
# in print and for readers who do not tell the colours apart (the legend draws the same stroke).
SERIES_DASHES = ("", "8 4", "2 3", "10 3 2 3", "4 4", "1 2")
# Colours by meaning.
SLO_COLOUR = "#c0392b"
THRESHOLD_COLOUR = "#8e44ad"
BUDGET_COLOUR = "#c0392b"
PLANNED_COLOUR = "#b8c4cc"
ON_PLAN_COLOUR = "#27ae60"
OVER_PLAN_COLOUR = "#e67e22"
MARKER_COLOURS = {
    "injection": "#c0392b",
    "shift": "#2e86c1",
    "stop": "#8e44ad",
    "abort": "#8e44ad",
    "failback": "#27ae60",
    "revert": "#7f8c8d",
}
_DEFAULT_MARKER_COLOUR = "#555555"
# Steps (seconds) an x axis of simulated time may use: whole, readable minutes and hours.
_TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)
# At most this many points per series are drawn (min/max per bucket keeps the spikes).
MAX_POINTS = 600

Point = tuple[float, float | None]


@dataclass(frozen=True)
class Series:
    """One line: a name for the legend and (t_s, value) points; None or NaN breaks the line."""

    name: str
    points: Sequence[Point]


@dataclass(frozen=True)
class HLine:
    """A horizontal reference line: ``kind`` 'slo' (dashed red) or 'threshold' (dotted)."""

    label: str
    value: float
    kind: str = "threshold"


@dataclass(frozen=True)
class Marker:
    """A vertical marker at ``at_s``: an injection, a traffic-shift step, a stop, a failback."""

    at_s: float
    label: str
    kind: str = "injection"


@dataclass(frozen=True)
class Panel:
    """One plot area of a (possibly multi-panel) time-series chart."""

    series: Sequence[Series]
    y_label: str
    y_fmt: Callable[[float], str]
    hlines: Sequence[HLine] = ()
    y_min: float = 0.0
    y_max: float | None = None  # fixed top (e.g. 1.0 for a usage share); None: from the data


@dataclass(frozen=True)
class WaterfallTerm:
    """One RTO term: the plan and what was measured (seconds); None where unknown."""

    name: str
    planned_s: float | None
    actual_s: float | None


def series_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per series name, in the order given (sort the names for a stable mapping)."""
    return {n: SERIES_PALETTE[i % len(SERIES_PALETTE)] for i, n in enumerate(names)}


def _num(v: float) -> str:
    """A coordinate with fixed precision (deterministic bytes, no '-0.0')."""
    text = f"{v:.1f}"
    return "0.0" if text == "-0.0" else text


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def time_ticks(x_max_s: float, *, most: int = 8, x_min_s: float = 0.0) -> list[float]:
    """Ticks on a readable time step (10s, 5m, 1h, …) from ``x_min_s`` (rounded down to the
    step) up to at least ``x_max_s``."""
    lo = max(x_min_s, 0.0)
    span = max(x_max_s - lo, 1.0)
    step = next((s for s in _TIME_STEPS_S if span / s <= most), None)
    if step is None:
        step = 21600 * math.ceil(span / (21600 * most))
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(max(x_max_s, lo + 1.0) / step - 1e-9)
    return [float(step * i) for i in range(first, max(last, first + 1) + 1)]


# A chart zooms when the events (markers, and where the lines move) fill less than this share of
# the run; the window is padded by this share of its span on each side, at least ``_PAD_MIN_S``.
_ZOOM_BELOW = 0.6
_PAD_SHARE = 0.15
_PAD_MIN_S = 60.0
_SETTLED = 0.05  # a line has settled once it stays within 5% of the panel's range of its end value


def event_window(
    panels: Sequence[Panel], markers: Sequence[Marker], x_top_s: float
) -> tuple[float, float] | None:
    """Where a chart's events are: from the first marker to the last marker or the last time a
    line moved (whichever is later), padded; ``None`` when that is most of the run anyway.

    A marker at the very end of the run (the duration cap, a final revert) does not count as an
    event to zoom on: it is listed in the key and drawn at the right edge.
    """
    inside = [m.at_s for m in markers if math.isfinite(m.at_s) and m.at_s < x_top_s * 0.98]
    if not inside or x_top_s <= 0:
        return None
    start, end = min(inside), max(inside)
    for p in panels:
        values = [v for s in p.series for _, v in s.points if v is not None and math.isfinite(v)]
        if not values:
            continue
        band = (max(values) - min(values)) * _SETTLED
        for s in p.series:
            known = [(t, v) for t, v in s.points if v is not None and math.isfinite(v + t)]
            if not known:
                continue
            last_t, final = known[-1]
            moved = [t for t, v in known if abs(v - final) > band]
            if moved:
                end = max(end, min(max(moved), last_t))
            gaps = [t for t, v in s.points if not _finite(v) and math.isfinite(t) and t > last_t]
            if gaps and known[-1][0] < x_top_s * 0.98:
                end = max(end, last_t)  # a line that stopped (a blackholed region): its end shows
    pad = max(_PAD_MIN_S, (end - start) * _PAD_SHARE)
    lo, hi = max(0.0, start - pad), min(x_top_s, end + pad)
    if hi - lo >= x_top_s * _ZOOM_BELOW:
        return None
    return lo, hi


def decimate(points: Sequence[Point], *, most: int = MAX_POINTS) -> list[Point]:
    """At most ``most`` points: per equal-count bucket, the min and max in time order."""
    if len(points) <= most:
        return list(points)
    per = math.ceil(len(points) / (most // 2))
    out: list[Point] = []
    for start in range(0, len(points), per):
        bucket = points[start : start + per]
        known = [(i, p) for i, p in enumerate(bucket) if _finite(p[1])]
        if not known:
            out.append(bucket[0])  # keeps the gap
            continue
        lo = min(known, key=lambda ip: (ip[1][1], ip[0]))
        hi = max(known, key=lambda ip: (ip[1][1], -ip[0]))
        out.extend(p for _, p in sorted({lo, hi}))
    return out


def _segments(points: Sequence[Point]) -> list[list[tuple[float, float]]]:
    """The runs of consecutive known values (a None/NaN value ends a run)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if v is None or not math.isfinite(v) or not math.isfinite(t):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((t, v))
    return [r for r in runs if r]


def _svg_open(chart: str, title: str, width: int, height: int) -> list[str]:
    e = html.escape
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}" '
        f'data-chart="{e(chart)}">',
        f'<text x="0" y="16" class="title">{e(title)}</text>',
    ]


def time_series_chart(
    chart: str,
    panels: Sequence[Panel],
    *,
    title: str,
    markers: Sequence[Marker] = (),
    x_max_s: float | None = None,
    colours: Mapping[str, str] | None = None,
    width: int = 900,
    panel_h: int = 220,
    zoom: bool = True,
) -> str:
    """One or more stacked panels over a shared simulated-time axis; inline SVG.

    With ``zoom`` the time axis spans where the events are (``event_window``) rather than the
    whole run, and says so under the axis; markers outside the window stay in the key.

    Each panel draws its series (one colour per series name, shared across panels; pass
    ``colours`` to keep a name's colour the same across charts), its
    horizontal lines with labels at the right edge, and every marker as a vertical line. Markers
    are numbered in a band above the first panel (rows chosen so numbers do not overlap) and a
    key under the last panel says when and what each one was.
    """
    e = html.escape
    left, right = 64, 150  # px; right holds the reference-line labels
    legend_y, band_top = 34, 48
    gap = 34
    plot_w = width - left - right
    all_t = [t for p in panels for s in p.series for t, _ in s.points if math.isfinite(t)]
    all_t += [m.at_s for m in markers]
    x_top = x_max_s if x_max_s is not None else max([*all_t, 60.0])
    window = event_window(panels, markers, x_top) if zoom else None
    xt = time_ticks(window[1], x_min_s=window[0]) if window else time_ticks(x_top)
    x_lo, x_hi = xt[0], xt[-1]

    def x(t: float) -> float:
        return left + (min(max(t, x_lo), x_hi) - x_lo) / (x_hi - x_lo) * plot_w

    def shown(t: float) -> bool:
        return x_lo - 1e-9 <= t <= x_hi + 1e-9

    tag_rows = _tag_rows(
        [x(m.at_s) if shown(m.at_s) else -1e6 - i * 100 for i, m in enumerate(markers)],
        [len(str(i + 1)) for i in range(len(markers))],
    )
    rows = max(tag_rows, default=-1) + 1
    plot_top0 = band_top + rows * 13 + 22  # px; room for the first panel's axis label
    key_cols = 2 if all(len(m.label) <= 40 for m in markers) else 1
    key_lines = math.ceil(len(markers) / key_cols)
    key_top = plot_top0 + len(panels) * (panel_h + gap) + (14 if window else 0)
    height = key_top + key_lines * 14 + 6

    names: list[str] = []
    for p in panels:
        for s in p.series:
            if s.name not in names:
                names.append(s.name)
    colour = series_colours(names)
    colour.update({n: c for n, c in (colours or {}).items() if n in colour})

    dashes = {n: SERIES_DASHES[i % len(SERIES_DASHES)] for i, n in enumerate(names)}

    def series_stroke(n: str) -> str:
        pattern = f' stroke-dasharray="{dashes[n]}"' if dashes[n] else ""
        return f'stroke="{colour[n]}" stroke-width="2"{pattern}'

    out = _svg_open(chart, title, width, height)
    lx = left
    for n in names:  # legend: the line as drawn (colour and dash), then the name
        out.append(
            f'<line x1="{lx}" y1="{legend_y - 4}" x2="{lx + 28}" y2="{legend_y - 4}" '
            f'{series_stroke(n)} class="legend-line" data-series="{e(n)}"/>'
            f'<text x="{lx + 34}" y="{legend_y}">{e(n)}</text>'
        )
        lx += max(150, 34 + 7 * len(n) + 24)  # px: about 7 px a character at 11 px
    for pi, p in enumerate(panels):
        top = plot_top0 + pi * (panel_h + gap)
        bottom = top + panel_h
        values = [v for s in p.series for _, v in s.points if v is not None and math.isfinite(v)]
        values += [h.value for h in p.hlines]
        y_top = p.y_max if p.y_max is not None else max([*values, p.y_min]) * 1.08
        if y_top <= p.y_min:  # flat at the bottom (nothing pulled): a unit axis, not 1e-9
            y_top = p.y_min + 1.0
        yt = [p.y_min + t for t in nice_ticks(y_top - p.y_min, most=5)]
        y_lo, y_hi = yt[0], yt[-1]

        def y(v: float, top: int = top, y_lo: float = y_lo, y_hi: float = y_hi) -> float:
            v = min(max(v, y_lo), y_hi)
            return top + panel_h - (v - y_lo) / (y_hi - y_lo) * panel_h

        out.append(f'<g class="panel" data-panel="{pi}">')
        out.append(f'<text x="{left}" y="{top - 6}" class="axis-label">{e(p.y_label)}</text>')
        for t in yt:
            ty = y(t)
            out.append(
                f'<line x1="{left}" y1="{_num(ty)}" x2="{left + plot_w}" y2="{_num(ty)}" '
                f'class="grid"/><text x="{left - 6}" y="{_num(ty + 4)}" '
                f'text-anchor="end">{e(p.y_fmt(t))}</text>'
            )
        for t in xt:
            tx = x(t)
            out.append(
                f'<line x1="{_num(tx)}" y1="{top}" x2="{_num(tx)}" y2="{bottom}" class="grid"/>'
                f'<text x="{_num(tx)}" y="{bottom + 14}" text-anchor="middle">'
                f"{e(format_tick(t))}</text>"
            )
        out.append(
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{panel_h}" class="frame"/>'
        )
        for s in p.series:
            in_window = [(t, v) for t, v in s.points if shown(t)] if window else s.points
            for run in _segments(decimate(in_window)):
                pts = " ".join(f"{_num(x(t))},{_num(y(v))}" for t, v in run)
                if len(run) == 1:
                    cx, cy = x(run[0][0]), y(run[0][1])
                    out.append(
                        f'<circle cx="{_num(cx)}" cy="{_num(cy)}" r="2" fill="{colour[s.name]}" '
                        f'class="series" data-series="{e(s.name)}"/>'
                    )
                    continue
                out.append(
                    f'<polyline points="{pts}" fill="none" {series_stroke(s.name)} '
                    f'class="series" data-series="{e(s.name)}"/>'
                )
        for h in p.hlines:
            hy = _num(y(h.value))
            stroke = SLO_COLOUR if h.kind == "slo" else THRESHOLD_COLOUR
            dash = "6 3" if h.kind == "slo" else "2 3"
            cls = "slo" if h.kind == "slo" else "threshold"
            out.append(
                f'<line x1="{left}" y1="{hy}" x2="{left + plot_w}" y2="{hy}" stroke="{stroke}" '
                f'stroke-width="1.4" stroke-dasharray="{dash}" class="{cls}" '
                f'data-value="{h.value:g}"><title>{e(h.label)}</title></line>'
                f'<text x="{left + plot_w + 4}" y="{_num(y(h.value) + 4)}" fill="{stroke}" '
                f'class="{cls}-label">{e(h.label)}</text>'
            )
        for mi, m in enumerate(markers):
            if not shown(m.at_s):
                continue
            mx = _num(x(m.at_s))
            mc = MARKER_COLOURS.get(m.kind, _DEFAULT_MARKER_COLOUR)
            label_y = band_top + tag_rows[mi] * 13 + 9
            y1 = label_y + 3 if pi == 0 else top
            out.append(
                f'<line x1="{mx}" y1="{y1}" x2="{mx}" y2="{bottom}" stroke="{mc}" '
                f'stroke-width="1" stroke-dasharray="3 2" class="marker marker-{e(m.kind)}" '
                f'data-at-s="{m.at_s:g}"><title>{e(format_duration(m.at_s))} '
                f"{e(m.label)}</title></line>"
            )
            if pi == 0:
                out.append(
                    f'<text x="{mx}" y="{label_y}" text-anchor="middle" fill="{mc}" '
                    f'class="marker-tag">{mi + 1}</text>'
                )
        out.append("</g>")
    if window:
        note_y = plot_top0 + len(panels) * (panel_h + gap) - gap + 30
        out.append(
            f'<text x="{left}" y="{note_y}" class="zoom-note" data-from-s="{x_lo:g}" '
            f'data-to-s="{x_hi:g}">time axis zoomed to T+{e(format_duration(x_lo))} – '
            f"T+{e(format_duration(x_hi))}, where the events are (the run lasted "
            f"{e(format_duration(x_top))})</text>"
        )
    col_w = (width - left) // key_cols
    for mi, m in enumerate(markers):  # the key: number, time, what happened
        kx = left + (mi // key_lines) * col_w
        ky = key_top + (mi % key_lines) * 14 + 10
        mc = MARKER_COLOURS.get(m.kind, _DEFAULT_MARKER_COLOUR)
        out.append(
            f'<text x="{kx}" y="{ky}" class="marker-label" data-marker="{mi + 1}">'
            f'<tspan fill="{mc}" font-weight="600">{mi + 1}</tspan> '
            f"T+{e(format_duration(m.at_s))} {e(m.label)}"
            f"{'' if shown(m.at_s) else ' (outside the zoomed axis)'}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _tag_rows(xs: Sequence[float], chars: Sequence[int], *, most: int = 4) -> list[int]:
    """A row for each marker tag so that tags in a row do not overlap (greedy, left to right)."""
    ends: list[float] = []
    rows = [0] * len(xs)
    for i in sorted(range(len(xs)), key=lambda i: (xs[i], i)):
        half = 3.5 * chars[i] + 3  # px: half the tag's width plus a gap
        row = next((r for r, end in enumerate(ends) if xs[i] - half >= end), None)
        if row is None:
            if len(ends) < most:
                ends.append(-math.inf)
                row = len(ends) - 1
            else:
                row = min(range(len(ends)), key=lambda r: (ends[r], r))
        ends[row] = xs[i] + half
        rows[i] = row
    return rows


def waterfall_chart(
    terms: Sequence[WaterfallTerm],
    *,
    budget_s: float | None,
    title: str,
    total_s: float | None = None,
    width: int = 900,
) -> str:
    """The RTO waterfall: each term a bar starting where the previous one ended, plan and actual
    side by side (plan in grey, actual green within plan and orange over it), the budget as a
    vertical line, and a total row (``total_s``: the measured RTO when given, else the sum).
    """
    e = html.escape
    label_w, right_pad, bar_h, gap, top = 120, 190, 12, 10, 46  # px
    plot_w = width - label_w - right_pad
    planned_sum = sum(t.planned_s or 0.0 for t in terms)
    actual_sum = sum(t.actual_s or 0.0 for t in terms)
    total_actual = total_s if total_s is not None else actual_sum
    rows = [*terms, WaterfallTerm("total", planned_sum, total_actual)]
    top_s = max(planned_sum, actual_sum, total_actual, budget_s or 0.0, 60.0)
    xt = time_ticks(top_s, most=8)
    x_hi = xt[-1]

    def x(v: float) -> float:
        return label_w + min(max(v, 0.0), x_hi) / x_hi * plot_w

    group_h = 2 * bar_h + gap
    height = top + len(rows) * group_h + 34
    axis_y = top + len(rows) * group_h
    out = _svg_open("rto_waterfall", title, width, height)
    legend = (
        ("planned", PLANNED_COLOUR),
        ("actual within plan", ON_PLAN_COLOUR),
        ("actual over plan", OVER_PLAN_COLOUR),
    )
    for i, (name, fill) in enumerate(legend):
        lx = label_w + i * 160
        out.append(
            f'<rect x="{lx}" y="26" width="10" height="10" fill="{fill}"/>'
            f'<text x="{lx + 14}" y="35">{e(name)}</text>'
        )
    for t in xt:
        tx = _num(x(t))
        out.append(
            f'<line x1="{tx}" y1="{top - 4}" x2="{tx}" y2="{axis_y}" class="grid"/>'
            f'<text x="{tx}" y="{axis_y + 14}" text-anchor="middle">{e(format_tick(t))}</text>'
        )
    start_plan = start_actual = 0.0
    for ri, term in enumerate(rows):
        is_total = ri == len(rows) - 1
        gy = top + ri * group_h
        if is_total:
            start_plan = start_actual = 0.0
            out.append(
                f'<line x1="0" y1="{gy - gap / 2:.1f}" x2="{width - right_pad}" '
                f'y2="{gy - gap / 2:.1f}" class="grid"/>'
            )
        out.append(
            f'<text x="{label_w - 8}" y="{gy + bar_h + 4}" text-anchor="end" '
            f'class="{"total" if is_total else "term"}">{e(term.name)}</text>'
        )
        over = (
            term.actual_s is not None
            and term.planned_s is not None
            and term.actual_s > term.planned_s
        )
        bars = (
            ("planned", term.planned_s, start_plan, PLANNED_COLOUR, gy),
            (
                "actual",
                term.actual_s,
                start_actual,
                OVER_PLAN_COLOUR if over else ON_PLAN_COLOUR,
                gy + bar_h,
            ),
        )
        for cls, value, start, fill, by in bars:
            if value is None:
                out.append(
                    f'<text x="{_num(x(start) + 4)}" y="{by + bar_h - 2}" class="missing">'
                    f"{cls}: not measured</text>"
                )
                continue
            bx, bw = x(start), max(x(start + value) - x(start), 1.0)
            out.append(
                f'<rect x="{_num(bx)}" y="{by}" width="{_num(bw)}" height="{bar_h - 2}" '
                f'fill="{fill}" class="{cls}" data-term="{e(term.name)}" '
                f'data-s="{value:g}"><title>{e(term.name)} {cls}: '
                f"{e(format_duration(value))}</title></rect>"
                f'<text x="{_num(bx + bw + 4)}" y="{by + bar_h - 2}" class="value">'
                f"{cls} {e(format_duration(value))}</text>"
            )
        start_plan += term.planned_s or 0.0
        start_actual += term.actual_s or 0.0
    if budget_s is not None:
        budget_x = _num(x(budget_s))
        out.append(
            f'<line x1="{budget_x}" y1="{top - 8}" x2="{budget_x}" y2="{axis_y}" '
            f'stroke="{BUDGET_COLOUR}" '
            f'stroke-width="1.6" stroke-dasharray="6 3" class="budget" '
            f'data-s="{budget_s:g}"/><text x="{_num(x(budget_s) + 4)}" y="{axis_y + 28}" '
            f'fill="{BUDGET_COLOUR}" class="budget-label">budget '
            f"{e(format_duration(budget_s))}</text>"
        )
    out.append("</svg>")
    return "".join(out)
