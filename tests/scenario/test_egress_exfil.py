"""Reference self-check 4 as a scenario: an exfiltration pattern in acme's sandboxes is contained
narrowest first, its evidence is preserved, and other tenants are untouched.

The scenario asserts its outcome in its ``expect`` list; here the same run is compared, tenant by
tenant, with a run of the same scenario without the injection: globex's sandbox sessions, egress
and tool-call records, its counters, and every pool's TTFT are equal bit for bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.scenario.expect import evaluate
from firedrill.scenario.run import ScenarioRun, run_scenario
from firedrill.scenario.security_check import evidence_bundles, security_incidents
from firedrill.specfile import load_scenario
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld, embedded_world

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "egress-exfil-acme.yaml"
runner = CliRunner()


def twin_of(run: ScenarioRun) -> Twin:
    """The embedded twin the scenario ran on (these tests look at its state)."""
    assert isinstance(run.world, TwinWorld)
    return run.world.twin


@pytest.fixture(scope="module")
def runs() -> tuple[ScenarioRun, ScenarioRun]:
    spec, fleet, slo, policy = load_scenario(SCENARIO)
    treated = run_scenario(spec, fleet, slo, policy, make_world=embedded_world)
    quiet = spec.model_copy(update={"timeline": [], "expect": []})
    control = run_scenario(quiet, fleet, slo, policy, make_world=embedded_world)
    return treated, control


def test_every_expectation_holds(runs: tuple[ScenarioRun, ScenarioRun]) -> None:
    treated, _ = runs
    results = evaluate(treated, list(treated.spec.expect))
    assert [r.check for r in results if not r.passed] == []
    assert len(results) == 4


def test_one_security_incident_contained_narrowest_first(
    runs: tuple[ScenarioRun, ScenarioRun],
) -> None:
    treated, control = runs
    assert security_incidents(control) == []
    (inc,) = security_incidents(treated)
    assert str(inc.sev) == "SEV1"
    assert inc.severity.history[0].axis == "security"
    assert treated.responder is not None
    applied = [r.entry for r in treated.responder.records(inc.id) if r.applied]
    assert [(e.kind, e.target) for e in applied[:2]] == [
        ("kill_switch", "acme"),
        ("warm_pool", "acme"),
    ]
    assert all(e.target != "*" for e in applied)
    assert treated.world.flags() == {"acme.max_side_effect": "read"}
    (pod,) = [e.target for e in applied if e.kind == "pod_quarantine"]
    assert treated.world.sandbox.has_pod(pod)
    refused = [r.entry for r in treated.responder.records(inc.id) if r.entry.status == "refused"]
    assert [e.kind for e in refused] == ["delete_pod_under_investigation"]


def test_other_tenants_are_untouched_bit_for_bit(runs: tuple[ScenarioRun, ScenarioRun]) -> None:
    treated, control = runs
    t, c = twin_of(treated), twin_of(control)
    assert t.sandbox.tenant_snapshot("acme") != c.sandbox.tenant_snapshot("acme")
    assert t.sandbox.tenant_snapshot("globex") == c.sandbox.tenant_snapshot("globex")
    for name in ("ttft_hist", "ttft_sum", "lam", "ok", "errors", "ready"):
        assert np.array_equal(getattr(t, name), getattr(c, name)), name
    for metric, labels in (
        ("firedrill_sandbox_connections_total", {"tenant": "globex"}),
        ("firedrill_toolgw_calls_total", {"tenant": "globex"}),
        ("firedrill_sandbox_sessions_active", {"tenant": "globex"}),
        ("vllm:time_to_first_token_seconds_bucket", {}),
    ):
        a = t.query(metric, labels, start_s=0.0, end_s=math.inf)
        b = c.query(metric, labels, start_s=0.0, end_s=math.inf)
        assert a
        assert [s.labels for s in a] == [s.labels for s in b]
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x.values, y.values, equal_nan=True), (metric, x.labels)
    allowed = [
        r
        for r in t.sandbox.egress_records(start_s=0.0, end_s=math.inf, tenant="globex")
        if r.decision == "allow"
    ]
    assert allowed  # globex kept its egress: no deny-all


def test_evidence_holds_the_window_and_verifies(runs: tuple[ScenarioRun, ScenarioRun]) -> None:
    treated, _ = runs
    (b,) = evidence_bundles(treated)
    assert b.tenant == "acme"
    assert b.complete
    denials = [r for r in b.records("egress-proxy.jsonl") if r["dest_class"] == "base64-subdomain"]
    assert len(denials) > 50
    assert {r["tenant"] for r in b.records("egress-proxy.jsonl")} == {"acme"}
    kinds = [r["kind"] for r in b.records("levers.jsonl")]
    assert kinds[:2] == ["kill_switch", "warm_pool"]
    assert b.records("hubble-drops.jsonl")  # the quarantined pod kept trying


def _respond_json(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "run.json"
    result = runner.invoke(app, ["respond", str(SCENARIO), "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_export_evidence_writes_once_and_audit_verifies(tmp_path: Path) -> None:
    out = tmp_path / "evidence"
    first = runner.invoke(app, ["export", "evidence", str(SCENARIO), "--out", str(out)])
    assert first.exit_code == 0, first.output
    directory = out / "INC-0001"
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [
            "SHA256SUMS",
            "compensations.jsonl",
            "egress-proxy.jsonl",
            "hubble-drops.jsonl",
            "levers.jsonl",
            "manifest.json",
            "operations.jsonl",
            "toolgw.jsonl",
        ]
    )
    ok = runner.invoke(app, ["audit", "evidence", str(directory)])
    assert ok.exit_code == 0, ok.output
    again = runner.invoke(
        app, ["export", "evidence", str(SCENARIO), "--out", str(out), "--incident", "INC-0001"]
    )
    assert again.exit_code == 4
    assert "written once" in again.output
    directory.chmod(0o755)
    target = directory / "egress-proxy.jsonl"
    target.chmod(0o644)
    target.write_bytes(target.read_bytes()[:-10])
    bad = runner.invoke(app, ["audit", "evidence", str(directory)])
    assert bad.exit_code == 1
    assert "egress-proxy.jsonl changed" in bad.output


def test_the_json_report_is_what_the_scenario_asserts(tmp_path: Path) -> None:
    data = _respond_json(tmp_path)
    assert data["passed"] is True
    (inc,) = [i for i in data["incidents"] if i["kind"] == "security"]
    assert inc["sev"] == "SEV1"
    assert inc["deciding_axis"] == "security"
    comms = inc["comms"]["updates"]
    assert comms
    assert all("use1-a" not in u["status_page"]["text"] for u in comms)
