"""Alertmanager webhook payloads into the store's ingestor, and the store's audit chain.

Webhook: a v4 payload (``version``, ``status``, ``alerts`` with ``labels`` and ``startsAt``) is
what ``firedrill`` receives from Alertmanager; each alert goes to ``AlertIngestor`` the way a
receiver hands it over. Whatever the labels hold (brackets, unicode, empty or missing
``alertname``/``cell``, times out of order), an alert is taken or refused with ``StoreError``,
and the audit chain stays intact.

Audit chain: any sequence of appends verifies; changing any one stored field of any one record
to a different value is caught (TAMPERED at that record or earlier), never a crash.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from firedrill.errors import StoreError
from firedrill.store import audit, open_store
from firedrill.store.ingest import AlertIngestor
from tests.fuzz.profiles import FUZZ

EPOCH = datetime(2026, 12, 3, tzinfo=UTC)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz-store") / "migrated.db"
    with open_store(f"sqlite:///{path}") as store:
        store.migrate()
    return path


def _fresh(template: Path, directory: Path, n: int) -> str:
    path = directory / f"store-{n}.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


label_text = st.one_of(
    st.sampled_from(["use1-a", "use1-b", "DCGMXidFatal", "SLOBurn", "", " ", "[/x]", "a[b]c"]),
    st.text(max_size=40),
)
labels = st.fixed_dictionaries(
    {},
    optional={
        "alertname": label_text,
        "cell": label_text,
        "severity": st.sampled_from(["page", "ticket", "security", "weird"]),
        "region": label_text,
    },
).flatmap(
    lambda known: st.dictionaries(st.text(max_size=10), label_text, max_size=3).map(
        lambda extra: {**extra, **known}
    )
)
alert = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved", "unknown"]),
        "labels": labels,
        "annotations": st.dictionaries(st.text(max_size=8), st.text(max_size=30), max_size=2),
        "startsAt": st.integers(min_value=-3600, max_value=86_400 * 3).map(
            lambda s: (EPOCH + timedelta(seconds=s)).isoformat()
        )
        | st.sampled_from(["0001-01-01T00:00:00Z", "not a time", ""]),
        "fingerprint": st.text(max_size=16),
    }
)
payload = st.fixed_dictionaries(
    {
        "version": st.just("4"),
        "status": st.sampled_from(["firing", "resolved"]),
        "receiver": st.sampled_from(["page", "ticket", "security", "[/x]"]),
        "groupKey": st.text(max_size=20),
        "commonLabels": labels,
        "alerts": st.lists(alert, min_size=1, max_size=6),
    }
)


def _deliver(ingestor: AlertIngestor, session: Any, body: dict[str, Any]) -> int:
    """Hand each alert of a v4 payload to the ingestor, as a receiver does; how many it took."""
    taken = 0
    for a in body["alerts"]:
        merged = {**body["commonLabels"], **a["labels"]}
        try:
            at = datetime.fromisoformat(a["startsAt"].replace("Z", "+00:00"))
        except ValueError:
            continue  # a receiver answers 400 for a time it cannot read
        try:
            ingestor.ingest(
                session,
                merged,
                (at - EPOCH).total_seconds(),
                resolved=a["status"] == "resolved",
                receiver=body["receiver"],
            )
            taken += 1
        except StoreError:
            pass  # refused: nothing written for this alert
    return taken


@FUZZ
@given(payloads=st.lists(payload, min_size=1, max_size=4))
def test_webhook_payloads_are_taken_or_refused_and_the_log_stays_intact(
    template: Path, tmp_path_factory: pytest.TempPathFactory, payloads: list[dict[str, Any]]
) -> None:
    url = _fresh(template, tmp_path_factory.mktemp("webhook"), 0)
    ingestor = AlertIngestor()
    with open_store(url) as store:
        for body in payloads:
            try:
                with store.session() as session:
                    _deliver(ingestor, session, body)
            except StoreError:
                ingestor = AlertIngestor()  # an ingestor out of step is replaced, as a server does
        with store.session() as session:
            result = audit.verify(session)
    assert result.ok, result.problem


names = st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=20).filter(
    str.strip
)  # what audit.append accepts (it refuses NUL and blank names up front)
record = st.fixed_dictionaries(
    {
        "actor": names,
        "action": st.sampled_from(["lever.apply", "incident.open", "x"]),
        "subject": names,
        "data": st.dictionaries(
            st.text(st.characters(blacklist_characters="\x00"), max_size=6),
            st.none() | st.booleans() | st.integers(-(2**53), 2**53) | names,
            max_size=4,
        ),
        "at_s": st.floats(min_value=0, max_value=1e9),
    }
)
tamper = st.one_of(
    st.sampled_from(["'x'", "X'00FF'", "NULL", "0", "1e308", "'{broken'", "'[]'", "'{}'"]),
    st.integers(-5, 5).map(str),
)


@FUZZ
@given(
    records=st.lists(record, min_size=1, max_size=8),
    column=st.sampled_from(
        ["seq", "at_s", "actor", "action", "subject", "data", "prev_hash", "hash"]
    ),
    value=tamper,
    which=st.integers(min_value=0, max_value=7),
)
def test_any_one_edit_of_the_audit_chain_is_caught(
    template: Path,
    tmp_path_factory: pytest.TempPathFactory,
    records: list[dict[str, Any]],
    column: str,
    value: str,
    which: int,
) -> None:
    url = _fresh(template, tmp_path_factory.mktemp("chain"), 0)
    with open_store(url) as store:
        with store.session() as session:
            for r in records:
                audit.append(session, **r)
        with store.session() as session:
            assert audit.verify(session).ok
        seq = which % len(records) + 1
        with store.engine.begin() as conn:
            before: object = conn.execute(
                text(f"SELECT quote({column}) FROM audit_log WHERE seq = :s"), {"s": seq}
            ).scalar_one()
            try:
                conn.execute(
                    text(f"UPDATE audit_log SET {column} = {value} WHERE seq = :s"), {"s": seq}
                )
            except IntegrityError:  # a constraint refused the edit: nothing changed
                return
            after = conn.execute(
                text(f"SELECT quote({column}) FROM audit_log WHERE seq = :s"), {"s": seq}
            ).scalar_one_or_none()
        with store.session() as session:
            result = audit.verify(session)
    if after == before:
        assert result.ok
    else:
        assert not result.ok, f"edit of {column} of record {seq} to {value} not caught"
        assert result.first_bad_seq is not None
        assert result.first_bad_seq <= seq
