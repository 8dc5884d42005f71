"""Example scenarios give the same respond report embedded and against ``firedrill twin serve``.

The served twin is started as an operator would (its own process, loopback, manual clock, the
control token in a file) on the fleet and seed the scenario builds its embedded twin from; the
scenario then runs twice through ``firedrill respond``: on its embedded twin, and with
``--target``. Every fact the report holds (the sandboxes' audit records a security incident's
containment and evidence read, the JobSet and flight recorder the hang runbook reads, the change
journal, flags and quarantines the checks read) comes through the ports, so the two reports must
be equal as a whole. A served twin the scenario cannot run on is refused with nothing applied.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.adapters.twin_api import ControlApi
from firedrill.cli import app
from firedrill.specfile import load_fleet, load_scenario
from firedrill.twin.engine import Twin
from tests.drill.test_remote_world import served_twin

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
TOKEN = "r" * 43


def _respond(scenario: Path, out: Path, *extra: str) -> dict[str, Any]:
    args = ["respond", str(scenario), "--quiet", "--json", str(out), *extra]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": ""})
    assert result.exit_code == 0, f"{out.name}: exit {result.exit_code}\n{result.output}"
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.parametrize(
    "name",
    [
        "egress-exfil-acme",  # security: audit records, quarantine, compensations, evidence
        "training-hang-512",  # training: JobSet, flight recorder, the hang runbook's steps
    ],
)
def test_a_scenario_is_the_same_embedded_and_against_a_served_twin(
    name: str, tmp_path: Path
) -> None:
    scenario = SCENARIOS / f"{name}.yaml"
    spec, fleet, _, _ = load_scenario(scenario)
    embedded = _respond(scenario, tmp_path / "embedded.json")
    with served_twin(fleet.model_dump(mode="json"), spec.seed, tmp_path) as (url, token_file):
        remote = _respond(
            scenario, tmp_path / "remote.json", "--target", url, "--token-file", str(token_file)
        )
        applied = RemoteTwin(url, token_file.read_text().strip()).operations()
    assert embedded["passed"]
    assert remote["passed"]
    assert [e["passed"] for e in remote["expectations"]] == [True] * len(spec.expect)
    # the run really went to the served twin: its journal holds the timeline and the levers
    assert [type(a.op).__name__ for a in applied][: len(spec.timeline)] == [
        e.op for e in spec.timeline
    ]
    assert len(applied) > len(spec.timeline)
    assert remote == embedded  # the whole report: alerts, incidents, levers, checks, changes


def _served(fleet_path: Path, seed: int) -> tuple[Twin, ControlApi]:
    twin = Twin(load_fleet(fleet_path), seed, hours_hint=1.0)
    return twin, ControlApi(twin, threading.Lock(), TOKEN)


def test_a_served_twin_the_scenario_cannot_run_on_is_refused_with_nothing_applied(
    tmp_path: Path,
) -> None:
    scenario = SCENARIOS / "egress-exfil-acme.yaml"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    # another fleet
    other, api = _served(SCENARIOS.parent / "fleet-train.yaml", 4)
    with MetricsServer(lambda: "", api=api.handle) as server:
        args = ["respond", str(scenario), "--quiet", "--target", server.url]
        result = CliRunner().invoke(
            app, [*args, "--token-file", str(token_file)], env={"FIREDRILL_TWIN_TOKEN": ""}
        )
    assert result.exit_code == 4, result.output
    said = " ".join(result.output.split())
    assert "serves fleet 'train', not the scenario's 'demo'" in said
    assert "differs in" in said
    assert other.journal == []
    assert other.now_s() == 0.0
    # the right fleet, but already past the scenario's first event (3 min)
    late, api = _served(SCENARIOS.parent / "fleet.yaml", 4)
    late.advance(200.0)
    with MetricsServer(lambda: "", api=api.handle) as server:
        args = ["respond", str(scenario), "--quiet", "--target", server.url]
        result = CliRunner().invoke(
            app, [*args, "--token-file", str(token_file)], env={"FIREDRILL_TWIN_TOKEN": ""}
        )
    assert result.exit_code == 4, result.output
    assert "past the scenario's first event at 180 s" in " ".join(result.output.split())
    assert late.journal == []
    assert late.now_s() == 200.0
    # a wrong token
    with MetricsServer(lambda: "", api=api.handle) as server:
        token_file.write_text("w" * 43 + "\n")
        args = ["respond", str(scenario), "--quiet", "--target", server.url]
        result = CliRunner().invoke(
            app, [*args, "--token-file", str(token_file)], env={"FIREDRILL_TWIN_TOKEN": ""}
        )
    assert result.exit_code == 4, result.output
    assert "refused the control token" in " ".join(result.output.split())
