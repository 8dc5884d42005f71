"""Group commit of webhook calls: calls queued during a commit share the next one, each call is
answered only after its group committed, and one call the store refuses fails alone.

The writer runs over a stand-in service where the test has to hold a commit open, and over the
real ``IncidentService`` on a migrated store (SQLite and PostgreSQL) where what is stored counts.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from firedrill.app.group_commit import GroupCommit
from firedrill.app.serve import IncidentService, IngestResult
from firedrill.app.webhook import WebhookPayload
from firedrill.errors import StoreError
from firedrill.store import Store, open_store
from firedrill.store import alerts as received
from tests.web.test_serve_api import FixedClock, alert, payload, snapshot

WAIT_S = 10.0


def call(*alerts: dict[str, Any]) -> WebhookPayload:
    return WebhookPayload.model_validate(payload(*alerts))


class Held:
    """A service whose first commit waits until the test lets it go."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.inside = threading.Event()
        self.go = threading.Event()

    def ingest(self, p: WebhookPayload) -> str:
        return self.ingest_many([p])[0]

    def ingest_many(self, ps: Sequence[WebhookPayload]) -> list[str]:
        self.inside.set()
        assert self.go.wait(WAIT_S)
        self.groups.append([p.alerts[0].fingerprint for p in ps])
        return [p.alerts[0].fingerprint for p in ps]


def test_calls_queued_during_a_commit_share_the_next_one_and_wait_for_it() -> None:
    service = Held()
    writer: GroupCommit[str] = GroupCommit(service)
    first = writer.submit(call(alert("use1-a", fp="a1")))
    assert service.inside.wait(WAIT_S)  # the first commit is under way, held open
    rest = [writer.submit(call(alert("use1-b", fp=fp))) for fp in ("b1", "b2", "b3")]
    assert writer.queued == 3
    assert not first.done()  # nothing is answered before its commit
    assert not any(f.done() for f in rest)
    service.go.set()
    assert first.result(WAIT_S) == "a1"
    assert [f.result(WAIT_S) for f in rest] == ["b1", "b2", "b3"]
    writer.stop()
    assert service.groups == [["a1"], ["b1", "b2", "b3"]]


def test_a_group_stops_at_its_alert_cap() -> None:
    service = Held()
    service.go.set()
    writer: GroupCommit[str] = GroupCommit(service, max_alerts=2, autostart=False)
    futures = [writer.submit(call(alert("use1-a", fp=fp))) for fp in ("a1", "a2", "a3")]
    writer.start()
    assert [f.result(WAIT_S) for f in futures] == ["a1", "a2", "a3"]
    writer.stop()
    assert service.groups == [["a1", "a2"], ["a3"]]


def _copy_store(migrated_sqlite: Path, tmp_path: Path, name: str) -> Store:
    path = tmp_path / name
    shutil.copyfile(migrated_sqlite, path)
    return open_store(f"sqlite:///{path}")


def _calls() -> list[WebhookPayload]:
    return [
        call(alert("use1-a", fp="a1"), alert("use1-a", fp="a2", node="n2")),
        call(alert("use1-b", fp="b1")),
        call(alert("use1-a", fp="a1"), alert("use1-a", fp="a3", node="n3")),  # a1 again
        call(alert("use1-b", fp="b1", status="resolved")),  # closes use1-b's incident
        call(alert("use1-b", fp="b4", starts="2026-12-03T11:00:00Z")),  # opens a new one
    ]


def test_a_group_stores_what_the_calls_store_one_by_one(
    store: Store, migrated_sqlite: Path, tmp_path: Path
) -> None:
    grouped = IncidentService(store, clock=FixedClock())
    grouped.start()
    together = grouped.ingest_many(_calls())
    with _copy_store(migrated_sqlite, tmp_path, "one-by-one.db") as other:
        alone = IncidentService(other, clock=FixedClock())
        alone.start()
        one_by_one = [alone.ingest(p) for p in _calls()]
        assert together == one_by_one
        assert snapshot(store) == snapshot(other)
    assert [r.duplicates for r in together] == [0, 0, 1, 0, 0]
    assert together[3].resolved
    assert together[4].opened


def test_one_call_the_store_refuses_fails_alone_and_the_others_are_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = received.record_many

    def refusing(session: Any, rows: Sequence[Any]) -> None:
        if any(r["fingerprint"] == "bad" for r in rows):
            raise StoreError("refused: a row the store will not take")
        real(session, rows)

    monkeypatch.setattr(received, "record_many", refusing)
    service = IncidentService(store, clock=FixedClock())
    service.start()
    before = snapshot(store)
    writer: GroupCommit[IngestResult] = GroupCommit(service, autostart=False)
    good = writer.submit(call(alert("use1-a", fp="a1")))
    bad = writer.submit(call(alert("use1-b", fp="bad")))
    again = writer.submit(call(alert("use1-a", fp="a1"), alert("use1-a", fp="a2", node="n2")))
    writer.start()  # the three go in one group, which fails; then each goes alone
    assert good.result(WAIT_S).new == 1
    with pytest.raises(StoreError, match="refused"):
        bad.result(WAIT_S)
    assert (again.result(WAIT_S).new, again.result(WAIT_S).duplicates) == (1, 1)
    writer.stop()
    assert (writer.groups, writer.calls) == (1, 3)
    _, _, kept, _ = snapshot(store)
    assert kept == before[2] + 2  # a1 and a2; nothing of the refused call
    assert _cells(store) == ["use1-a"]
    assert service.ready


def _cells(store: Store) -> list[str]:
    from firedrill.store import incidents

    with store.session() as s:
        return [i.cell for i in incidents.list(session=s)]
