"""``firedrill serve``'s use cases: alerts in, incidents and lever proposals out, people decide.

An on-call team puts firedrill beside its pager: Alertmanager's webhook delivers alerts, this
service turns them into one incident per cell group in the store (the same ``IncidentBook`` rules
``respond`` uses, through ``AlertIngestor``), and the responder proposes levers in the rollback
order with their guard checks, **advise mode**: nothing touches the fleet until the people a
lever's guard needs approve it through the API. The last approval pulls it (the guards run
again first, the inverse is journalled before anything is applied); verification then reads the
incident's burn rate from Prometheus until it clears (the incident is mitigated) or the window
ends (the lever is undone, as the responder does).

Restarts: every distinct alert event is kept (``store.alerts``); on start, unresolved incidents
are adopted back into the book with the alerts they carried and which of them still fire, so the
next alert of that cell joins the same incident. Levers proposed before a restart are matched to
the responder's new proposals by kind, target and operations, so they are not proposed twice.

Concurrency: one lock orders ingestion, ticks and lever decisions. Webhook calls are committed
in groups (``ingest_many``, driven by ``app/group_commit.py``): the calls queued while the
previous group committed go in one transaction, each routed as it would be alone, and none is
answered before that transaction committed. Time comes from the ``Clock`` port: the fleet's
clock when a served twin is the fleet (its change feed and the incidents share one time base),
else the wall clock.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, Protocol, cast

from pydantic import BaseModel

from firedrill.app.webhook import MAX_ALERTS, WebhookAlert, WebhookPayload
from firedrill.detect.notify import Notification
from firedrill.detect.rules import sli_error_expr
from firedrill.detect.slo import SloSpec
from firedrill.drill.journal import encode_op
from firedrill.errors import FiredrillError, OperationError, StoreError, UnknownTargetError
from firedrill.model.series import Labels
from firedrill.ports import Clock, Fleet, Signals
from firedrill.respond import levers as lv
from firedrill.respond.breakglass import SEV1_ROLES, BreakGlassBroker, BreakGlassError
from firedrill.respond.guards import Approver, GuardResult, Role
from firedrill.respond.incidents import Incident as BookIncident
from firedrill.respond.incidents import IncidentBook, IncidentKind
from firedrill.respond.levers import Lever, LeverJournalEntry
from firedrill.respond.responder import LeverRecord, Responder, ResponderPolicy, Runbook
from firedrill.respond.runbooks import RUNBOOKS
from firedrill.respond.severity import Sev, SevMatrix
from firedrill.respond.suspects import SymptomKind
from firedrill.scenario.command import symptom_kind
from firedrill.store import Store, audit, comms, incidents, levers, timeline
from firedrill.store import alerts as received
from firedrill.store import breakglass as store_breakglass
from firedrill.store.ingest import AlertIngestor
from firedrill.store.models import Channel, JsonValue, LeverStatus

log = logging.getLogger("firedrill.serve")

ROLES: Final[tuple[Role, ...]] = (
    "incident_commander",
    "ops_lead",
    "comms_lead",
    "scribe",
    "model_owner",
    "capacity_lead",
    "security_lead",
)
SERVICE_ACTOR: Final = "firedrill-serve"
EventType = Literal[
    "incident.opened",
    "incident.updated",
    "timeline",
    "lever.proposed",
    "lever.approved",
    "lever.applied",
    "lever.refused",
    "lever.verified",
    "lever.undone",
    "comms",
]
EventSink = Callable[[EventType, str | None, Mapping[str, Any]], None]


def canonical(person: str) -> str:
    """How identities compare: case-folded, surrounding space stripped."""
    return person.strip().casefold()


class ServeError(FiredrillError):
    """A request the service refuses: ``status`` is the HTTP status the web layer answers."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        self.status = status
        super().__init__(message)


# --- reading burn rates from Prometheus ------------------------------------------------------


class PromQLSource(Signals, Protocol):
    """Signals that also evaluate raw PromQL (``PrometheusSignals``)."""

    def vector(self, promql: str, *, at_s: float | None = None) -> Sequence[Any]: ...


class SloBurnProbe:
    """The responder's ``SymptomProbe`` on a real Prometheus: the SLOs' error ratio per cell over
    ``window`` (a PromQL duration on Prometheus's own clock) as a multiple of each SLO's budget;
    ``firing`` is what Alertmanager told the service is firing."""

    def __init__(
        self,
        prometheus: PromQLSource,
        slo: SloSpec,
        *,
        window: str,
        firing: Callable[[], Collection[Labels]],
    ) -> None:
        self.prometheus = prometheus
        self.slo = slo
        self.window = window
        self._firing = firing

    def burn_rate(self, cells: Collection[str], window_s: float) -> float | None:
        worst: float | None = None
        for o in self.slo.objectives:
            for sample in self.prometheus.vector(sli_error_expr(o, self.window)):
                if sample.label("cell") not in cells or sample.value != sample.value:  # NaN
                    continue
                rate = float(sample.value) / o.budget
                worst = rate if worst is None else max(worst, rate)
        return worst

    def firing(self) -> Collection[Labels]:
        return self._firing()


class HeldAlert(Protocol):
    """An alert as Alertmanager holds it (``adapters.alertmanager.AmAlert``)."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def labels(self) -> Labels: ...

    @property
    def starts_at(self) -> datetime: ...


class AlertSource(Protocol):
    """Where the alerts firing now can be read (``adapters.alertmanager.AlertmanagerClient``)."""

    def alerts(self) -> Sequence[HeldAlert]: ...


# --- what the API shows ------------------------------------------------------------------------


class CheckRead(BaseModel):
    guard: str
    ok: bool
    reason: str


class ApprovalRead(BaseModel):
    person: str
    role: str
    at_s: float


class LeverRead(BaseModel):
    id: int
    incident_id: str
    kind: str
    target: str
    scope: str
    status: Literal["proposed", "refused", "applied", "verified", "not_cleared", "undone"]
    reason: str
    at_s: float
    operations: list[dict[str, Any]]
    checks: list[CheckRead]
    roles_needed: list[str]
    approvals: list[ApprovalRead]
    roles_missing: list[str]
    applied_id: int | None = None  # the journal entry of the pull
    verify_detail: str = ""


class AxisRead(BaseModel):
    axis: str
    level: str
    value: float
    reason: str


class SuspectRead(BaseModel):
    stream: str
    cell: str
    subject: str
    before: str
    after: str
    at_s: float
    score: float
    lead_s: float
    evidence: list[str]


class IncidentRead(BaseModel):
    id: str
    cell: str
    region: str
    title: str
    sev: int
    status: str
    opened_at_s: float
    mitigated_at_s: float | None
    resolved_at_s: float | None
    kind: str | None = None  # cell | automation | security, while the service follows it
    firing_alerts: int = 0


class TimelineRead(BaseModel):
    id: int
    at_s: float
    kind: str
    actor: str
    text: str
    data: dict[str, Any]


class IncidentDetail(IncidentRead):
    axes: list[AxisRead]
    deciding_axis: str | None
    suspects: list[SuspectRead]
    levers: list[LeverRead]
    timeline: list[TimelineRead]
    alerts: list[dict[str, str]]


class BreakGlassRead(BaseModel):
    request_id: str
    status: Literal["pending", "granted"]
    identity: str
    scope: str
    grant_id: int | None = None
    expires_at_s: float | None = None


class Dependency(BaseModel):
    name: str
    state: Literal["ok", "down", "not configured"]
    detail: str = ""


class StatusRead(BaseModel):
    mode: str
    ready: bool
    open_incidents: int
    pending_verifications: int
    last_tick_at_s: float | None
    dependencies: list[Dependency]


class IngestResult(BaseModel):
    received: int
    new: int
    duplicates: int
    opened: list[str]
    joined: list[str]
    resolved: list[str]


@dataclass
class _Pending:
    """A pulled lever whose symptom is being watched."""

    proposal_id: int
    applied_id: int
    entry: LeverJournalEntry
    book_id: str
    applied_at_s: float
    approvers: tuple[Approver, ...]


@dataclass
class _Proposal:
    """A proposed lever the service can pull: its request, once the responder proposed it."""

    journal_id: int
    book_id: str
    lever: Lever | None
    key: str


@dataclass
class _Outcome:
    status: Literal["applied", "verified", "not_cleared", "undone"]
    applied_id: int
    detail: str = ""


@dataclass
class ServeSettings:
    """How the service decides: responder policy (advise by default) and verification."""

    policy: ResponderPolicy = field(default_factory=ResponderPolicy)
    verify_window_s: float = 600.0  # on the service's clock: how long a pull may take to clear
    # the severity matrix at the fleet's GPU-hour price (``severity_for``; $2/GPU-h by default)
    severity: SevMatrix = field(default_factory=SevMatrix)


def _proposal_key(book_cell: str, entry: LeverJournalEntry) -> str:
    ops = [encode_op(o) for o in entry.ops]
    return json.dumps([book_cell, entry.kind, entry.target, ops], sort_keys=True)


def _labels(alert: WebhookAlert) -> Labels:
    return alert.label_pairs


def _receiver(labels: Mapping[str, str]) -> str:
    severity = labels.get("severity", "")
    return severity if severity in ("security", "page") else "ticket"


def _record(
    s: Any,
    *,
    incident_id: str,
    at_s: float,
    kind: str,
    actor: str,
    text: str,
    data: dict[str, JsonValue],
    action: str,
    audit_subject: str | None = None,
    audit_data: dict[str, JsonValue] | None = None,
) -> None:
    """A decision on an incident, kept twice: on its timeline for people, in the audit log for
    auditors (by the same actor, about the incident unless ``audit_subject`` says otherwise)."""
    timeline.add(
        session=s, incident_id=incident_id, at_s=at_s, kind=kind, actor=actor, text=text, data=data
    )
    audit.append(
        s,
        actor=actor,
        action=action,
        subject=incident_id if audit_subject is None else audit_subject,
        data=data if audit_data is None else audit_data,
        at_s=at_s,
    )


class IncidentService:
    """Alerts → incidents → proposals → approvals → pulls → verification, kept in the store."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        settings: ServeSettings | None = None,
        fleet: Fleet | None = None,
        signals: Signals | None = None,
        probe_factory: Callable[[Callable[[], Collection[Labels]]], Any] | None = None,
        on_event: EventSink | None = None,
        runbooks: Mapping[SymptomKind, Runbook] | None = None,
        alertmanager: AlertSource | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings or ServeSettings()
        self.fleet = fleet
        self.signals = signals
        self._emit: EventSink = on_event or (lambda *_: None)
        self.lock = threading.RLock()
        self._probe_factory = probe_factory
        self._runbooks = RUNBOOKS if runbooks is None else runbooks
        self.alertmanager = alertmanager
        self._now_s = float("-inf")
        self.ready = False
        self._started = False
        self.last_tick_at_s: float | None = None
        self._reset()

    # --- state ------------------------------------------------------------------------------

    def _reset(self) -> None:
        """A fresh book and responder (at start, and after a failed write)."""
        self.ingestor = AlertIngestor(
            actor=SERVICE_ACTOR, book=IncidentBook(self.settings.severity)
        )
        self.responder: Responder | None = None
        if self.fleet is not None and self._probe_factory is not None:
            self.responder = Responder(
                self.settings.policy,
                self.fleet,
                probe=self._probe_factory(self.firing),
                classify=symptom_kind,
                signals=self.signals,
                book=self.ingestor.book,
                runbooks=self._runbooks,
            )
        self._holder: dict[Labels, str] = {}  # alert labels -> book id of its incident
        self._kind: dict[str, IncidentKind] = {}
        self._proposals: dict[str, _Proposal] = {}  # proposal key -> proposal
        self._by_journal: dict[int, _Proposal] = {}
        self._comms_done: dict[str, int] = {}
        self._pending: dict[int, _Pending] = {}
        self._outcomes: dict[int, _Outcome] = {}  # proposal id -> what its pull did
        # verified pulls: the entry and approvers an undo needs
        self._kept: dict[int, tuple[LeverJournalEntry, tuple[Approver, ...]]] = {}
        self.broker = BreakGlassBroker()  # pending requests live here until granted
        self._bg_incident: dict[str, str] = {}  # request id -> incident id

    def firing(self) -> Collection[Labels]:
        """Alerts firing now, as Alertmanager reported them."""
        out: set[Labels] = set()
        for inc in self.ingestor.book.incidents:
            out.update(inc.firing)
        return out

    def _now(self) -> float:
        now = max(self.clock.now_s(), self._now_s)  # the book's clock only moves forward
        self._now_s = now
        return now

    def start(self) -> None:
        """Adopt the store's unresolved incidents, catch up with Alertmanager, accept alerts."""
        with self.lock:
            self._reset()
            self._restore()
            self.ready = True
            self._started = True
        if self.alertmanager is not None:
            try:
                self.catch_up()
            except FiredrillError as exc:  # Alertmanager re-sends what it holds anyway
                log.warning("cannot catch up with Alertmanager: %s", exc)

    def catch_up(self) -> IngestResult | None:
        """Ingest the alerts Alertmanager holds firing now (those missed while this service was
        down; the ones already kept are duplicates). Alerts without a cell are skipped."""
        assert self.alertmanager is not None
        held = []
        for a in self.alertmanager.alerts():
            try:
                held.append(
                    WebhookAlert(
                        status="firing",
                        labels=dict(a.labels),
                        startsAt=a.starts_at,
                        fingerprint=a.fingerprint,
                    )
                )
            except ValueError as exc:
                log.info("not caught up: alert %s: %s", a.fingerprint, exc)
        if not held:
            return None
        results = [
            self.ingest(
                WebhookPayload(
                    version="4",
                    status="firing",
                    receiver="alertmanager-catch-up",
                    alerts=held[i : i + MAX_ALERTS],
                )
            )
            for i in range(0, len(held), MAX_ALERTS)
        ]
        return IngestResult(
            received=sum(r.received for r in results),
            new=sum(r.new for r in results),
            duplicates=sum(r.duplicates for r in results),
            opened=[x for r in results for x in r.opened],
            joined=[x for r in results for x in r.joined],
            resolved=[x for r in results for x in r.resolved],
        )

    def _restore(self) -> None:
        with self.store.session() as s:
            kept = received.open_incident_alerts(s)
            by_incident: dict[str, list[received.Received]] = {}
            for r in kept:
                if r.incident_id is not None:
                    by_incident.setdefault(r.incident_id, []).append(r)
            kinds = {
                rec.subject: str(rec.data.get("kind", "cell"))
                for rec in received.audit_of(s, action="incident.open")
            }
            for row in incidents.list(session=s):
                if row.status.value == "resolved":
                    continue
                rows = by_incident.get(row.id, [])
                carried = [tuple(sorted(r.labels.items())) for r in rows]
                state: dict[Labels, bool] = {}
                for r in rows:  # the latest event of each alert decides
                    state[tuple(sorted(r.labels.items()))] = r.status == "firing"
                kind = cast(IncidentKind, kinds.get(row.id, "cell"))
                if kind not in ("cell", "automation", "security"):
                    kind = "cell"
                book_id = self.ingestor.adopt(
                    row.id,
                    kind=kind,
                    cell=row.cell,
                    region=row.region,
                    title=row.title,
                    opened_at_s=row.opened_at_s,
                    status="mitigated" if row.status.value == "mitigated" else "open",
                    sev=row.sev,
                    alerts=list(dict.fromkeys(carried)),
                    firing=[a for a, on in state.items() if on],
                )
                self._kind[book_id] = kind
                for a in carried:
                    self._holder[a] = book_id
                self._now_s = max(self._now_s, row.opened_at_s, *(r.at_s for r in rows))
                for entry in levers.list(session=s, incident_id=row.id):
                    key = entry.op.get("key")
                    if entry.status is LeverStatus.proposed and isinstance(key, str):
                        p = _Proposal(entry.id, book_id, None, key)
                        self._proposals[key] = p
                        self._by_journal[entry.id] = p
                self._comms_done[book_id] = 0

    # --- alerts in ----------------------------------------------------------------------------

    def ingest(self, payload: WebhookPayload) -> IngestResult:
        """One webhook call: keep each new alert event once, route it, write what changed."""
        return self.ingest_many([payload])[0]

    def ingest_many(self, payloads: Sequence[WebhookPayload]) -> list[IngestResult]:
        """Several webhook calls in one transaction (a group commit): each routed as ``ingest``
        routes it, in order, with one duplicate check and one INSERT of the received alerts for
        all. All of them are stored, or (on an error) none and the book is rebuilt."""
        results: list[IngestResult] = []
        events: list[tuple[EventType, str | None, dict[str, Any]]] = []
        with self.lock:
            if not self.ready and self._started:
                self._recover()  # a write failed earlier and the store was unreachable then
            if not self.ready:
                raise ServeError("not ready: open incidents are being restored", status=503)
            now = self._now()
            try:
                with self.store.session() as s:
                    known = received.seen(s, (a.key for p in payloads for a in p.alerts))
                    rows: list[dict[str, object]] = []
                    for payload in payloads:
                        results.append(self._route(s, payload, now, known, rows, events))
                    received.record_many(s, rows)
            except BaseException:
                self._recover()  # the session rolled back: the book is ahead of the store
                raise
        for kind, subject, data in events:
            self._emit(kind, subject, data)
        return results

    def _route(
        self,
        s: Any,
        payload: WebhookPayload,
        now: float,
        known: set[received.Key],
        rows: list[dict[str, object]],
        events: list[tuple[EventType, str | None, dict[str, Any]]],
    ) -> IngestResult:
        """One call's new alerts through the book; their received rows are added to ``rows``."""
        opened: list[str] = []
        joined: list[str] = []
        resolved: list[str] = []
        fresh: dict[tuple[str, str, str], WebhookAlert] = {}
        for a in payload.alerts:
            if a.key not in known:
                fresh.setdefault(a.key, a)
        known.update(fresh)  # a later call of the same commit finds them kept
        groups: dict[tuple[str, str], list[WebhookAlert]] = {}
        for a in fresh.values():
            groups.setdefault((a.labels["cell"], a.labels["alertname"]), []).append(a)
        for (cell, name), group in groups.items():
            self._notify(s, cell, name, group, now, opened, joined)
        for a in fresh.values():
            holder = self._holder.get(_labels(a))
            rows.append(
                {
                    "fingerprint": a.fingerprint,
                    "starts_at": a.starts_at_key,
                    "status": a.status,
                    "labels": a.labels,
                    "receiver": payload.receiver,
                    "at_s": now,
                    "incident_id": None if holder is None else self.ingestor.store_id(holder),
                }
            )
        for book_id in self._resolvable():
            sid = self.ingestor.store_id(book_id)
            self.ingestor.resolve(s, sid, now)
            resolved.append(sid)
        for opened_id in dict.fromkeys(opened):
            events.append(("incident.opened", opened_id, {"at_s": now}))
        for changed_id in dict.fromkeys(joined + resolved):
            if changed_id not in opened:
                events.append(("incident.updated", changed_id, {"at_s": now}))
        return IngestResult(
            received=len(payload.alerts),
            new=len(fresh),
            duplicates=len(payload.alerts) - len(fresh),
            opened=list(dict.fromkeys(opened)),
            joined=list(dict.fromkeys(joined)),
            resolved=resolved,
        )

    def _notify(
        self,
        s: Any,
        cell: str,
        name: str,
        group: list[WebhookAlert],
        now: float,
        opened: list[str],
        joined: list[str],
    ) -> None:
        firing = [a for a in group if a.status == "firing"]
        gone = [a for a in group if a.status == "resolved"]
        for severity_group in _by_receiver(firing):
            first = severity_group[0].labels
            n = Notification(
                receiver=_receiver(first),
                group_key=(cell, name),
                alertname=name,
                cell=cell,
                at_s=now,
                alerts=tuple(_labels(a) for a in severity_group),
                resolved=(),
            )
            before = {i.id for i in self.ingestor.book.incidents}
            got = self.ingestor.notify(s, n)
            opened += got.opened
            joined += got.joined
            touched = [i for i in self.ingestor.book.incidents if i.id not in before]
            touched += [
                i for i in self.ingestor.book.incidents if i.id in before and i.status != "resolved"
            ]
            # each alert's holder is the first of ``touched`` it fires in: one set
            # intersection per incident instead of a scan of the incidents per alert
            left = {_labels(a) for a in severity_group}
            for holder in touched:
                if not left:
                    break
                here = left.intersection(holder.firing)
                if here:
                    left -= here
                    for labels in here:
                        self._holder[labels] = holder.id
                    self._kind[holder.id] = holder.kind
        if gone:
            n = Notification(
                receiver=_receiver(gone[0].labels),
                group_key=(cell, name),
                alertname=name,
                cell=cell,
                at_s=now,
                alerts=(),
                resolved=tuple(_labels(a) for a in gone),
            )
            self.ingestor.notify(s, n)
            for a in gone:
                gone_from = self._holder.get(_labels(a))
                if gone_from is not None:
                    joined.append(self.ingestor.store_id(gone_from))

    def _resolvable(self) -> list[str]:
        return [
            i.id
            for i in self.ingestor.book.incidents
            if i.status != "resolved" and not i.firing and i.alerts
        ]

    def _recover(self) -> None:
        """A write failed half-way: the book is ahead of the store. Rebuild it from the store."""
        log.warning("a write failed: rebuilding the incident book from the store")
        self.ready = False
        try:
            self._reset()
            self._restore()
        except FiredrillError:
            log.exception("cannot rebuild the incident book; /readyz reports not ready")
            return
        self.ready = True

    # --- the responder loop ---------------------------------------------------------------------

    def tick(self) -> None:
        """One evaluation step: propose levers and comms, verify pulls. Called periodically."""
        events: list[tuple[EventType, str | None, dict[str, Any]]] = []
        with self.lock:
            if not self.ready or self.responder is None:
                return
            now = self._now()
            self.responder.observe(now, [])
            self.last_tick_at_s = now
            with self.store.session() as s:
                for inc in self.ingestor.book.incidents:
                    if inc.status == "resolved":
                        continue
                    sid = self.ingestor.store_id(inc.id)
                    self._persist_proposals(s, inc, sid, now, events)
                    self._persist_comms(s, inc, sid, events)
                for pending in list(self._pending.values()):
                    self._verify(s, pending, now, events)
        for kind, subject, data in events:
            self._emit(kind, subject, data)

    def _persist_proposals(
        self,
        s: Any,
        inc: BookIncident,
        sid: str,
        now: float,
        events: list[tuple[EventType, str | None, dict[str, Any]]],
    ) -> None:
        assert self.responder is not None
        for rec in self.responder.records(inc.id):
            if rec.lever is None and rec.entry.status != "refused":
                continue
            key = _proposal_key(inc.cell, rec.entry)
            known = self._proposals.get(key)
            if known is not None:
                if known.lever is None:
                    known.lever = rec.lever
                continue
            status = "refused" if rec.entry.status == "refused" else "proposed"
            roles = list(self.responder.roles_needed(rec.lever)) if rec.lever else []
            row = levers.record(
                session=s,
                incident_id=sid,
                kind=rec.entry.kind,
                scope=rec.entry.scope,
                op=self._op_data(rec, key, roles),
                inverse=None,
                status=status,
                at_s=rec.entry.at_s,
                reason=rec.entry.reason,
                approvers=[],
            )
            s.flush()
            p = _Proposal(row.id, inc.id, rec.lever, key)
            self._proposals[key] = p
            self._by_journal[row.id] = p
            verb = "refused" if status == "refused" else "proposed"
            need = f"; needs {' + '.join(roles)}" if roles else ""
            _record(
                s,
                incident_id=sid,
                at_s=now,
                kind="lever",
                actor=SERVICE_ACTOR,
                text=f"{verb} {rec.entry.kind} on {rec.entry.target}{need}: {rec.entry.reason}",
                data={"journal_id": row.id, "kind": rec.entry.kind, "status": status},
                action=f"lever.{verb}",
                audit_data={
                    "journal_id": row.id,
                    "kind": rec.entry.kind,
                    "target": rec.entry.target,
                },
            )
            kind: EventType = "lever.refused" if status == "refused" else "lever.proposed"
            events.append((kind, sid, {"lever_id": row.id}))

    def _op_data(self, rec: LeverRecord, key: str, roles: list[Role]) -> dict[str, JsonValue]:
        return {
            "lever": rec.entry.kind,
            "target": rec.entry.target,
            "operations": cast(JsonValue, [encode_op(o) for o in rec.entry.ops]),
            "checks": cast(
                JsonValue,
                [{"guard": c.guard, "ok": c.ok, "reason": c.reason} for c in rec.entry.checks],
            ),
            "roles_needed": cast(JsonValue, list(roles)),
            "candidate": rec.candidate_reason,
            "key": key,
        }

    def _persist_comms(
        self,
        s: Any,
        inc: BookIncident,
        sid: str,
        events: list[tuple[EventType, str | None, dict[str, Any]]],
    ) -> None:
        assert self.responder is not None
        updates = self.responder.updates(inc.id)
        done = self._comms_done.get(inc.id, 0)
        for u in updates[done:]:
            posts = [(Channel.incident_channel, u.channel_text)]
            if u.status_page is not None:
                posts.append((Channel.status_page, u.update.text))
            for channel, text in posts:
                comms.post(
                    session=s,
                    incident_id=sid,
                    channel=channel,
                    text=text,
                    at_s=u.update.at_s,
                    due_s=u.update.due_s,
                )
            events.append(("comms", sid, {"at_s": u.update.at_s}))
        self._comms_done[inc.id] = len(updates)

    # --- levers -------------------------------------------------------------------------------

    def _proposal(self, journal_id: int) -> _Proposal:
        p = self._by_journal.get(journal_id)
        if p is None:
            raise ServeError(f"no open proposal {journal_id}", status=404)
        return p

    def approve(self, journal_id: int, *, person: str, roles: Collection[str]) -> LeverRead:
        """Approve a proposed lever in one of the caller's roles; the last approval pulls it."""
        events: list[tuple[EventType, str | None, dict[str, Any]]] = []
        with self.lock:
            p = self._proposal(journal_id)
            now = self._now()
            with self.store.session() as s:
                view = self._lever_view(s, journal_id)
                if view.status != "proposed":
                    raise ServeError(f"lever {journal_id} is {view.status}: nothing to approve")
                who = canonical(person)
                if any(canonical(a.person) == who for a in view.approvals):
                    raise ServeError(
                        f"{person} approved lever {journal_id} already: a second approver must be "
                        "another person"
                    )
                role = next((r for r in view.roles_missing if r in roles), None)
                if role is None:
                    needed = ", ".join(view.roles_missing) or "none"
                    raise ServeError(
                        f"{person} holds none of the roles lever {journal_id} still needs "
                        f"({needed})",
                        status=403,
                    )
                sid = self.ingestor.store_id(p.book_id)
                _record(
                    s,
                    incident_id=sid,
                    at_s=now,
                    kind="approval",
                    actor=person.strip(),
                    text=f"{person.strip()} approved {view.kind} on {view.target} as {role}",
                    data={"journal_id": journal_id, "role": role},
                    action="lever.approve",
                    audit_subject=f"lever:{journal_id}",
                    audit_data={"role": role, "incident": sid},
                )
            events.append(("lever.approved", sid, {"lever_id": journal_id, "by": person}))
            result = self.lever(journal_id)
            if not result.roles_missing:
                result = self._pull_locked(journal_id, events)
        for kind, sid2, data in events:
            self._emit(kind, sid2, data)
        return result

    def pull(self, journal_id: int) -> LeverRead:
        """Pull a fully approved lever again (a pull that failed, e.g. the fleet was down)."""
        events: list[tuple[EventType, str | None, dict[str, Any]]] = []
        with self.lock:
            result = self._pull_locked(journal_id, events)
        for kind, sid, data in events:
            self._emit(kind, sid, data)
        return result

    def _pull_locked(
        self, journal_id: int, events: list[tuple[EventType, str | None, dict[str, Any]]]
    ) -> LeverRead:
        p = self._proposal(journal_id)
        if self.fleet is None or self.responder is None:
            raise ServeError("no fleet control endpoint configured: levers cannot be pulled")
        if p.lever is None:
            raise ServeError(
                f"lever {journal_id} was proposed before a restart and the responder has not "
                "proposed it again yet: try again after its next evaluation"
            )
        now = self._now()
        with self.store.session() as s:
            view = self._lever_view(s, journal_id)
            if view.status != "proposed":
                raise ServeError(f"lever {journal_id} is {view.status}: it cannot be pulled")
            if view.roles_missing:
                raise ServeError(
                    f"lever {journal_id} still needs {', '.join(view.roles_missing)}", status=403
                )
            approvers = tuple(Approver(a.person, a.role) for a in view.approvals if a.role in ROLES)
            sid = self.ingestor.store_id(p.book_id)
            try:
                checks = self.responder.checks(p.book_id, p.lever)
                entry = lv.pull(
                    p.lever,
                    self.fleet,
                    approvers=approvers,
                    at_s=now,
                    reason=view.reason,
                    checks=checks,
                    dry_run=False,
                )
            except (OperationError, UnknownTargetError) as exc:
                raise ServeError(f"the fleet refused lever {journal_id}: {exc}") from exc
            inverse = {"operations": cast(JsonValue, [encode_op(o) for o in entry.inverses])}
            row = levers.record(
                session=s,
                incident_id=sid,
                kind=entry.kind,
                scope=entry.scope,
                op={
                    "proposal_id": journal_id,
                    "operations": cast(JsonValue, [encode_op(o) for o in entry.ops]),
                    "checks": cast(JsonValue, [_check(c) for c in entry.checks]),
                },
                inverse=inverse if entry.status == "applied" else None,
                status=entry.status,
                at_s=now,
                reason=entry.reason,
                approvers=[a.name for a in approvers],
            )
            s.flush()
            applied = entry.status == "applied"
            timeline.add(
                session=s,
                incident_id=sid,
                at_s=now,
                kind="lever",
                actor=" + ".join(a.name for a in approvers),
                text=(
                    f"applied {entry.kind} on {entry.target}"
                    if applied
                    else f"refused {entry.kind} on {entry.target}: {entry.reason}"
                ),
                data={"journal_id": row.id, "proposal_id": journal_id, "status": entry.status},
            )
            audit.append(
                s,
                actor=approvers[0].name if approvers else SERVICE_ACTOR,
                action=f"lever.{entry.status}",
                subject=sid,
                data={
                    "journal_id": row.id,
                    "proposal_id": journal_id,
                    "approvers": [a.name for a in approvers],
                    "inverse": inverse["operations"] if applied else None,
                },
                at_s=now,
            )
        if applied:
            self._outcomes[journal_id] = _Outcome("applied", row.id)
            self._pending[journal_id] = _Pending(
                journal_id, row.id, entry, p.book_id, now, approvers
            )
            events.append(("lever.applied", sid, {"lever_id": journal_id, "journal_id": row.id}))
        else:
            events.append(("lever.refused", sid, {"lever_id": journal_id, "reason": entry.reason}))
            raise ServeError(f"lever {journal_id} refused at pull time: {entry.reason}")
        return self.lever(journal_id)

    def undo(self, journal_id: int, *, person: str) -> LeverRead:
        """Undo a pulled lever (its recorded inverse, in reverse order)."""
        events: list[tuple[EventType, str | None, dict[str, Any]]] = []
        with self.lock:
            outcome = self._outcomes.get(journal_id)
            pending = self._pending.get(journal_id)
            if outcome is None or outcome.status == "undone" or self.fleet is None:
                raise ServeError(f"lever {journal_id} was not pulled by this service: no undo")
            p = self._proposal(journal_id)
            entry, approvers = self._applied_entry(journal_id, pending)
            now = self._now()
            with self.store.session() as s:
                self._undo_locked(s, p, entry, approvers, now, f"undone by {person.strip()}")
            self._pending.pop(journal_id, None)
            events.append(
                ("lever.undone", self.ingestor.store_id(p.book_id), {"lever_id": journal_id})
            )
            result = self.lever(journal_id)
        for kind, sid, data in events:
            self._emit(kind, sid, data)
        return result

    def _applied_entry(
        self, journal_id: int, pending: _Pending | None
    ) -> tuple[LeverJournalEntry, tuple[Approver, ...]]:
        if pending is not None:
            return pending.entry, pending.approvers
        kept = self._kept.get(journal_id)
        if kept is None:
            raise ServeError(f"lever {journal_id}: its applied entry is not held by this service")
        return kept

    def _undo_locked(
        self,
        s: Any,
        p: _Proposal,
        entry: LeverJournalEntry,
        approvers: tuple[Approver, ...],
        now: float,
        why: str,
    ) -> None:
        assert self.fleet is not None
        back = lv.undo(entry, self.fleet, approvers=approvers, at_s=now, reason=why)
        sid = self.ingestor.store_id(p.book_id)
        row = levers.record(
            session=s,
            incident_id=sid,
            kind=entry.kind,
            scope=entry.scope,
            op={
                "undo_of": p.journal_id,
                "operations": cast(JsonValue, [encode_op(o) for o in back.ops]),
            },
            inverse={"operations": cast(JsonValue, [encode_op(o) for o in entry.ops])},
            status=back.status,
            at_s=now,
            reason=back.reason,
            approvers=[a.name for a in approvers],
        )
        s.flush()
        _record(
            s,
            incident_id=sid,
            at_s=now,
            kind="lever",
            actor=SERVICE_ACTOR,
            text=f"undid {entry.kind} on {entry.target}: {why}",
            data={"journal_id": row.id, "proposal_id": p.journal_id, "status": "undone"},
            action="lever.undo",
            audit_data={"journal_id": row.id, "proposal_id": p.journal_id, "reason": why},
        )
        prior = self._outcomes.get(p.journal_id)
        self._outcomes[p.journal_id] = _Outcome(
            "undone", prior.applied_id if prior else row.id, why
        )

    def _verify(
        self,
        s: Any,
        pending: _Pending,
        now: float,
        events: list[tuple[EventType, str | None, dict[str, Any]]],
    ) -> None:
        assert self.responder is not None
        if now <= pending.applied_at_s:
            return
        inc = self.ingestor.book.get(pending.book_id)
        sid = self.ingestor.store_id(pending.book_id)
        verify = self.settings.policy.verify
        try:
            rate = self.responder.probe.burn_rate((inc.cell,), verify.burn_window_s)
        except FiredrillError as exc:
            log.warning(
                "verification of lever %s cannot read the burn: %s", pending.proposal_id, exc
            )
            rate = None
        if rate is not None and rate <= verify.burn_rate:
            detail = f"cleared: burn {rate:.2f}x <= {verify.burn_rate:g}x"
            self._outcomes[pending.proposal_id] = _Outcome("verified", pending.applied_id, detail)
            self._kept[pending.proposal_id] = (pending.entry, pending.approvers)
            del self._pending[pending.proposal_id]
            timeline.add(
                session=s,
                incident_id=sid,
                at_s=now,
                kind="verified",
                actor=SERVICE_ACTOR,
                text=f"{pending.entry.kind} verified: {detail}",
                data={"proposal_id": pending.proposal_id, "burn_rate": rate},
            )
            if inc.status == "open":
                self.ingestor.mitigate(s, sid, now, by=f"{SERVICE_ACTOR}: {pending.entry.kind}")
            events.append(("lever.verified", sid, {"lever_id": pending.proposal_id}))
            return
        if now - pending.applied_at_s < self.settings.verify_window_s:
            return
        shown = "no burn-rate data" if rate is None else f"burn {rate:.2f}x"
        why = f"not cleared within {self.settings.verify_window_s:g} s: {shown}"
        p = self._proposal(pending.proposal_id)
        self._undo_locked(s, p, pending.entry, pending.approvers, now, why)
        self._outcomes[pending.proposal_id] = _Outcome("not_cleared", pending.applied_id, why)
        del self._pending[pending.proposal_id]
        events.append(("lever.undone", sid, {"lever_id": pending.proposal_id, "reason": why}))

    # --- break-glass ----------------------------------------------------------------------------

    def breakglass_request(
        self,
        incident_id: str,
        *,
        person: str,
        identity: str,
        scope: str,
        reason: str,
        ttl_s: float,
    ) -> BreakGlassRead:
        """Ask for emergency access during an incident; two other people must approve it."""
        with self.lock:
            now = self._now()
            with self.store.session() as s:
                row = incidents.require(session=s, incident_id=incident_id)
                if row.status.value == "resolved":
                    raise ServeError(f"{incident_id} is resolved: no break-glass")
                try:
                    req = self.broker.request(
                        identity=canonical(identity),
                        scope=scope,
                        reason=f"{incident_id}: {reason}",
                        requested_by=canonical(person),
                        at_s=now,
                        sev=Sev(row.sev),
                        ttl_s=ttl_s,
                    )
                except BreakGlassError as exc:
                    raise ServeError(exc.reason, status=403) from exc
                self._bg_incident[req.request_id] = incident_id
                _record(
                    s,
                    incident_id=incident_id,
                    at_s=now,
                    kind="breakglass",
                    actor=person.strip(),
                    text=f"{person.strip()} asked break-glass for {identity} on {scope}: {reason}",
                    data={"request_id": req.request_id, "scope": scope},
                    action="breakglass.request",
                    audit_data={
                        "request_id": req.request_id,
                        "identity": req.identity,
                        "scope": scope,
                    },
                )
        self._emit("timeline", incident_id, {"breakglass": req.request_id})
        return BreakGlassRead(
            request_id=req.request_id, status="pending", identity=req.identity, scope=req.scope
        )

    def breakglass_approve(
        self, request_id: str, *, person: str, roles: Collection[str]
    ) -> BreakGlassRead:
        """Approve a request (never one's own); the second distinct approval grants it."""
        with self.lock:
            incident_id = self._bg_incident.get(request_id)
            if incident_id is None:
                raise ServeError(f"no pending break-glass request {request_id}", status=404)
            now = self._now()
            req = self.broker.pending(request_id)
            used = {a.role for a in req.approvals}
            preferred = [r for r in ROLES if r in roles and r not in used]
            sev1 = [r for r in preferred if r in SEV1_ROLES]
            candidates = sev1 or preferred
            if not candidates:
                raise ServeError(f"{person} holds no incident role to approve with", status=403)
            role = candidates[0]
            try:
                grant = self.broker.approve(request_id, canonical(person), role, now)
            except BreakGlassError as exc:
                raise ServeError(exc.reason, status=403) from exc
            with self.store.session() as s:
                audit.append(
                    s,
                    actor=person.strip(),
                    action="breakglass.approve",
                    subject=incident_id,
                    data={"request_id": request_id, "role": role},
                    at_s=now,
                )
                if grant is None:
                    out = BreakGlassRead(
                        request_id=request_id,
                        status="pending",
                        identity=req.identity,
                        scope=req.scope,
                    )
                else:
                    row = store_breakglass.grant(
                        session=s,
                        incident_id=incident_id,
                        identity=grant.identity,
                        requested_by=req.requested_by,
                        approved_by=grant.approvers,
                        granted_at_s=grant.granted_at_s,
                        expires_at_s=grant.expires_at_s,
                        scope=grant.scope,
                    )
                    s.flush()
                    del self._bg_incident[request_id]
                    _record(
                        s,
                        incident_id=incident_id,
                        at_s=now,
                        kind="breakglass",
                        actor=" + ".join(grant.approvers),
                        text=f"break-glass {grant.identity} on {grant.scope} granted by "
                        f"{', '.join(grant.approvers)} until {grant.expires_at_s:g} s",
                        data={"grant_id": row.id, "request_id": request_id},
                        action="breakglass.grant",
                    )
                    out = BreakGlassRead(
                        request_id=request_id,
                        status="granted",
                        identity=grant.identity,
                        scope=grant.scope,
                        grant_id=row.id,
                        expires_at_s=grant.expires_at_s,
                    )
        self._emit("timeline", incident_id, {"breakglass": request_id, "status": out.status})
        return out

    # --- reading --------------------------------------------------------------------------------

    def status(self) -> StatusRead:
        """What the service runs with and whether what it depends on answers."""
        deps = [
            self._probe_dep("fleet", self.fleet, lambda: self.clock.now_s()),
            self._probe_dep(
                "prometheus",
                self.responder.probe if self.responder is not None else None,
                lambda: self.responder.probe.burn_rate((), 60.0) if self.responder else None,
            ),
            self._probe_dep(
                "alertmanager",
                self.alertmanager,
                lambda: self.alertmanager.alerts() if self.alertmanager else None,
            ),
        ]
        with self.lock:
            open_ = sum(1 for i in self.ingestor.book.incidents if i.status != "resolved")
            return StatusRead(
                mode=self.settings.policy.mode,
                ready=self.ready,
                open_incidents=open_,
                pending_verifications=len(self._pending),
                last_tick_at_s=self.last_tick_at_s,
                dependencies=deps,
            )

    @staticmethod
    def _probe_dep(name: str, configured: object, check: Callable[[], object]) -> Dependency:
        if configured is None:
            return Dependency(name=name, state="not configured")
        try:
            check()
        except FiredrillError as exc:
            return Dependency(name=name, state="down", detail=str(exc)[:300])
        return Dependency(name=name, state="ok")

    def lever(self, journal_id: int) -> LeverRead:
        with self.store.session() as s:
            return self._lever_view(s, journal_id)

    def _lever_view(self, s: Any, journal_id: int) -> LeverRead:
        row = levers.get(session=s, journal_id=journal_id)
        if row is None or row.status is LeverStatus.applied or "key" not in row.op:
            raise ServeError(f"no proposed lever {journal_id}", status=404)
        op = row.op
        roles = [str(r) for r in _list(op.get("roles_needed"))]
        approvals = [
            ApprovalRead(person=p, role=r, at_s=t) for p, r, t in received.approvals(s, journal_id)
        ]
        have = {a.role for a in approvals}
        outcome = self._outcomes.get(journal_id)
        status: Any = "refused" if row.status is LeverStatus.refused else "proposed"
        if outcome is not None:
            status = outcome.status
        elif self._applied_in_store(s, row.incident_id, journal_id) is not None:
            status = "applied"
        return LeverRead(
            id=row.id,
            incident_id=row.incident_id,
            kind=row.kind,
            target=str(op.get("target", "")),
            scope=row.scope,
            status=status,
            reason=row.reason,
            at_s=row.at_s,
            operations=[o for o in _list(op.get("operations")) if isinstance(o, dict)],
            checks=[
                CheckRead(
                    guard=str(c.get("guard", "")),
                    ok=bool(c.get("ok")),
                    reason=str(c.get("reason", "")),
                )
                for c in _list(op.get("checks"))
                if isinstance(c, dict)
            ],
            roles_needed=roles,
            approvals=approvals,
            roles_missing=[r for r in roles if r not in have],
            applied_id=None if outcome is None else outcome.applied_id,
            verify_detail="" if outcome is None else outcome.detail,
        )

    def _applied_in_store(self, s: Any, incident_id: str, journal_id: int) -> int | None:
        for e in levers.list(session=s, incident_id=incident_id, status=LeverStatus.applied):
            if e.op.get("proposal_id") == journal_id:
                return e.id
        return None

    def levers_of(self, incident_id: str) -> list[LeverRead]:
        with self.store.session() as s:
            incidents.require(session=s, incident_id=incident_id)
            return [
                self._lever_view(s, e.id)
                for e in levers.list(session=s, incident_id=incident_id)
                if e.status is not LeverStatus.applied and "key" in e.op
            ]

    def list_incidents(
        self,
        *,
        status: str | None = None,
        cell: str | None = None,
        region: str | None = None,
        sev: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[IncidentRead]:
        with self.store.session() as s:
            rows = incidents.list(session=s, status=status, cell=cell)
        with self.lock:
            followed = self._followed()
        out = [self._incident_read(r, followed) for r in rows]
        if region is not None:
            out = [i for i in out if i.region == region]
        if sev is not None:
            out = [i for i in out if i.sev == sev]
        out.reverse()  # newest first
        return out[offset : offset + limit]

    def deciding_axes(self) -> dict[str, str | None]:
        """The deciding severity axis of every followed incident, by store id (for the board)."""
        from firedrill.respond.severity import assess

        with self.lock:
            return {
                sid: assess(inc.tally.impact(), self.ingestor.book.matrix).deciding_axis
                for sid, inc in self._followed().items()
            }

    def _followed(self) -> dict[str, BookIncident]:
        """The book's incidents by store id."""
        out: dict[str, BookIncident] = {}
        for inc in self.ingestor.book.incidents:
            try:
                out[self.ingestor.store_id(inc.id)] = inc
            except StoreError:
                continue
        return out

    def _book_of(self, store_id: str) -> BookIncident | None:
        return self._followed().get(store_id)

    def _incident_read(self, row: Any, followed: Mapping[str, BookIncident]) -> IncidentRead:
        inc = followed.get(row.id)
        return IncidentRead(
            id=row.id,
            cell=row.cell,
            region=row.region,
            title=row.title,
            sev=row.sev,
            status=row.status.value,
            opened_at_s=row.opened_at_s,
            mitigated_at_s=row.mitigated_at_s,
            resolved_at_s=row.resolved_at_s,
            kind=None if inc is None else inc.kind,
            firing_alerts=0 if inc is None else len(inc.firing),
        )

    def timeline_of(self, incident_id: str) -> list[TimelineRead]:
        with self.store.session() as s:
            incidents.require(session=s, incident_id=incident_id)
            return [
                TimelineRead(
                    id=e.id, at_s=e.at_s, kind=e.kind, actor=e.actor, text=e.text, data=dict(e.data)
                )
                for e in timeline.list(session=s, incident_id=incident_id)
            ]

    def incident(self, incident_id: str) -> IncidentDetail:
        with self.lock:
            with self.store.session() as s:
                row = incidents.require(session=s, incident_id=incident_id)
                base = self._incident_read(row, self._followed())
                kept = received.for_incident(s, incident_id)
            inc = self._book_of(incident_id)
            axes: list[AxisRead] = []
            deciding: str | None = None
            if inc is not None:
                from firedrill.respond.severity import assess

                a = assess(inc.tally.impact(), self.ingestor.book.matrix)
                deciding = a.deciding_axis
                axes = [
                    AxisRead(axis=k, level=str(v.level), value=v.value, reason=v.reason)
                    for k, v in a.axes.items()
                ]
            suspects = self._suspects(inc)
        return IncidentDetail(
            **base.model_dump(),
            axes=axes,
            deciding_axis=deciding,
            suspects=suspects,
            levers=self.levers_of(incident_id),
            timeline=self.timeline_of(incident_id),
            alerts=[{**r.labels, "_status": r.status} for r in kept],
        )

    def _suspects(self, inc: BookIncident | None) -> list[SuspectRead]:
        if inc is None or self.fleet is None or self.responder is None:
            return []
        from firedrill.respond.suspects import WINDOW_S, rank

        try:
            changes = self.fleet.changes(since_s=max(0.0, inc.opened_at_s - WINDOW_S))
            ranked = rank(changes, self.responder.symptom(inc))[:5]
        except FiredrillError as exc:
            log.warning("cannot rank suspects of %s: %s", inc.id, exc)
            return []
        return [
            SuspectRead(
                stream=x.stream,
                cell=x.change.cell,
                subject=x.change.subject,
                before=x.change.before,
                after=x.change.after,
                at_s=x.at_s,
                score=x.score,
                lead_s=x.lead_s,
                evidence=list(x.evidence),
            )
            for x in ranked
        ]


def _by_receiver(alerts: list[WebhookAlert]) -> list[list[WebhookAlert]]:
    """Alerts split by the receiver their severity routes them to (security apart)."""
    out: dict[str, list[WebhookAlert]] = {}
    for a in alerts:
        out.setdefault(_receiver(a.labels), []).append(a)
    return list(out.values())


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _check(c: GuardResult) -> dict[str, JsonValue]:
    return {"guard": c.guard, "ok": c.ok, "reason": c.reason}
