"""The audit log: append-only and tamper-evident, so "who did what, when" can be trusted later.

Each record is a link in a hash chain::

    hash = sha256(prev_hash + canonical_json({seq, at_s, actor, action, subject, data}))

where ``prev_hash`` is the previous record's ``hash`` (64 zeros for the first record), ``seq``
counts 1, 2, 3, ... with no gaps, and the canonical JSON has sorted keys, no spaces and UTF-8
text. ``verify`` walks the chain in ``seq`` order and reports the first record that does not fit:

* an edited record (any field, including ``hash``): its hash no longer matches its contents;
* a removed record: a gap in ``seq``, and the next record's ``prev_hash`` links to nothing;
* reordered records (``seq`` values swapped): ``seq`` is hashed, so both hashes break;
* records removed from the end leave a shorter but consistent chain: keep the ``head`` somewhere
  else (a ticket, a log line, a second database) and pass it back as ``verify``'s ``anchor``;
* a row that cannot be read back (its JSON broken, a number stored as bytes, a column of the
  wrong type) is reported like an edited one: it is evidence of tampering, not a reason to stop.

An anchor is the only defence against removing the whole log, or its newest records: an empty
log is a consistent chain of zero records. ``firedrill audit head`` prints the anchor to keep
(``seq`` and ``hash``), and ``firedrill audit verify --expect-head HASH --expect-count N``
checks the log against it.

This module has no function that updates or deletes a record. On PostgreSQL the migration also
installs a trigger that raises on UPDATE, DELETE and TRUNCATE of ``audit_log``, so a mistake or a
user without the owner's rights cannot change history. SQLite has no such guard: there the hash
chain alone makes tampering evident (it cannot prevent it; neither can the trigger against the
table's owner).

Appends are serialised (``serialize_writers``) so two writers never read the same head; the
unique ``prev_hash`` would refuse a fork anyway.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, select, type_coerce
from sqlalchemy.orm import Session

from firedrill.store import validate
from firedrill.store.db import mapped_errors, serialize_writers, writing
from firedrill.store.models import AuditRecord, JsonValue

GENESIS = "0" * 64
VERIFY_BATCH = 1000  # rows fetched at a time while verifying


@dataclass(frozen=True)
class ChainHead:
    """The last record of the log, worth keeping outside the database (see ``verify``)."""

    seq: int
    hash: str


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found: ``ok``, how many records the log holds, and the first bad one."""

    ok: bool
    records: int
    first_bad_seq: int | None = None
    problem: str | None = None


def record_hash(
    prev_hash: str,
    *,
    seq: int,
    at_s: float,
    actor: str,
    action: str,
    subject: str,
    data: Mapping[str, Any],
) -> str:
    """The hash of a record given the hash of the one before it."""
    body = validate.canonical_json(
        {
            "seq": seq,
            "at_s": at_s,
            "actor": actor,
            "action": action,
            "subject": subject,
            "data": data,
        }
    )
    return hashlib.sha256((prev_hash + body).encode("utf-8")).hexdigest()


def append(
    session: Session,
    *,
    actor: str,
    action: str,
    subject: str,
    data: Mapping[str, JsonValue] | None = None,
    at_s: float,
) -> AuditRecord:
    """Add a record at the end of the chain (committed with the caller's unit of work)."""
    row = AuditRecord(
        at_s=validate.seconds(at_s, "at_s"),
        actor=validate.name(actor, "actor"),
        action=validate.name(action, "action"),
        subject=validate.name(subject, "subject"),
        data=validate.json_object({} if data is None else data, "data"),
    )
    with writing(session, "cannot append to the audit log"):
        serialize_writers(session, AuditRecord.__tablename__)
        last = head(session)
        row.seq = 1 if last is None else last.seq + 1
        row.prev_hash = GENESIS if last is None else last.hash
        row.hash = record_hash(
            row.prev_hash,
            seq=row.seq,
            at_s=row.at_s,
            actor=row.actor,
            action=row.action,
            subject=row.subject,
            data=row.data,
        )
        session.add(row)
    return row


def head(session: Session) -> ChainHead | None:
    """The last record's ``seq`` and ``hash`` (``None`` for an empty log)."""
    query = select(AuditRecord.seq, AuditRecord.hash).order_by(AuditRecord.seq.desc()).limit(1)
    with mapped_errors("cannot read the audit log"):
        row = session.execute(query).first()
    return None if row is None else ChainHead(seq=row.seq, hash=row.hash)


def records(session: Session, *, after_seq: int = 0, limit: int = 100) -> Sequence[AuditRecord]:
    """Up to ``limit`` records after ``after_seq``, in order."""
    query = (
        select(AuditRecord)
        .where(AuditRecord.seq > after_seq)
        .order_by(AuditRecord.seq)
        .limit(validate.count(limit, "limit", low=1))
    )
    with mapped_errors("cannot read the audit log"):
        return session.scalars(query).all()


def verify(
    session: Session, *, anchor: ChainHead | None = None, expect_count: int | None = None
) -> VerifyResult:
    """Walk the whole chain; report the first record that was edited, removed or moved.

    ``anchor`` (a head kept outside the database) and ``expect_count`` (how many records the log
    held when it was last seen) catch records removed from the end, the whole log included.
    ``anchor.seq`` may be 0 when only the hash is known: the record with that hash is looked up.
    """
    # The JSON column is read as its stored text, so a row whose JSON is broken is reported as
    # tampered rather than failing inside the driver (PostgreSQL hands back parsed JSON).
    columns = (
        AuditRecord.seq,
        AuditRecord.at_s,
        AuditRecord.actor,
        AuditRecord.action,
        AuditRecord.subject,
        type_coerce(AuditRecord.data, String).label("data"),
        AuditRecord.prev_hash,
        AuditRecord.hash,
    )
    query = select(*columns).order_by(AuditRecord.seq).execution_options(yield_per=VERIFY_BATCH)
    with mapped_errors("cannot read the audit log"):
        rows = session.execute(query)
        seen, bad = _walk(rows)
        total = seen if bad is None else _count_rest(rows, seen)
    if bad is not None:
        return VerifyResult(ok=False, records=total, first_bad_seq=bad[0], problem=bad[1])
    if expect_count is not None and total < expect_count:
        return VerifyResult(
            ok=False,
            records=total,
            first_bad_seq=total + 1,
            problem=f"the log holds {total} records but {expect_count} were expected: "
            "records were removed from its end",
        )
    if anchor is not None:
        with mapped_errors("cannot read the audit log"):
            bad = _against_anchor(session, anchor, total)
        if bad is not None:
            return VerifyResult(ok=False, records=total, first_bad_seq=bad[0], problem=bad[1])
    return VerifyResult(ok=True, records=total)


_TEXT_FIELDS = ("actor", "action", "subject", "prev_hash", "hash")


def _readable(row: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The row's fields as the chain hashes them, or why they cannot be (a broken row)."""
    if isinstance(row.seq, bool) or not isinstance(row.seq, int):
        return None, f"seq is not an integer ({type(row.seq).__name__})"
    at_s = row.at_s
    if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not math.isfinite(at_s):
        return None, f"at_s is not a finite number ({type(at_s).__name__})"
    for name in _TEXT_FIELDS:
        if not isinstance(getattr(row, name), str):
            return None, f"{name} is not text ({type(getattr(row, name)).__name__})"
    data = row.data
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None, "data is not valid JSON"
    if not isinstance(data, dict):
        return None, f"data is not a JSON object ({type(data).__name__})"
    fields = {name: getattr(row, name) for name in _TEXT_FIELDS}
    return {"seq": row.seq, "at_s": float(at_s), "data": data, **fields}, None


def _walk(rows: Iterable[Any]) -> tuple[int, tuple[int, str] | None]:
    """Check rows in seq order; return how many were read and the first (seq, problem), if any."""
    expected_seq = 1
    prev_hash = GENESIS
    seen = 0
    for raw in rows:
        seen += 1
        row, broken = _readable(raw)
        if row is None:
            return seen, (
                expected_seq,
                f"record {expected_seq} cannot be read back ({broken}): it was edited",
            )
        seq = row["seq"]
        if seq != expected_seq:
            if seq > expected_seq:
                return seen, (
                    expected_seq,
                    f"record {expected_seq} is missing (the next record is {seq}): "
                    "records were removed or renumbered",
                )
            return seen, (seq, f"seq {seq} is out of order (expected {expected_seq})")
        if row["prev_hash"] != prev_hash:
            before = "the genesis value" if seq == 1 else f"record {seq - 1}'s hash"
            return seen, (
                seq,
                f"prev_hash does not match {before}: a record before it was removed, "
                "reordered or edited",
            )
        computed = record_hash(
            row["prev_hash"],
            seq=seq,
            at_s=row["at_s"],
            actor=row["actor"],
            action=row["action"],
            subject=row["subject"],
            data=row["data"],
        )
        if computed != row["hash"]:
            return seen, (
                seq,
                "hash does not match the record's contents: the record was edited or moved",
            )
        prev_hash = row["hash"]
        expected_seq += 1
    return seen, None


def _count_rest(rows: Iterable[Any], seen: int) -> int:
    return seen + sum(1 for _ in rows)


def _against_anchor(session: Session, anchor: ChainHead, total: int) -> tuple[int, str] | None:
    if anchor.seq <= 0 and anchor.hash == GENESIS:  # anchored while the log was empty
        return None
    if anchor.seq <= 0:  # only the hash is known: the record holding it must still be there
        seq = session.scalar(select(AuditRecord.seq).where(AuditRecord.hash == anchor.hash))
        if seq is None:
            return (
                total + 1,
                f"no record has the anchored hash {anchor.hash[:16]}…: the record it names "
                "(and perhaps those after it) was removed or edited",
            )
        return None
    if anchor.seq > total:
        return (
            total + 1,
            f"the log ends at record {total} but the anchor names record {anchor.seq}: "
            "records were removed from its end",
        )
    stored = session.scalar(select(AuditRecord.hash).where(AuditRecord.seq == anchor.seq))
    if stored != anchor.hash:
        return anchor.seq, f"record {anchor.seq}'s hash differs from the anchor's"
    return None
