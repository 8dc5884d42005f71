"""Levers through the API: advise mode proposes, the roles a guard needs approve (two distinct
people where two are needed), the last approval pulls it on the fleet, verification mitigates or
undoes it, and an undo applies the recorded inverse. The fleet is the in-process twin; the
symptom probe is a stand-in whose burn rate the test sets (verification against a real
Prometheus is the end-to-end test's)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from firedrill.app.serve import IncidentService, ServeSettings
from firedrill.errors import SpecError
from firedrill.model.series import Labels
from firedrill.respond.levers import Lever, RouteWeightParams
from firedrill.respond.responder import Candidate, RunbookContext
from firedrill.specfile import load_fleet
from firedrill.store import Store
from firedrill.twin.engine import Twin
from firedrill.web import WebSettings, create_app
from firedrill.web.auth import Tokens, token_sha256
from tests.web.test_serve_api import alert, auth, payload

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
PEOPLE = {
    "am-token": ("alertmanager", ["webhook"]),
    "alice-token": ("Alice", ["capacity_lead", "incident_commander"]),
    "bob-token": ("Bob", ["incident_commander"]),
    "eve-token": ("Eve", ["comms_lead"]),
}


class Probe:
    def __init__(self) -> None:
        self.rate: float | None = 20.0

    def burn_rate(self, cells: Collection[str], window_s: float) -> float | None:
        return self.rate

    def firing(self) -> Collection[Labels]:
        return ()


def both_cells(ctx: RunbookContext) -> list[Candidate]:
    """Two cells' weights at once: the global route table, so a second approver is needed."""
    weights = RouteWeightParams((("usw2-a", 40), ("usw2-b", 40)))
    return [Candidate(Lever("route_weight", "llm-70b", weights), "even out us-west-2")]


@pytest.fixture
def world(store: Store) -> Iterator[tuple[TestClient, Twin, Probe, IncidentService]]:
    twin = Twin(load_fleet(FLEET), 3)
    twin.advance(60)
    probe = Probe()
    service = IncidentService(
        store,
        clock=twin,
        settings=ServeSettings(verify_window_s=300),
        fleet=twin,
        signals=twin,
        probe_factory=lambda firing: probe,
        runbooks={"ttft": both_cells, "availability": both_cells},
    )
    tokens = Tokens.from_entries([(token_sha256(t), p, r) for t, (p, r) in PEOPLE.items()])
    with TestClient(create_app(WebSettings(tokens=tokens, tick_s=0), service)) as client:
        yield client, twin, probe, service


def weights(twin: Twin) -> dict[str, int]:
    cells = {c.name: dict(c.route_weights).get("llm-70b", 0) for c in twin.cells()}
    return {c: cells[c] for c in ("usw2-a", "usw2-b")}


def open_and_propose(client: TestClient, service: IncidentService) -> dict[str, Any]:
    page = payload(alert("usw2-b", "CellTTFTBurnFast", region="us-west-2"))
    assert (
        client.post("/api/v1/alerts/webhook", json=page, headers=auth("am-token")).status_code
        == 200
    )
    service.tick()
    (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
    (lever,) = client.get(f"/api/v1/incidents/{inc['id']}/levers", headers=auth("bob-token")).json()
    assert isinstance(lever, dict)
    return lever


def test_a_fleet_wide_lever_needs_two_distinct_people_and_the_last_approval_pulls_it(
    world: Any,
) -> None:
    client, twin, probe, service = world
    before = weights(twin)
    lever = open_and_propose(client, service)
    assert lever["status"] == "proposed"
    assert lever["scope"] == "fleet"
    assert lever["roles_needed"] == ["capacity_lead", "incident_commander"]
    url = f"/api/v1/levers/{lever['id']}"

    # someone holding neither role
    assert client.post(f"{url}/approve", headers=auth("eve-token")).status_code == 403
    # Alice holds both roles, but one person is one approval
    first = client.post(f"{url}/approve", headers=auth("alice-token")).json()
    assert first["status"] == "proposed"
    assert first["roles_missing"] == ["incident_commander"]
    again = client.post(f"{url}/approve", headers=auth("alice-token"))
    assert again.status_code == 409
    assert "another person" in again.json()["detail"]
    # nothing moved yet, and a pull before the approvals are in is refused
    assert weights(twin) == before
    assert client.post(f"{url}/pull", headers=auth("bob-token")).status_code == 403
    # the second person: the lever is pulled on the fleet, its inverse journalled first
    done = client.post(f"{url}/approve", headers=auth("bob-token")).json()
    assert done["status"] == "applied"
    assert [a["person"] for a in done["approvals"]] == ["Alice", "Bob"]
    assert weights(twin) == {"usw2-a": 40, "usw2-b": 40}

    # verification: still burning, nothing happens; the burn stops, the incident is mitigated
    twin.advance(30)
    service.tick()
    assert client.get(url, headers=auth("bob-token")).json()["status"] == "applied"
    probe.rate = 0.5
    twin.advance(30)
    service.tick()
    assert client.get(url, headers=auth("bob-token")).json()["status"] == "verified"
    (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
    assert inc["status"] == "mitigated"

    # an undo applies the recorded inverse
    undone = client.post(f"{url}/undo", headers=auth("bob-token")).json()
    assert undone["status"] == "undone"
    assert weights(twin) == before


def test_a_lever_that_does_not_clear_the_burn_is_undone_at_the_end_of_the_window(
    world: Any,
) -> None:
    client, twin, _, service = world
    before = weights(twin)
    lever = open_and_propose(client, service)
    url = f"/api/v1/levers/{lever['id']}"
    client.post(f"{url}/approve", headers=auth("alice-token"))
    client.post(f"{url}/approve", headers=auth("bob-token"))
    assert weights(twin) != before
    twin.advance(301)
    service.tick()
    out = client.get(url, headers=auth("bob-token")).json()
    assert out["status"] == "not_cleared"
    assert "not cleared within 300 s" in out["verify_detail"]
    assert weights(twin) == before
    kinds = [
        e["kind"]
        for e in client.get(
            f"/api/v1/incidents/{lever['incident_id']}/timeline", headers=auth("bob-token")
        ).json()
    ]
    assert kinds.count("lever") == 3  # proposed, applied, undone


def test_one_person_one_identity_compared_canonically() -> None:
    with pytest.raises(SpecError, match="two tokens"):
        Tokens.from_entries(
            [
                (token_sha256("a"), "Alice", ["capacity_lead"]),
                (token_sha256("b"), "  alice ", ["incident_commander"]),
            ]
        )
    with pytest.raises(SpecError, match="unknown role"):
        Tokens.from_entries([(token_sha256("a"), "Alice", ["root"])])
