"""Every example scenario runs on the twin and its asserted outcomes hold."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.scenario.result import RespondReport, respond_report_schema
from firedrill.scenario.run import _backfill_at
from firedrill.scenario.spec import TimelineEntry

SCENARIOS = sorted(Path("examples/scenarios").glob("*.yaml"))
runner = CliRunner()


def _run(path: Path, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / f"{path.stem}.json"
    result = runner.invoke(app, ["respond", str(path), "--json", str(out), "--quiet"])
    text = out.read_text()
    data: dict[str, object] = json.loads(text)
    assert result.exit_code == 0, json.dumps(data["expectations"], indent=1)
    # the typed report is the contract: it reads the file back byte for byte, and the schema
    # that `firedrill schema respond-report` prints accepts it
    assert RespondReport.from_json(data).dumps() == text
    jsonschema.validate(data, respond_report_schema())
    return data


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_example_scenario_meets_its_expectations(path: Path, tmp_path: Path) -> None:
    data = _run(path, tmp_path)
    assert data["passed"] is True
    assert data["expectations"], "a scenario without expectations proves nothing"
    # the alerts saw the steady state back past the longest window (the 1x ticket's 3 d)
    history = data["alert_history_s"]
    assert isinstance(history, float)
    assert history >= 3 * 86400
    rem = data["remediation"]
    assert isinstance(rem, dict)
    for key in ("actions", "blocked", "chains"):
        assert isinstance(rem[key], list)
    notifications = data["notifications"]
    assert isinstance(notifications, list)
    for n in notifications:
        assert {"receiver", "alertname", "cell", "at_s", "alerts"} <= set(n)
    for a in rem["actions"]:
        assert {"node", "cell", "action", "reason", "at_s", "dry_run"} <= set(a)
    for b in rem["blocked"]:
        assert {"node", "cell", "budget", "at_s"} <= set(b)
    for c in rem["chains"]:
        assert {"stages", "broken_at"} <= set(c)
        assert all("at_s" in s for s in c["stages"])


def test_same_scenario_and_seed_give_the_same_json(tmp_path: Path) -> None:
    path = Path("examples/scenarios/xid13-no-drain.yaml")
    a = _run(path, tmp_path / "a")
    b = _run(path, tmp_path / "b")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_a_failed_expectation_exits_1(tmp_path: Path) -> None:
    text = Path("examples/scenarios/xid13-no-drain.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(
        text.replace("fleet: ../fleet.yaml", "fleet: " + str(Path("examples/fleet.yaml").resolve()))
        .replace("slo: ../slo.yaml", "slo: " + str(Path("examples/slo.yaml").resolve()))
        .replace("policy: ../policy.yaml", "policy: " + str(Path("examples/policy.yaml").resolve()))
        .replace(
            "{check: actions, action: drain, max: 0}", "{check: actions, action: drain, min: 1}"
        )
    )
    result = runner.invoke(app, ["respond", str(bad), "--quiet"])
    assert result.exit_code == 1


def test_a_malformed_scenario_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text(
        "name: x\nfleet: f.yaml\nslo: s.yaml\nduration: 10m\n"
        "timeline:\n  - at: 1m\n    op: InjectWarpCore\n"
    )
    result = runner.invoke(app, ["respond", str(bad)])
    assert result.exit_code == 4
    assert "s.yaml:7" in result.output
    assert "InjectWarpCore" in result.output


def test_a_storm_of_node_alerts_in_a_cell_is_one_incident(tmp_path: Path) -> None:
    data = _run(Path("examples/scenarios/exporter-upgrade-storm.yaml"), tmp_path)
    incidents = data["incidents"]
    assert isinstance(incidents, list)
    cells = [i["cell"] for i in incidents]
    assert cells.count("use1-a") == 1
    (inc,) = [i for i in incidents if i["cell"] == "use1-a"]
    assert inc["alerts"] > 20  # every node alert and the budget page joined it
    for key in ("id", "sev", "axes", "sev_history", "suspects", "levers", "opened_at_s"):
        assert key in inc
    assert {"ttd_s", "ttm_s", "ttr_s", "gpu_hours_lost", "requests_failed", "action_items"} <= set(
        inc["postmortem"]
    )
    assert inc["suspects"][0]["stream"] == "node_layer"  # the exporter upgrade, 1 min before
    assert any(
        lv["kind"] == "node_quarantine" and lv["status"] == "applied" for lv in inc["levers"]
    )
    assert inc["postmortem"]["action_items"][0]["kind"] == "automation_guardrail"


def test_a_hung_training_run_is_rated_on_gpu_hours(tmp_path: Path) -> None:
    data = _run(Path("examples/scenarios/training-hang-512.yaml"), tmp_path)
    incidents = data["incidents"]
    assert isinstance(incidents, list)
    (inc,) = incidents
    assert inc["deciding_axis"] == "gpu_hours"
    assert inc["sev"] == "SEV3"  # 4,096 GPUs x $2 = $8,192/h, no user affected
    assert inc["postmortem"]["gpu_hours_lost"] > 0
    assert any(lv["kind"] == "jobset_suspend" for lv in inc["levers"])


@pytest.mark.parametrize(
    ("ats", "expected"),
    [
        ([120.0], 105.0),  # the evaluation before the first event
        ([0.0, 0.0, 120.0], 105.0),  # entries at 0 s are the starting state, not the first event
        ([0.0], 15.0),  # nothing after 0 s: as soon as two evaluations give a rate
        ([], 15.0),
        ([10.0, 300.0], -5.0),  # an event within the first step: no steady state to continue
    ],
)
def test_the_history_is_backfilled_just_before_the_first_event(
    ats: list[float], expected: float
) -> None:
    timeline = [
        TimelineEntry.model_validate({"at": f"{a:g}s", "op": "DenyCapacity",
                                      "args": {"region": "us-east-1"}})
        for a in ats
    ]  # fmt: skip
    assert _backfill_at(timeline, 15.0) == expected
