"""A security scenario on a live fleet: ``respond --target --prometheus --speed``.

Real processes on loopback, started as an operator would: ``firedrill twin serve`` accelerated
40x on the scenario's fleet and seed, a Debian ``prometheus`` scraping it every 0.5 s (20 s of the
twin's time), and ``firedrill respond`` whose timeline and levers go to the twin's control API
while every signal its detectors and responder read comes from Prometheus, on the wall clock. The
run takes the scenario's 15 minutes of the twin's time (about 23 s of wall time).

A live fleet is not the embedded twin at second 0: it has been running before the scenario
starts, its readings lag by the observation pipeline (a scrape, the twin's recording interval, the
evaluation step), and a loaded machine can make a step fall behind. So the report is not compared
field for field; what must hold is what the scenario is about: the exfiltration tripwire fires
from Prometheus's series and pages security, one SEV1 security incident contains acme narrowest
first with the pod quarantined and kept, its deletion refused, the fleet-wide deny-all not pulled,
and the evidence verifies, all read through the control API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.cli import app
from firedrill.specfile import load_scenario
from tests.drill.test_live_drill import LiveFleet, serve_live_fleet

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "egress-exfil-acme.yaml"
SPEED = 40.0
SCRAPE_S = 0.5  # wall seconds; 20 s of the twin's time
PIPELINE_S = 4 * SPEED * SCRAPE_S
CONTAINMENT = ["kill_switch", "warm_pool", "pod_quarantine", "promotion_freeze"]


@pytest.fixture
def live_fleet(tmp_path: Path) -> Iterator[LiveFleet]:
    """The scenario's twin served at 40x, and a Prometheus scraping it every 0.5 s."""
    spec, fleet, _, _ = load_scenario(SCENARIO)
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(fleet.model_dump(mode="json"), sort_keys=False))
    with serve_live_fleet(
        fleet_path, seed=spec.seed, speed=SPEED, hours=1, scrape_s=SCRAPE_S, tmp_path=tmp_path
    ) as live:
        yield live


def test_a_security_scenario_runs_on_a_live_fleet_with_signals_from_prometheus(
    live_fleet: LiveFleet, tmp_path: Path
) -> None:
    out = tmp_path / "live.json"
    args = ["respond", str(SCENARIO), "--json", str(out), "--target", live_fleet.twin_url]
    args += ["--token-file", str(live_fleet.token_file), "--prometheus", live_fleet.prometheus_url]
    args += ["--speed", f"{SPEED:g}"]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": "", "COLUMNS": "200"})
    assert out.is_file(), f"exit {result.exit_code}\n{result.output}\n{live_fleet.logs()}"
    report: dict[str, Any] = json.loads(out.read_text())
    said = " ".join(result.output.split())
    assert f"live: the fleet ran {SPEED:g}x the wall clock" in said, said
    assert report["sim_seconds"] >= 900.0
    checks = {c["check"]: c for c in report["expectations"]}
    # detection from Prometheus's series, and the page to security; within the scenario's
    # 120 s plus the observation pipeline (a scrape of staleness, another for the scrape itself,
    # the twin's recording interval and the evaluation step)
    fired = [a for a in report["alerts"] if a["alertname"] == "EgressExfilPattern"]
    assert fired, report["alerts"]
    injected_at = report["timeline"][0]["at_s"]
    assert injected_at < fired[0]["at_s"] <= injected_at + 120.0 + PIPELINE_S
    assert checks["security notifications of EgressExfilPattern"]["passed"]
    # one SEV1 security incident, contained narrowest first, through the control API
    (incident,) = [i for i in report["incidents"] if i["kind"] == "security"]
    assert incident["sev"] == "SEV1"
    assert incident["deciding_axis"] == "security"
    levers = [(lever["kind"], lever["status"]) for lever in incident["levers"]]
    applied = [kind for kind, status in levers if status == "applied"]
    # compensation only when the implicated session completed writes since the run started
    # (a live fleet's earlier history is outside the scenario's window)
    assert applied in (CONTAINMENT, [*CONTAINMENT, "compensation"]), levers
    assert ("delete_pod_under_investigation", "refused") in levers
    twin = RemoteTwin(live_fleet.twin_url, live_fleet.token_file.read_text().strip())
    journal = [type(a.op).__name__ for a in twin.operations()]
    assert journal[0] == "InjectExfiltration"
    assert {"SetFlag", "SetWarmPool", "QuarantinePod", "FreezePromotions"} <= set(journal)
    assert twin.flags().get("proxy.deny_all") != "true"  # globex is not broken
    assert twin.flags().get("acme.max_side_effect") == "read"
    (pod,) = twin.quarantined_pods()
    assert pod.startswith("sbx-tenant-acme/")
    assert twin.sandbox.has_pod(pod)  # kept as evidence
    assert twin.sandbox.warm_pool("acme") == 0


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--prometheus", "http://127.0.0.1:9"], "--prometheus needs --target"),
        (["--target", "http://127.0.0.1:9", "--speed", "60"], "--speed is the live fleet's"),
    ],
)
def test_live_options_that_do_not_go_together_are_refused_before_anything_runs(
    extra: list[str], reason: str, tmp_path: Path
) -> None:
    out = tmp_path / "never.json"
    result = CliRunner().invoke(
        app, ["respond", str(SCENARIO), "--json", str(out), *extra], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 4, result.output
    assert reason in " ".join(result.output.split())
    assert not out.exists()
