"""The in-process burn-rate evaluator against the real Prometheus rule engine.

The evaluator claims to compute exactly what the generated rules ask Prometheus to compute. This
module holds it to that with ``promtool test rules``: the twin runs through an outage, a slow burn,
a blip and an overload, the evaluator is stepped at every scrape, and the series the rules read
are exported as promtool ``input_series`` (promtool time 0 is the twin's first scrape, at t = 0).
For every state change the evaluator reports at time T, promtool must show the old state at
T - 2 intervals and the new one at T + 1 interval: the same evaluation step, to within one interval
either way, as the product requires. A sweep every few minutes over every burn alert of the
objectives under test makes sure promtool fires nothing the evaluator does not.

promtool compares the whole list of firing alerts of an alertname at a time, labels and
annotations included, so each check lists every cell the evaluator has firing then, with the
labels Prometheus gives the alert: those of the long-window recording rule (``sloth_*``,
``model_name``, ``product``, ``cell``, ``region``, ``sloth_window``) and the alert's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from firedrill.detect.evaluator import AlertEvent, BurnRateEvaluator
from firedrill.detect.rules import alert_name, generate
from firedrill.detect.slo import SloSpec, duration_s
from firedrill.model.operations import (
    Heal,
    InjectServingErrors,
    Operation,
    Partition,
    PauseScaler,
    SetReplicas,
)
from firedrill.model.series import Series
from firedrill.model.spec import FleetSpec
from firedrill.specfile import load_fleet, load_spec
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import (
    promtool_duration,
    to_promtool_input_series,
)
from tests.detect.promtool import assert_promtool_agrees

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = 7
INTERVAL_S = 15.0  # scrape = evaluation interval: fleet spec, SLO spec and promtool alike
HOUR_S = 3600.0
SWEEP_S = 600.0  # every burn alert is also checked this often, firing or not

# One model's objectives, one per SLI kind.
OBJECTIVES = ("chat-ttft", "chat-availability", "chat-goodput")
RULE_INPUTS = (
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_count",
    "http_requests_total",
)


@dataclass(frozen=True)
class Scenario:
    hours: float
    injections: tuple[tuple[float, Operation], ...]  # (twin time in s, operation applied then)
    # Cells whose series promtool gets: those under test (and a quiet one). The alerts are per
    # cell, so the other cells change nothing there; leaving them out keeps promtool quick.
    cells: tuple[str, ...]


EDGE_CUT = Partition("region-edge", "eu-west-1", "edge")
EDGE_HEAL = Heal("region-edge", "eu-west-1", "edge")
QUIET_CELL = "use1-b"
EU_CELLS = ("euw1-a", "euw1-b")
SCENARIOS = {
    # users cannot reach eu-west-1 (both its cells) for 10 minutes
    "outage": Scenario(3.0, ((HOUR_S, EDGE_CUT), (HOUR_S + 600, EDGE_HEAL)), EU_CELLS),
    # 2% of completed requests fail in one cell: 20x the budget of a 99.9% target
    "slow_burn": Scenario(
        2.0, ((HOUR_S, InjectServingErrors("llm-70b", "usw2-a", 0.02)),), ("usw2-a", QUIET_CELL)
    ),
    # the outage, for 2 minutes only
    "blip": Scenario(2.0, ((HOUR_S, EDGE_CUT), (HOUR_S + 120, EDGE_HEAL)), EU_CELLS),
    # 12 replicas for the cell's ~250 requests/s, the autoscaler pinned: queues, then slow TTFT
    "overload": Scenario(
        1.5,
        (
            (HOUR_S, SetReplicas("llm-70b", "use1-a", 12)),
            (HOUR_S, PauseScaler("llm-70b", "use1-a", 12)),
        ),
        ("use1-a", QUIET_CELL),
    ),
}


@dataclass(frozen=True)
class Run:
    spec: SloSpec
    end_s: float
    events: tuple[AlertEvent, ...]  # in every cell
    cells: tuple[str, ...]  # the cells promtool sees
    series: tuple[Series, ...]  # what the rules read in those cells

    def fired(self, alertname: str) -> set[str]:
        """Cells the evaluator fired ``alertname`` in at some point."""
        return {
            e.label("cell") for e in self.events if e.alertname == alertname and e.state == "firing"
        }

    def firing_at(self, alertname: str, at_s: float) -> list[AlertEvent]:
        """The evaluator's firing alerts of ``alertname`` after its evaluation at ``at_s``."""
        state: dict[str, AlertEvent] = {}
        for e in self.events:
            if e.alertname == alertname and e.at_s <= at_s:
                state[e.label("cell")] = e
        return [e for e in state.values() if e.state == "firing"]

    def checked_events(self) -> list[AlertEvent]:
        """State changes in the cells promtool sees."""
        return [e for e in self.events if e.label("cell") in self.cells]


def simulate(spec: SloSpec, fleet: FleetSpec, scenario: Scenario) -> Run:
    """Run the twin, evaluating after every scrape, and export what the rules read."""
    twin = Twin(fleet, SEED, hours_hint=scenario.hours)
    evaluator = BurnRateEvaluator(spec, twin)
    evaluator.evaluate()  # the scrape at t = 0
    end_s = scenario.hours * HOUR_S
    pending = sorted(scenario.injections, key=lambda item: item[0])
    while twin.t < end_s - 1e-9:
        while pending and pending[0][0] <= twin.t + 1e-9:
            twin.apply(pending.pop(0)[1])
        twin.run_for(INTERVAL_S)
        evaluator.evaluate()
    assert not pending, "an injection lies beyond the end of the run"
    series = rule_inputs(twin, spec, scenario.cells, end_s)
    return Run(spec, end_s, tuple(evaluator.events), scenario.cells, tuple(series))


def rule_inputs(twin: Twin, spec: SloSpec, cells: Sequence[str], end_s: float) -> list[Series]:
    """The series the burn rules read in ``cells``: the objectives' models, the ``le`` they use."""
    models = sorted({o.model for o in spec.objectives})
    les = {repr(float(o.ttft_threshold_s)) for o in spec.objectives}
    out: list[Series] = []
    for name in RULE_INPUTS:
        assert name in twin.series_names()
        for model, cell in product(models, cells):
            for s in twin.query(name, {"model_name": model, "cell": cell}, start_s=0, end_s=end_s):
                if not name.endswith("_bucket") or s.label("le") in les:
                    out.append(s)
    assert {s.label("cell") for s in out} == set(cells)
    return out


# --- expected alerts, from the generated rule file ----------------------------------------------


@dataclass(frozen=True)
class AlertRule:
    rule: Mapping[str, Any]
    series_labels: Mapping[str, str]  # the recording rule's on the left of the `and`s

    def expected(self, cell: str, region: str) -> dict[str, dict[str, str]]:
        """One ``exp_alerts`` entry: the labels and rendered annotations Prometheus gives."""
        labels = {**self.series_labels, "cell": cell, "region": region, **self.rule["labels"]}
        annotations = {
            k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
            for k, v in self.rule["annotations"].items()
        }
        return {"exp_labels": labels, "exp_annotations": annotations}


def burn_alert_rules(rule_file: Mapping[str, Any]) -> dict[str, AlertRule]:
    out: dict[str, AlertRule] = {}
    for group in rule_file["groups"]:
        records = {r["record"]: r["labels"] for r in group["rules"] if "record" in r}
        for r in group["rules"]:
            if "alert" in r and "burn_tier" in r.get("labels", {}):
                long_record = f"slo:sli_error:ratio_rate{r['labels']['long_window']}"
                out[r["alert"]] = AlertRule(r, records[long_record])
    return out


def alert_rule_tests(run: Run, rules: Mapping[str, AlertRule]) -> list[dict[str, Any]]:
    """promtool checks around every state change, and a sweep over every burn alert.

    A check at time X lists the alerts the evaluator has firing at X. It is made only where no
    cell changes that alertname's state at X or X + 1 interval, so that an engine one step early
    or late in some cell still agrees there (the requirement's tolerance).
    """
    changes: dict[str, set[float]] = {name: set() for name in rules}
    wanted: set[tuple[float, str]] = set()
    for e in run.checked_events():
        assert e.at_s % INTERVAL_S == 0, f"evaluation off the scrape grid: {e}"
        changes[e.alertname].add(e.at_s)
        wanted |= {(e.at_s - 2 * INTERVAL_S, e.alertname), (e.at_s + INTERVAL_S, e.alertname)}
    sweep = [SWEEP_S * k for k in range(1, int(run.end_s // SWEEP_S) + 1)]
    wanted |= {(at_s, name) for at_s in sweep for name in rules}
    tests: list[dict[str, Any]] = []
    for at_s, name in sorted(wanted):
        if not 0 < at_s <= run.end_s or {at_s, at_s + INTERVAL_S} & changes[name]:
            continue
        firing = [e for e in run.firing_at(name, at_s) if e.label("cell") in run.cells]
        exp_alerts = []
        for e in sorted(firing, key=lambda e: e.label("cell")):
            expected = rules[name].expected(e.label("cell"), e.label("region"))
            # The evaluator's own labels are among those Prometheus puts on the alert.
            assert dict(e.labels).items() <= {**expected["exp_labels"], "alertname": name}.items()
            exp_alerts.append(expected)
        tests.append(
            {"eval_time": promtool_duration(at_s), "alertname": name, "exp_alerts": exp_alerts}
        )
    return tests


# --- promtool -----------------------------------------------------------------------------------


def promtool_agrees(run: Run, directory: Path) -> list[dict[str, Any]]:
    """Write the rule file and the test, run ``promtool test rules``; return the checks made."""
    rule_file = generate(run.spec).rule_file()
    tests = alert_rule_tests(run, burn_alert_rules(rule_file))
    series = to_promtool_input_series(
        run.series, interval_s=INTERVAL_S, start_s=0.0, end_s=run.end_s
    )
    assert_promtool_agrees(directory, rule_file, series, tests, interval_s=INTERVAL_S)
    return tests


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec() -> SloSpec:
    full = load_spec(EXAMPLES / "slo.yaml", SloSpec)
    objectives = [o for o in full.objectives if o.name in OBJECTIVES]
    assert {o.name for o in objectives} == set(OBJECTIVES)
    return full.model_copy(update={"objectives": objectives})


@pytest.fixture(scope="module")
def fleet(spec: SloSpec) -> FleetSpec:
    fleet = load_fleet(EXAMPLES / "fleet.yaml")
    # promtool evaluates on the sample grid: one sample per evaluation, at the same times.
    assert fleet.scrape_interval_s == INTERVAL_S == duration_s(spec.evaluation_interval)
    return fleet


@pytest.fixture(scope="module")
def outage(spec: SloSpec, fleet: FleetSpec) -> Run:
    return simulate(spec, fleet, SCENARIOS["outage"])


@pytest.fixture(scope="module")
def slow_burn(spec: SloSpec, fleet: FleetSpec) -> Run:
    return simulate(spec, fleet, SCENARIOS["slow_burn"])


@pytest.fixture(scope="module")
def blip(spec: SloSpec, fleet: FleetSpec) -> Run:
    return simulate(spec, fleet, SCENARIOS["blip"])


@pytest.fixture(scope="module")
def overload(spec: SloSpec, fleet: FleetSpec) -> Run:
    return simulate(spec, fleet, SCENARIOS["overload"])


def tier_alert(spec: SloSpec, objective_name: str, tier_name: str) -> str:
    o = next(o for o in spec.objectives if o.name == objective_name)
    return alert_name(o, next(t for t in spec.tiers if t.tier == tier_name))


# --- what the evaluator saw (so that the agreement below is not agreement on nothing) -----------


def test_the_outage_pages_both_eu_cells_and_the_fast_burn_resolves_after_the_heal(
    outage: Run,
) -> None:
    fast = tier_alert(outage.spec, "chat-availability", "fast")
    slow = tier_alert(outage.spec, "chat-availability", "slow")
    assert outage.fired(fast) == outage.fired(slow) == {"euw1-a", "euw1-b"}
    heal_s = SCENARIOS["outage"].injections[1][0]
    resolved = [e.at_s for e in outage.events if e.alertname == fast and e.state == "resolved"]
    assert resolved
    assert min(resolved) > heal_s
    assert not outage.firing_at(fast, outage.end_s)


def test_the_slow_burn_fires_every_availability_tier_in_its_cell_only(slow_burn: Run) -> None:
    for tier in ("fast", "slow", "drift", "budget"):
        alertname = tier_alert(slow_burn.spec, "chat-availability", tier)
        assert slow_burn.fired(alertname) == {"usw2-a"}, alertname


def test_the_blip_pages_and_the_pages_resolve_within_the_run(blip: Run) -> None:
    # Two minutes of total failure are over 3% of the hour's requests, above the fast tier's
    # 14.4 x 0.1% over 1 h and 5 m, and of the slow tier's 6 x 0.1% over 6 h (here: since t = 0)
    # and 30 m: by the workbook's arithmetic a blip that size pages. The agreement test below
    # shows that the real rule engine pages at the same evaluations.
    fast = tier_alert(blip.spec, "chat-availability", "fast")
    slow = tier_alert(blip.spec, "chat-availability", "slow")
    pages = {
        (e.alertname, e.label("cell"))
        for e in blip.events
        if e.state == "firing" and e.label("severity") == "page"
    }
    assert pages == set(product((fast, slow), ("euw1-a", "euw1-b")))
    assert not blip.firing_at(fast, blip.end_s)
    assert not blip.firing_at(slow, blip.end_s)


def test_the_overload_burns_the_ttft_budget_fast(overload: Run) -> None:
    assert overload.fired(tier_alert(overload.spec, "chat-ttft", "fast")) == {"use1-a"}


# --- the real rule engine agrees ----------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promtool_fires_the_same_alerts_at_the_same_evaluation(
    scenario: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run: Run = request.getfixturevalue(scenario)
    tests = promtool_agrees(run, tmp_path)
    checked = {(duration_s(t["eval_time"]), t["alertname"]) for t in tests}
    # Every state change was checked on one side at least; on both unless another change of its
    # alertname lies within an interval of a check.
    changes = run.checked_events()
    assert changes
    sides = [
        {(e.at_s - 2 * INTERVAL_S, e.alertname), (e.at_s + INTERVAL_S, e.alertname)} & checked
        for e in changes
    ]
    assert all(sides), [e for e, s in zip(changes, sides, strict=True) if not s]


def test_an_evaluator_two_evaluations_late_is_caught(blip: Run, tmp_path: Path) -> None:
    """The checks allow one interval either way, and no more."""
    end_s = HOUR_S + 600  # the pages have fired by then; a shorter run keeps promtool quick
    late = Run(
        blip.spec,
        end_s,
        tuple(
            AlertEvent(e.at_s + 2 * INTERVAL_S, e.alertname, e.state, e.labels, e.value)
            for e in blip.events
            if e.at_s + 2 * INTERVAL_S <= end_s
        ),
        blip.cells,
        tuple(
            Series(s.name, s.labels, s.t_s[s.t_s <= end_s], s.values[s.t_s <= end_s])
            for s in blip.series
        ),
    )
    assert late.events
    with pytest.raises(AssertionError, match="promtool disagrees"):
        promtool_agrees(late, tmp_path)
