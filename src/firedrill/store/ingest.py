"""Incidents into the store: a ``respond`` run's report, and alerts as they arrive.

A run of ``firedrill respond`` decides everything in memory: which incidents open, their
severity, the levers pulled and their inverses, the postmortem's numbers. Incident command has to
outlive that process (a handoff at 04:00, a postmortem next week, an auditor next year), so two
ways lead into the store:

``persist_report(session, report, actor=..., run_at_s=0)``
    Writes the ``incidents[]`` of a respond report (its JSON, as a dict): one incident row each,
    a timeline event per alert group, severity change, lever, comms update, break-glass grant,
    mitigation and resolution, the lever journal with each applied lever's inverse, the comms
    posted, the break-glass grants, the postmortem with its action items (resolved incidents
    only: TTR needs a resolution), and an audit record for every decision: opening, escalation,
    lever (and its undo), approval, break-glass request/approval/grant/use/reap, mitigation,
    resolution, postmortem. The whole report is checked first (``respond_report.read_report``);
    a bad one is refused with the path of the bad field and nothing written, and a write the
    store refuses half-way undoes the whole report. Times are the report's seconds plus
    ``run_at_s``.

    **Re-importing the same run is idempotent**: a run is identified by the SHA-256 of its
    report's canonical JSON, recorded in a ``respond.persist`` audit record together with the ids
    the store gave its incidents. Persisting it again writes nothing and returns those ids
    (``Persisted.created`` is False).

``AlertIngestor``
    Takes notifications one at a time (a webhook call, or a single alert's labels) and routes
    them through ``respond.incidents.IncidentBook``, the same logic ``respond`` uses (one
    incident per cell group, tripwires their own, severity only up), then writes what changed:
    an opened incident (row, timeline, audit), an alert group joining one (timeline), a severity
    raised (row, timeline, audit). The caller chooses the unit of work: one transaction per alert
    (what a webhook receiver does) or one per batch. The book lives in memory and assumes every
    write it made was committed: if a write fails or its transaction is rolled back, discard the
    ingestor (it refuses further alerts after a failure it sees).

Where the store's rules and a report disagree, the store's rules win and the report's numbers
are adjusted in the open: an incident cannot be mitigated before it opened (automation that acted
earlier, within the five minutes command looks back, counts as mitigating it when it opened; the
timeline says how much earlier), nor after it resolved.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Literal, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from firedrill.detect.notify import Notification
from firedrill.errors import OperationError, StoreError
from firedrill.model.series import Labels
from firedrill.respond.incidents import IncidentBook, IncidentKind
from firedrill.respond.incidents import TimelineEvent as BookEvent
from firedrill.respond.severity import Sev
from firedrill.scenario.result import RespondReport as TypedReport
from firedrill.store import (
    audit,
    breakglass,
    comms,
    incidents,
    levers,
    postmortems,
    timeline,
    validate,
)
from firedrill.store.db import mapped_errors, serialize_writers, writing
from firedrill.store.models import (
    AuditRecord,
    Channel,
    JsonObject,
    JsonValue,
    LeverStatus,
    TimelineEvent,
)
from firedrill.store.respond_report import (
    SEVS,
    UNKNOWN_REGION,
    ReportEvent,
    ReportGrant,
    ReportIncident,
    ReportLever,
    ReportUpdate,
    RespondReport,
    read_report,
)

PERSIST_ACTION: Final = "respond.persist"
SYSTEM_ACTOR: Final = "firedrill"  # triage: the incident book that opened and rated incidents
ALERT_ACTOR: Final = "alertmanager"
DEFAULT_GROUP_BY: Final = ("cell", "alertname")  # Alertmanager's grouping in RoutingSpec

# --- persisting a report ---------------------------------------------------------------------


@dataclass(frozen=True)
class Persisted:
    """Where a run went: the store's id for each of the report's incident ids."""

    run: str  # the report's digest
    incidents: dict[str, str]  # report id -> store id, in report order
    created: bool  # False: the run was already in the store and nothing was written


def run_subject(digest: str) -> str:
    """The audit subject that names a persisted run."""
    return f"run:{digest}"


def persisted_run(session: Session, digest: str) -> dict[str, str] | None:
    """The incident ids a run was stored under, or ``None`` when it never was."""
    query = (
        select(AuditRecord.data)
        .where(AuditRecord.action == PERSIST_ACTION, AuditRecord.subject == run_subject(digest))
        .order_by(AuditRecord.seq)
        .limit(1)
    )
    with mapped_errors("cannot read the audit log"):
        data = session.scalar(query)
    if data is None:
        return None
    ids = data.get("incidents")
    return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}


def persist_report(
    session: Session,
    report: TypedReport | Mapping[str, object],
    *,
    actor: str,
    run_at_s: float = 0.0,
) -> Persisted:
    """Write a respond report's incidents to the store (all of them, or nothing on an error).

    Idempotent: a run already persisted (same report digest) is not written again; its ids are
    returned with ``created`` False.
    """
    parsed = read_report(report)
    who = validate.name(actor, "actor")
    base_s = validate.seconds(run_at_s, "run_at_s")
    with writing(session, "cannot persist the run"):
        # one importer at a time, so two cannot both find the run missing and both write it
        serialize_writers(session, AuditRecord.__tablename__)
        before = persisted_run(session, parsed.digest)
        if before is not None:
            return Persisted(parsed.digest, before, created=False)
        ids = {
            inc.id: _IncidentWriter(session, inc, parsed, who, base_s).write()
            for inc in parsed.incidents
        }
        audit.append(
            session,
            actor=who,
            action=PERSIST_ACTION,
            subject=run_subject(parsed.digest),
            data={
                "scenario": parsed.scenario,
                "seed": parsed.seed,
                "spec_sha256": parsed.spec_sha256,
                "incidents": cast(JsonValue, ids),
            },
            at_s=base_s + parsed.sim_seconds,
        )
    return Persisted(parsed.digest, ids, created=True)


@dataclass
class _IncidentWriter:
    """Writes one report incident: its row, timeline, lever journal, postmortem and audit."""

    session: Session
    inc: ReportIncident
    report: RespondReport
    who: str
    base_s: float
    sid: str = ""

    def at(self, s: float) -> float:
        return self.base_s + s

    @property
    def ref(self) -> JsonObject:
        return {"report_id": self.inc.id, "run": self.report.digest}

    def event(
        self, at_s: float, kind: str, actor: str, text: str, data: Mapping[str, JsonValue]
    ) -> None:
        timeline.add(
            session=self.session,
            incident_id=self.sid,
            at_s=self.at(at_s),
            kind=kind,
            actor=actor,
            text=text,
            data={**data, **self.ref},
        )

    def record(self, at_s: float, action: str, actor: str, data: Mapping[str, JsonValue]) -> None:
        audit.append(
            self.session,
            actor=actor,
            action=action,
            subject=self.sid,
            data={**data, **self.ref},
            at_s=self.at(at_s),
        )

    def write(self) -> str:
        inc = self.inc
        row = incidents.create(
            session=self.session,
            cell=inc.cell,
            region=inc.region,
            title=inc.title,
            sev=inc.opening_sev,
            opened_at_s=self.at(inc.opened_at_s),
        )
        self.sid = row.id
        self.record(
            inc.opened_at_s,
            "incident.open",
            self.who,
            {"sev": inc.opening_sev, "cell": inc.cell, "region": inc.region, "title": inc.title},
        )
        self._alerts()
        self.event(
            inc.opened_at_s,
            "assessment",
            SYSTEM_ACTOR,
            _assessment_text(inc),
            {
                **inc.assessment,
                "alerts": inc.alerts,
                "scenario": self.report.scenario,
                "seed": self.report.seed,
                "postmortem_draft": _draft(inc),
            },
        )
        self._severity()
        for grant in inc.grants:
            self._grant(grant)
        for lv in inc.levers:
            self._lever(lv)
        for update in inc.updates:
            self._update(update)
        self._ending()
        return self.sid

    def _grant(self, g: ReportGrant) -> None:
        """The grant (reaped when the broker reaped it) and every broker event, audited."""
        row = breakglass.grant(
            session=self.session,
            incident_id=self.sid,
            identity=g.identity,
            requested_by=g.requested_by,
            approved_by=g.approvers,
            granted_at_s=self.at(g.granted_at_s),
            expires_at_s=self.at(g.expires_at_s),
            scope=g.scope,
        )
        reaped = g.reaped_at_s
        if reaped is not None:
            breakglass.reap(session=self.session, grant_id=row.id, at_s=self.at(reaped))
        self.event(
            g.granted_at_s,
            "breakglass",
            " + ".join(g.approvers),
            f"break-glass {g.identity} for {g.scope}, approved by {', '.join(g.approvers)}, "
            f"until {g.expires_at_s:g} s",
            {"grant_id": row.id, "grant": g.grant, "requested_by": g.requested_by},
        )
        for e in g.events:
            self.record(
                e.at_s,
                f"breakglass.{e.event}",
                e.actor,
                {"grant_id": row.id, "grant": g.grant, "scope": g.scope, "detail": e.detail},
            )

    def _update(self, u: ReportUpdate) -> None:
        """A comms update: the status page's text and the incident channel's, as posted."""
        posts = [(Channel.status_page, u.status_page), (Channel.incident_channel, u.channel)]
        for channel, text in posts:
            if text.strip():
                comms.post(
                    session=self.session,
                    incident_id=self.sid,
                    channel=channel,
                    text=text,
                    at_s=self.at(u.at_s),
                    due_s=None if u.due_s is None else self.at(u.due_s),
                )
        late = f", {u.late_s:g} s late" if u.late_s > 0 else ""
        first = "first update" if u.first else "update"
        self.event(
            u.at_s,
            "comms",
            self.who,
            f"{first}{late}: {u.status_page or u.channel}",
            {"due_s": u.due_s, "late_s": u.late_s, "first": u.first},
        )

    def _alerts(self) -> None:
        """The book's opening and every alert group that joined: one event each."""
        inc = self.inc
        book = [e for e in inc.events if e.kind in ("opened", "alert_joined")]
        if not any(e.kind == "opened" for e in book):  # a report without the book's timeline
            book.insert(
                0, ReportEvent(inc.opened_at_s, "opened", f"{inc.kind} incident opened", {})
            )
        for e in book:
            if e.kind == "opened":
                self.event(e.at_s, "opened", SYSTEM_ACTOR, e.text, e.data)
            else:
                self.event(e.at_s, "alert_group", ALERT_ACTOR, e.text, e.data)

    def _severity(self) -> None:
        """An event per rating (kept or not); the row and the audit log follow each rise."""
        sev = self.inc.opening_sev
        for h in self.inc.sev_history:
            shown = "none" if h.sev is None else f"SEV{h.sev}"
            kept = "" if h.applied else " (not applied: severity only goes up during an incident)"
            self.event(
                h.at_s,
                "severity",
                SYSTEM_ACTOR,
                f"{shown} on {h.axis}: {h.reason}{kept}",
                {"sev": shown, "axis": h.axis, "applied": h.applied},
            )
            if h.applied and h.sev is not None and h.sev < sev:
                incidents.escalate(session=self.session, incident_id=self.sid, sev=h.sev)
                self.record(
                    h.at_s,
                    "incident.escalate",
                    self.who,
                    {"from": sev, "to": h.sev, "axis": h.axis, "reason": h.reason},
                )
                sev = h.sev

    def _lever(self, lv: ReportLever) -> None:
        entry = levers.record(
            session=self.session,
            incident_id=self.sid,
            kind=lv.kind,
            scope=lv.scope,
            op={
                "lever": lv.kind,
                "scope": lv.scope,
                "cell": self.inc.cell,
                "operations": list(lv.operations),
            },
            inverse=None if lv.inverse is None else {"operations": list(lv.inverse)},
            status=lv.status,
            at_s=self.at(lv.at_s),
            reason=lv.reason,
            approvers=lv.approvers,
        )
        by = lv.approvers[0] if lv.approvers else self.who
        self.event(
            lv.at_s,
            "lever",
            by,
            f"{lv.status.value} {lv.kind} ({lv.scope}): {lv.reason or 'no reason given'}",
            {"journal_id": entry.id, "kind": lv.kind, "status": lv.status.value},
        )
        self.record(
            lv.at_s,
            f"lever.{lv.status.value}",
            by,
            {
                "journal_id": entry.id,
                "kind": lv.kind,
                "scope": lv.scope,
                "reason": lv.reason,
                "approvers": list(lv.approvers),
                "inverse": None if lv.inverse is None else list(lv.inverse),
            },
        )
        for approver in lv.approvers:
            self.record(lv.at_s, "lever.approve", approver, {"journal_id": entry.id})
        if lv.undone_at_s is not None:
            why = lv.undo or "verification did not clear the symptom"
            self.event(
                lv.undone_at_s,
                "lever",
                by,
                f"undid {lv.kind}: {why}",
                {"journal_id": entry.id, "kind": lv.kind, "status": "undone"},
            )
            self.record(
                lv.undone_at_s,
                "lever.undo",
                by,
                {"journal_id": entry.id, "kind": lv.kind, "reason": why},
            )

    def _ending(self) -> None:
        """Mitigation, resolution and the postmortem (which needs the resolution)."""
        inc, who = self.inc, self.who
        opened, resolved, first = inc.opened_at_s, inc.resolved_at_s, inc.mitigated_at_s
        mitigated: float | None = None
        if first is not None:
            mitigated = max(first, opened)
            if resolved is not None:
                mitigated = min(mitigated, resolved)
            early = (
                f"; automation acted {opened - first:g} s before it opened"
                if first < opened
                else ""
            )
            incidents.mitigate(session=self.session, incident_id=self.sid, at_s=self.at(mitigated))
            self.event(mitigated, "mitigated", who, f"mitigated: first lever applied{early}", {})
            self.record(mitigated, "incident.mitigate", who, {"first_lever_at_s": self.at(first)})
        if resolved is None:
            return
        incidents.resolve(session=self.session, incident_id=self.sid, at_s=self.at(resolved))
        self.event(resolved, "resolved", who, f"resolved at SEV{inc.sev}: every alert resolved", {})
        self.record(resolved, "incident.resolve", who, {"sev": inc.sev})
        start = opened - inc.ttd_s
        pm = postmortems.create(
            session=self.session,
            incident_id=self.sid,
            ttd_s=inc.ttd_s,
            ttm_s=(resolved if mitigated is None else mitigated) - start,
            ttr_s=resolved - start,
            gpu_hours_lost=inc.gpu_hours_lost,
            requests_failed=inc.requests_failed,
            tokens_refunded=inc.tokens_refunded,
            root_cause_class=inc.root_cause_class,
            text=_postmortem_text(inc),
        )
        for item in inc.action_items:
            postmortems.add_action_item(
                session=self.session,
                postmortem_id=pm.id,
                kind=item.kind,
                text=item.text,
                owner=item.owner,
            )
        self.record(
            resolved,
            "postmortem.write",
            who,
            {"postmortem_id": pm.id, "action_items": len(inc.action_items)},
        )


def _assessment_text(inc: ReportIncident) -> str:
    deciding = inc.assessment.get("deciding_axis") or "none (its floor or a declaration)"
    suspects = inc.assessment.get("suspects")
    n = len(suspects) if isinstance(suspects, list) else 0
    return f"{inc.kind} incident at SEV{inc.sev}, deciding axis {deciding}; {n} suspect change(s)"


def _draft(inc: ReportIncident) -> JsonObject:
    return {
        "ttd_s": inc.ttd_s,
        "gpu_hours_lost": inc.gpu_hours_lost,
        "requests_failed": inc.requests_failed,
        "action_items": [{"kind": a.kind.value, "text": a.text} for a in inc.action_items],
    }


def _postmortem_text(inc: ReportIncident) -> str:
    lines = [f"{inc.title} ({inc.kind} incident in {inc.cell}, {inc.region}), SEV{inc.sev}."]
    recommendation = inc.assessment.get("recommendation")
    if isinstance(recommendation, str) and recommendation:
        lines.append(f"First lever advised: {recommendation}.")
    applied = [lv for lv in inc.levers if lv.status is LeverStatus.applied]
    if applied:
        lines.append(
            f"{len(applied)} lever(s) applied, the first {applied[0].kind} "
            f"{applied[0].at_s:g} s into the run."
        )
    return "\n".join(lines)


# --- alerts one at a time --------------------------------------------------------------------


@dataclass(frozen=True)
class Ingested:
    """What one notification did in the store, by store incident id."""

    opened: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()  # got at least one new alert (opened ones included)
    raised: tuple[str, ...] = ()  # severity went up after opening


@dataclass
class _Mirror:
    store_id: str
    written: int = 0  # how many of the book incident's timeline events are in the store
    sev: int = 0


@dataclass
class AlertIngestor:
    """Opens and joins incidents from alerts with ``IncidentBook``'s rules, writing to the store."""

    actor: str = SYSTEM_ACTOR  # who the audit log names for the book's decisions
    book: IncidentBook = field(default_factory=IncidentBook)
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    _mirrors: dict[str, _Mirror] = field(default_factory=dict, init=False, repr=False)
    _failed: str | None = field(default=None, init=False, repr=False)

    def store_id(self, book_id: str) -> str:
        """The store's id of an incident the book opened."""
        mirror = self._mirrors.get(book_id)
        if mirror is None:
            raise StoreError(f"the ingestor opened no incident {book_id!r}")
        return mirror.store_id

    def ingest(
        self,
        session: Session,
        labels: Labels | Mapping[str, str],
        at_s: float,
        *,
        resolved: bool = False,
        receiver: str | None = None,
    ) -> Ingested:
        """One alert, firing (or ``resolved``), as a notification of its own."""
        pairs: Labels = (
            tuple(sorted(labels.items())) if isinstance(labels, Mapping) else tuple(labels)
        )
        as_map = dict(pairs)
        for key in ("alertname", "cell"):
            if not as_map.get(key, "").strip():
                raise StoreError(f"alert {as_map!r} has no '{key}' label")
        to = receiver if receiver is not None else _receiver(pairs)
        n = Notification(
            receiver=to,
            group_key=tuple(as_map.get(k, "") for k in self.group_by),
            alertname=as_map["alertname"],
            cell=as_map["cell"],
            at_s=at_s,
            alerts=() if resolved else (pairs,),
            resolved=(pairs,) if resolved else (),
        )
        return self.notify(session, n)

    def notify(self, session: Session, n: Notification) -> Ingested:
        """A notification (one webhook call): route it through the book, write what changed."""
        self._usable()
        if not math.isfinite(n.at_s):
            raise StoreError(f"at_s must be a finite number, got {n.at_s!r}")
        if not n.cell.strip():
            raise StoreError(f"notification for {n.alertname!r} has no cell")
        try:
            update = self.book.ingest(n)
        except ValueError as exc:  # time going backwards: checked before the book changes
            raise StoreError(str(exc)) from exc
        with self._writes(f"alert {n.alertname} in {n.cell}"):
            for book_id in update.touched:
                self._sync(session, book_id)
        return Ingested(
            opened=tuple(self._mirrors[i].store_id for i in update.opened),
            joined=tuple(self._mirrors[i].store_id for i in update.joined),
            raised=tuple(self._mirrors[i].store_id for i in update.raised),
        )

    def adopt(
        self,
        store_id: str,
        *,
        kind: IncidentKind,
        cell: str,
        region: str,
        title: str,
        opened_at_s: float,
        status: Literal["open", "mitigated"],
        sev: int,
        alerts: Sequence[Labels],
        firing: Collection[Labels],
    ) -> str:
        """Take back an unresolved store incident (after a restart); the book's id for it.

        Nothing is written: the store has the incident already. Its next alerts join it and are
        written as they arrive.
        """
        self._usable()
        book_id = f"R-{store_id}"
        group_key: tuple[str, ...] = ()
        if alerts:
            first = dict(alerts[0])
            group_key = tuple(first.get(k, "") for k in self.group_by)
        try:
            self.book.adopt(
                book_id,
                kind=kind,
                cell=cell,
                region=region,
                title=title,
                opened_at_s=opened_at_s,
                status=status,
                sev=Sev(sev),
                alerts=alerts,
                firing=firing,
                group_key=group_key,
            )
        except (OperationError, ValueError) as exc:
            raise StoreError(f"cannot adopt {store_id}: {exc}") from exc
        self._mirrors[book_id] = _Mirror(store_id, written=0, sev=sev)
        return book_id

    def mitigate(self, session: Session, store_id: str, at_s: float, *, by: str) -> None:
        """Mark an incident mitigated, in the book and the store."""
        book_id = self._book_id(store_id)
        self._usable()
        try:
            self.book.mitigate(book_id, at_s, by)
        except ValueError as exc:  # checked before the book changes
            raise StoreError(str(exc)) from exc
        with self._writes(f"mitigating {store_id}"):
            self._sync(session, book_id)

    def resolve(self, session: Session, store_id: str, at_s: float) -> None:
        """Resolve an incident whose alerts have all resolved; the cell's next alert opens anew."""
        book_id = self._book_id(store_id)
        self._usable()
        try:
            self.book.resolve(book_id, at_s)
        except ValueError as exc:  # checked before the book changes
            raise StoreError(str(exc)) from exc
        with self._writes(f"resolving {store_id}"):
            self._sync(session, book_id)

    def _book_id(self, store_id: str) -> str:
        for book_id, mirror in self._mirrors.items():
            if mirror.store_id == store_id:
                return book_id
        raise StoreError(f"no incident {store_id!r} was opened by this ingestor")

    def _usable(self) -> None:
        if self._failed is not None:
            raise StoreError(
                f"this ingestor no longer matches the store ({self._failed}): start a new one"
            )

    @contextmanager
    def _writes(self, what: str) -> Iterator[None]:
        """Mark the ingestor unusable when a write fails: the book is ahead of the store then."""
        try:
            yield
        except BaseException:
            self._failed = f"writing {what} failed"
            raise

    def _sync(self, session: Session, book_id: str) -> None:
        """Write the book incident's events the store does not have yet."""
        inc = self.book.get(book_id)
        mirror = self._mirrors.get(book_id)
        new = inc.timeline if mirror is None else inc.timeline[mirror.written :]
        for e in new:
            mirror = self._write(session, book_id, e, mirror)
        if mirror is not None:
            mirror.written = len(inc.timeline)

    def _write(
        self, session: Session, book_id: str, e: BookEvent, mirror: _Mirror | None
    ) -> _Mirror:
        inc = self.book.get(book_id)
        data: dict[str, JsonValue] = {k: v for k, v in e.data.items()}
        if mirror is None:  # the first event of an incident is its opening
            sev = SEVS.get(str(e.data.get("sev")), int(inc.sev))
            row = incidents.create(
                session=session,
                cell=inc.cell,
                region=inc.region or UNKNOWN_REGION,
                title=inc.title,
                sev=sev,
                opened_at_s=inc.opened_at_s,
            )
            mirror = _Mirror(row.id, sev=sev)
            self._mirrors[book_id] = mirror
            _add_event(session, row.id, e.at_s, "opened", SYSTEM_ACTOR, e.text, data)
            audit.append(
                session,
                actor=self.actor,
                action="incident.open",
                subject=row.id,
                data={"sev": sev, "cell": inc.cell, "kind": inc.kind, "book_id": book_id},
                at_s=e.at_s,
            )
            return mirror
        sid = mirror.store_id
        if e.kind == "alert_joined":
            _add_event(session, sid, e.at_s, "alert_group", ALERT_ACTOR, e.text, data)
        elif e.kind == "severity_raised":
            to = SEVS[str(e.data["to"])]
            incidents.escalate(session=session, incident_id=sid, sev=to)
            _add_event(session, sid, e.at_s, "severity", SYSTEM_ACTOR, e.text, data)
            audit.append(
                session,
                actor=self.actor,
                action="incident.escalate",
                subject=sid,
                data={"from": mirror.sev, "to": to, "reason": e.text},
                at_s=e.at_s,
            )
            mirror.sev = to
        elif e.kind in ("mitigated", "resolved"):
            by = inc.mitigated_by if e.kind == "mitigated" else self.actor
            if e.kind == "mitigated":
                incidents.mitigate(session=session, incident_id=sid, at_s=e.at_s)
            else:
                incidents.resolve(session=session, incident_id=sid, at_s=e.at_s)
            _add_event(session, sid, e.at_s, e.kind, by, e.text, data)
            action = "incident.mitigate" if e.kind == "mitigated" else "incident.resolve"
            audit.append(session, actor=by, action=action, subject=sid, data=data, at_s=e.at_s)
        else:  # pragma: no cover - the book has no other event kinds
            _add_event(session, sid, e.at_s, e.kind, SYSTEM_ACTOR, e.text, data)
        return mirror


def _receiver(labels: Labels) -> str:
    """Where the default routing sends an alert: its ``severity`` label decides, else a ticket."""
    severity = dict(labels).get("severity", "")
    return severity if severity in ("security", "page") else "ticket"


def _add_event(
    session: Session,
    incident_id: str,
    at_s: float,
    kind: str,
    actor: str,
    text: str,
    data: Mapping[str, JsonValue],
) -> None:
    """``timeline.add`` for an incident the ingestor itself wrote: one INSERT and nothing else.

    It skips the service's lookup of the incident (the ingestor created it; the foreign key
    still refuses an unknown one) and its savepoint (a failed write ends the ingestor's use and
    its transaction anyway). The values are checked by the same ``validate`` functions.
    """
    row = {
        "incident_id": incident_id,
        "at_s": validate.seconds(at_s, "at_s"),
        "kind": validate.name(kind, "kind"),
        "actor": validate.name(actor, "actor"),
        "text": validate.prose(text, "text"),
        "data": validate.json_object(data, "data"),
    }
    with mapped_errors(f"cannot add to the timeline of {incident_id}"):
        session.execute(_INSERT_EVENT, [row])


_INSERT_EVENT = insert(cast(Table, TimelineEvent.__table__))
