"""Quality and prefill/decode alerting: the rules, their in-process evaluators, and promtool.

The evaluators must fire where Prometheus fires: each test runs the twin, evaluates at every
scrape, then hands the same series and rule file to ``promtool test rules`` with the alerts the
evaluator had firing at times where no alert changes state within an evaluation interval.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from firedrill.detect.disagg import PdImbalanceAlerting, pd_group
from firedrill.detect.evaluator import AlertEvent
from firedrill.detect.golden import QualityEvaluator
from firedrill.detect.imbalance import PdImbalanceEvaluator
from firedrill.detect.quality import ALERT, QualityAlerting, QualityTier, quality_group
from firedrill.detect.rules import generate
from firedrill.detect.slo import SloSpec
from firedrill.model import operations as ops
from firedrill.model.series import Labels, Series, labels_of
from firedrill.model.spec import WeightsSpec
from firedrill.specfile import load_fleet, load_spec
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import to_promtool_input_series
from tests.detect.promtool import assert_promtool_agrees
from tests.twin import fleets

INTERVAL_S = 15.0
ROOT = Path(__file__).resolve().parents[2]
NEW = "sha256:" + "ba" * 32

# --- the rules ----------------------------------------------------------------------------------


def test_tiers_carry_their_drop_and_threshold() -> None:
    q = QualityAlerting()
    group = quality_group(q, "15s")
    assert group["name"] == "model-quality"
    rules = {r["labels"]["golden_drop_pts"]: r for r in group["rules"]}
    assert set(rules) == {"25", "10", "5"}
    assert {r["alert"] for r in group["rules"]} == {ALERT}
    assert rules["10"]["labels"]["severity"] == "page"
    assert rules["5"]["labels"]["severity"] == "ticket"
    # failure ratio above the 97% baseline's 3% plus the drop
    assert "> 0.08\n" in rules["5"]["expr"]
    assert "> 0.28\n" in rules["25"]["expr"]
    assert "by (cell, region, model_name, digest)" in rules["5"]["expr"]
    assert rules["5"]["for"] == "2m"
    names = [g["name"] for g in generate(load_spec(ROOT / "examples/slo.yaml", SloSpec)).groups]
    assert names[-2:] == ["model-quality", "prefill-decode"]


def test_quality_spec_rejects_duplicate_tiers() -> None:
    with pytest.raises(ValueError, match="drop_pts"):
        QualityAlerting(tiers=[QualityTier(drop_pts=5, severity="page")] * 2)


# --- the evaluator on synthetic counters ----------------------------------------------------------


class Counters:
    """A ``Signals`` stand-in: golden-set counters of one digest in one cell, set by the test."""

    def __init__(self) -> None:
        self.t = 0.0
        self.passed = 0.0
        self.failed = 0.0

    def labels(self, result: str) -> Labels:
        return labels_of(model_name="m", digest=NEW, cell="c", region="r", result=result)

    def series_names(self) -> Sequence[str]:
        return ["firedrill_golden_set_requests_total"]

    def query(
        self, name: str, matchers: Mapping[str, str] | None = None, *, start_s: float, end_s: float
    ) -> Sequence[Series]:
        raise NotImplementedError

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        values = np.array([self.passed, self.failed])
        return self.t, [self.labels("pass"), self.labels("fail")], values


def drive(
    ev: QualityEvaluator, c: Counters, seconds: float, pass_per_s: float, fail_per_s: float
) -> list[AlertEvent]:
    out: list[AlertEvent] = []
    for _ in range(int(seconds / INTERVAL_S)):
        c.t += INTERVAL_S
        c.passed += pass_per_s * INTERVAL_S
        c.failed += fail_per_s * INTERVAL_S
        out += ev.evaluate()
    return out


def test_fires_after_the_hold_and_resolves_when_probes_stop() -> None:
    c = Counters()
    ev = QualityEvaluator(QualityAlerting(), c)
    ev.evaluate()
    assert drive(ev, c, 600, 0.97, 0.03) == []  # the signed-off rate: nothing
    fired = drive(ev, c, 600, 0.6, 0.4)
    drops = sorted(float(dict(e.labels)["golden_drop_pts"]) for e in fired)
    assert [e.state for e in fired] == ["firing"] * 3
    assert drops == [5.0, 10.0, 25.0]
    assert all(dict(e.labels)["digest"] == NEW for e in fired)
    # rolled back: no more probes; the window empties below min_probes and the alerts resolve
    resolved = drive(ev, c, 900, 0.0, 0.0)
    assert sorted(e.state for e in resolved) == ["resolved"] * 3
    assert ev.firing() == []


def test_too_few_probes_never_page() -> None:
    c = Counters()
    ev = QualityEvaluator(QualityAlerting(), c)
    assert drive(ev, c, 1800, 0.05, 0.1) == []  # 67% failing, but 90 probes per 10 minutes


# --- promtool agrees -----------------------------------------------------------------------------


def _firing_at(events: Sequence[AlertEvent], at_s: float) -> list[Labels]:
    state: dict[Labels, bool] = {}
    for e in sorted(events, key=lambda e: e.at_s):
        if e.at_s <= at_s:
            state[e.labels] = e.state == "firing"
    return sorted(k for k, v in state.items() if v)


def _render(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)


def _tests(
    events: Sequence[AlertEvent], rules: Sequence[Mapping[str, Any]], end_s: float, alert: str
) -> list[dict[str, Any]]:
    changes = {e.at_s for e in events}
    annotations = {
        r["labels"].get("golden_drop_pts", r["labels"].get("saturated")): r for r in rules
    }
    tests = []
    for k in range(1, int(end_s // 60) + 1):
        at = 60.0 * k
        if {at - INTERVAL_S, at, at + INTERVAL_S} & changes:
            continue
        exp = []
        for labels in _firing_at(events, at):
            d = {key: v for key, v in labels if key != "alertname"}
            rule = annotations[d.get("golden_drop_pts", d.get("saturated"))]
            exp.append(
                {
                    "exp_labels": d,
                    "exp_annotations": {
                        key: _render(v, d) for key, v in rule.get("annotations", {}).items()
                    },
                }
            )
        tests.append({"eval_time": f"{int(at)}s", "alertname": alert, "exp_alerts": exp})
    return tests


def _simulate(
    twin: Twin,
    evaluate: Callable[[], list[AlertEvent]],
    end_s: float,
    at: dict[float, ops.Operation],
) -> list[AlertEvent]:
    events = evaluate()
    while twin.t < end_s - 1e-9:
        for t_op, op in at.items():
            if abs(twin.t - t_op) < 1e-9:
                twin.apply(op)
        twin.advance(INTERVAL_S)
        events += evaluate()
    return events


def _export(twin: Twin, name: str, end_s: float) -> str:
    return to_promtool_input_series(
        list(twin.query(name, start_s=0.0, end_s=end_s)),
        interval_s=INTERVAL_S,
        start_s=0.0,
        end_s=end_s,
    )


def test_model_quality_burn_fires_where_promtool_fires(tmp_path: Path) -> None:
    m = fleets.model(name="m", weights_gb=16.0, tp=1).model_copy(
        update={"weights": WeightsSpec(digest=fleets.D), "golden_probes_per_s": 1.0}
    )
    twin = Twin(fleets.fleet(regions={"r": (2, 4, 8, 5.0)}, m=m), 5, hours_hint=0.6)
    q = QualityAlerting()
    ev = QualityEvaluator(q, twin)
    end = 1800.0
    events = _simulate(
        twin,
        ev.evaluate,
        end,
        {
            60.0: ops.SetWeightsQuality("m", NEW, 0.55),
            120.0: ops.StartRollout("m", NEW, 25),
            900.0: ops.AbortRollout("m"),
        },
    )
    fired = [e for e in events if e.state == "firing"]
    assert {dict(e.labels)["cell"] for e in fired} == {"c0-0", "c0-1"}
    assert {dict(e.labels)["digest"] for e in fired} == {NEW}  # the stable digest keeps passing
    assert any(e.state == "resolved" for e in events)
    group = quality_group(q, "15s")
    tests = _tests(events, group["rules"], end, ALERT)
    assert any(t["exp_alerts"] for t in tests)
    assert any(not t["exp_alerts"] for t in tests)
    series = _export(twin, "firedrill_golden_set_requests_total", end)
    assert_promtool_agrees(tmp_path, {"groups": [group]}, series, tests, interval_s=INTERVAL_S)


def test_prefill_decode_imbalance_fires_where_promtool_fires(tmp_path: Path) -> None:
    twin = Twin(load_fleet(ROOT / "examples/fleet-pd.yaml"), 3, hours_hint=0.5)
    p = PdImbalanceAlerting()
    ev = PdImbalanceEvaluator(p, twin)
    end = 1500.0
    events = _simulate(
        twin,
        ev.evaluate,
        end,
        {
            120.0: ops.SetRequestShape("llm-70b", 2000.0, 250.0),
            720.0: ops.SetPrefillDecodeSplit("llm-70b", "use1-pd-a", 0.55),
        },
    )
    firing = [e for e in events if e.state == "firing"]
    assert {dict(e.labels)["saturated"] for e in firing} == {"prefill"}
    assert {dict(e.labels)["cell"] for e in firing} == {"use1-pd-a", "use1-pd-b"}
    resolved = [e for e in events if e.state == "resolved"]
    assert [dict(e.labels)["cell"] for e in resolved] == ["use1-pd-a"]  # only the rebalanced one
    group = pd_group(p, "15s")
    tests = _tests(events, group["rules"], end, "PrefillDecodeImbalance")
    series = _export(twin, "firedrill_pd_utilization", end)
    assert_promtool_agrees(tmp_path, {"groups": [group]}, series, tests, interval_s=INTERVAL_S)


def test_a_fleet_without_disaggregation_never_evaluates() -> None:
    twin = Twin(load_fleet(ROOT / "examples/fleet.yaml"), 3, hours_hint=0.1)
    ev = PdImbalanceEvaluator(PdImbalanceAlerting(), twin)
    twin.advance(60)
    assert ev.evaluate() == []
