"""Game-day reports: Markdown sections and numbers, a self-contained HTML page with one SVG per
chart, deterministic bytes, partial results, and the page rendered by a real headless Chromium
with the network blocked."""

from __future__ import annotations

import copy
import itertools
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from firedrill.drill.report import (
    render_html,
    render_many_html,
    render_many_markdown,
    render_markdown,
)
from firedrill.report.charts import format_duration
from firedrill.report.drill_charts import Panel, Series, decimate, time_series_chart, time_ticks

CHROMIUM_TIMEOUT_S = 120
SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'
CHARTS = ("ttft_p99", "rto_waterfall", "hydrate", "kv_usage")

# ----------------------------------------------------------------------------------------------
# A realistic L5 result: us-east-1 blackholed at T+5m, traffic stepped to us-west-2, a hydrate
# storm that alone outlasts the 10-minute budget (posture problem), survivor KV over 85%.


def _curve(step_s: int, end_s: int, f: Any) -> list[list[float | None]]:
    return [[float(t), f(t)] for t in range(0, end_s + 1, step_s)]


def _east_ttft(t: int) -> float | None:
    return None if t >= 300 else 0.42 + 0.01 * (t % 60) / 60


def _west_ttft(t: int) -> float:
    if t < 420:
        return 0.45
    if t < 1500:
        return round(0.45 + 5.2 * min(1.0, (t - 420) / 240) * max(0.0, 1 - (t - 660) / 900), 4)
    return 1.1


def _kv(t: int) -> float:
    return round(min(0.91, 0.55 + 0.36 * max(0, t - 420) / 600), 4)


def _gbps(t: int) -> float:
    return 0.0 if t < 600 else round(max(0.4, 4.2 - 0.004 * (t - 600)), 3)


def _ready(t: int) -> float:
    return 6.0 if t < 600 else float(min(18, 6 + (t - 600) // 60))


def fixture_report() -> dict[str, Any]:
    markers = [
        {"at_s": 300.0, "label": "region_blackhole us-east-1", "kind": "injection"},
        {"at_s": 360.0, "label": "bad_digest us-west-2 (denied)", "kind": "injection"},
        {"at_s": 480.0, "label": "new_digest_during_pause", "kind": "injection"},
        {"at_s": 485.0, "label": "shift 10%", "kind": "shift"},
        {"at_s": 545.0, "label": "shift 40%", "kind": "shift"},
        {"at_s": 605.0, "label": "shift 100%", "kind": "shift"},
    ]
    return {
        "drill": "l5-region-blackhole-llm-70b",
        "rung": "L5",
        "seed": 7,
        "spec_sha256": "9f2c" + "0" * 60,
        "verdict": "failed",
        "hypothesis": [
            {
                "clause": "survivor serves chat within TTFT p99 SLO within 10 min",
                "metric": "time_to_slo_s",
                "op": "<=",
                "value": 600.0,
                "expected": "<= 600",  # the runner's shape; the other clauses: a number
                "observed": 1215.0,
                "passed": False,
            },
            {
                "clause": "survivor KV usage stays under 85%",
                "metric": "kv_usage_max",
                "op": "<",
                "expected": 0.85,
                "observed": 0.91,
                "passed": False,
            },
            {
                "clause": "zero unsigned digests admitted",
                "metric": "unsigned_admitted",
                "op": "==",
                "expected": 0,
                "observed": 0,
                "passed": True,
            },
        ],
        "rto": {
            "budget_s": 600.0,
            "measured_s": 1215.0,
            "terms": {
                "detect_s": 95.0,
                "decide_s": 90.0,
                "shift_s": 180.0,
                "hydrate_s": 720.0,
                "time_to_slo_s": 130.0,
            },
            "planned": {
                "detect_s": 120.0,
                "decide_s": 120.0,
                "shift_s": 180.0,
                "hydrate_s": 180.0,
                "time_to_slo_s": 120.0,
            },
            "posture_problem": True,
        },
        "stop_conditions": [
            {
                "name": "survivor-ttft-burn",
                "kind": "alert",
                "threshold": None,
                "fired": False,
                "at_s": None,
            },
            {
                "name": "paid-tier-5xx",
                "kind": "paid_5xx_ratio",
                "threshold": 0.02,
                "fired": False,
                "at_s": None,
            },
        ],
        "reverted": {
            "all": True,
            "injections": [
                {
                    "label": "#0 region_blackhole us-east-1",
                    "kind": "injection",
                    "applied_at_s": 300.0,
                    "reverted_at_s": 2700.0,
                    "inverse": ["Heal(kind='region-edge', a='us-east-1', b='edge')"],
                    "ok": True,
                },
                {
                    "label": "route_weight llm-70b",
                    "kind": "lever",
                    "applied_at_s": 485.0,
                    "reverted_at_s": 2700.0,
                    "inverse": [
                        "SetRegionWeight(model='llm-70b', region='us-east-1', percent=100)"
                    ],
                    "ok": True,
                },
            ],
        },
        "admission": {"admitted": 189, "denied": 48, "unsigned_admitted": 0},
        "security_floor": [
            {"check": "bad digest denied by admission", "passed": True},
            {"check": "survivor serves the last attested digest", "passed": True},
            {"check": "admission mode Enforce", "passed": True},
        ],
        "hydrate": {
            "peak_gbps_per_node": 4.2,
            "p2p_hit_rate": 0.62,
            "origin_errors": 1834,
            "first_ready_s": 660.0,
            "time_to_slo_s": 1215.0,
        },
        "failback": {"steps": []},
        "dependencies": [
            {
                "service": "probe-idp",
                "kind": "idp",
                "lives_in": "us-east-1",
                "used_by": ["us-east-1", "us-west-2"],
                "crosses_cut": ["us-west-2"],
                "observed": True,
                "broke": "synthetic probes could not get a token",
                "evidence": {"us-west-2": "440 failed probe token requests"},
            }
        ],
        "findings": [
            {
                "kind": "runbook_step",
                "text": "Preheat the survivor pool before shifting: hydrate took 12m 00s",
                "owner": "serving-oncall",
            },
            {"kind": "alert", "text": "Alert on survivor KV usage above 85%", "owner": None},
        ],
        "run_by": "alice",
        "timeline": [
            {"at_s": 300.0, "kind": "injection", "text": "region_blackhole us-east-1"},
            {"at_s": 395.0, "kind": "detect", "text": "CellTTFTBurnFast fired"},
            {"at_s": 2700.0, "kind": "revert", "text": "all injections reverted"},
        ],
        "charts": {
            "ttft_p99": {
                "us-west-2": _curve(10, 2700, _west_ttft),
                "us-east-1": _curve(10, 2700, _east_ttft),
            },
            "kv_usage": {
                "us-west-2": _curve(10, 2700, _kv),
                "us-east-1": _curve(10, 2700, lambda t: 0.5),
            },
            "hydrate_gbps": {"us-west-2": _curve(10, 2700, _gbps)},
            "ready_replicas": {"us-west-2": _curve(10, 2700, _ready)},
            "markers": markers,
            "slo_ttft_s": 2.0,
            "survivor": ["us-west-2"],
            "stop_thresholds": [
                {"name": "survivor-ttft", "value": 6.0, "chart": "ttft_p99"},
                {"name": "paid-tier-5xx", "value": 0.02, "chart": None},
            ],
        },
    }


def fixture_summary() -> dict[str, Any]:
    return {
        "drill": "l5-region-blackhole-llm-70b",
        "runs": 20,
        "seed": 7,
        "pass_rate": 0.6,
        "verdicts": {"passed": 12, "failed": 6, "aborted": 2},
        "terms": {
            "detect_s": {"p50": 90.0, "p95": 140.0, "p99": 170.0},
            "decide_s": {"p50": 90.0, "p95": 90.0, "p99": 90.0},
            "shift_s": {"p50": 180.0, "p95": 200.0, "p99": 230.0},
            "hydrate_s": {"p50": 240.0, "p95": 610.0, "p99": 720.0},
            "time_to_slo_s": {"p50": 100.0, "p95": 150.0, "p99": 175.0},
        },
        "measured": {"p50": 560.0, "p95": 980.0, "p99": 1215.0},
        "budget_s": 600.0,
    }


# ----------------------------------------------------------------------------------------------
# Helpers


class _Svgs(HTMLParser):
    """Every <svg> with the classes and attributes of the elements inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.svgs: list[dict[str, Any]] = []
        self.depth = 0
        self.scripts = 0
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for k in ("src", "href", "xlink:href", "action", "poster", "srcset", "data"):
            if k in a:
                self.urls.append(a[k] or "")
        if "url(" in (a.get("style") or ""):
            self.urls.append(a["style"] or "")
        if tag == "svg":
            self.depth += 1
            self.svgs.append({"chart": a.get("data-chart"), "elements": []})
        elif self.depth:
            self.svgs[-1]["elements"].append((tag, a))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.depth -= 1


def parse_svgs(page: str) -> _Svgs:
    p = _Svgs()
    p.feed(page)
    return p


def by_chart(page: str) -> dict[str, list[tuple[str, dict[str, str | None]]]]:
    return {s["chart"]: s["elements"] for s in parse_svgs(page).svgs}


def classed(elements: list[tuple[str, dict[str, str | None]]], cls: str) -> list[dict[str, Any]]:
    return [a for _, a in elements if cls in (a.get("class") or "").split()]


def md_tables(text: str) -> dict[str, list[list[str]]]:
    """Each Markdown table (header row first) under the '## ' heading it follows."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables: dict[str, list[list[str]]] = {}
    heading, rows, row, in_heading = "", None, None, False
    for t in tokens:
        if t.type == "heading_open":
            in_heading = True
        elif t.type == "inline" and in_heading:
            heading, in_heading = t.content, False
        elif t.type == "table_open":
            rows = tables.setdefault(heading, [])
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(t.content)
        elif t.type == "tr_close" and rows is not None and row is not None:
            rows.append(row)
            row = None
    return tables


def assert_self_contained(page: str) -> None:
    """No URL of any kind: nothing to fetch, nothing to run (the SVG namespace is a name)."""
    parsed = parse_svgs(page)
    assert parsed.scripts == 0
    assert parsed.urls == []
    bare = page.replace(SVG_NS, "")
    assert not re.search(r"https?:", bare, re.I)
    assert not re.search(r"url\(", bare, re.I)
    assert "@import" not in bare
    assert "<script" not in bare.lower()
    assert "<link" not in bare.lower()


# ----------------------------------------------------------------------------------------------
# Markdown


def test_markdown_has_every_section_and_the_numbers() -> None:
    md = render_markdown(fixture_report())
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings == [
        "Hypothesis",
        "RTO",
        "Stop conditions",
        "Reverted injections",
        "Security floor",
        "Hydrate",
        "Hidden dependencies",
        "Failback",
        "Findings",
        "Timeline",
        "Reproduce",
    ]
    assert md.startswith("# Game day: l5-region-blackhole-llm-70b\n")
    verdict = md.splitlines()[2]
    assert verdict.startswith("**Verdict: FAILED**")
    assert "1 of 3 hypothesis clauses held" in verdict
    assert "RTO 20m 15s against a 10m 00s budget" in verdict

    tables = md_tables(md)
    assert tables["Hypothesis"][0] == ["clause", "expected", "observed", "pass"]
    assert tables["Hypothesis"][1:] == [
        ["survivor serves chat within TTFT p99 SLO within 10 min", "<= 10m 00s", "20m 15s", "NO"],
        ["survivor KV usage stays under 85%", "< 85.0%", "91.0%", "NO"],
        ["zero unsigned digests admitted", "== 0", "0", "yes"],
    ]
    rto = {row[0]: row[1:] for row in tables["RTO"][1:]}
    assert rto["detect"] == ["2m 00s", "1m 35s", "−25s", ""]
    assert rto["hydrate"] == ["3m 00s", "12m 00s", "+9m 00s", "over plan"]
    assert rto["total (measured RTO)"][:2] == ["12m 00s", "20m 15s"]
    assert "Budget 10m 00s: over budget by 10m 15s." in md
    assert "> **Posture problem: the hydrate term alone exceeds the RTO budget" in md

    hydrate = dict(row for row in tables["Hydrate"][1:])  # type: ignore[misc]
    assert hydrate["P2P peer hit rate"] == "62.0%"
    assert hydrate["origin errors (503/429)"] == "1834"
    assert hydrate["first ready replica"] == "11m 00s"
    assert [r[0] for r in tables["Security floor"][1:]] == [
        "bad digest denied by admission",
        "survivor serves the last attested digest",
        "admission mode Enforce",
    ]
    assert tables["Findings"][1:] == [
        [
            "runbook_step",
            "Preheat the survivor pool before shifting: hydrate took 12m 00s",
            "serving-oncall",
        ],
        ["alert", "Alert on survivor KV usage above 85%", "UNOWNED"],
    ]
    assert tables["Hidden dependencies"][1:] == [
        [
            "probe-idp",
            "idp",
            "us-east-1",
            "us-west-2",
            "yes",
            "synthetic probes could not get a token (440 failed probe token requests)",
        ]
    ]
    assert "Every injection was reverted (2 operations)." in md
    assert tables["Reverted injections"][1] == [
        "#0 region_blackhole us-east-1",
        "injection",
        "T+5m 00s",
        "T+45m 00s",
        "Heal(kind='region-edge', a='us-east-1', b='edge')",
        "yes",
    ]
    assert "Admission during the drill: 189 admitted, 48 denied, 0 unsigned admitted." in md
    assert "No failback in this drill." in md
    assert "```sh\nfiredrill gameday run l5-region-blackhole-llm-70b --seed 7\n```" in md


def test_posture_problem_only_when_the_hydrate_term_alone_exceeds_the_budget() -> None:
    report = fixture_report()
    del report["rto"]["posture_problem"]  # derived from the terms when not given
    assert "Posture problem" in render_markdown(report)
    report["rto"]["terms"]["hydrate_s"] = 590.0
    assert "Posture problem" not in render_markdown(report)
    assert "Posture problem" not in render_html(report)


def test_aborted_run_names_the_stop_condition_and_marks_it_on_the_charts() -> None:
    report = fixture_report()
    report["verdict"] = "aborted"
    report["stop_conditions"][1].update(fired=True, at_s=777.0)
    md = render_markdown(report)
    assert md.splitlines()[2].startswith("**Verdict: ABORTED**")
    assert "stopped by paid-tier-5xx at T+12m 57s" in md
    assert md_tables(md)["Stop conditions"][1:] == [
        ["survivor-ttft-burn", "alert", "—", "no", "—"],
        ["paid-tier-5xx", "paid_5xx_ratio", "0.02", "yes", "T+12m 57s"],
    ]
    stops = classed(by_chart(render_html(report))["ttft_p99"], "marker-stop")
    assert [s["data-at-s"] for s in stops] == ["777"]


# ----------------------------------------------------------------------------------------------
# HTML


def test_html_is_self_contained_with_one_svg_per_chart() -> None:
    page = render_html(fixture_report())
    assert page.startswith("<!DOCTYPE html>")
    assert_self_contained(page)
    assert [s["chart"] for s in parse_svgs(page).svgs] == list(CHARTS)
    assert page.count("<svg") == len(CHARTS)
    assert 'data-verdict="failed"' in page
    assert "Verdict: FAILED" in page
    assert "@media print" in page
    assert "data-chart-missing" not in page


def test_ttft_chart_has_the_slo_the_stop_threshold_markers_and_a_gap() -> None:
    charts = by_chart(render_html(fixture_report()))
    ttft = charts["ttft_p99"]
    assert [a["data-value"] for a in classed(ttft, "slo")] == ["2"]
    assert [a["data-value"] for a in classed(ttft, "threshold")] == ["6"]  # 5xx: not this chart
    markers = classed(ttft, "marker")
    assert [m["data-at-s"] for m in markers] == ["300", "360", "480", "485", "545", "605"]
    assert len(classed(ttft, "marker-injection")) == 3
    assert len(classed(ttft, "marker-shift")) == 3
    lines = {a["data-series"]: a for a in classed(ttft, "series")}
    assert set(lines) == {"us-east-1", "us-west-2"}
    # us-east-1 is blackholed at T+5m: its line stops there (no line drawn through the gap).
    east_x = [float(p.split(",")[0]) for p in (lines["us-east-1"]["points"] or "").split()]
    west_x = [float(p.split(",")[0]) for p in (lines["us-west-2"]["points"] or "").split()]
    assert max(east_x) < max(west_x) / 5
    texts = [a for tag, a in ttft if tag == "text"]
    assert texts  # labels exist; their words are checked in the rendered DOM below


def test_waterfall_plan_beside_actual_with_the_budget() -> None:
    wf = by_chart(render_html(fixture_report()))["rto_waterfall"]
    planned = {a["data-term"]: float(a["data-s"]) for a in classed(wf, "planned")}
    actual = {a["data-term"]: a for a in classed(wf, "actual")}
    assert planned == {
        "detect": 120,
        "decide": 120,
        "shift": 180,
        "hydrate": 180,
        "time to SLO": 120,
        "total": 720,
    }
    assert float(actual["total"]["data-s"] or 0) == 1215
    assert actual["hydrate"]["fill"] != actual["detect"]["fill"]  # over plan vs within plan
    # Consecutive: each actual bar starts where the previous one ended.
    order = ["detect", "decide", "shift", "hydrate", "time to SLO"]
    for before, after in itertools.pairwise(order):
        end = float(actual[before]["x"] or 0) + float(actual[before]["width"] or 0)
        assert float(actual[after]["x"] or 0) == pytest.approx(end, abs=0.15)
    assert [a["data-s"] for a in classed(wf, "budget")] == ["600"]


def test_hydrate_two_panels_and_survivor_kv_with_the_hypothesis_limit() -> None:
    charts = by_chart(render_html(fixture_report()))
    panels = [a for tag, a in charts["hydrate"] if tag == "g" and a.get("class") == "panel"]
    assert len(panels) == 2
    assert len(classed(charts["hydrate"], "series")) == 2
    kv = charts["kv_usage"]
    assert [a["data-series"] for a in classed(kv, "series")] == ["us-west-2"]  # the survivor
    assert [a["data-value"] for a in classed(kv, "slo")] == ["0.85"]


def test_a_region_keeps_its_colour_across_charts() -> None:
    charts = by_chart(render_html(fixture_report()))
    colour: dict[str, str] = {}
    for key in ("ttft_p99", "hydrate", "kv_usage"):
        for line in classed(charts[key], "series"):
            name = line["data-series"]
            stroke = line.get("stroke") or line.get("fill")
            assert colour.setdefault(name, stroke) == stroke, (key, name)
    assert len(set(colour.values())) == len(colour) == 2


def test_same_report_same_bytes_whatever_the_key_order() -> None:
    report = fixture_report()
    shuffled = copy.deepcopy(report)
    shuffled["charts"]["ttft_p99"] = dict(reversed(list(report["charts"]["ttft_p99"].items())))
    assert render_html(report) == render_html(copy.deepcopy(report)) == render_html(shuffled)
    assert render_markdown(report) == render_markdown(shuffled)
    summary = fixture_summary()
    assert render_many_html(summary) == render_many_html(copy.deepcopy(summary))
    assert render_many_markdown(summary) == render_many_markdown(copy.deepcopy(summary))


@pytest.mark.parametrize(
    "report",
    [
        {},
        {"drill": "x", "verdict": "passed"},
        {"drill": "x", "charts": {"ttft_p99": {"a": []}, "markers": [{"label": "no time"}]}},
        {"drill": "x", "rto": {"terms": {"detect_s": {"actual_s": 30, "planned_s": 60}}}},
        {"drill": "x", "reverted": False, "hydrate": {}, "charts": {"kv_usage": {"r": "junk"}}},
    ],
)
def test_partial_results_render_with_notes_not_errors(report: dict[str, Any]) -> None:
    md = render_markdown(report)
    assert len(re.findall(r"^## ", md, re.M)) == 11
    page = render_html(report)
    assert_self_contained(page)
    drawn = {s["chart"] for s in parse_svgs(page).svgs}
    missing = set(re.findall(r'data-chart-missing="([a-z_0-9]+)"', page))
    assert drawn | missing == set(CHARTS)
    assert not drawn & missing
    if report.get("reverted") is False:
        assert "Not every injection was reverted." in md


def test_labels_from_the_spec_are_escaped() -> None:
    report = fixture_report()
    evil = '<script>alert(1)</script>"><img src=//x>'
    report["hypothesis"][0]["clause"] = evil
    report["charts"]["markers"][0]["label"] = evil
    report["charts"]["ttft_p99"][evil] = [[0, 1.0], [60, 1.5]]
    report["findings"][0]["owner"] = evil
    page = render_html(report)
    assert_self_contained(page)
    assert "&lt;script&gt;" in page
    # A pipe in a clause stays inside its Markdown table cell.
    report["hypothesis"][1]["clause"] = "KV | usage"
    rows = md_tables(render_markdown(report))["Hypothesis"]
    assert [len(r) for r in rows] == [4, 4, 4, 4]
    assert rows[2][0] == "KV | usage"


def test_marker_numbers_close_in_time_do_not_overlap() -> None:
    ttft = by_chart(render_html(fixture_report()))["ttft_p99"]
    ys = [(float(a["x"] or 0), float(a["y"] or 0)) for a in classed(ttft, "marker-tag")]
    assert len(ys) == 6
    for (x1, y1), (x2, y2) in itertools.combinations(ys, 2):
        assert abs(x1 - x2) >= 10 or y1 != y2  # markers 5 s apart (T+8m 00s, T+8m 05s)


# ----------------------------------------------------------------------------------------------
# Many runs


def test_many_markdown_pass_rate_and_term_distributions() -> None:
    md = render_many_markdown(fixture_summary())
    assert md.startswith("# Game day: l5-region-blackhole-llm-70b — 20 runs\n")
    assert "Pass rate 60.0% over 20 runs (12 passed, 6 failed, 2 aborted)" in md
    rows = md_tables(md)["RTO terms over the runs"]
    assert rows[0] == ["term", "p50", "p95", "p99", "plan / budget"]
    assert [r[0] for r in rows[1:]] == [
        "detect",
        "decide",
        "shift",
        "hydrate",
        "time to SLO",
        "measured RTO",
    ]
    assert rows[4][1:4] == ["4m 00s", "10m 10s", "12m 00s"]
    assert rows[6] == ["measured RTO", "9m 20s", "16m 20s", "20m 15s", "10m 00s"]
    assert "firedrill gameday run l5-region-blackhole-llm-70b --runs 20 --seed 7" in md


def test_many_html_has_verdicts_and_distribution_charts_with_the_budget() -> None:
    page = render_many_html(fixture_summary())
    assert_self_contained(page)
    assert re.findall(r'<figure class="chart" data-chart="([a-z]+)"', page) == [
        "verdicts",
        "terms",
    ]
    assert page.count("<svg") == 2
    assert 'class="mark"' in page
    assert "budget 10m 00s" in page
    empty = render_many_html({"drill": "x", "runs": 0})
    assert_self_contained(empty)
    assert "No RTO terms in this summary." in empty


# ----------------------------------------------------------------------------------------------
# Chart helpers


def test_decimate_keeps_spikes_and_gaps() -> None:
    points: list[tuple[float, float | None]] = [(float(t), 1.0) for t in range(10_000)]
    points[4321] = (4321.0, 99.0)
    points[7000] = (7000.0, None)
    out = decimate(points)
    assert len(out) <= 600
    assert (4321.0, 99.0) in out
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert decimate(points[:50]) == points[:50]


def test_a_flat_zero_series_gets_a_unit_axis() -> None:
    svg = time_series_chart(
        "hydrate",
        [Panel([Series("us-west-2", [(0.0, 0.0), (60.0, 0.0)])], "GB/s", lambda v: f"{v:g}")],
        title="Hydrate curve",
    )
    assert 'text-anchor="end">1</text>' in svg
    assert not re.search(r"\de-\d", svg)  # no 1e-09 tick labels


def test_time_ticks_use_readable_steps() -> None:
    assert time_ticks(2700) == [i * 600.0 for i in range(6)]
    assert time_ticks(45) == [i * 10.0 for i in range(6)]
    assert time_ticks(1215, most=8) == [i * 300.0 for i in range(6)]
    assert format_duration(time_ticks(40 * 3600)[-1]) == "42h 00m"


# ----------------------------------------------------------------------------------------------
# A real headless Chromium, with every host name unresolvable


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium not installed (`make tools` installs the Debian package chromium)")


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            chromium_binary(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--force-color-profile=srgb",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            *args,
        ],
        capture_output=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=False,
    )


def png_rows(data: bytes, *, rows: int) -> tuple[int, int, list[bytes]]:
    """Width, height and the first ``rows`` unfiltered scanlines of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8
            assert interlace == 0
            assert colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompressobj().decompress(idat, (width * channels + 1) * rows)
    stride, bpp = width * channels, channels
    prev = bytearray(stride)
    out = []
    for r in range(min(rows, height)):
        f = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        out.append(bytes(line if channels == 3 else _rgb(line)))
        prev = line
    return width, height, out


def _rgb(rgba: bytearray) -> bytearray:
    return bytearray(b for i, b in enumerate(rgba) if i % 4 != 3)


def test_chromium_renders_the_report_offline(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(fixture_report()), encoding="utf-8")
    dumped = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dumped.returncode == 0, dumped.stderr.decode()[-2000:]
    dom = dumped.stdout.decode()
    # The browser parsed the page into the same charts and text.
    assert [s["chart"] for s in parse_svgs(dom).svgs] == list(CHARTS)
    assert "Verdict: FAILED" in dom
    assert "region_blackhole us-east-1" in dom
    assert "SLO 2s" in dom
    assert "budget 10m 00s" in dom
    assert "hypothesis &lt; 85%" in dom

    shot = tmp_path / "report.png"
    done = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,260", page.as_uri())
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    width, height, rows = png_rows(shot.read_bytes(), rows=260)
    assert (width, height) == (1000, 260)
    pixels = Counter(row[i : i + 3] for row in rows for i in range(0, len(row), 3))
    assert len(pixels) > 20  # text and a banner, not a blank page
    assert pixels[b"\xc0\x39\x2b"] > 1000  # the 'failed' verdict banner, painted


def test_chromium_renders_the_many_runs_summary(tmp_path: Path) -> None:
    page = tmp_path / "summary.html"
    page.write_text(render_many_html(fixture_summary()), encoding="utf-8")
    dumped = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dumped.returncode == 0, dumped.stderr.decode()[-2000:]
    dom = dumped.stdout.decode()
    assert dom.count("<svg") == 2
    assert "Pass rate 60.0% over 20 runs" in dom


# ----------------------------------------------------------------------------------------------
# The result of a real drill (the L5 example on the twin), rendered and opened in Chromium

EXAMPLE_DRILL = Path(__file__).parents[2] / "examples" / "drills" / "l5-region-blackhole.yaml"


@pytest.fixture(scope="module")
def real_result() -> dict[str, Any]:
    from firedrill.drill.run import run_drill
    from firedrill.specfile import load_drill
    from firedrill.twin.world import embedded_world

    drill = load_drill(EXAMPLE_DRILL)
    return dict(
        run_drill(
            drill.spec,
            drill.fleet,
            drill.slo,
            drill.policy,
            spec_sha256=drill.spec_sha256,
            make_world=embedded_world,
        ).report
    )


def test_a_real_drill_result_renders_every_section_and_chart(
    real_result: dict[str, Any], tmp_path: Path
) -> None:
    md = render_markdown(real_result)
    assert len(re.findall(r"^## ", md, re.M)) == 11
    tables = md_tables(md)
    assert len(tables["Hypothesis"]) == 1 + len(real_result["hypothesis"])
    assert [r[0] for r in tables["RTO"][1:]] == [
        "detect",
        "decide",
        "shift",
        "hydrate",
        "time to SLO",
        "total (measured RTO)",
    ]
    assert f"--seed {real_result['seed']}" in md
    page = render_html(real_result)
    assert_self_contained(page)
    assert [s["chart"] for s in parse_svgs(page).svgs] == list(CHARTS)
    assert "data-chart-missing" not in page
    assert render_html(copy.deepcopy(real_result)) == page

    path = tmp_path / "real.html"
    path.write_text(page, encoding="utf-8")
    dumped = run_chromium(tmp_path, "--dump-dom", path.as_uri())
    assert dumped.returncode == 0, dumped.stderr.decode()[-2000:]
    dom = dumped.stdout.decode()
    assert [s["chart"] for s in parse_svgs(dom).svgs] == list(CHARTS)
    assert f"Verdict: {real_result['verdict'].upper()}" in dom
