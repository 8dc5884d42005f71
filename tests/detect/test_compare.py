"""The six workbook strategies: exact timings on hand-made counters, the workbook's conclusions on
the twin, the report's shape and its determinism."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from firedrill.detect.compare import (
    INCIDENT_CLASSES,
    SIGNIFICANT_BUDGET_FRACTION,
    CompareResult,
    CounterHistory,
    Incident,
    IncidentMix,
    IncidentPlan,
    availability_objective,
    compare,
    first_cell_serving,
    plan_incidents,
    score,
)
from firedrill.detect.slo import Objective, SloSpec
from firedrill.model.spec import FleetSpec
from firedrill.report.charts import render_html, render_table
from firedrill.specfile import load_fleet, load_spec
from firedrill.twin.engine import Twin

FLEET = "examples/fleet.yaml"
SLO = "examples/slo.yaml"
SEED = 11
STEP_S = 15.0
PERIOD_S = 30 * 86400.0
HOUR_S = 3600.0

# A small plan: a total outage long enough for `for: 1h` to fire, a partial outage and a blip
# that costs ~0.4 % of the budget (10 % of requests fail for 90 s at 99.9 %/30 d).
SMALL_PLAN = (
    Incident("outage", "total_outage", 900.0, 55 * 60.0, 1.0),
    Incident("partial", "partial", 900.0 + 70 * 60.0, 30 * 60.0, 0.2),
    Incident("blip", "blip", 900.0 + 115 * 60.0, 90.0, 0.1),
)


@pytest.fixture(scope="module")
def fleet() -> FleetSpec:
    return load_fleet(FLEET)


@pytest.fixture(scope="module")
def slo() -> SloSpec:
    return load_spec(SLO, SloSpec)


@pytest.fixture(scope="module")
def objective(slo: SloSpec) -> Objective:
    return availability_objective(slo, "chat-availability")


def _run(fleet: FleetSpec, slo: SloSpec, objective: Objective) -> CompareResult:
    cell = first_cell_serving(fleet, objective.model)
    plan = IncidentPlan(SEED, objective.model, cell, SMALL_PLAN, horizon_s=900.0 + 135 * 60.0)
    twin = Twin(fleet, SEED, record=True, hours_hint=plan.horizon_s / HOUR_S)
    return compare(twin, plan, slo, objective)


@pytest.fixture(scope="module")
def result(fleet: FleetSpec, slo: SloSpec, objective: Objective) -> CompareResult:
    return _run(fleet, slo, objective)


# ----------------------------------------------------------------------------------------------
# the plan


def test_plan_is_seeded_spaced_and_on_the_evaluation_grid(objective: Objective) -> None:
    a = plan_incidents(3, objective, cell="use1-a", period_s=PERIOD_S)
    assert a == plan_incidents(3, objective, cell="use1-a", period_s=PERIOD_S)
    assert a != plan_incidents(4, objective, cell="use1-a", period_s=PERIOD_S)
    mix = IncidentMix()
    assert [sum(i.kind == k for i in a.incidents) for k in INCIDENT_CLASSES] == [
        mix.count(k) for k in INCIDENT_CLASSES
    ]
    for prev, nxt in zip(a.incidents, a.incidents[1:], strict=False):
        assert nxt.start_s - prev.end_s >= 15 * 60
    for inc in a.incidents:
        assert inc.start_s % STEP_S == 0
        assert inc.duration_s % STEP_S == 0


def test_plan_classes_straddle_the_significance_line(objective: Objective) -> None:
    budget_s = objective.budget * PERIOD_S  # seconds of full outage the budget allows
    for seed in range(20):
        plan = plan_incidents(seed, objective, cell="use1-a", period_s=PERIOD_S)
        for inc in plan.incidents:
            cost = inc.fraction * inc.duration_s / budget_s
            if inc.kind == "blip":
                assert cost <= 0.01 * 1.001  # at most half the line: room for the daily peak
            else:
                assert cost >= 2 * SIGNIFICANT_BUDGET_FRACTION


def test_overlapping_incidents_are_refused() -> None:
    clash = (Incident("a", "partial", 0.0, 600.0, 0.2), Incident("b", "blip", 300.0, 60.0, 0.5))
    with pytest.raises(ValueError, match="do not overlap"):
        IncidentPlan(1, "llm-70b", "use1-a", clash, horizon_s=3600.0)


# ----------------------------------------------------------------------------------------------
# exact timings on hand-made counters: 100 requests/s, failures as planned, nothing else


def _history(plan: IncidentPlan, *, rps: float = 100.0, extra: float = 0.0) -> CounterHistory:
    t = np.arange(round(plan.horizon_s / STEP_S) + 1) * STEP_S
    errors = np.zeros_like(t)
    for inc in plan.incidents:
        errors += rps * inc.fraction * np.clip(t - inc.start_s, 0.0, inc.duration_s)
    errors += extra * (t >= plan.horizon_s - STEP_S)  # background errors at the very end
    return CounterHistory(STEP_S, np.asarray(rps * t, dtype=np.float64), errors)


def test_burn_rate_timings_match_the_workbook_arithmetic(objective: Objective) -> None:
    outage = Incident("o", "total_outage", 1800.0, 600.0, 1.0)
    plan = IncidentPlan(1, "m", "c", (outage,), horizon_s=4 * HOUR_S)
    res = score(_history(plan), plan, objective, period_s=PERIOD_S)
    one = res.strategy(1).outcomes[0]
    assert one.detection_time_s == 15.0  # the first evaluation sees errors
    assert one.reset_time_s == 600.0  # the 10 m window empties
    four = res.strategy(4).outcomes[0]
    # 14.4 × 0.1 % of an hour is 51.84 s of full outage: the first evaluation after it.
    assert four.detection_time_s == 60.0
    assert four.reset_time_s == 3555.0  # under 51.84 s of errors left in the last hour
    assert four.budget_consumed_before_firing == pytest.approx(60.0 / (0.001 * PERIOD_S))
    assert res.strategy(3).outcomes[0].detection_time_s is None  # 10 min never holds for 1 h
    assert res.incidents[0].budget_consumed == pytest.approx(600.0 / (0.001 * PERIOD_S))


def test_for_fires_once_the_condition_held_an_hour(objective: Objective) -> None:
    partial = Incident("p", "partial", 900.0, 90 * 60.0, 0.2)
    plan = IncidentPlan(1, "m", "c", (partial,), horizon_s=3 * HOUR_S)
    res = score(_history(plan), plan, objective, period_s=PERIOD_S)
    # pending at the first evaluation after the start, firing 1 h later
    assert res.strategy(3).outcomes[0].detection_time_s == 15.0 + HOUR_S


def test_background_errors_count_against_precision(objective: Objective) -> None:
    outage = Incident("o", "total_outage", 900.0, 600.0, 1.0)
    plan = IncidentPlan(1, "m", "c", (outage,), horizon_s=3 * HOUR_S)
    res = score(_history(plan, extra=100.0), plan, objective, period_s=PERIOD_S)
    s1 = res.strategy(1)
    assert (s1.true_alerts, s1.false_alerts) == (1, 1)  # 100 errors at the end fire the 10 m rule
    assert s1.precision == 0.5
    assert res.strategy(6).false_alerts == 0


# ----------------------------------------------------------------------------------------------
# the workbook's conclusions, on the twin


def test_strategy_1_catches_everything_and_pages_on_blips(result: CompareResult) -> None:
    s = result.strategy(1)
    assert s.recall == 1.0
    assert s.detected("blip") == (1, 1)
    assert s.precision is not None
    assert s.precision < 1.0


def test_strategy_2_takes_a_day_and_more_to_reset(result: CompareResult) -> None:
    resets = result.strategy(2).reset_time_s
    for kind in ("total_outage", "partial"):
        reset = resets[kind]
        assert reset is not None
        assert reset > 24 * HOUR_S


def test_strategy_3_needs_an_hour_for_a_total_outage(result: CompareResult) -> None:
    detection = result.strategy(3).detection_time_s["total_outage"]
    assert detection is not None  # the 55 min outage keeps the 10 m ratio up for 65 min
    assert detection >= HOUR_S
    outcome = next(o for o in result.strategy(3).outcomes if o.kind == "total_outage")
    # by then the outage has spent more than the whole month's budget
    assert outcome.budget_consumed_before_firing is not None
    assert outcome.budget_consumed_before_firing > 1.0


def test_strategy_6_is_fast_precise_and_resets_early(result: CompareResult) -> None:
    s6, s2 = result.strategy(6), result.strategy(2)
    detection = s6.detection_time_s["total_outage"]
    assert detection is not None
    assert detection <= 5 * 60
    assert s6.precision == 1.0
    assert s6.recall == 1.0
    assert s6.detected("blip") == (0, 1)
    r6, r2 = s6.mean_reset_time_s, s2.mean_reset_time_s
    assert r6 is not None
    assert r2 is not None
    assert r6 < r2 / 3


def test_only_the_blip_is_insignificant(result: CompareResult) -> None:
    assert [r.significant for r in result.incidents] == [True, True, False]
    assert all(r.errors > 0 for r in result.incidents)


# ----------------------------------------------------------------------------------------------
# the report


def test_json_has_every_strategy_with_per_class_measures(result: CompareResult) -> None:
    doc = json.loads(json.dumps(result.to_json()))  # plain JSON types only
    assert doc["seed"] == SEED
    assert doc["slo"]["objective"] == "chat-availability"
    assert doc["slo"]["target"] == 0.999
    assert [i["id"] for i in doc["incidents"]] == ["outage", "partial", "blip"]
    strategies = doc["strategies"]
    assert [s["number"] for s in strategies] == [1, 2, 3, 4, 5, 6]
    assert len({s["name"] for s in strategies}) == 6
    for s in strategies:
        for key in ("detection_time_s", "reset_time_s", "budget_consumed_before_firing"):
            assert set(s[key]) == set(INCIDENT_CLASSES)
        assert s["detection_time_s"]["slow_burn"] is None  # none in this plan
        for key in ("precision", "recall"):
            assert s[key] is None or 0.0 <= s[key] <= 1.0
        assert len(s["outcomes"]) == 3
    # strategies 5 and 6 are the workbook's three tiers, with and without short windows
    assert [r["windows"] for r in strategies[4]["rules"]] == [["1h"], ["6h"], ["3d"]]
    assert [r["windows"] for r in strategies[5]["rules"]] == [
        ["1h", "5m"],
        ["6h", "30m"],
        ["3d", "6h"],
    ]


def test_same_seed_same_report(
    result: CompareResult, fleet: FleetSpec, slo: SloSpec, objective: Objective
) -> None:
    again = _run(fleet, slo, objective)
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(
        result.to_json(), sort_keys=True
    )


def test_table_has_a_row_per_strategy(result: CompareResult) -> None:
    table = render_table(result)
    assert table.row_count == 6
    assert any("Precision" in str(c.header) for c in table.columns)


def test_html_is_self_contained_with_svg_charts(result: CompareResult) -> None:
    page = render_html(result)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 4
    for svg in svgs:
        ET.fromstring(svg)  # well-formed
    assert "Multiwindow, multi-burn-rate" in page
    assert not math.isnan(result.mean_rps)
