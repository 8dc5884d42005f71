"""The browser pages, in process: login and sessions, CSRF on every form post, no write without a
session, the same lever rules as the API (two distinct people), escaping of user text, and a
public status-page preview that never shows a secret or a node name.

The fleet is the in-process twin with a runbook whose lever needs two approvers (as in
``test_serve_levers.py``); the real-browser tests are in ``test_browser.py``.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from firedrill.app.serve import IncidentService, ServeSettings
from firedrill.specfile import load_fleet
from firedrill.store import Store, comms, incidents, ladder, open_store
from firedrill.twin.engine import Twin
from firedrill.web import WebSettings, create_app
from firedrill.web.auth import Tokens, token_sha256
from firedrill.web.session import COOKIE
from tests.web.test_serve_api import alert, auth, payload
from tests.web.test_serve_levers import FLEET, PEOPLE, Probe, both_cells

STATIC = Path(__file__).resolve().parents[2] / "src" / "firedrill" / "web" / "static"


@pytest.fixture
def sqlite_store(tmp_path: Path, migrated_sqlite: Path) -> Iterator[Store]:
    path = tmp_path / "store.db"
    shutil.copyfile(migrated_sqlite, path)
    with open_store(f"sqlite:///{path}") as s:
        yield s


@pytest.fixture
def world(sqlite_store: Store) -> Iterator[tuple[TestClient, IncidentService]]:
    twin = Twin(load_fleet(FLEET), 3)
    twin.advance(60)
    probe = Probe()
    service = IncidentService(
        sqlite_store,
        clock=twin,
        settings=ServeSettings(verify_window_s=300),
        fleet=twin,
        signals=twin,
        probe_factory=lambda firing: probe,
        runbooks={"ttft": both_cells, "availability": both_cells},
    )
    tokens = Tokens.from_entries([(token_sha256(t), p, r) for t, (p, r) in PEOPLE.items()])
    with TestClient(create_app(WebSettings(tokens=tokens, tick_s=0), service)) as client:
        yield client, service


def open_incident(client: TestClient, service: IncidentService) -> tuple[str, int]:
    page = payload(alert("usw2-b", "CellTTFTBurnFast", region="us-west-2"))
    r = client.post("/api/v1/alerts/webhook", json=page, headers=auth("am-token"))
    assert r.status_code == 200, r.text
    service.tick()
    (inc,) = client.get("/api/v1/incidents", headers=auth("bob-token")).json()
    (lever,) = client.get(f"/api/v1/incidents/{inc['id']}/levers", headers=auth("bob-token")).json()
    return inc["id"], lever["id"]


def login(client: TestClient, token: str) -> str:
    """Log in through the form; returns the page's CSRF token (the session cookie is kept)."""
    form = client.get("/ui/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    r = client.post(
        "/ui/login",
        data={"token": token, "csrf": nonce.group(1), "next": "/ui/board"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "samesite=strict" in cookie.lower()
    board = client.get("/ui/board")
    assert board.status_code == 200
    found = re.search(r'"X-CSRF-Token": "([^"]+)"', board.text)
    assert found is not None
    return found.group(1)


def test_pages_need_a_session_and_the_login_form_its_own_csrf_token(world: Any) -> None:
    client, _ = world
    r = client.get("/ui/board", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/ui/login?next=/ui/board")
    deep = client.get("/ui/board?sev=1&cell=usw2-b", follow_redirects=False)
    assert deep.headers["location"] == "/ui/login?next=/ui/board%3Fsev%3D1%26cell%3Dusw2-b"
    # a login post from another site's form: no nonce cookie, no matching field
    assert client.post("/ui/login", data={"token": "bob-token", "csrf": "x"}).status_code == 403
    form = client.get("/ui/login")
    nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert nonce is not None
    bad = client.post("/ui/login", data={"token": "nope", "csrf": nonce.group(1)})
    assert bad.status_code == 401
    assert COOKIE not in client.cookies
    # an open redirect through ?next= is not followed
    ok = client.post(
        "/ui/login",
        data={"token": "bob-token", "csrf": nonce.group(1), "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert ok.headers["location"] == "/ui/board"
    assert "Bob" in client.get("/ui/board").text


def test_no_write_without_a_session_and_its_csrf_token(world: Any) -> None:
    client, service = world
    incident_id, lever_id = open_incident(client, service)
    url = f"/ui/levers/{lever_id}/approve"
    assert client.post(url).status_code == 401  # no session
    csrf = login(client, "alice-token")
    assert client.post(url).status_code == 403  # a session, no CSRF token
    assert client.post(url, data={"csrf": "forged"}).status_code == 403
    assert client.post(url, headers={"X-CSRF-Token": csrf + "x"}).status_code == 403
    lever = client.get(f"/api/v1/levers/{lever_id}", headers=auth("bob-token")).json()
    assert lever["approvals"] == []  # nothing was written
    posted = client.post(
        f"/ui/incidents/{incident_id}/comms",
        data={"channel": "incident_channel", "text": "hello"},
    )
    assert posted.status_code == 403
    with service.store.session() as s:
        assert not [c for c in comms.list(session=s, incident_id=incident_id) if c.text == "hello"]
    # a logout ends the session on the server, not just in this browser
    client.post("/ui/logout", data={"csrf": csrf})
    assert client.post(url, data={"csrf": csrf}).status_code == 401


def test_a_two_person_lever_through_the_pages_refuses_one_person_twice(world: Any) -> None:
    client, service = world
    incident_id, lever_id = open_incident(client, service)
    url = f"/ui/levers/{lever_id}/approve"
    alice = login(client, "alice-token")
    first = client.post(url, data={"csrf": alice}, headers={"HX-Request": "true"})
    assert first.status_code == 200, first.text
    assert "Still missing: incident_commander" in first.text
    again = client.post(url, data={"csrf": alice}, headers={"HX-Request": "true"})
    assert again.status_code == 409
    assert "a second approver must be another person" in again.text
    # a pull before the approvals are in is refused, as on the API
    assert client.post(f"/ui/levers/{lever_id}/pull", data={"csrf": alice}).status_code == 403
    client.cookies.clear()
    eve = login(client, "eve-token")
    assert client.post(url, data={"csrf": eve}).status_code == 403  # holds no role it needs
    client.cookies.clear()
    bob = login(client, "bob-token")
    done = client.post(url, data={"csrf": bob}, follow_redirects=False)
    assert done.status_code == 303  # without JavaScript: back to the incident page
    lever = client.get(f"/api/v1/levers/{lever_id}", headers=auth("bob-token")).json()
    assert lever["status"] == "applied"
    assert [a["person"] for a in lever["approvals"]] == ["Alice", "Bob"]
    page = client.get(f"/ui/incidents/{incident_id}").text
    assert "Undo lever" in page
    assert "Alice approved route_weight" in page
    # the TTFT probe of the incident's region, drawn server-side from the fleet's series
    assert "<svg" in page.split('id="chart-h"')[1].split("</section>")[0]


def test_user_text_is_escaped_everywhere(world: Any) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    csrf = login(client, "bob-token")
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    r = client.post(
        f"/ui/incidents/{incident_id}/comms",
        data={"csrf": csrf, "channel": "incident_channel", "text": evil},
    )
    assert r.status_code == 200, r.text
    client.post(
        f"/ui/incidents/{incident_id}/handoff",
        data={"csrf": csrf, "role": "incident_commander", "to_person": "<b>Mallory</b>"},
    )
    page = client.get(f"/ui/incidents/{incident_id}").text
    assert "<script>alert(2)" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    assert "<b>Mallory</b>" not in page
    board = client.get("/ui/board").text
    assert "&lt;b&gt;Mallory&lt;/b&gt;" in board  # the new IC, escaped
    assert "script-src 'self'" in client.get("/ui/board").headers["content-security-policy"]


@pytest.mark.parametrize(
    ("draft", "forbidden"),
    [
        ("Slow answers: gpu-usw2-b-0012 is being drained", "gpu-usw2-b-0012"),
        ("usw2-b lost half its replicas", "usw2-b"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig was leaked, rotating", "eyJhbGciOiJIUzI1NiJ9"),
        ("password=hunter2 rotated; latency elevated", "hunter2"),
        ("key sk-live_abcdefghijklmnop in a log; latency elevated", "sk-live_abcdefghijklmnop"),
        ("ops@example.com is on it; latency elevated", "ops@example.com"),
    ],
)
def test_the_public_status_page_preview_never_shows_a_secret_or_a_node_name(
    world: Any, draft: str, forbidden: str
) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    csrf = login(client, "bob-token")
    preview = client.post(
        f"/ui/incidents/{incident_id}/preview", data={"csrf": csrf, "text": draft}
    )
    assert preview.status_code == 200
    assert forbidden not in preview.text
    assert "us-west-2" in preview.text  # product × region granularity
    posted = client.post(
        f"/ui/incidents/{incident_id}/comms",
        data={"csrf": csrf, "channel": "status_page", "text": draft},
        headers={"HX-Request": "true"},
    )
    assert forbidden not in posted.text
    with service.store.session() as s:
        stored = [c.text for c in comms.list(session=s, incident_id=incident_id)]
    assert not any(forbidden in t for t in stored)
    assert forbidden not in client.get(f"/ui/incidents/{incident_id}").text.split('id="comms"')[1]


def test_a_clean_status_page_draft_is_shown_as_the_public_will_see_it(world: Any) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    csrf = login(client, "bob-token")
    text = "Elevated latency for chat in us-west-2; mitigation under way."
    preview = client.post(f"/ui/incidents/{incident_id}/preview", data={"csrf": csrf, "text": text})
    assert text in preview.text
    assert "withheld" not in preview.text


def test_the_board_shows_sev_axis_cell_ic_and_the_update_deadline(world: Any) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    csrf = login(client, "bob-token")
    client.post(
        f"/ui/incidents/{incident_id}/handoff",
        data={"csrf": csrf, "role": "incident_commander", "to_person": "Carol"},
    )
    board = client.get("/ui/board").text
    row = board.split(f'href="/ui/incidents/{incident_id}"')[1].split("</tr>")[0]
    assert "usw2-b" in row
    assert "Carol" in row
    assert "users" in row  # the deciding axis
    assert client.get("/ui/board?sev=1").text.count("/ui/incidents/INC-") == 0
    assert client.get("/ui/board?axis=security").text.count("/ui/incidents/INC-") == 0
    assert client.get("/ui/board?region=us-west-2").text.count("/ui/incidents/INC-") == 1
    fragment = client.get("/ui/board", headers={"HX-Request": "true", "HX-Target": "board-rows"})
    assert fragment.text.lstrip().startswith('<div id="board-rows"')


def test_break_glass_through_the_pages_needs_two_others_and_shows_its_expiry(world: Any) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    bob = login(client, "bob-token")
    asked = client.post(
        f"/ui/incidents/{incident_id}/breakglass",
        data={
            "csrf": bob,
            "identity": "carol",
            "scope": "nodes:patch",
            "reason": "cordon by hand",
            "ttl_min": "30",
        },
    )
    assert asked.status_code == 200, asked.text
    (request_id,) = set(re.findall(r"/ui/breakglass/([^/]+)/approve", asked.text))
    url = f"/ui/breakglass/{request_id}/approve"
    own = client.post(url, data={"csrf": bob, "incident": incident_id})
    assert own.status_code == 403  # the requester never approves their own request
    client.cookies.clear()
    alice = login(client, "alice-token")
    htmx = {"HX-Request": "true"}
    first = client.post(url, data={"csrf": alice, "incident": incident_id}, headers=htmx)
    assert first.status_code == 200
    assert "break-glass pending" in first.text
    client.cookies.clear()
    eve = login(client, "eve-token")
    second = client.post(url, data={"csrf": eve, "incident": incident_id}, headers=htmx)
    assert second.status_code == 200, second.text
    assert "break-glass granted" in second.text
    security = client.get("/ui/breakglass").text
    row = security.split("<td>nodes:patch</td>")[1].split("</tr>")[0]
    assert "<td>carol</td><td>nodes:patch</td>" in security
    assert "<td>bob</td><td>alice, eve</td>" in row  # who asked, who approved
    assert "active, 30m 00s left" in row


def test_the_commander_writes_the_postmortem_once_resolved(world: Any) -> None:
    client, service = world
    incident_id, _ = open_incident(client, service)
    form = {
        "root_cause_class": "capacity",
        "text": "usw2-b <b>ran hot</b> after a neighbour drain.",
        "ttd_min": "5",
        "gpu_hours_lost": "12.5",
        "item_kind": "game_day_scenario",
        "item_text": "drill the neighbour drain",
        "item_owner": "Dana",
    }
    bob = login(client, "bob-token")
    early = client.post(f"/ui/incidents/{incident_id}/postmortem", data={"csrf": bob, **form})
    assert early.status_code == 409  # not resolved yet: the API's rule and reason
    assert "is not resolved" in early.text
    gone = payload(alert("usw2-b", "CellTTFTBurnFast", region="us-west-2", status="resolved"))
    client.post("/api/v1/alerts/webhook", json=gone, headers=auth("am-token"))
    client.cookies.clear()
    eve = login(client, "eve-token")
    assert (
        client.post(
            f"/ui/incidents/{incident_id}/postmortem", data={"csrf": eve, **form}
        ).status_code
        == 403
    )  # the comms lead does not write it
    client.cookies.clear()
    bob = login(client, "bob-token")
    assert "Write postmortem" in client.get(f"/ui/incidents/{incident_id}").text
    done = client.post(
        f"/ui/incidents/{incident_id}/postmortem",
        data={"csrf": bob, **form},
        headers={"HX-Request": "true"},
    )
    assert done.status_code == 200, done.text
    assert "TTD</dt><dd>5m 00s" in done.text
    assert "12.5 GPU·h" in done.text
    assert "&lt;b&gt;ran hot&lt;/b&gt;" in done.text
    pm = client.get(f"/api/v1/incidents/{incident_id}/postmortem", headers=auth("bob-token"))
    assert pm.json()["action_items"][0]["owner"] == "Dana"


def test_the_board_pages_through_many_incidents_most_severe_first(world: Any) -> None:
    client, service = world
    with service.store.session() as s:
        for i in range(150):
            incidents.create(
                session=s,
                cell="use1-a",
                region="us-east-1",
                title=f"many {i}",
                sev=4 if i < 149 else 1,
                opened_at_s=float(i),
            )
    login(client, "bob-token")
    first = client.get("/ui/board").text
    assert "150 incidents; showing 1–100 (page 1 of 2)" in first
    assert first.index("many 149") < first.index("many 0<")  # the SEV1 first
    second = client.get("/ui/board?page=1").text
    assert "showing 101–150" in second
    assert "many 99<" in second
    assert 'rel="prev"' in second


def test_the_game_day_pages_show_the_ladder_and_render_a_stored_report(world: Any) -> None:
    from tests.drill.test_report import fixture_report

    client, service = world
    with service.store.session() as s:
        row, _ = ladder.record(
            session=s,
            name="l5-region-blackhole-llm-70b",
            rung=5,
            model="llm-70b",
            verdict="passed",
            run_by="Carol",
            runbook_author="Carol",
            at_s=3600.0,
            report=fixture_report(),
            started_at=datetime(2026, 11, 20, 10, tzinfo=UTC),
            override_reason="the pages need a run",
        )
        s.flush()
        result_id = row.id
    login(client, "bob-token")
    page = client.get("/ui/gamedays").text
    assert "last successful L5 for llm-70b:" in page
    assert "days ago" in page
    assert "Carol ran a drill of a runbook they wrote" in page  # a rotation warning
    assert "Preheat the survivor pool before shifting" in page  # an open action item
    assert f"/ui/gamedays/runs/{result_id}/report" in page
    report = client.get(f"/ui/gamedays/runs/{result_id}/report")
    assert report.status_code == 200
    assert report.text.count("<svg") >= 3
    assert "default-src 'none'" in report.headers["content-security-policy"]
    assert client.get("/ui/gamedays/runs/999/report").status_code == 404


def test_the_vendored_htmx_is_the_one_the_notes_name() -> None:
    notes = (STATIC / "VENDORED.md").read_text()
    digest = hashlib.sha256((STATIC / "htmx.min.js").read_bytes()).hexdigest()
    assert digest in notes
    assert (STATIC / "htmx.LICENSE").read_text().startswith("Zero-Clause BSD")


def test_the_cell_ttft_p99_is_the_histogram_quantile_of_the_summed_buckets() -> None:
    import numpy as np

    from firedrill.model.series import Series
    from firedrill.web.ui import cell_ttft_p99

    t = np.arange(0.0, 181.0, 15.0)

    # two replicas; every request of the last minute took between 0.25 s and 0.5 s
    def bucket(le: str, per_s: float, replica: str) -> Series:
        labels = (("cell", "usw2-b"), ("le", le), ("replica", replica))
        return Series("vllm:time_to_first_token_seconds_bucket", labels, t, per_s * t)

    found = [
        bucket(le, rate, r)
        for r in ("a", "b")
        for le, rate in (("0.25", 0.0), ("0.5", 10.0), ("1", 10.0), ("+Inf", 10.0))
    ]
    out = cell_ttft_p99(found)
    assert [x for x, _ in out] == [float(x) for x in t[1:]]
    assert all(v == pytest.approx(0.25 + 0.25 * 0.99) for _, v in out)
    assert cell_ttft_p99(found[:1]) == []  # one bucket is no histogram
