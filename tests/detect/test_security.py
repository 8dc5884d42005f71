"""Security tripwires on the twin, and the real rule engine agreeing with the evaluator.

One seeded 20-minute run of the demo fleet carries: an exfiltration from an acme session in use1-a
(a deny spike to base64-looking subdomains), a prompt injection making acme sessions in use1-b call
write and money tools mostly without approval, then the compromised pod quarantined and the
injecting content blocked. The evaluator is stepped after every scrape; ``promtool test rules``
must then show the same security alerts (labels and annotations) at every state change, one
interval before it, and on a sweep every two minutes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from firedrill.detect import security
from firedrill.detect.evaluator import AlertEvent
from firedrill.detect.rules import generate, security_group
from firedrill.detect.security import TRIPWIRES, SecurityEvaluator, Tripwire
from firedrill.detect.slo import SloSpec
from firedrill.model import operations as ops
from firedrill.model.series import Series
from firedrill.specfile import load_fleet, load_spec
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import promtool_duration, to_promtool_input_series
from tests.detect.promtool import assert_promtool_agrees

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED = 3
INTERVAL_S = 15.0
RUN_S = 1200.0
SWEEP_S = 120.0
HASH_W = "sha256:" + "57" * 32
HASH_M = "sha256:" + "3e" * 32


@pytest.fixture(scope="module")
def slo() -> SloSpec:
    return load_spec(EXAMPLES / "slo.yaml", SloSpec)


@dataclass
class Drill:
    twin: Twin
    events: list[AlertEvent]
    firing: dict[float, list[AlertEvent]]  # evaluation time -> alerts firing after it
    pod: str


@pytest.fixture(scope="module")
def drill(slo: SloSpec) -> Drill:
    twin = Twin(load_fleet(EXAMPLES / "fleet.yaml"), SEED, hours_hint=RUN_S / 3600)
    ev = SecurityEvaluator(slo, twin)
    ev.evaluate()
    firing: dict[float, list[AlertEvent]] = {0.0: ev.firing()}
    pod = ""
    while twin.t < RUN_S - 1e-9:
        at = twin.t
        if at == 180.0:
            twin.apply(ops.InjectExfiltration("acme", "use1-a", 2.0))
            twin.apply(ops.InjectPromptInjection("acme", "use1-b", HASH_W, "write", 0.3, 0.2))
            twin.apply(ops.InjectPromptInjection("acme", "use1-b", HASH_M, "money", 0.1, 0.2))
        if at == 480.0:
            pod = next(
                r.pod
                for r in twin.egress_records(start_s=0.0, end_s=at, tenant="acme")
                if r.dest_class == "base64-subdomain"
            )
            twin.apply(ops.QuarantinePod(pod))
        if at == 600.0:
            twin.apply(ops.BlockContentHash("acme", HASH_W))
            twin.apply(ops.BlockContentHash("acme", HASH_M))
        twin.advance(INTERVAL_S)
        ev.evaluate()
        firing[twin.t] = ev.firing()
    return Drill(twin, list(ev.events), firing, pod)


def test_the_evaluator_mirrors_the_rule_file(slo: SloSpec) -> None:
    rules = {r["alert"]: r for r in security_group(slo)["rules"]}
    assert sorted(rules) == sorted(w.alertname for w in TRIPWIRES)
    for w in TRIPWIRES:
        assert re.sub(r"\s+", " ", rules[w.alertname]["expr"]) == w.expr
        assert rules[w.alertname]["labels"] == {"severity": "security", "team": "security"}


def test_a_rule_file_that_says_something_else_is_refused(
    slo: SloSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = tuple(
        Tripwire(w.alertname, w.metric, w.matchers, w.by, w.threshold + 1, w.range)
        if w.alertname == "EgressExfilPattern"
        else w
        for w in TRIPWIRES
    )
    monkeypatch.setattr(security, "TRIPWIRES", changed)
    with pytest.raises(ValueError, match="EgressExfilPattern"):
        SecurityEvaluator(slo, Twin(load_fleet(EXAMPLES / "fleet.yaml"), SEED))


def _fired(d: Drill, name: str) -> list[AlertEvent]:
    return [e for e in d.events if e.alertname == name and e.state == "firing"]


def test_nothing_fires_before_the_injections(drill: Drill) -> None:
    assert all(e.at_s > 180.0 for e in drill.events)
    assert not any(drill.firing[t] for t in drill.firing if t <= 180.0)


def test_the_exfiltration_pattern_pages_security_for_the_tenant_and_cell(drill: Drill) -> None:
    (fired,) = _fired(drill, "EgressExfilPattern")
    assert fired.at_s <= 180.0 + 2 * INTERVAL_S  # ~2 denials a second: over 10 in 15 s
    assert fired.label("tenant") == "acme"
    assert fired.label("cell") == "use1-a"
    assert fired.label("region") == "us-east-1"
    assert fired.label("severity") == "security"
    # quarantined at 480 s: the proxy sees nothing more, the 5 m increase falls below 10
    (resolved,) = [
        e for e in drill.events if e.alertname == "EgressExfilPattern" and e.state == "resolved"
    ]
    assert 480.0 < resolved.at_s <= 480.0 + 300.0 + INTERVAL_S


def test_unapproved_write_and_money_calls_page_security(drill: Drill) -> None:
    for name in ("WriteToolWithoutApproval", "MoneyToolWithoutApproval"):
        fired = _fired(drill, name)
        assert fired, name
        assert {(e.label("tenant"), e.label("cell")) for e in fired} == {("acme", "use1-b")}
    # the content blocked at retrieval at 600 s: no call after it, so they resolve
    assert not any(drill.firing[t] for t in drill.firing if t > 600.0 + 300.0 + INTERVAL_S)


def test_globex_raises_nothing(drill: Drill) -> None:
    assert {e.label("tenant") for e in drill.events} == {"acme"}


# -- promtool ----------------------------------------------------------------------------------


def _render(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)


def _inputs(twin: Twin) -> list[Series]:
    out: list[Series] = []
    for name in (security.CONNECTIONS, security.TOOLGW_CALLS):
        for s in twin.query(name, start_s=0.0, end_s=RUN_S):
            assert not np.isnan(s.values).any()
            out.append(s)
    return out


def test_promtool_fires_the_same_tripwires_at_the_same_evaluation(
    slo: SloSpec, drill: Drill, tmp_path: Path
) -> None:
    groups = [g for g in generate(slo).rule_file()["groups"] if g["name"] == "security-tripwires"]
    rules: dict[str, Mapping[str, Any]] = {r["alert"]: r for g in groups for r in g["rules"]}
    wanted = {(float(t), n) for t in np.arange(SWEEP_S, RUN_S + 1, SWEEP_S) for n in rules}
    for e in drill.events:
        wanted |= {(e.at_s - INTERVAL_S, e.alertname), (e.at_s, e.alertname)}
    tests: list[dict[str, Any]] = []
    for at_s, name in sorted(wanted):
        if not 0 < at_s <= RUN_S:
            continue
        exp = []
        for e in drill.firing[at_s]:
            if e.alertname == name:
                labels = {k: v for k, v in e.labels if k != "alertname"}
                notes = {k: _render(v, labels) for k, v in rules[name]["annotations"].items()}
                exp.append({"exp_labels": labels, "exp_annotations": notes})
        tests.append({"eval_time": promtool_duration(at_s), "alertname": name, "exp_alerts": exp})
    assert_promtool_agrees(
        tmp_path,
        {"groups": groups},
        to_promtool_input_series(
            _inputs(drill.twin), interval_s=INTERVAL_S, start_s=0.0, end_s=RUN_S
        ),
        tests,
        interval_s=INTERVAL_S,
    )
    checked = {t["alertname"] for t in tests if t["exp_alerts"]}
    assert checked == {"EgressExfilPattern", "WriteToolWithoutApproval", "MoneyToolWithoutApproval"}
