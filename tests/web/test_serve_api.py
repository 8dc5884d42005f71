"""``firedrill serve``'s HTTP layer: webhook ingestion, deduplication, auth, limits, restarts.

Runs the real FastAPI application in process (Starlette's test client) on a migrated store, on
SQLite and on the PostgreSQL test server. Without a fleet endpoint the responder is off, which is
what these tests want: what arrives and what is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firedrill.adapters.clock import WallClock
from firedrill.app.serve import IncidentService
from firedrill.store import Store, audit, incidents, timeline
from firedrill.store import alerts as received
from firedrill.web import WebSettings, create_app
from firedrill.web.auth import Tokens, token_sha256

TOKENS = {
    "am-token": ("alertmanager", ["webhook"]),
    "alice-token": ("Alice", ["capacity_lead"]),
    "bob-token": ("bob", ["incident_commander"]),
    "viewer-token": ("Vera", ["viewer"]),
}


def tokens() -> Tokens:
    return Tokens.from_entries([(token_sha256(t), p, r) for t, (p, r) in TOKENS.items()])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class FixedClock(WallClock):
    def __init__(self) -> None:
        super().__init__(time_fn=lambda: self.t)
        self.t = 1000.0


def client_for(store: Store, **kw: Any) -> tuple[TestClient, IncidentService]:
    service = IncidentService(store, clock=FixedClock())
    app = create_app(WebSettings(tokens=tokens(), tick_s=0, **kw), service)
    return TestClient(app), service


@pytest.fixture
def api(store: Store) -> Iterator[tuple[TestClient, IncidentService]]:
    client, service = client_for(store)
    with client:
        yield client, service


def alert(
    cell: str,
    name: str = "CellAvailabilityBurnFast",
    *,
    status: str = "firing",
    fp: str = "a1",
    starts: str = "2026-12-03T10:00:00Z",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {
            "alertname": name,
            "cell": cell,
            "region": "us-east-1",
            "severity": "page",
            "burn_tier": "fast",
            "burn_factor": "14.4",
            **labels,
        },
        "annotations": {},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fp,
    }


def payload(*alerts: dict[str, Any], receiver: str = "page") -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": '{}:{cell="use1-a"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": list(alerts),
    }


def snapshot(store: Store) -> tuple[Any, ...]:
    with store.session() as s:
        incs = [(i.id, i.status.value, i.sev) for i in incidents.list(session=s)]
        events = sum(len(timeline.list(session=s, incident_id=i[0])) for i in incs)
        head = audit.head(s)
        return (tuple(incs), events, received.count(s), None if head is None else head.seq)


def test_a_page_opens_one_incident_per_cell_and_resends_are_deduplicated(api: Any) -> None:
    client, _ = api
    first = client.post(
        "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["new"] == 1
    assert len(body["opened"]) == 1
    # Alertmanager re-sends the group on its interval: same fingerprint and startsAt
    again = client.post(
        "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
    )
    assert again.json() == {**body, "new": 0, "duplicates": 1, "opened": [], "joined": []}
    # another alert of the same cell joins; another cell opens its own
    more = payload(alert("use1-a", "CellTTFTBurnFast", fp="b2"), alert("use1-b", fp="c3"))
    client.post("/api/v1/alerts/webhook", json=more, headers=auth("am-token"))
    listed = client.get("/api/v1/incidents", headers=auth("viewer-token")).json()
    assert sorted(i["cell"] for i in listed) == ["use1-a", "use1-b"]
    a = next(i for i in listed if i["cell"] == "use1-a")
    assert a["firing_alerts"] == 2
    assert a["sev"] == 3  # a 14.4x page in one region: users, SEV3
    detail = client.get(f"/api/v1/incidents/{a['id']}", headers=auth("alice-token")).json()
    assert detail["deciding_axis"] == "users"
    assert [e["kind"] for e in detail["timeline"]][:1] == ["opened"]
    # everything resolves: the incident resolves
    done = payload(
        alert("use1-a", status="resolved"),
        alert("use1-a", "CellTTFTBurnFast", status="resolved", fp="b2"),
    )
    out = client.post("/api/v1/alerts/webhook", json=done, headers=auth("am-token")).json()
    assert out["resolved"] == [a["id"]]
    assert (
        client.get("/api/v1/incidents?status=resolved", headers=auth("bob-token")).json()[0]["id"]
        == a["id"]
    )


def test_every_call_is_authenticated_and_roles_are_enforced(api: Any) -> None:
    client, _ = api
    assert client.get("/api/v1/incidents").status_code == 401
    assert client.get("/api/v1/incidents", headers=auth("nope")).status_code == 401
    assert client.post("/api/v1/alerts/webhook", json=payload(alert("use1-a"))).status_code == 401
    # a person may read, not post alerts; the webhook identity may not read
    assert (
        client.post(
            "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("alice-token")
        ).status_code
        == 403
    )
    assert client.get("/api/v1/incidents", headers=auth("am-token")).status_code == 403
    assert client.post("/api/v1/levers/1/approve", headers=auth("viewer-token")).status_code == 403
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client.get("/metrics").status_code == 401
    assert (
        "firedrill_serve_http_requests" in client.get("/metrics", headers=auth("viewer-token")).text
    )
    assert client.get("/openapi.json").status_code == 200
    status = client.get("/api/v1/status", headers=auth("viewer-token")).json()
    assert status["mode"] == "advise"
    assert status["ready"] is True
    assert {d["name"]: d["state"] for d in status["dependencies"]} == {
        "fleet": "not configured",
        "prometheus": "not configured",
        "alertmanager": "not configured",
    }


def test_body_size_is_limited(store: Store) -> None:
    client, _ = client_for(store, max_body_bytes=2048)
    with client:
        big = payload(*[alert("use1-a", fp=f"{i:x}") for i in range(40)])
        r = client.post("/api/v1/alerts/webhook", json=big, headers=auth("am-token"))
        assert r.status_code == 413
        assert "bytes" in r.json()["detail"]
        assert snapshot(store)[2] == 0


def test_open_incidents_survive_a_restart(store: Store) -> None:
    client, _ = client_for(store)
    with client:
        client.post(
            "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
        )
    before = snapshot(store)
    client, _ = client_for(store)  # a new process: a new book, the same store
    with client:
        # the re-sent group is a duplicate, a new alert of that cell joins the same incident
        r = client.post(
            "/api/v1/alerts/webhook",
            json=payload(alert("use1-a"), alert("use1-a", "CellTTFTBurnFast", fp="d4")),
            headers=auth("am-token"),
        )
        assert r.status_code == 200, r.text
        assert r.json()["new"] == 1
        assert r.json()["opened"] == []
        listed = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
        assert len(listed) == 1
        assert listed[0]["firing_alerts"] == 2
    assert snapshot(store)[0] == before[0]


BAD: list[tuple[str, Any]] = [
    ("not JSON", b"{"),
    ("version 3", {**payload(alert("use1-a")), "version": "3"}),
    ("no alerts", payload()),
    ("no cell", payload({**alert("use1-a"), "labels": {"alertname": "X"}})),
    ("bad fingerprint", payload({**alert("use1-a"), "fingerprint": "XYZ"})),
    ("naive time", payload({**alert("use1-a"), "startsAt": "2026-12-03T10:00:00"})),
    ("bad status", payload({**alert("use1-a"), "status": "pending"})),
    ("blank receiver", payload(alert("use1-a"), receiver="  ")),
    ("NUL label", payload(alert("use1-a", team="a\x00b"))),
]


@pytest.mark.parametrize(("why", "body"), BAD, ids=[b[0] for b in BAD])
def test_bad_payloads_get_a_4xx_with_a_reason_and_store_nothing(
    api: Any, store: Store, why: str, body: Any
) -> None:
    client, _ = api
    client.post(
        "/api/v1/alerts/webhook", json=payload(alert("use1-c", fp="ee")), headers=auth("am-token")
    )
    before = snapshot(store)
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = client.post(
        "/api/v1/alerts/webhook",
        headers={**auth("am-token"), "content-type": "application/json"},
        **kw,
    )
    assert 400 <= r.status_code < 500, (why, r.status_code, r.text)
    assert r.json()["detail"]
    assert snapshot(store) == before


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    base = payload(alert("use1-z", fp="f00d"))
    keys = st.sampled_from(["version", "status", "receiver", "alerts"])
    alert_keys = st.sampled_from(["status", "labels", "startsAt", "fingerprint"])

    def top(k: str, v: Any) -> dict[str, Any]:
        return {**base, k: v}

    def inner(k: str, v: Any) -> dict[str, Any]:
        return {**base, "alerts": [{**base["alerts"][0], k: v}]}

    return st.one_of(st.builds(top, keys, json_value), st.builds(inner, alert_keys, json_value))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=_mutations())
def test_fuzzed_payloads_are_refused_whole_or_stored_whole(
    api: Any, store: Store, body: dict[str, Any]
) -> None:
    client, _ = api
    before = snapshot(store)
    r = client.post("/api/v1/alerts/webhook", json=body, headers=auth("am-token"))
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert r.json()["detail"]
        assert snapshot(store) == before
    else:
        assert snapshot(store)[2] >= before[2]


def test_events_stream_replays_what_happened_since_the_last_event_id(api: Any) -> None:
    client, _ = api
    client.post("/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token"))
    headers = {**auth("viewer-token"), "Last-Event-ID": "0"}
    with client.stream("GET", "/api/v1/events", headers=headers) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines: list[str] = []
        for line in stream.iter_lines():
            lines.append(line)
            if line.startswith("data:"):
                break
    assert "id: 1" in lines
    assert "event: incident.opened" in lines
    assert '"incident": "INC-0001"' in lines[-1]


def test_a_client_too_slow_to_send_its_body_gets_408() -> None:
    import asyncio

    from firedrill.web.app import _Limits

    sent: list[dict[str, Any]] = []
    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def slow_receive() -> dict[str, Any]:
        await asyncio.sleep(5)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": []}
    asyncio.run(_Limits(app, max_body=1024, timeout_s=0.1)(scope, slow_receive, send))
    assert sent[0]["status"] == 408
    assert reached == []


def test_break_glass_needs_two_people_other_than_the_requester(store: Store) -> None:
    extra = {
        "ic-token": ("Ian", ["incident_commander"]),
        "sec-token": ("Sara", ["security_lead"]),
    }
    entries = [(token_sha256(t), p, r) for t, (p, r) in {**TOKENS, **extra}.items()]
    service = IncidentService(store, clock=FixedClock())
    app = create_app(WebSettings(tokens=Tokens.from_entries(entries), tick_s=0), service)
    with TestClient(app) as client:
        client.post(
            "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
        )
        (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
        url = f"/api/v1/incidents/{inc['id']}/breakglass"
        body = {"identity": "alice", "scope": "nodes:patch", "reason": "drain by hand"}
        assert (
            client.post(url, json={**body, "scope": "cluster-admin"}, headers=auth("alice-token"))
        ).status_code == 403
        asked = client.post(url, json=body, headers=auth("alice-token"))
        assert asked.status_code == 201, asked.text
        rid = asked.json()["request_id"]
        approve = f"/api/v1/breakglass/{rid}/approve"
        # the requester (and the identity it is for) cannot approve it
        own = client.post(approve, headers=auth("alice-token"))
        assert own.status_code == 403
        assert "own" in own.json()["detail"]
        first = client.post(approve, headers=auth("ic-token")).json()
        assert first["status"] == "pending"
        assert client.post(approve, headers=auth("ic-token")).status_code == 403  # same person
        granted = client.post(approve, headers=auth("sec-token")).json()
        assert granted["status"] == "granted"
        grants = client.get(url, headers=auth("bob-token")).json()
        assert [g["approved_by"] for g in grants] == [["ian", "sara"]]
        assert grants[0]["requested_by"] == "alice"


def test_on_start_it_catches_up_with_what_alertmanager_holds(
    store: Store, alertmanager: str
) -> None:
    import httpx

    from firedrill.adapters.alertmanager import AlertmanagerClient

    held = [
        {"labels": {"alertname": "CellTTFTBurnFast", "cell": "use1-b", "severity": "page"}},
        {"labels": {"alertname": "NoCellHere", "severity": "ticket"}},  # skipped: no cell
    ]
    assert httpx.post(f"{alertmanager}/api/v2/alerts", json=held, timeout=5).status_code == 200
    am = AlertmanagerClient(alertmanager)
    from tests.adapters.test_twin_serve import wait_for

    wait_for("Alertmanager to hold both", lambda: len(am.alerts()) == 2)
    service = IncidentService(store, clock=FixedClock(), alertmanager=am)
    with TestClient(create_app(WebSettings(tokens=tokens(), tick_s=0), service)) as client:
        (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
        assert inc["cell"] == "use1-b"
        assert inc["firing_alerts"] == 1
        # the webhook delivering the same alert later is a duplicate
        (a,) = [x for x in am.alerts() if x.label("cell") == "use1-b"]
        again = alert(
            "use1-b", "CellTTFTBurnFast", fp=a.fingerprint, starts=a.starts_at.isoformat()
        )
        again["labels"] = dict(a.labels)
        r = client.post("/api/v1/alerts/webhook", json=payload(again), headers=auth("am-token"))
        assert r.json()["duplicates"] == 1


def test_comms_handoffs_postmortems_drills_and_the_ladder_for_a_ui(api: Any) -> None:
    client, _ = api
    client.post("/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token"))
    (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
    base = f"/api/v1/incidents/{inc['id']}"
    update = {"channel": "status_page", "text": "Investigating elevated errors for chat."}
    assert client.post(f"{base}/comms", json=update, headers=auth("alice-token")).status_code == 403
    posted = client.post(f"{base}/comms", json=update, headers=auth("bob-token"))
    assert posted.status_code == 201, posted.text
    assert [
        c["text"] for c in client.get(f"{base}/comms", headers=auth("viewer-token")).json()
    ] == [update["text"]]
    handoff = {"role": "incident_commander", "to_person": "Dana", "open_threads": ["drain use1-a"]}
    made = client.post(f"{base}/handoffs", json=handoff, headers=auth("bob-token"))
    assert made.status_code == 201, made.text
    assert "Dana" in made.json()["text"]
    assert (
        client.get(f"{base}/handoffs", headers=auth("bob-token")).json()[0]["to_person"] == "Dana"
    )
    assert client.get(f"{base}/postmortem", headers=auth("bob-token")).status_code == 404
    written = {
        "root_cause_class": "capacity",
        "text": "use1-a lost its 5xx budget.",
        "action_items": [{"kind": "game_day_scenario", "text": "drill the drain", "owner": "Dana"}],
    }
    early = client.post(f"{base}/postmortem", json=written, headers=auth("bob-token"))
    assert early.status_code == 409  # not resolved yet
    gone = payload(alert("use1-a", status="resolved"))
    client.post("/api/v1/alerts/webhook", json=gone, headers=auth("am-token"))
    assert (
        client.post(f"{base}/postmortem", json=written, headers=auth("alice-token")).status_code
        == 403
    )
    pm = client.post(f"{base}/postmortem", json=written, headers=auth("bob-token"))
    assert pm.status_code == 201, pm.text
    assert pm.json()["action_items"][0]["text"] == "drill the drain"
    assert (
        client.post(f"{base}/postmortem", json=written, headers=auth("bob-token")).status_code
        == 409
    )
    assert client.get(f"{base}/postmortem", headers=auth("viewer-token")).json()["ttr_s"] >= 0
    no_items = client.post(
        f"{base}/postmortem", json={**written, "action_items": []}, headers=auth("bob-token")
    )
    assert no_items.status_code == 422
    assert (
        client.get("/api/v1/incidents/INC-9999/comms", headers=auth("bob-token")).status_code == 404
    )
    assert client.get("/api/v1/drills", headers=auth("bob-token")).json() == []
    assert client.get("/api/v1/ladder", headers=auth("bob-token")).json() == []
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/alerts/webhook", "/api/v1/levers/{lever_id}/approve", "/api/v1/events"} <= set(
        paths
    )


def test_serve_refuses_a_bad_tokens_file_before_it_listens(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from firedrill.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["serve", "--tokens", str(tmp_path / "none.yml")])
    assert missing.exit_code == 4
    assert "cannot read the tokens file" in missing.output
    bad = tmp_path / "tokens.yml"
    bad.write_text("tokens:\n  - {sha256: " + "a" * 64 + ", person: Al, roles: [root]}\n")
    refused = runner.invoke(
        app, ["serve", "--tokens", str(bad), "--db", f"sqlite:///{tmp_path / 's.db'}"]
    )
    assert refused.exit_code == 4
    assert "tokens.0.roles" in refused.output
    assert "unknown role" in refused.output


def test_a_write_that_fails_half_way_stores_nothing_and_the_retry_lands_once(
    api: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from firedrill.errors import StoreError

    client, _ = api
    real = received.record_many
    calls: list[int] = []

    def flaky(session: Any, rows: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("disk full")
        real(session, rows)

    monkeypatch.setattr(received, "record_many", flaky)
    before = snapshot(store)
    first = client.post(
        "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
    )
    assert first.status_code == 503
    assert first.headers["Retry-After"]
    assert snapshot(store) == before  # the incident it opened in that transaction is gone too
    again = client.post(
        "/api/v1/alerts/webhook", json=payload(alert("use1-a")), headers=auth("am-token")
    )
    assert again.status_code == 200, again.text
    assert again.json()["new"] == 1
    assert len(client.get("/api/v1/incidents", headers=auth("bob-token")).json()) == 1
