"""Cause tickets and remediation guardrails on the demo fleet, and the real rule engine agreeing.

One seeded two-hour twin run carries every injection below. Each lands 5 s after a scrape, so the
next scrape (10 s later) is the first to show it and the evaluation after that scrape is the
first that can react. The evaluator is stepped after every scrape; its state changes are
checked against what the rules mean (``firedrill.detect.rules``), then against ``promtool test
rules``: the series the rules read are exported as promtool ``input_series`` (promtool time 0 is
the twin's first scrape), and for every state change at T promtool must show the evaluator's
alerts of that name at T - 1 interval and at T, labels and annotations included, with a sweep
every 10 minutes over every cause and guardrail alert so that promtool fires nothing the
evaluator does not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from firedrill.detect import causes
from firedrill.detect.causes import CauseEvaluator
from firedrill.detect.evaluator import AlertEvent
from firedrill.detect.promql import bucket_quantile
from firedrill.detect.rules import generate
from firedrill.detect.slo import SloSpec, duration_s
from firedrill.model.operations import (
    ClearThermal,
    InjectDcgmField,
    InjectThermal,
    Operation,
    PauseScaler,
    RebootNode,
    SetReplicas,
    Taint,
    UnpauseScaler,
    Untaint,
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
SEED = 11
INTERVAL_S = 15.0  # scrape = evaluation interval: fleet spec, SLO spec and promtool alike
OFFSET_S = 5.0  # injections land this long after a scrape
RUN_S = 7200.0
SWEEP_S = 600.0
CAUSE_GROUPS = ("causes", "remediation-guardrails")
XID_FIELD, ECC_DBE_FIELD = 230, 319
QUARANTINE = "gpu.corp/quarantine"


def node(cell: str, i: int) -> str:
    return f"gpu-{cell}-h100-serve-{i:04d}"


FATAL_NODE, FATAL_GPU, FATAL_AT_S = node("use1-a", 3), 3, 605.0
APP_ONCE_NODE, APP_ONCE_GPU = node("use1-a", 5), 1
APP_NODE, APP_GPU = node("use1-b", 7), 2
APP_XIDS_AT_S = ((905.0, 13.0), (1205.0, 31.0), (1505.0, 13.0))
ECC_NODE, ECC_GPU, ECC_AT_S = node("usw2-a", 10), 0, 1805.0
HOT_NODE, HOT_GPU, HOT_AT_S, COOL_AT_S = node("euw1-a", 4), 5, 2105.0, 3005.0
REBOOT_NODE, REBOOT_AT_S = node("usw2-b", 20), 2405.0
STORM_CELL, STORM_AT_S = "use1-c", 1205.0  # 21 quarantines, one a minute
CALM_CELL, CALM_AT_S = "euw1-b", 1235.0  # 20 quarantines: at the threshold, not above
FLAP_NODE, FLAP_AT_S = node("usw2-a", 30), (3005.0, 3305.0, 3605.0)  # taint, untaint, taint
# One llm-8b replica for the cell's traffic for 10 minutes, then all 128 back: queues, a full KV
# cache, preemptions, slow first tokens, then a weights pull the registry throttles.
SQUEEZE_MODEL, SQUEEZE_CELL, SQUEEZE_AT_S, RELEASE_AT_S = "llm-8b", "usw2-b", 1805.0, 2405.0


def taint(name: str) -> Taint:
    return Taint(name, QUARANTINE, "xid79", "NoSchedule")


INJECTIONS: tuple[tuple[float, Operation], ...] = (
    (FATAL_AT_S, InjectDcgmField(FATAL_NODE, FATAL_GPU, XID_FIELD, 79.0)),
    (905.0, InjectDcgmField(APP_ONCE_NODE, APP_ONCE_GPU, XID_FIELD, 13.0)),
    *((at, InjectDcgmField(APP_NODE, APP_GPU, XID_FIELD, xid)) for at, xid in APP_XIDS_AT_S),
    (ECC_AT_S, InjectDcgmField(ECC_NODE, ECC_GPU, ECC_DBE_FIELD, 1.0)),
    (HOT_AT_S, InjectThermal(HOT_NODE, HOT_GPU, 2.0)),
    (COOL_AT_S, ClearThermal(HOT_NODE, HOT_GPU)),
    (REBOOT_AT_S, RebootNode(REBOOT_NODE)),
    *((STORM_AT_S + 60 * k, taint(node(STORM_CELL, 10 + k))) for k in range(21)),
    *((CALM_AT_S + 60 * k, taint(node(CALM_CELL, 10 + k))) for k in range(20)),
    (FLAP_AT_S[0], taint(FLAP_NODE)),
    (FLAP_AT_S[1], Untaint(FLAP_NODE, QUARANTINE, "NoSchedule")),
    (FLAP_AT_S[2], taint(FLAP_NODE)),
    (SQUEEZE_AT_S, SetReplicas(SQUEEZE_MODEL, SQUEEZE_CELL, 1)),
    (SQUEEZE_AT_S, PauseScaler(SQUEEZE_MODEL, SQUEEZE_CELL, 1)),
    (RELEASE_AT_S, SetReplicas(SQUEEZE_MODEL, SQUEEZE_CELL, 128)),
    (RELEASE_AT_S, UnpauseScaler(SQUEEZE_MODEL, SQUEEZE_CELL)),
)

# Every series the cause and guardrail rules read.
RULE_INPUTS = (
    causes.TTFT_BUCKET,
    causes.WAITING,
    causes.RUNNING,
    causes.KV_USAGE,
    causes.PREEMPTIONS,
    causes.XID,
    causes.ECC_DBE,
    causes.ROW_REMAP,
    causes.PCIE_REPLAY,
    causes.GPU_TEMP,
    causes.POWER_VIOLATION,
    causes.REGISTRY_ERRORS,
    causes.NODE_CONDITION,
    causes.NODE_TAINT,
    causes.QUARANTINES,
    causes.CELL_NODES,
)


@dataclass(frozen=True)
class Run:
    """One evaluator's view of the run: its state changes and what fired after each step."""

    events: tuple[AlertEvent, ...]
    firing: Mapping[float, tuple[AlertEvent, ...]]  # evaluation time -> alerts firing then

    def of(self, alertname: str, **labels: str) -> list[AlertEvent]:
        return [
            e
            for e in self.events
            if e.alertname == alertname and all(e.label(k) == v for k, v in labels.items())
        ]

    def fired(self, alertname: str, label: str) -> set[str]:
        return {e.label(label) for e in self.of(alertname) if e.state == "firing"}


@dataclass(frozen=True)
class Drill:
    spec: SloSpec
    twin: Twin
    zero_filled: Run  # absent node/GPU series read as 0 (the default)
    as_recorded: Run  # absent_is_zero=False

    def first_shown(self, name: str, matchers: Mapping[str, str], value: float) -> float:
        """The first scrape at which a series has ``value``."""
        (series,) = self.twin.query(name, matchers, start_s=0.0, end_s=RUN_S)
        return float(series.t_s[np.flatnonzero(series.values == value)[0]])


def simulate(spec: SloSpec, fleet: FleetSpec) -> Drill:
    twin = Twin(fleet, SEED, hours_hint=RUN_S / 3600)
    evaluators = (CauseEvaluator(spec, twin), CauseEvaluator(spec, twin, absent_is_zero=False))
    firing: tuple[dict[float, tuple[AlertEvent, ...]], ...] = ({}, {})
    for ev, snap in zip(evaluators, firing, strict=True):
        ev.evaluate()  # the scrape at t = 0
        snap[twin.t] = tuple(ev.firing())
    pending = sorted(INJECTIONS, key=lambda item: item[0])
    while twin.t < RUN_S - 1e-9:
        twin.run_for(OFFSET_S)
        while pending and pending[0][0] <= twin.t + 1e-9:
            twin.apply(pending.pop(0)[1])
        twin.run_for(INTERVAL_S - OFFSET_S)
        for ev, snap in zip(evaluators, firing, strict=True):
            ev.evaluate()
            snap[twin.t] = tuple(ev.firing())
    assert not pending, "an injection lies beyond the end of the run"
    runs = [Run(tuple(ev.events), snap) for ev, snap in zip(evaluators, firing, strict=True)]
    return Drill(spec, twin, runs[0], runs[1])


@pytest.fixture(scope="module")
def spec() -> SloSpec:
    return load_spec(EXAMPLES / "slo.yaml", SloSpec)


@pytest.fixture(scope="module")
def drill(spec: SloSpec) -> Drill:
    fleet = load_fleet(EXAMPLES / "fleet.yaml")
    assert fleet.scrape_interval_s == INTERVAL_S == duration_s(spec.evaluation_interval)
    return simulate(spec, fleet)


def gpu_labels(name: str, gpu: int, cell: str, region: str, **extra: str) -> dict[str, str]:
    return {
        "Hostname": name,
        "node": name,
        "gpu": str(gpu),
        "cell": cell,
        "region": region,
        **extra,
    }


# --- what the evaluator raises ------------------------------------------------------------------


def test_a_fatal_xid_fires_at_the_first_evaluation_that_shows_it(drill: Drill) -> None:
    shown_s = drill.first_shown(causes.XID, {"Hostname": FATAL_NODE, "gpu": str(FATAL_GPU)}, 79)
    assert shown_s - FATAL_AT_S <= 120
    first = drill.zero_filled.of("DCGMXidFatal", node=FATAL_NODE)[0]
    assert (first.at_s, first.state, first.value) == (shown_s, "firing", 79.0)
    assert dict(first.labels) == gpu_labels(
        FATAL_NODE,
        FATAL_GPU,
        "use1-a",
        "us-east-1",
        alertname="DCGMXidFatal",
        severity="ticket",
        team="gpu-fleet",
    )


def test_a_fatal_xid_resolves_once_the_change_leaves_fifteen_minutes(drill: Drill) -> None:
    changes = drill.zero_filled.of("DCGMXidFatal", node=FATAL_NODE)
    assert [e.state for e in changes] == ["firing", "resolved"]
    # changes() needs both samples of the 0 -> 79 step inside [t - 15m, t]
    assert changes[1].at_s == changes[0].at_s + 900


def test_one_app_xid_is_no_ticket_and_a_second_within_the_hour_is(drill: Drill) -> None:
    assert not drill.zero_filled.of("DCGMXidAppRepeated", node=APP_ONCE_NODE)
    second_s = drill.first_shown(causes.XID, {"Hostname": APP_NODE, "gpu": str(APP_GPU)}, 31)
    repeated = drill.zero_filled.of("DCGMXidAppRepeated", node=APP_NODE)
    assert repeated[0].state == "firing"
    assert repeated[0].at_s == second_s
    assert dict(repeated[0].labels) == gpu_labels(
        APP_NODE,
        APP_GPU,
        "use1-b",
        "us-east-1",
        alertname="DCGMXidAppRepeated",
        severity="ticket",
        team="inference",
    )
    # Two of its three changes (0 -> 13 -> 31 -> 13) stay within the hour until the hour after 31.
    assert repeated[1].state == "resolved"
    assert repeated[1].at_s == second_s + 3600


def test_a_double_bit_ecc_error_tickets_the_gpu_fleet(drill: Drill) -> None:
    shown_s = drill.first_shown(causes.ECC_DBE, {"Hostname": ECC_NODE, "gpu": str(ECC_GPU)}, 1.0)
    ecc = drill.zero_filled.of("DCGMEccDbe", node=ECC_NODE)
    assert [(e.at_s, e.state) for e in ecc] == [(shown_s, "firing"), (shown_s + 3600, "resolved")]
    assert ecc[0].label("severity") == "ticket"
    assert ecc[0].label("gpu") == str(ECC_GPU)
    assert ecc[0].label("Hostname") == ECC_NODE


def test_a_thermal_violation_waits_out_its_two_minutes(drill: Drill) -> None:
    hot_s = drill.first_shown(causes.GPU_TEMP, {"Hostname": HOT_NODE, "gpu": str(HOT_GPU)}, 92.0)
    thermal = drill.zero_filled.of("GPUThermalViolation", node=HOT_NODE)
    assert [(e.at_s, e.state) for e in thermal] == [
        (hot_s + 120, "firing"),
        (COOL_AT_S + INTERVAL_S - OFFSET_S, "resolved"),
    ]
    assert dict(thermal[0].labels) == gpu_labels(
        HOT_NODE,
        HOT_GPU,
        "euw1-a",
        "eu-west-1",
        alertname="GPUThermalViolation",
        severity="ticket",
        team="gpu-fleet",
    )
    # Not firing during the hold.
    held = [
        at_s
        for at_s, alerts in drill.zero_filled.firing.items()
        if hot_s <= at_s < hot_s + 120 and any(e.alertname == "GPUThermalViolation" for e in alerts)
    ]
    assert not held


def test_a_rebooting_node_is_not_ready_after_two_minutes(drill: Drill) -> None:
    down_s = REBOOT_AT_S + INTERVAL_S - OFFSET_S
    not_ready = drill.zero_filled.of("NodeNotReady", node=REBOOT_NODE)
    assert not_ready[0].state == "firing"
    assert not_ready[0].at_s == down_s + 120
    assert dict(not_ready[0].labels) == {
        "alertname": "NodeNotReady",
        "node": REBOOT_NODE,
        "cell": "usw2-b",
        "region": "us-west-2",
        "condition": "Ready",
        "status": "false",
        "severity": "ticket",
        "team": "gpu-fleet",
    }


def test_a_quarantine_storm_pages_for_its_cell_only(drill: Drill) -> None:
    assert drill.zero_filled.fired("QuarantineRateAnomalous", "cell") == {STORM_CELL}
    storm = drill.zero_filled.of("QuarantineRateAnomalous", cell=STORM_CELL)
    last_taint_s = STORM_AT_S + 60 * 20
    assert storm[0].state == "firing"
    assert storm[0].at_s == last_taint_s + INTERVAL_S - OFFSET_S
    assert storm[0].value == 21.0
    assert dict(storm[0].labels) == {
        "alertname": "QuarantineRateAnomalous",
        "cell": STORM_CELL,
        "region": "us-east-1",
        "severity": "page",
        "team": "gpu-fleet",
    }
    # The first quarantine leaves the hour, and 20 an hour is within the guardrail.
    assert storm[1].state == "resolved"
    assert storm[1].at_s == STORM_AT_S + INTERVAL_S - OFFSET_S + 3600


def test_two_quarantines_of_a_node_within_ninety_minutes_are_flapping(drill: Drill) -> None:
    assert drill.zero_filled.fired("NodeRemediationFlapping", "node") == {FLAP_NODE}
    (flapping,) = drill.zero_filled.of("NodeRemediationFlapping", node=FLAP_NODE)
    assert flapping.at_s == FLAP_AT_S[2] + INTERVAL_S - OFFSET_S
    assert flapping.label("cell") == "usw2-a"
    assert flapping.label("severity") == "ticket"


@pytest.mark.parametrize(
    "alertname", ["VllmQueueDeep", "KVCacheHigh", "VllmPreemptions", "PodTTFTHigh"]
)
def test_a_squeezed_pool_raises_the_serving_tickets_after_five_minutes(
    drill: Drill, alertname: str
) -> None:
    fired = [e for e in drill.zero_filled.of(alertname) if e.state == "firing"]
    assert {(e.label("cell"), e.label("model_name")) for e in fired} == {
        (SQUEEZE_CELL, SQUEEZE_MODEL)
    }
    assert fired[0].at_s >= SQUEEZE_AT_S + INTERVAL_S - OFFSET_S + 300  # for: 5m
    assert dict(fired[0].labels) == {
        "alertname": alertname,
        "cell": SQUEEZE_CELL,
        "region": "us-west-2",
        "model_name": SQUEEZE_MODEL,
        "severity": "ticket",
        "team": "inference",
    }


def test_registry_throttling_is_a_region_scoped_ticket(drill: Drill) -> None:
    fired = [e for e in drill.zero_filled.of("HydrateOrigin5xx") if e.state == "firing"]
    assert fired
    assert all(e.at_s > RELEASE_AT_S for e in fired)
    assert {e.label("cell") for e in fired} == {"region:us-west-2"}
    assert {k for k, _ in fired[0].labels} == {
        "alertname",
        "cell",
        "region",
        "code",
        "severity",
        "team",
    }


def test_series_read_as_recorded_miss_what_appears_at_once(drill: Drill) -> None:
    """Without the default 0, a GPU's XID series is born at 79: no change, no ticket."""
    assert drill.zero_filled.of("DCGMXidFatal", node=FATAL_NODE)
    assert not drill.as_recorded.of("DCGMXidFatal", node=FATAL_NODE)
    assert not drill.as_recorded.of("QuarantineRateAnomalous")


def test_the_evaluator_mirrors_every_cause_and_guardrail_rule(spec: SloSpec) -> None:
    class Silent:
        def series_names(self) -> Sequence[str]:
            return []

        def query(self, *args: Any, **kwargs: Any) -> list[Series]:
            return []

        def instant(self, *args: Any, **kwargs: Any) -> tuple[float, list[Any], Any]:
            return 0.0, [], np.zeros(0)

    ev = CauseEvaluator(spec, Silent())
    rule_file = generate(spec).rule_file()
    rules = [r for g in rule_file["groups"] if g["name"] in CAUSE_GROUPS for r in g["rules"]]
    assert sorted(r.alertname for r in ev.rules) == sorted(r["alert"] for r in rules)
    assert ev.evaluate() == []
    assert ev.evaluate() == []  # no newer scrape: nothing to evaluate


def test_bucket_quantile_interpolates_as_prometheus_does() -> None:
    buckets = [(1.0, 50.0), (2.0, 90.0), (4.0, 100.0), (math.inf, 100.0)]
    assert bucket_quantile(0.5, buckets) == 1.0
    assert bucket_quantile(0.95, buckets) == 2.0 + 2.0 * (5.0 / 10.0)
    assert bucket_quantile(0.99, [(1.0, 0.0), (math.inf, 10.0)]) == 1.0  # top bucket: its floor
    assert math.isnan(bucket_quantile(0.99, [(1.0, 0.0), (2.0, 0.0)]))  # no +Inf bucket
    assert math.isnan(bucket_quantile(0.99, [(1.0, 0.0), (math.inf, 0.0)]))  # no observations


# --- the real rule engine agrees ----------------------------------------------------------------


def go_value(v: float) -> str:
    """A float as Go's ``fmt`` prints it with %v (what ``{{ $value }}`` renders)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    d = Decimal(repr(v))
    sign, digits, exponent = d.normalize().as_tuple()
    assert isinstance(exponent, int)
    exp10 = len(digits) + exponent - 1
    if exp10 < -4 or exp10 >= 21:
        mantissa = "".join(map(str, digits))
        head = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
        return f"{'-' if sign else ''}{head}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    return format(d.normalize(), "f")


def render(template: str, labels: Mapping[str, str], value: float) -> str:
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return out.replace("{{ $value }}", go_value(value))


def cause_rules(spec: SloSpec) -> tuple[dict[str, Any], dict[str, Mapping[str, Any]]]:
    """The rule file with the cause and guardrail groups, and those rules by alert name."""
    groups = [g for g in generate(spec).rule_file()["groups"] if g["name"] in CAUSE_GROUPS]
    assert [g["name"] for g in groups] == list(CAUSE_GROUPS)
    return {"groups": groups}, {r["alert"]: r for g in groups for r in g["rules"]}


def rule_inputs(twin: Twin, *, zero_filled: bool) -> list[Series]:
    """The series the rules read, from the first scrape; a node/GPU series the twin has not
    stored yet is 0 there when ``zero_filled`` (as its exporter would publish it), absent
    otherwise."""
    out: list[Series] = []
    grid = np.asarray(twin.store.times)
    for name in RULE_INPUTS:
        for s in twin.query(name, start_s=0.0, end_s=RUN_S):
            assert not np.isnan(s.values).any(), f"a gap in {s.name}{s.labels}"
            if zero_filled and name in causes.ZERO_UNTIL_SEEN and s.t_s.size:
                before = grid[grid < s.t_s[0]]  # the exporter published 0 before the first change
                t_s = np.concatenate([before, s.t_s])
                values = np.concatenate([np.zeros(before.size), s.values])
                out.append(Series(s.name, s.labels, t_s, values))
            else:
                out.append(s)
    assert {s.name for s in out} >= {causes.TTFT_BUCKET, causes.XID, causes.QUARANTINES}
    return out


def alert_rule_tests(run: Run, rules: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checks one interval before and at every state change, and a sweep over every alert."""
    wanted = {(at_s, name) for at_s in np.arange(SWEEP_S, RUN_S + 1, SWEEP_S) for name in rules}
    for e in run.events:
        assert e.at_s % INTERVAL_S == 0, f"evaluation off the scrape grid: {e}"
        wanted |= {(e.at_s - INTERVAL_S, e.alertname), (e.at_s, e.alertname)}
    tests: list[dict[str, Any]] = []
    for at_s, name in sorted(wanted):
        if not 0 < at_s <= RUN_S:
            continue
        exp_alerts = []
        for e in run.firing[float(at_s)]:
            if e.alertname != name:
                continue
            labels = {k: v for k, v in e.labels if k != "alertname"}
            annotations = {
                k: render(v, labels, e.value) for k, v in rules[name].get("annotations", {}).items()
            }
            exp_alerts.append({"exp_labels": labels, "exp_annotations": annotations})
        tests.append(
            {
                "eval_time": promtool_duration(float(at_s)),
                "alertname": name,
                "exp_alerts": exp_alerts,
            }
        )
    return tests


def promtool_agrees(
    spec: SloSpec, run: Run, series: Sequence[Series], directory: Path
) -> list[dict[str, Any]]:
    """Write the rules, the series and the checks; run ``promtool test rules``."""
    rule_file, rules = cause_rules(spec)
    tests = alert_rule_tests(run, rules)
    assert_promtool_agrees(
        directory,
        rule_file,
        to_promtool_input_series(series, interval_s=INTERVAL_S, start_s=0.0, end_s=RUN_S),
        tests,
        interval_s=INTERVAL_S,
    )
    return tests


MODES: dict[str, Callable[[Drill], Run]] = {
    "zero_filled": lambda d: d.zero_filled,
    "as_recorded": lambda d: d.as_recorded,
}


@pytest.mark.parametrize("mode", list(MODES))
def test_promtool_fires_the_same_alerts_at_the_same_evaluation(
    mode: str, drill: Drill, tmp_path: Path
) -> None:
    run = MODES[mode](drill)
    series = rule_inputs(drill.twin, zero_filled=mode == "zero_filled")
    tests = promtool_agrees(drill.spec, run, series, tmp_path)
    # The checks are about something: every kind of alert injected here fired and was checked
    # while firing (in the zero-filled reading; as recorded, fresh series show no change).
    checked_firing = {t["alertname"] for t in tests if t["exp_alerts"]}
    if mode == "zero_filled":
        assert checked_firing >= {
            "DCGMXidFatal",
            "DCGMXidAppRepeated",
            "DCGMEccDbe",
            "GPUThermalViolation",
            "NodeNotReady",
            "QuarantineRateAnomalous",
            "NodeRemediationFlapping",
            "QuarantinedFractionHigh",
            "VllmQueueDeep",
            "KVCacheHigh",
            "VllmPreemptions",
            "PodTTFTHigh",
            "HydrateOrigin5xx",
        }
    else:
        assert checked_firing >= {"GPUThermalViolation", "NodeNotReady", "PodTTFTHigh"}


def test_an_evaluator_one_evaluation_late_is_caught(drill: Drill, tmp_path: Path) -> None:
    """The checks allow no slack: the same alerts one evaluation later fail them."""
    run = drill.zero_filled
    times = sorted(run.firing)
    late = Run(
        tuple(
            AlertEvent(e.at_s + INTERVAL_S, e.alertname, e.state, e.labels, e.value)
            for e in run.events
            if e.at_s + INTERVAL_S <= RUN_S
        ),
        {t: run.firing[times[i - 1]] if i else () for i, t in enumerate(times)},
    )
    with pytest.raises(AssertionError, match="promtool disagrees"):
        promtool_agrees(drill.spec, late, rule_inputs(drill.twin, zero_filled=True), tmp_path)
