"""Game-day reports: the run result as Markdown and as one self-contained HTML page with charts.

A drill closes with "actual vs hypothesised numbers for every RTO term, and owners for every
gap" (reference 001): these renderers turn the run result (the JSON contract produced by
`firedrill.drill.run`) into the two documents people read. Both are pure and deterministic —
the same result gives the same bytes — and tolerate missing keys: a section without data says
so, a chart without data is left out with a note, nothing raises on a partial result.

The HTML page carries its own CSS and inline SVG: no scripts, no fonts, images or styles from
anywhere else, so it opens offline, can be attached to a ticket and prints cleanly.

Chart data is read from the result's ``charts`` key::

    "charts": {
      "ttft_p99":       {"us-west-2": [[t_s, seconds], ...], ...},   # per region
      "kv_usage":       {"us-west-2": [[t_s, share 0..1], ...]},
      "hydrate_gbps":   {"us-east-1": [[t_s, GB/s per node], ...]},
      "ready_replicas": {"us-east-1": [[t_s, count], ...]},
      "markers": [{"at_s": 300, "label": "region_blackhole us-east-1",
                   "kind": "injection"}],        # injection | shift | stop | failback | revert
      "slo_ttft_s": 2.0,
      "kv_limit": 0.85,                          # optional; else the kv_usage_max clause
      "survivor": ["us-west-2"],                 # optional; the KV chart shows these regions
      "stop_thresholds": [{"name": "survivor-ttft", "value": 4.0, "chart": "ttft_p99"}]
    }

A value of ``null`` in a series is a gap (no data, e.g. a blackholed region). A series may also
be given as ``{"t_s": [...], "values": [...]}``.

The multi-run summary (``firedrill gameday run --runs N``, `firedrill.drill.many`) rendered by
`render_many_markdown` / `render_many_html`::

    {"drill": str, "runs": int, "seed": int, "pass_rate": 0..1,
     "verdicts": {"passed": int, "failed": int, "aborted": int},
     "terms": {"detect_s": {"p50": s, "p95": s, "p99": s}, ...},
     "measured": {"p50": s, "p95": s, "p99": s},        # measured RTO
     "budget_s": s, "planned": {"detect_s": s, ...}}   # optional
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from firedrill.drill.spec import seconds as duration_seconds
from firedrill.report.charts import _CSS as _BASE_CSS
from firedrill.report.charts import bar_chart, format_duration, format_tick
from firedrill.report.drill_charts import (
    HLine,
    Marker,
    Panel,
    Series,
    WaterfallTerm,
    series_colours,
    time_series_chart,
    time_ticks,
    waterfall_chart,
)

# The RTO terms in the order they happen, with their titles.
RTO_TERMS: tuple[tuple[str, str], ...] = (
    ("detect_s", "detect"),
    ("decide_s", "decide"),
    ("shift_s", "shift"),
    ("hydrate_s", "hydrate"),
    ("time_to_slo_s", "time to SLO"),
)
_RATIO_METRICS = frozenset(
    {"kv_usage_max", "paid_5xx_ratio", "error_ratio", "p2p_hit_rate", "pass_rate"}
)
_SERIES_KEYS = ("ttft_p99", "kv_usage", "hydrate_gbps", "ready_replicas")
_VERDICT_COLOURS = {"passed": "#1e8449", "failed": "#c0392b", "aborted": "#8e44ad"}
_POSTURE_NOTE = (
    "the hydrate term alone exceeds the RTO budget: a posture problem (pilot light pretending "
    "to be warm standby), not a tuning problem"
)
_CSS_EXTRA = """
td, th { text-align: left; vertical-align: top; overflow-wrap: anywhere; }
td.num, th.num { text-align: right; }
.verdict { font-size: 1.15rem; font-weight: 700; padding: 0.5rem 0.8rem; color: #fff;
  border-radius: 4px; display: inline-block; }
.note { color: #666; font-style: italic; } .bad { color: #c0392b; font-weight: 600; }
.good { color: #1e8449; } .posture { border-left: 4px solid #c0392b; padding: 0.3rem 0.8rem;
  background: #fdf2f0; }
figure { margin: 1rem 0; } figcaption { color: #666; font-size: 12px; }
svg { max-width: 100%; height: auto; } svg .frame { fill: none; stroke: #bbb; }
svg .axis-label { fill: #555; font-style: italic; } svg .total { font-weight: 600; }
code, pre { font: 12px ui-monospace, monospace; background: #f4f4f4; padding: 2px 4px; }
pre { padding: 0.6rem; white-space: pre-wrap; }
@page { size: A4; margin: 12mm; }
@media print {
  body { margin: 0; max-width: none; font-size: 11px; }
  figure, table, .posture { break-inside: avoid; } h2 { break-after: avoid; }
  .verdict { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
"""


# ----------------------------------------------------------------------------------------------
# Reading a (possibly partial) result


def _map(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[Any]:
    return list(v) if isinstance(v, list | tuple) else []


def _number(v: object) -> float | None:
    """A finite number, or None (bools and non-numbers are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _secs(v: object) -> float | None:
    """Seconds from a number or a duration string ('2m'); None when neither."""
    n = _number(v)
    if n is not None:
        return n
    if isinstance(v, str):
        try:
            return duration_seconds(v.strip())
        except ValueError:
            return None
    return None


def _first(m: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if m.get(k) is not None:
            return m[k]
    return None


def _fmt_number(v: float) -> str:
    if v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}" if abs(v) >= 10_000 else str(int(v))
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _fmt(v: object, metric: str | None = None) -> str:
    """A value for a table cell; seconds and ratios by the metric's unit."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    n = _number(v)
    if n is not None:
        if metric is not None and metric.endswith("_s"):
            return f"{n:.3g}s" if abs(n) < 60 else format_duration(n)
        if metric in _RATIO_METRICS:
            return f"{n:.1%}" if abs(n) >= 0.001 or n == 0 else f"{n:.3%}"
        return _fmt_number(n)
    if isinstance(v, Mapping):
        op, value = v.get("op"), v.get("value")
        if op is not None and value is not None:
            return f"{op} {_fmt(value, metric)}"
        return "; ".join(f"{k}: {_fmt(x)}" for k, x in v.items() if x not in (None, "", [], {}))
    if isinstance(v, list | tuple):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def _expected(h: Mapping[str, Any]) -> str:
    metric = h.get("metric")
    metric = metric if isinstance(metric, str) else None
    op = h.get("op")
    value = h.get("value") if _number(h.get("value")) is not None else h.get("expected")
    if isinstance(op, str) and _number(value) is not None:
        return f"{op} {_fmt(value, metric)}"
    return _fmt(h.get("expected", value), metric)


def _held(v: object) -> str:
    return "—" if v is None else ("yes" if v is True else "no" if v is False else str(v))


def _at(v: object) -> str:
    n = _number(v)
    return "—" if n is None else f"T+{format_duration(n)}"


def _rto(report: Mapping[str, Any]) -> tuple[list[WaterfallTerm], float | None, float | None]:
    """The RTO terms (planned and actual), the budget and the measured RTO."""
    rto = _map(report.get("rto"))
    terms = _map(rto.get("terms"))
    planned = _map(_first(rto, "planned", "plan")) or _map(terms.get("planned"))
    out: list[WaterfallTerm] = []
    for key, title in RTO_TERMS:
        short = key.removesuffix("_s")
        raw = _first(terms, key, short)
        actual: float | None
        plan: float | None = None
        if isinstance(raw, Mapping):
            actual = _secs(_first(raw, "actual_s", "measured_s", "actual", "measured", "value"))
            plan = _secs(_first(raw, "planned_s", "planned", "plan"))
        else:
            actual = _secs(raw)
        if plan is None:
            plan = _secs(_first(planned, key, short))
        out.append(WaterfallTerm(title, plan, actual))
    return out, _secs(_first(rto, "budget_s", "budget")), _secs(rto.get("measured_s"))


def _posture_problem(report: Mapping[str, Any], terms: Sequence[WaterfallTerm]) -> bool:
    flag = _map(report.get("rto")).get("posture_problem")
    if isinstance(flag, bool):
        return flag
    _, budget, _ = _rto(report)
    hydrate = next((t.actual_s for t in terms if t.name == "hydrate"), None)
    return budget is not None and hydrate is not None and hydrate > budget


def _reverted(report: Mapping[str, Any]) -> tuple[bool | None, list[Any]]:
    """Whether every injection was reverted (None: not said) and what was reverted."""
    raw = report.get("reverted")
    complete: bool | None = None
    items: list[Any]
    if isinstance(raw, bool):
        return raw, []
    if isinstance(raw, Mapping):
        flag = _first(raw, "all", "complete", "ok", "reverted")
        complete = flag if isinstance(flag, bool) else None
        items = _list(_first(raw, "injections", "items", "list", "reverted_injections"))
    else:
        items = _list(raw)
        complete = True if items else None
    return complete, items


def _describe(item: object) -> str:
    """One line for a loosely shaped record (an injection, a dependency, an event)."""
    if not isinstance(item, Mapping):
        return _fmt(item)
    head = _first(
        item, "label", "name", "service", "dependency", "kind", "op", "injection", "check"
    )
    rest = [
        f"{k.removesuffix('at_s').replace('_', ' ')}at {_at(v)}"
        if k.endswith("at_s")
        else f"{k}: {_fmt(v, k)}"
        for k, v in item.items()
        if v is not None and v is not head
    ]
    text = _fmt(head) if head is not None else ""
    return f"{text} ({'; '.join(rest)})" if text and rest else text or "; ".join(rest)


def _event_text(ev: Mapping[str, Any]) -> str:
    text = _first(ev, "text", "event", "message", "what", "description")
    kind = ev.get("kind")
    rest = {
        k: v
        for k, v in ev.items()
        if k not in {"at_s", "t_s", "text", "event", "message", "what", "description", "kind"}
    }
    parts = [str(kind)] if kind is not None else []
    if text is not None:
        parts.append(str(text))
    if rest:
        parts.append("(" + "; ".join(f"{k}: {_fmt(v, k)}" for k, v in rest.items()) + ")")
    return " ".join(parts) or "—"


def _series(raw: object) -> list[tuple[float, float | None]]:
    """Points from ``[[t, v], ...]`` or ``{"t_s": [...], "values": [...]}``."""
    pairs: Iterable[Any]
    if isinstance(raw, Mapping):
        ts = _list(_first(raw, "t_s", "t", "times"))
        vs = _list(_first(raw, "values", "v", "value"))
        pairs = zip(ts, vs, strict=False)
    else:
        pairs = _list(raw)
    out: list[tuple[float, float | None]] = []
    for p in pairs:
        if not isinstance(p, list | tuple) or len(p) < 2:
            continue
        t = _number(p[0])
        if t is not None:
            out.append((t, _number(p[1])))
    return out


def _region_series(charts: Mapping[str, Any], key: str, only: Sequence[str] = ()) -> list[Series]:
    by_region = _map(charts.get(key))
    names = sorted(r for r in by_region if not only or r in only)
    out = [Series(str(r), _series(by_region[r])) for r in names]
    return [s for s in out if any(v is not None for _, v in s.points)]


def _markers(report: Mapping[str, Any], charts: Mapping[str, Any]) -> list[Marker]:
    out: list[Marker] = []
    for m in _list(charts.get("markers")):
        mm = _map(m)
        at = _number(mm.get("at_s"))
        if at is not None:
            out.append(
                Marker(
                    at,
                    str(mm.get("label") or mm.get("kind") or ""),
                    str(mm.get("kind") or "injection"),
                )
            )
    stops = {round(m.at_s, 3) for m in out if m.kind in {"stop", "abort"}}
    for sc in _list(report.get("stop_conditions")):
        s = _map(sc)
        at = _number(s.get("at_s"))
        if s.get("fired") is True and at is not None and round(at, 3) not in stops:
            out.append(Marker(at, f"stop: {s.get('name', '')}", "stop"))
    return sorted(out, key=lambda m: (m.at_s, m.kind, m.label))


def _thresholds(charts: Mapping[str, Any], chart: str) -> list[HLine]:
    out = []
    for th in _list(charts.get("stop_thresholds")):
        t = _map(th)
        v = _number(t.get("value"))
        if t.get("chart") == chart and v is not None:
            out.append(HLine(f"stop: {t.get('name', '')}", v, "threshold"))
    return out


def _kv_limit(report: Mapping[str, Any], charts: Mapping[str, Any]) -> float | None:
    limit = _number(charts.get("kv_limit"))
    if limit is not None:
        return limit
    for h in _list(report.get("hypothesis")):
        hm = _map(h)
        if hm.get("metric") == "kv_usage_max":
            v = _number(_first(hm, "value", "expected"))
            if v is not None:
                return v
    return None


def _survivors(report: Mapping[str, Any], charts: Mapping[str, Any]) -> list[str]:
    raw = _first(charts, "survivor", "survivors") or report.get("survivor")
    if isinstance(raw, str):
        return [raw]
    return [str(r) for r in _list(raw)]


def _seconds_fmt(v: float) -> str:
    return f"{v:g}s"


def _charts(report: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """(key, caption, svg or None when there is no data) for each chart of the report."""
    charts = _map(report.get("charts"))
    markers = _markers(report, charts)
    out: list[tuple[str, str, str | None]] = []
    # One colour per region across every chart of the report.
    regions = sorted({str(r) for k in _SERIES_KEYS for r in _map(charts.get(k))})
    colours = series_colours(regions)

    ttft = _region_series(charts, "ttft_p99")
    slo = _number(charts.get("slo_ttft_s"))
    hl = ([HLine(f"SLO {slo:g}s", slo, "slo")] if slo is not None else []) + _thresholds(
        charts, "ttft_p99"
    )
    out.append(
        (
            "ttft_p99",
            "TTFT p99 per region over the drill, with the SLO, the stop thresholds and the "
            "injections, shift steps and stops marked.",
            time_series_chart(
                "ttft_p99",
                [Panel(ttft, "TTFT p99", _seconds_fmt, hl)],
                title="TTFT p99 per region",
                markers=markers,
                colours=colours,
            )
            if ttft
            else None,
        )
    )

    terms, budget, measured = _rto(report)
    has_rto = any(t.actual_s is not None or t.planned_s is not None for t in terms)
    out.append(
        (
            "rto_waterfall",
            "The RTO waterfall: each term starts where the previous one ended, plan beside "
            "actual, against the budget.",
            waterfall_chart(terms, budget_s=budget, total_s=measured, title="RTO waterfall")
            if has_rto
            else None,
        )
    )

    gbps = _region_series(charts, "hydrate_gbps")
    ready = _region_series(charts, "ready_replicas")
    panels = []
    if gbps:
        panels.append(
            Panel(gbps, "GB/s per node", lambda v: f"{v:g}", _thresholds(charts, "hydrate_gbps"))
        )
    if ready:
        panels.append(
            Panel(
                ready, "ready replicas", lambda v: f"{v:g}", _thresholds(charts, "ready_replicas")
            )
        )
    out.append(
        (
            "hydrate",
            "The hydrate curve: pull bandwidth per node and ready replicas per region.",
            time_series_chart(
                "hydrate", panels, title="Hydrate curve", markers=markers, colours=colours
            )
            if panels
            else None,
        )
    )

    survivors = _survivors(report, charts)
    kv = _region_series(charts, "kv_usage", survivors)
    limit = _kv_limit(report, charts)
    kv_lines = [HLine(f"hypothesis < {limit:.0%}", limit, "slo")] if limit is not None else []
    kv_lines += _thresholds(charts, "kv_usage")
    who = f" ({', '.join(survivors)})" if survivors else ""
    out.append(
        (
            "kv_usage",
            "KV-cache usage of the survivor against the hypothesis limit.",
            time_series_chart(
                "kv_usage",
                [Panel(kv, "KV cache usage", lambda v: f"{v:.0%}", kv_lines, y_max=1.0)],
                title=f"Survivor KV cache usage{who}",
                markers=markers,
                colours=colours,
            )
            if kv
            else None,
        )
    )
    return out


def _reproduce(report: Mapping[str, Any]) -> str:
    target = _first(report, "spec_path", "drill_path", "drill") or "DRILL"
    seed = report.get("seed")
    return f"firedrill gameday run {target} --seed {seed if seed is not None else 'S'}"


def _verdict_line(report: Mapping[str, Any]) -> tuple[str, str]:
    """The verdict word and a sentence of why."""
    verdict = str(report.get("verdict") or "unknown")
    parts = []
    hyp = [_map(h) for h in _list(report.get("hypothesis"))]
    if hyp:
        held = sum(1 for h in hyp if h.get("passed") is True)
        parts.append(f"{held} of {len(hyp)} hypothesis clauses held")
    _, budget, measured = _rto(report)
    if measured is not None:
        against = f" against a {format_duration(budget)} budget" if budget is not None else ""
        parts.append(f"RTO {format_duration(measured)}{against}")
    fired = [_map(s) for s in _list(report.get("stop_conditions")) if _map(s).get("fired") is True]
    if fired:
        first = min(fired, key=lambda s: _number(s.get("at_s")) or 0.0)
        parts.append(f"stopped by {first.get('name')} at {_at(first.get('at_s'))}")
    return verdict, "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# Markdown


def _md_cell(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return lines


Block = tuple[str, Any]


def _table_or(header: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> list[Block]:
    return [("table", (list(header), [list(r) for r in rows]))] if rows else [("p", empty)]


def _rto_blocks(report: Mapping[str, Any]) -> list[Block]:
    terms, budget, measured = _rto(report)
    rows: list[list[object]] = []
    for t in terms:
        over = t.actual_s is not None and t.planned_s is not None and t.actual_s > t.planned_s
        delta = "—"
        if t.actual_s is not None and t.planned_s is not None:
            sign = "+" if t.actual_s >= t.planned_s else "−"
            delta = sign + format_duration(abs(t.actual_s - t.planned_s))
        plan, actual = format_duration(t.planned_s), format_duration(t.actual_s)
        rows.append([t.name, plan, actual, delta, "over plan" if over else ""])
    planned_total = format_duration(sum(t.planned_s or 0.0 for t in terms))
    rows.append(["total (measured RTO)", planned_total, format_duration(measured), "", ""])
    blocks: list[Block] = [("table", (["term", "planned", "actual", "Δ", ""], rows))]
    if budget is not None:
        if measured is None:
            verdict = "not measured (users were never served within SLO)"
        elif measured <= budget:
            verdict = "within budget"
        else:
            verdict = f"over budget by {format_duration(measured - budget)}"
        blocks.append(("p", f"Budget {format_duration(budget)}: {verdict}."))
    if _posture_problem(report, terms):
        blocks.append(("posture", f"Posture problem: {_POSTURE_NOTE}."))
    return blocks


def _reverted_blocks(report: Mapping[str, Any]) -> list[Block]:
    complete, reverted = _reverted(report)
    blocks: list[Block] = []
    if complete is False:
        blocks.append(("bad", "Not every injection was reverted."))
    elif complete is True:
        blocks.append(("p", f"Every injection was reverted ({len(reverted)} operations)."))
    if reverted and all(isinstance(r, Mapping) for r in reverted):
        rows = [
            [
                _fmt(_first(r, "label", "name", "injection", "op")),
                _fmt(r.get("kind")),
                _at(_first(r, "applied_at_s", "at_s")),
                _at(r.get("reverted_at_s")),
                _fmt(_first(r, "inverse", "inverses")),
                _held(r.get("ok")),
            ]
            for r in reverted
        ]
        blocks.append(("table", (["what", "kind", "applied", "reverted", "inverse", "ok"], rows)))
    elif reverted:
        blocks.append(("list", [_describe(r) for r in reverted]))
    refused = [_describe(r) for r in _list(report.get("refused"))]
    if refused:
        blocks.append(("bad", f"Refused ({len(refused)}): the guards stopped these operations."))
        blocks.append(("list", refused))
    return blocks or [("p", "Nothing recorded.")]


_HYDRATE_ROWS = (
    ("peak_gbps_per_node", "peak GB/s per node"),
    ("p2p_hit_rate", "P2P peer hit rate"),
    ("origin_errors", "origin errors (503/429)"),
    ("first_ready_s", "first ready replica"),
    ("time_to_slo_s", "time to SLO"),
)
# Titles of further measures the hydrate measurement may carry (others: the key, spaced).
_HYDRATE_TITLES = {
    "start_s": "measured from",
    "end_s": "measured to",
    "gbytes_pulled": "GB pulled",
    "mean_gbps_per_node": "mean GB/s per node",
    "origin_503": "origin 503 SlowDown",
    "origin_429": "origin 429",
    "competing_gbytes": "GB pulled by competing jobs",
    "replicas_became_ready": "replicas that became ready",
    "last_ready_s": "last ready replica",
    "min_ready": "fewest ready replicas",
}
_HYDRATE_AT = frozenset({"start_s", "end_s"})  # times on the drill clock (T+), not durations
_HYDRATE_SKIP = frozenset({"region", "model"})


def _hydrate_blocks(report: Mapping[str, Any]) -> list[Block]:
    """One row per measure; one column per region when the result has them by region."""
    by_region = {str(r): _map(v) for r, v in _map(report.get("hydrate_by_region")).items()}
    columns = by_region or ({"value": _map(report.get("hydrate"))} if report.get("hydrate") else {})
    if not any(columns.values()):
        return [("p", "No hydrate measurements in this result.")]
    titles = {**dict(_HYDRATE_ROWS), **_HYDRATE_TITLES}
    keys = [k for k, _ in _HYDRATE_ROWS]
    for stats in columns.values():  # further scalar measures, in the order the result has them
        keys += [
            k
            for k, v in stats.items()
            if k not in keys and k not in _HYDRATE_SKIP and not isinstance(v, Mapping | list)
        ]
    rows = [
        [
            titles.get(k, k.removesuffix("_s").replace("_", " ")),
            *(
                _at(st.get(k)) if k in _HYDRATE_AT else _fmt(st.get(k), k)
                for st in columns.values()
            ),
        ]
        for k in keys
    ]
    return [("table", (["measure", *columns], rows))]


def _dependency_blocks(report: Mapping[str, Any]) -> list[Block]:
    deps = _list(report.get("dependencies"))
    if not deps:
        return [("p", "No hidden cross-region dependency found.")]
    if not all(isinstance(d, Mapping) for d in deps):
        return [("list", [_describe(d) for d in deps])]
    rows = []
    for d in deps:
        broke = _fmt(_first(d, "broke", "impact", "effect"))
        evidence = _map(d.get("evidence"))
        if evidence:
            broke += " (" + "; ".join(_fmt(v) for v in evidence.values()) + ")"
        rows.append(
            [
                _fmt(_first(d, "service", "name", "dependency")),
                _fmt(d.get("kind")),
                _fmt(_first(d, "lives_in", "region")),
                _fmt(_first(d, "crosses_cut", "used_by")),
                _held(d.get("observed")),
                broke,
            ]
        )
    header = ["dependency", "kind", "lives in", "reached across the cut from", "observed", "broke"]
    return [("table", (header, rows))]


def _admission_blocks(report: Mapping[str, Any]) -> list[Block]:
    adm = _map(report.get("admission"))
    if not adm:
        return []
    parts = [
        f"{_fmt(adm[k])} {title}"
        for k, title in (
            ("admitted", "admitted"),
            ("denied", "denied"),
            ("unsigned_admitted", "unsigned admitted"),
        )
        if k in adm
    ]
    unsigned = _number(adm.get("unsigned_admitted"))
    kind = "bad" if unsigned else "p"
    return [(kind, "Admission during the drill: " + ", ".join(parts) + ".")]


def _sections(report: Mapping[str, Any]) -> list[tuple[str, list[Block]]]:
    """The report's sections as (title, blocks); a block is ('p'|'table'|'list'|'code', data).

    Both renderers walk the same blocks, so the Markdown and the HTML say the same things.
    """
    hyp = [_map(h) for h in _list(report.get("hypothesis"))]
    hyp_rows = [
        [
            _fmt(h.get("clause")),
            _expected(h),
            _fmt(h.get("observed"), h.get("metric")),
            "yes" if h.get("passed") is True else "NO",
        ]
        for h in hyp
    ]
    stops = [_map(s) for s in _list(report.get("stop_conditions"))]
    stop_rows = [
        [
            _fmt(s.get("name")),
            _fmt(s.get("kind")),
            _fmt(s.get("threshold")),
            _held(s.get("fired")),
            _at(s.get("at_s")),
        ]
        for s in stops
    ]
    floor = [_map(c) for c in _list(report.get("security_floor"))]
    floor_rows = [
        [
            _fmt(c.get("check")),
            "not exercised"
            if c.get("status") == "not_exercised"
            else "NO"
            if c.get("passed") is False
            else _held(c.get("passed")),
            _fmt(_first(c, "detail", "observed", "reason")),
        ]
        for c in floor
    ]
    deps = _dependency_blocks(report)
    steps = [_map(s) for s in _list(_map(report.get("failback")).get("steps"))]
    step_rows = [
        [
            str(i + 1),
            f"{_fmt(s.get('weight'))}%",
            _at(s.get("at_s")),
            _held(s.get("held")),
            _held(s.get("backed_off")),
        ]
        for i, s in enumerate(steps)
    ]
    findings = [_map(f) for f in _list(report.get("findings"))]
    finding_rows = [
        [
            _fmt(f.get("kind")),
            _fmt(f.get("text")),
            _fmt(f.get("owner")) if f.get("owner") else "UNOWNED",
        ]
        for f in findings
    ]
    timeline = [_map(ev) for ev in _list(report.get("timeline"))]
    event_rows = [[_at(_first(ev, "at_s", "t_s")), _event_text(ev)] for ev in timeline]
    return [
        (
            "Hypothesis",
            _table_or(["clause", "expected", "observed", "pass"], hyp_rows, "No clauses."),
        ),
        ("RTO", _rto_blocks(report)),
        (
            "Stop conditions",
            _table_or(["name", "kind", "threshold", "fired", "at"], stop_rows, "None recorded."),
        ),
        ("Reverted injections", _reverted_blocks(report)),
        (
            "Security floor",
            _table_or(["check", "held", "detail"], floor_rows, "No security-floor checks.")
            + _admission_blocks(report),
        ),
        ("Hydrate", _hydrate_blocks(report)),
        ("Hidden dependencies", deps),
        (
            "Failback",
            _table_or(
                ["step", "weight", "at", "held", "backed off"],
                step_rows,
                "No failback in this drill.",
            ),
        ),
        ("Findings", _table_or(["kind", "finding", "owner"], finding_rows, "No findings.")),
        ("Timeline", _table_or(["at", "event"], event_rows, "No timeline in this result.")),
        ("Reproduce", [("code", _reproduce(report))]),
    ]


def _meta(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    keys = (
        ("rung", "rung"),
        ("seed", "seed"),
        ("spec sha256", "spec_sha256"),
        ("run by", "run_by"),
        ("runbook author", "runbook_author"),
        ("abort owner", "abort_owner"),
        ("target", "target"),
    )
    return [(title, _fmt(report[k])) for title, k in keys if report.get(k) is not None]


def render_markdown(report: Mapping[str, Any]) -> str:
    """The run result as Markdown: verdict, hypothesis, RTO terms, guards, findings, reproduce."""
    name = _fmt(report.get("drill") or "unnamed drill")
    verdict, why = _verdict_line(report)
    lines = [f"# Game day: {name}", ""]
    lines.append(f"**Verdict: {verdict.upper()}**" + (f" — {why}." if why else ""))
    lines.append("")
    if report.get("reason"):
        lines += [f"Why: {_fmt(report['reason'])}.", ""]
    meta = _meta(report)
    if meta:
        lines.append(
            " · ".join(f"{k}: `{v}`" if k == "spec sha256" else f"{k}: {v}" for k, v in meta)
        )
        lines.append("")
    for title, blocks in _sections(report):
        lines += [f"## {title}", ""]
        for kind, data in blocks:
            if kind == "table":
                lines += _md_table(*data)
            elif kind == "list":
                lines += [f"- {_md_cell(x)}" for x in data]
            elif kind == "code":
                lines += ["```sh", data, "```"]
            elif kind in {"posture", "bad"}:
                lines.append(f"> **{data}**")
            else:
                lines.append(data)
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------
# HTML


def _h_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="bad">{e(str(c))}</td>'
            if c in {"NO", "UNOWNED", "over plan"}
            else f"<td>{e(str(c))}</td>"
            for c in r
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _h_blocks(blocks: Sequence[tuple[str, Any]]) -> list[str]:
    e = html.escape
    out = []
    for kind, data in blocks:
        if kind == "table":
            out.append(_h_table(*data))
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in data) + "</ul>")
        elif kind == "code":
            out.append(f"<pre><code>{e(data)}</code></pre>")
        elif kind == "posture":
            out.append(f'<p class="posture bad">{e(data)}</p>')
        elif kind == "bad":
            out.append(f'<p class="bad">{e(data)}</p>')
        else:
            out.append(f"<p>{e(data)}</p>")
    return out


def _figure(key: str, caption: str, svg: str | None) -> str:
    e = html.escape
    if svg is None:
        return (
            f'<p class="note" data-chart-missing="{e(key)}">No data for this chart in the '
            f"result: {e(caption[0].lower() + caption[1:])} Chart omitted.</p>"
        )
    return (
        f'<figure class="chart" data-chart="{e(key)}">{svg}'
        f"<figcaption>{e(caption)}</figcaption></figure>"
    )


def _page(title: str, body: Sequence[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_BASE_CSS}{_CSS_EXTRA}</style></head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def render_html(report: Mapping[str, Any]) -> str:
    """The run result as one self-contained, printable HTML page with inline SVG charts."""
    e = html.escape
    name = _fmt(report.get("drill") or "unnamed drill")
    verdict, why = _verdict_line(report)
    colour = _VERDICT_COLOURS.get(verdict, "#555")
    charts = {key: (caption, svg) for key, caption, svg in _charts(report)}
    body = [
        f"<h1>Game day: {e(name)}</h1>",
        f'<p><span class="verdict" style="background: {colour}" data-verdict="{e(verdict)}">'
        f"Verdict: {e(verdict.upper())}</span></p>",
    ]
    if why:
        body.append(f"<p>{e(why)}.</p>")
    if report.get("reason"):
        body.append(f"<p>Why: {e(_fmt(report['reason']))}.</p>")
    meta = _meta(report)
    if meta:
        body.append(
            '<p class="muted">'
            + " · ".join(
                f"{e(k)}: <code>{e(v)}</code>" if k == "spec sha256" else f"{e(k)}: {e(v)}"
                for k, v in meta
            )
            + "</p>"
        )
    # Which chart goes after which section.
    after = {
        "Hypothesis": ("ttft_p99",),
        "RTO": ("rto_waterfall",),
        "Hydrate": ("hydrate", "kv_usage"),
    }
    for title, blocks in _sections(report):
        body.append(f"<h2>{e(title)}</h2>")
        body += _h_blocks(blocks)
        for key in after.get(title, ()):
            body.append(_figure(key, *charts[key]))
    return _page(f"Game day {name}: {verdict}", body)


# ----------------------------------------------------------------------------------------------
# Many runs


def _term_title(key: str) -> str:
    titles = dict(RTO_TERMS)
    return titles.get(key, titles.get(f"{key}_s", key.removesuffix("_s").replace("_", " ")))


def _many_rows(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], float | None]]:
    """(title, {p50, p95, p99}, planned seconds) per term, then the measured RTO."""
    terms = _map(summary.get("terms"))
    planned = _map(summary.get("planned"))
    order = [k for k, _ in RTO_TERMS if k in terms] + [
        k for k, _ in RTO_TERMS if k.removesuffix("_s") in terms
    ]
    order += sorted(k for k in terms if k not in order)
    rows = [
        (
            _term_title(k),
            _map(terms[k] if k in terms else terms[k.removesuffix("_s")]),
            _secs(_first(planned, k, k.removesuffix("_s"), f"{k}_s")),
        )
        for k in order
        if k in terms or k.removesuffix("_s") in terms
    ]
    if summary.get("measured") is not None:
        rows.append(("measured RTO", _map(summary.get("measured")), _secs(summary.get("budget_s"))))
    return rows


def _many_head(summary: Mapping[str, Any]) -> tuple[str, str, list[tuple[str, int]]]:
    name = _fmt(summary.get("drill") or "unnamed drill")
    verdicts = _map(summary.get("verdicts"))
    counts = [(v, int(_number(verdicts.get(v)) or 0)) for v in ("passed", "failed", "aborted")]
    runs = _number(summary.get("runs"))
    total = int(runs) if runs is not None else sum(c for _, c in counts)
    rate = _number(summary.get("pass_rate"))
    if rate is None and total:
        rate = counts[0][1] / total
    line = (
        f"Pass rate {_fmt(rate, 'pass_rate')} over {total} runs "
        f"({', '.join(f'{c} {v}' for v, c in counts)})"
    )
    seed = summary.get("seed")
    if seed is not None:
        line += f"; seeds from {seed}"
    return name, line, counts


def _count_ticks(top: int) -> list[float]:
    """Whole-number ticks (1, 2, 5, 10, … apart) from 0 up to at least ``top``."""
    step = next(m * 10**e for e in range(12) for m in (1, 2, 5) if top / (m * 10**e) <= 5)
    return [float(step * i) for i in range(math.ceil(top / step) + 1)]


def _pct(row: Mapping[str, Any], p: str) -> float | None:
    return _secs(_first(row, p, f"{p}_s"))


def render_many_markdown(summary: Mapping[str, Any]) -> str:
    """A multi-run summary as Markdown: pass rate, verdicts, p50/p95/p99 of each RTO term."""
    name, line, _ = _many_head(summary)
    lines = [f"# Game day: {name} — {_fmt(summary.get('runs'))} runs", "", f"**{line}.**", ""]
    rows = [
        [
            title,
            *(format_duration(_pct(r, p)) for p in ("p50", "p95", "p99")),
            format_duration(planned),
        ]
        for title, r, planned in _many_rows(summary)
    ]
    lines += ["## RTO terms over the runs", ""]
    if rows:
        lines += _md_table(["term", "p50", "p95", "p99", "plan / budget"], rows)
    else:
        lines.append("No RTO terms in this summary.")
    budget = _secs(summary.get("budget_s"))
    if budget is not None:
        lines += ["", f"RTO budget {format_duration(budget)}."]
    seed = summary.get("seed")
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        f"firedrill gameday run {_first(summary, 'spec_path', 'drill') or 'DRILL'} "
        f"--runs {_fmt(summary.get('runs'))} --seed {seed if seed is not None else 'S'}",
        "```",
    ]
    return "\n".join(lines) + "\n"


def render_many_html(summary: Mapping[str, Any]) -> str:
    """A multi-run summary as one self-contained HTML page: verdict counts, term distributions."""
    e = html.escape
    name, line, counts = _many_head(summary)
    body = [
        f"<h1>Game day: {e(name)} — {e(_fmt(summary.get('runs')))} runs</h1>",
        f"<p><strong>{e(line)}.</strong></p>",
    ]
    top = max([c for _, c in counts] + [1])
    verdict_svg = bar_chart(
        [v for v, _ in counts],
        [("runs", [float(c) for _, c in counts])],
        title="Verdicts",
        ticks=_count_ticks(top),
        fmt=lambda v: f"{v:g}",
    )
    body.append(_figure("verdicts", "Runs by verdict.", verdict_svg))
    rows = _many_rows(summary)
    body.append("<h2>RTO terms over the runs</h2>")
    if rows:
        body.append(
            _h_table(
                ["term", "p50", "p95", "p99", "plan / budget"],
                [
                    [
                        t,
                        *(format_duration(_pct(r, p)) for p in ("p50", "p95", "p99")),
                        format_duration(pl),
                    ]
                    for t, r, pl in rows
                ],
            )
        )
        values = [
            v for _, r, _ in rows for p in ("p50", "p95", "p99") if (v := _pct(r, p)) is not None
        ]
        budget = _secs(summary.get("budget_s"))
        marks = [("budget", budget)] if budget is not None else []
        dist = bar_chart(
            [t for t, _, _ in rows],
            [(p, [_pct(r, p) for _, r, _ in rows]) for p in ("p50", "p95", "p99")],
            title="RTO terms: p50 / p95 / p99 over the runs",
            ticks=time_ticks(max([*values, budget or 0.0, 60.0]), most=8),
            fmt=format_duration,
            tick_fmt=format_tick,
            missing="not measured",
            marks=marks,
        )
        body.append(_figure("terms", "Distribution of each RTO term over the runs.", dist))
    else:
        body.append('<p class="note">No RTO terms in this summary.</p>')
    return _page(f"Game day {name}: {_fmt(summary.get('runs'))} runs", body)
