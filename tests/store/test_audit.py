"""The audit log's hash chain on SQLite and PostgreSQL: intact chains verify, tampering is caught.

Tampering is done the way an attacker with the database's keys would: direct SQL, on PostgreSQL
after switching the append-only trigger off (``session_replication_role = replica``, which needs
the rights the table's owner or a superuser has).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, bindparam, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.types import JSON
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.errors import StoreError
from firedrill.store import ChainHead, Store, audit
from firedrill.store.audit import GENESIS

runner = CliRunner()


def _fill(store: Store, n: int) -> None:
    with store.session() as s:
        for i in range(1, n + 1):
            audit.append(
                s,
                actor=f"user-{i % 3}",
                action="lever.apply" if i % 2 else "incident.open",
                subject=f"INC-{i:04d}",
                data={"i": i, "weights": {"use1-a": i % 100, "use1-b": 0.5}, "tags": ["a", "é"]},
                at_s=60.0 * i + 0.25,
            )


def _verify(store: Store, anchor: ChainHead | None = None) -> audit.VerifyResult:
    with store.session() as s:
        return audit.verify(s, anchor=anchor)


@contextmanager
def _tampering(store: Store) -> Iterator[Connection]:
    """A raw connection with the append-only trigger (PostgreSQL) out of the way; commits."""
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.execute(text("SET LOCAL session_replication_role = replica"))
        yield conn


def test_fifty_records_verify(store: Store) -> None:
    _fill(store, 50)
    result = _verify(store)
    assert result == audit.VerifyResult(ok=True, records=50)
    with store.session() as s:
        first, second = audit.records(s, limit=2)
        head = audit.head(s)
    assert (first.seq, first.prev_hash, second.prev_hash) == (1, GENESIS, first.hash)
    assert head is not None
    assert head.seq == 50
    assert _verify(store, anchor=head).ok


def test_hash_is_sha256_of_prev_hash_and_canonical_json(store: Store) -> None:
    with store.session() as s:
        rec = audit.append(
            s,
            actor="ana",
            action="breakglass.grant",
            subject="INC-0001",
            data={"scope": "cell/use1-a", "approvers": ["bo"]},
            at_s=12.5,
        )
    body = (
        '{"action":"breakglass.grant","actor":"ana","at_s":12.5,'
        '"data":{"approvers":["bo"],"scope":"cell/use1-a"},"seq":1,"subject":"INC-0001"}'
    )
    assert rec.hash == hashlib.sha256((GENESIS + body).encode()).hexdigest()


def test_empty_log_verifies(store: Store) -> None:
    assert _verify(store) == audit.VerifyResult(ok=True, records=0)


def test_edited_record_is_caught(store: Store) -> None:
    _fill(store, 50)
    with _tampering(store) as conn:
        conn.execute(text("UPDATE audit_log SET actor = 'mallory' WHERE seq = 17"))
    result = _verify(store)
    assert (result.ok, result.records, result.first_bad_seq) == (False, 50, 17)
    assert result.problem is not None
    assert "edited" in result.problem


def test_rehashed_edit_is_caught_at_the_next_record(store: Store) -> None:
    _fill(store, 50)
    with store.session() as s:
        (rec,) = audit.records(s, after_seq=16, limit=1)
        forged = audit.record_hash(
            rec.prev_hash,
            seq=17,
            at_s=rec.at_s,
            actor="mallory",
            action=rec.action,
            subject=rec.subject,
            data=rec.data,
        )
    with _tampering(store) as conn:
        conn.execute(
            text("UPDATE audit_log SET actor = 'mallory', hash = :h WHERE seq = 17"), {"h": forged}
        )
    result = _verify(store)
    assert (result.ok, result.first_bad_seq) == (False, 18)
    assert result.problem is not None
    assert "prev_hash" in result.problem


def test_removed_record_is_caught(store: Store) -> None:
    _fill(store, 50)
    with _tampering(store) as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq = 23"))
    result = _verify(store)
    assert (result.ok, result.records, result.first_bad_seq) == (False, 49, 23)
    assert result.problem is not None
    assert "missing" in result.problem


def test_removed_first_record_is_caught(store: Store) -> None:
    _fill(store, 5)
    with _tampering(store) as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq = 1"))
    assert _verify(store).first_bad_seq == 1


def test_swapped_records_are_caught(store: Store) -> None:
    _fill(store, 50)
    with _tampering(store) as conn:
        for old, new in ((10, -1), (30, 10), (-1, 30)):
            conn.execute(
                text("UPDATE audit_log SET seq = :new WHERE seq = :old"), {"old": old, "new": new}
            )
    result = _verify(store)
    assert (result.ok, result.first_bad_seq) == (False, 10)


def test_truncated_end_is_caught_with_an_anchor(store: Store) -> None:
    _fill(store, 50)
    with store.session() as s:
        anchor = audit.head(s)
    with _tampering(store) as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq > 45"))
    assert _verify(store).ok  # a shorter chain is consistent on its own ...
    result = _verify(store, anchor=anchor)  # ... but not with the head kept elsewhere
    assert (result.ok, result.records, result.first_bad_seq) == (False, 45, 46)
    assert anchor is not None
    wrong = ChainHead(seq=anchor.seq - 10, hash=anchor.hash)
    assert _verify(store, anchor=wrong).first_bad_seq == 40


def test_updates_and_deletes_raise_on_postgresql_only(store: Store) -> None:
    """PostgreSQL refuses them with a trigger; SQLite has none and relies on the hash chain."""
    _fill(store, 5)
    update = "UPDATE audit_log SET actor = 'mallory' WHERE seq = 2"
    if store.dialect == "postgresql":
        for sql in (update, "DELETE FROM audit_log WHERE seq = 3", "TRUNCATE audit_log"):
            with pytest.raises(DBAPIError, match="append-only"), store.engine.begin() as conn:
                conn.execute(text(sql))
        assert _verify(store) == audit.VerifyResult(ok=True, records=5)
    else:
        with store.engine.begin() as conn:
            conn.execute(text(update))
        assert _verify(store).first_bad_seq == 2


def test_refused_append_leaves_the_chain_intact(store: Store) -> None:
    _fill(store, 3)
    with store.session() as s:
        for bad in (
            {"data": {"x": float("nan")}},
            {"data": {"x": {1, 2}}},
            {"actor": ""},
            {"at_s": float("inf")},
            {"subject": "s" * 201},
        ):
            kwargs: dict[str, Any] = {
                "actor": "a",
                "action": "b",
                "subject": "c",
                "data": {},
                "at_s": 1.0,
                **bad,
            }
            with pytest.raises(StoreError):
                audit.append(s, **kwargs)
        audit.append(s, actor="a", action="b", subject="c", at_s=2.0)
    assert _verify(store) == audit.VerifyResult(ok=True, records=4)


def test_concurrent_appends_keep_one_chain(store: Store) -> None:
    def append_some(who: int) -> None:
        for i in range(10):
            with store.session() as s:
                audit.append(
                    s, actor=f"w{who}", action="tick", subject="s", data={"i": i}, at_s=float(i)
                )

    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(append_some, w) for w in range(4)]:
            future.result()  # re-raises a worker's error here
    assert _verify(store) == audit.VerifyResult(ok=True, records=40)


# --- any single edit of any field of any record is caught ---------------------------------------

CHAIN_LEN = 12
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
EDITS: dict[str, st.SearchStrategy[Any]] = {
    "seq": st.integers(CHAIN_LEN + 1, 2**31 - 1) | st.integers(-(2**31), 0),
    "at_s": st.floats(allow_nan=False, allow_infinity=False),
    "actor": _text,
    "action": _text,
    "subject": _text,
    "data": st.dictionaries(_text, _json, max_size=3),
    "prev_hash": st.text("0123456789abcdef", max_size=64),
    "hash": st.text("0123456789abcdef", max_size=64),
}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@settings(
    max_examples=120,
    deadline=None,
    # the chain is built once per backend; every example rolls its edit back
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_single_edit_is_caught(store: Store, data: st.DataObject) -> None:
    with store.session() as s:
        empty = audit.head(s) is None
    if empty:
        _fill(store, CHAIN_LEN)
    with store.session() as s:
        rows = {r.seq: r for r in audit.records(s, limit=CHAIN_LEN)}
    seq = data.draw(st.integers(1, CHAIN_LEN), label="record")
    field = data.draw(st.sampled_from(sorted(EDITS)), label="field")
    value = data.draw(EDITS[field], label="value")
    old = getattr(rows[seq], field)
    if _canonical(value) == _canonical(old):
        reject()  # not an edit
    statement = text(f"UPDATE audit_log SET {field} = :v WHERE seq = :seq")
    if field == "data":
        statement = statement.bindparams(bindparam("v", type_=JSON))
    with store.engine.connect() as conn:
        trans = conn.begin()
        try:
            if store.dialect == "postgresql":
                conn.execute(text("SET LOCAL session_replication_role = replica"))
            try:
                with conn.begin_nested():
                    conn.execute(statement, {"v": value, "seq": seq})
            except IntegrityError:
                reject()  # the database refused this edit (a duplicate hash): nothing to catch
            with Session(bind=conn) as s:
                result = audit.verify(s)
        finally:
            trans.rollback()
    assert not result.ok, (field, seq, value)
    moved_first = field == "seq" and value < 1
    assert result.first_bad_seq == (value if moved_first else seq), result


# --- the command line ---------------------------------------------------------------------------


def test_cli_audit_verify(store: Store) -> None:
    _fill(store, 20)
    url = store.url.render_as_string(hide_password=False)
    ok = runner.invoke(app, ["audit", "verify", "--db", url])
    assert ok.exit_code == 0, ok.output
    assert "20 records" in ok.output
    with _tampering(store) as conn:
        conn.execute(text("UPDATE audit_log SET at_s = 0 WHERE seq = 7"))
    bad = runner.invoke(app, ["audit", "verify", "--db", url])
    assert bad.exit_code == 1, bad.output
    assert "seq 7" in bad.output


def test_cli_audit_verify_without_a_store_is_exit_4(tmp_path: Any) -> None:
    result = runner.invoke(app, ["audit", "verify", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 4
    assert "no store" in result.output
    assert not (tmp_path / "none.db").exists()
