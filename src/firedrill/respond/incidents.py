"""Incidents opened from grouped notifications: one per cell, not one per alert.

Signals reach triage already grouped per cell, so 400 nodes throwing XIDs in one cell are one
incident, not 400 pages. ``IncidentBook`` takes the notifications the notifier sends and decides
which incident each alert belongs to:

- **Cell incidents.** Every non-security alert (page or ticket) of a cell joins the cell's incident
  while it is not resolved (open or mitigated): the node XID tickets, the burn-rate page and the
  pool tickets of one cell are one incident. After it is resolved, the next alert of that cell
  opens a new one.
- **Tickets alone** do not wait for a page: a ticket with no unresolved incident in its cell opens
  an *automation* incident at SEV4 (the floor), owned by the remediation system rather than a
  human. Tickets are causes, and a flood of them (a buggy exporter reporting phantom XIDs) is
  worth a record even when no user hurts. A page that later arrives in that cell joins it, the
  incident becomes a cell incident and its severity rises with the page.
- **Security tripwires** (alerts labelled ``severity="security"``, or any alert sent to the
  ``security`` receiver) always open their own incident, even when the cell has one open: security
  does not wait behind latency and has its own lead. Later notifications of the same group (the
  security receiver's and the page receiver's copy alike) join it. A security incident opens at
  SEV1 on the security axis: ``assess`` rates an unconfirmed tripwire SEV2, but severity only
  comes down in the postmortem, which is where the security lead rules a tripwire harmless.

Each incident's severity is a ``SeverityTracker`` fed by an ``Impact`` derived from every alert it
has ever carried, so it never goes down while the incident is live:

- burn-rate alerts: ``burn_factor`` label, else the ``burn_tier`` (fast 14.4×, slow 6×, drift 3×,
  budget 1×); a paid tier when an alert has ``tier="paid"`` or a product named in
  ``paid_products``; regions are the distinct ``region`` labels of the burn alerts;
- ``TrainingJobStalled`` with a ``gpus`` label: GPUs stalled (summed over distinct alerts);
- ``ModelQualityBurn`` (``golden_drop_pts`` label): the golden-set drop, the largest of the
  incident's quality alerts, and as many percent of answers wrong; its region counts as affected;
- ``MoneyToolWithoutApproval``, ``WriteToolWithoutApproval``: unapproved side effects;
  ``WeightsReadByNonServing``: weights exfiltrated; any other security alert (the
  ``EgressExfilPattern`` deny spike among them): a tripwire.

A mitigated incident stays the cell's incident until it is resolved; new alerts still join it.
Resolving is an explicit call and needs every alert of the incident to have resolved. Time is
simulated seconds and only moves forward.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from firedrill.detect.notify import Notification
from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model.series import Labels, label_value
from firedrill.respond.severity import (
    Assessment,
    Impact,
    Sev,
    SeverityTracker,
    SevMatrix,
    assess,
)

Status = Literal["open", "mitigated", "resolved"]
IncidentKind = Literal["cell", "automation", "security"]
EventKind = Literal["opened", "alert_joined", "severity_raised", "mitigated", "resolved"]
AlertClass = Literal["page", "ticket", "security"]

# × the error budget, per burn tier of the default multiwindow table
BURN_TIER_FACTORS: Mapping[str, float] = {"fast": 14.4, "slow": 6.0, "drift": 3.0, "budget": 1.0}
SIDE_EFFECT_ALERTS = frozenset({"MoneyToolWithoutApproval", "WriteToolWithoutApproval"})
EXFIL_ALERTS = frozenset({"WeightsReadByNonServing"})
STALLED_JOB_ALERT = "TrainingJobStalled"
QUALITY_DROP_LABEL = "golden_drop_pts"  # ModelQualityBurn's tier (detect/quality.py)


@dataclass(frozen=True)
class _Floor(Assessment):
    """An assessment set by policy rather than measured: the level an incident opens at."""

    why: str = ""

    @property
    def reason(self) -> str:
        return self.why


@dataclass(frozen=True)
class TimelineEvent:
    """One entry of an incident's timeline."""

    at_s: float
    kind: EventKind
    text: str
    data: Mapping[str, str | float] = field(default_factory=dict)


@dataclass(eq=False)
class Incident:
    """One incident; the ``IncidentBook`` that opened it is the only writer."""

    id: str
    kind: IncidentKind
    cell: str
    region: str
    opened_at_s: float
    title: str
    status: Status = "open"
    alerts: list[Labels] = field(default_factory=list)  # every alert it carried, first seen first
    firing: set[Labels] = field(default_factory=set)
    severity: SeverityTracker = field(default_factory=SeverityTracker)
    timeline: list[TimelineEvent] = field(default_factory=list)
    mitigated_by: str = ""
    tally: ImpactTally = field(default_factory=lambda: ImpactTally())  # impact_of(alerts)
    seen: set[Labels] = field(default_factory=set)  # set(alerts), kept with it

    @property
    def sev(self) -> Sev:
        """The incident's current severity."""
        return self.severity.sev


@dataclass(frozen=True)
class IncidentUpdate:
    """What one notification did: incidents opened, joined and raised, by id."""

    opened: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()  # got at least one new alert (opened ones included)
    raised: tuple[str, ...] = ()  # severity went up after opening
    resolved_alerts: int = 0  # alerts this notification reported resolved in some incident

    @property
    def touched(self) -> tuple[str, ...]:
        """Every incident the notification changed, in first-touched order."""
        return tuple(dict.fromkeys((*self.opened, *self.joined, *self.raised)))


def classify(receiver: str, labels: Labels) -> AlertClass:
    """Security, page or ticket: the alert's ``severity`` label, else the receiver it reached."""
    severity = label_value(labels, "severity")
    if severity == "security" or receiver == "security":
        return "security"
    if severity in ("page", "ticket"):
        return "page" if severity == "page" else "ticket"
    return "page" if receiver == "page" else "ticket"


@dataclass
class ImpactTally:
    """``impact_of`` kept up to date one alert at a time: every term is a max, a sum or a union,
    so an incident's impact costs the same to reassess at its 400th alert as at its first."""

    burn_rate: float = 0.0
    paid: bool = False
    regions: set[str] = field(default_factory=set)
    gpus_stalled: int = 0
    side_effects: int = 0
    exfiltrated: bool = False
    tripwires: int = 0
    golden_drop_pts: float = 0.0

    def add(self, labels: Labels, paid_products: Collection[str] = ()) -> None:
        """Count one more alert (each alert once: the caller deduplicates)."""
        name = label_value(labels, "alertname")
        if label_value(labels, "severity") == "security":
            if name in SIDE_EFFECT_ALERTS:
                self.side_effects += 1
            elif name in EXFIL_ALERTS:
                self.exfiltrated = True
            else:
                self.tripwires += 1
            return
        factor_text = label_value(labels, "burn_factor")
        factor = (
            float(factor_text)
            if factor_text
            else BURN_TIER_FACTORS.get(label_value(labels, "burn_tier"), 0.0)
        )
        if factor > 0:
            self.burn_rate = max(self.burn_rate, factor)
            self.regions.add(label_value(labels, "region"))
            self.paid = self.paid or (
                label_value(labels, "tier") == "paid"
                or label_value(labels, "product") in paid_products
            )
        if name == STALLED_JOB_ALERT and label_value(labels, "gpus").isdigit():
            self.gpus_stalled += int(label_value(labels, "gpus"))
        drop = _drop_pts(labels)
        if drop > 0:  # ModelQualityBurn: a digest's golden-set drop, answers gone wrong
            self.golden_drop_pts = max(self.golden_drop_pts, drop)
            self.regions.add(label_value(labels, "region"))
            self.paid = self.paid or (
                label_value(labels, "tier") == "paid"
                or label_value(labels, "product") in paid_products
            )

    def impact(self) -> Impact:
        """The impact of every alert counted so far."""
        return Impact(
            burn_rate=self.burn_rate,
            paid_tier=self.paid,
            regions_affected=len(self.regions),
            gpus_stalled=self.gpus_stalled,
            weights_exfiltrated=self.exfiltrated,
            unapproved_side_effects=self.side_effects,
            tripwires=self.tripwires,
            golden_drop_pts=self.golden_drop_pts,
            # the digest's answers gone wrong, as a share of its traffic (for a canary, an upper
            # bound of the cell's: fast and wrong is never rated below slow)
            wrong_answers_frac=min(self.golden_drop_pts / 100.0, 1.0),
        )


def _drop_pts(labels: Labels) -> float:
    try:
        drop = float(label_value(labels, QUALITY_DROP_LABEL) or 0.0)
    except ValueError:
        return 0.0
    return drop if 0.0 <= drop <= 100.0 else 0.0


def impact_of(alerts: Collection[Labels], paid_products: Collection[str] = ()) -> Impact:
    """The impact a set of alerts measures (see the module docstring for the mapping)."""
    tally = ImpactTally()
    for labels in alerts:
        tally.add(labels, paid_products)
    return tally.impact()


class IncidentBook:
    """Opens, joins, mitigates and resolves incidents from the notifier's notifications."""

    def __init__(
        self,
        matrix: SevMatrix | None = None,
        *,
        paid_products: Collection[str] = (),
        security_floor: Sev = Sev.SEV1,
    ) -> None:
        if security_floor is Sev.NONE:
            raise ValueError("a security incident needs a level: SEV1..SEV4")
        self.matrix = matrix if matrix is not None else SevMatrix()
        self.paid_products = frozenset(paid_products)
        self.security_floor = security_floor
        self._incidents: dict[str, Incident] = {}
        self._by_cell: dict[str, str] = {}  # cell -> its unresolved cell/automation incident
        self._by_group: dict[tuple[str, ...], str] = {}  # security group -> unresolved incident
        self._ids = itertools.count(1)
        self._now_s = float("-inf")

    @property
    def incidents(self) -> list[Incident]:
        """Every incident, in the order opened."""
        return list(self._incidents.values())

    def get(self, incident_id: str) -> Incident:
        """The incident with ``incident_id``."""
        try:
            return self._incidents[incident_id]
        except KeyError:
            raise UnknownTargetError("incident", incident_id) from None

    def _advance(self, at_s: float) -> None:
        if at_s < self._now_s:
            raise ValueError(f"at_s {at_s} is before the book's clock ({self._now_s})")
        self._now_s = at_s

    # --- notifications in -----------------------------------------------------------------------

    def ingest(self, n: Notification) -> IncidentUpdate:
        """Route a notification's firing alerts to incidents and record its resolved ones."""
        self._advance(n.at_s)
        opened: list[str] = []
        joined: list[str] = []
        raised: list[str] = []
        resolved = self._record_resolved(n.resolved)
        security = [a for a in n.alerts if classify(n.receiver, a) == "security"]
        others = [a for a in n.alerts if classify(n.receiver, a) != "security"]
        targets: list[tuple[Incident, list[Labels]]] = []
        if security:
            inc = self._security_incident(n, security, opened)
            targets.append((inc, security))
        if others:
            inc = self._cell_incident(n, others, opened)
            targets.append((inc, others))
        for inc, alerts in targets:
            new = [a for a in alerts if a not in inc.firing]
            fresh = [a for a in new if a not in inc.seen]
            inc.alerts.extend(fresh)
            inc.seen.update(fresh)
            for a in fresh:
                inc.tally.add(a, self.paid_products)
            inc.firing.update(new)
            if new:
                joined.append(inc.id)
                if inc.id not in opened:
                    inc.timeline.append(
                        TimelineEvent(
                            n.at_s,
                            "alert_joined",
                            f"{len(new)} alert(s) {n.alertname} via {n.receiver}",
                            {"alertname": n.alertname, "alerts": len(new), "receiver": n.receiver},
                        )
                    )
            if inc.id in opened:
                self._open_at(inc, n)
            elif self._assess(inc, n.at_s):
                raised.append(inc.id)
        return IncidentUpdate(tuple(opened), tuple(joined), tuple(raised), resolved)

    def _record_resolved(self, resolved: Collection[Labels]) -> int:
        count = 0
        for labels in resolved:
            for inc in self._incidents.values():
                if inc.status != "resolved" and labels in inc.firing:
                    inc.firing.discard(labels)
                    count += 1
        return count

    def _security_incident(
        self, n: Notification, alerts: list[Labels], opened: list[str]
    ) -> Incident:
        existing = self._by_group.get(n.group_key)
        if existing is not None:
            return self._incidents[existing]
        inc = self._open(n, "security", alerts[0], f"Security: {n.alertname} in {n.cell}")
        self._by_group[n.group_key] = inc.id
        opened.append(inc.id)
        return inc

    def _cell_incident(self, n: Notification, alerts: list[Labels], opened: list[str]) -> Incident:
        pages = any(classify(n.receiver, a) == "page" for a in alerts)
        existing = self._by_cell.get(n.cell)
        if existing is not None:
            inc = self._incidents[existing]
            if pages and inc.kind == "automation":
                inc.kind = "cell"
                inc.title = f"{n.alertname} in {n.cell}"
            return inc
        if pages:
            inc = self._open(n, "cell", alerts[0], f"{n.alertname} in {n.cell}")
        else:
            inc = self._open(n, "automation", alerts[0], f"{n.alertname} in {n.cell} (automation)")
        self._by_cell[n.cell] = inc.id
        opened.append(inc.id)
        return inc

    def _open(self, n: Notification, kind: IncidentKind, first: Labels, title: str) -> Incident:
        inc = Incident(
            id=f"INC-{next(self._ids):04d}",
            kind=kind,
            cell=n.cell,
            region=label_value(first, "region"),
            opened_at_s=n.at_s,
            title=title,
        )
        self._incidents[inc.id] = inc
        return inc

    def _floor(self, inc: Incident, alertname: str) -> _Floor:
        """The level an incident opens at whatever its alerts measure."""
        axes = assess(Impact(), self.matrix).axes
        if inc.kind == "security":
            why = (
                f"security: {alertname} opens at {self.security_floor} whatever the latency; "
                "only the postmortem brings it down"
            )
            return _Floor(self.security_floor, axes, "security", why)
        return _Floor(Sev.SEV4, axes, None, f"an incident opens at SEV4 at least ({alertname})")

    def _open_at(self, inc: Incident, n: Notification) -> None:
        measured = assess(inc.tally.impact(), self.matrix)
        floor = self._floor(inc, n.alertname)
        inc.severity.raise_to(measured if measured.sev <= floor.sev else floor, n.at_s)
        inc.timeline.append(
            TimelineEvent(
                n.at_s,
                "opened",
                f"{inc.kind} incident opened at {inc.sev}: {inc.title} "
                f"({len(inc.alerts)} alert(s) via {n.receiver})",
                {
                    "alertname": n.alertname,
                    "alerts": len(inc.alerts),
                    "receiver": n.receiver,
                    "sev": str(inc.sev),
                },
            )
        )

    def _assess(self, inc: Incident, at_s: float) -> bool:
        """Feed the tracker the impact of every alert the incident carried; True if it rose."""
        before = inc.sev
        assessment = assess(inc.tally.impact(), self.matrix)
        if assessment.sev is Sev.NONE or not inc.severity.raise_to(assessment, at_s):
            return False
        inc.timeline.append(
            TimelineEvent(
                at_s,
                "severity_raised",
                f"{before} → {assessment.sev}: {assessment.reason}",
                {"from": str(before), "to": str(assessment.sev)},
            )
        )
        return True

    def adopt(
        self,
        incident_id: str,
        *,
        kind: IncidentKind,
        cell: str,
        region: str,
        title: str,
        opened_at_s: float,
        status: Status,
        sev: Sev,
        alerts: Sequence[Labels],
        firing: Collection[Labels],
        group_key: tuple[str, ...] = (),
    ) -> Incident:
        """Take back an unresolved incident kept elsewhere (a store, after a restart).

        It carries on as if this book had opened it: its cell's (or, for a security incident,
        its group's) next alerts join it, and its severity starts at ``sev`` and only goes up.
        """
        if incident_id in self._incidents:
            raise OperationError(f"{incident_id} is in the book already")
        if status == "resolved":
            raise OperationError(f"{incident_id} is resolved: only an unresolved one is adopted")
        inc = Incident(
            id=incident_id,
            kind=kind,
            cell=cell,
            region=region,
            opened_at_s=opened_at_s,
            title=title,
            status=status,
        )
        for a in alerts:
            if a not in inc.seen:
                inc.alerts.append(a)
                inc.seen.add(a)
                inc.tally.add(a, self.paid_products)
        inc.firing.update(a for a in firing if a in inc.seen)
        if sev is not Sev.NONE:
            axes = assess(Impact(), self.matrix).axes
            floor = _Floor(sev, axes, None, f"restored at {sev}")
            inc.severity.raise_to(floor, opened_at_s)
        self._assess(inc, opened_at_s)
        inc.timeline.clear()  # what it did before is in the store already
        self._incidents[inc.id] = inc
        if kind == "security":
            self._by_group[group_key] = inc.id
        else:
            self._by_cell[cell] = inc.id
        self._now_s = max(self._now_s, opened_at_s)
        return inc

    # --- commands -------------------------------------------------------------------------------

    def mitigate(self, incident_id: str, at_s: float, by: str) -> Incident:
        """Mark an open incident mitigated: the bleeding stopped, the cause may still be there."""
        inc = self.get(incident_id)
        if not by.strip():
            raise ValueError("a mitigation needs who mitigated it")
        if inc.status != "open":
            raise OperationError(f"{incident_id} is {inc.status}: only an open one is mitigated")
        self._advance(at_s)
        inc.status = "mitigated"
        inc.mitigated_by = by.strip()
        inc.timeline.append(
            TimelineEvent(at_s, "mitigated", f"mitigated by {inc.mitigated_by}", {"by": by.strip()})
        )
        return inc

    def resolve(self, incident_id: str, at_s: float) -> Incident:
        """Resolve an incident whose alerts have all resolved; later alerts open a new one."""
        inc = self.get(incident_id)
        if inc.status == "resolved":
            raise OperationError(f"{incident_id} is already resolved")
        if inc.firing:
            raise OperationError(
                f"{incident_id} still has {len(inc.firing)} firing alert(s): resolve them first"
            )
        self._advance(at_s)
        inc.status = "resolved"
        self._by_cell = {k: v for k, v in self._by_cell.items() if v != incident_id}
        self._by_group = {k: v for k, v in self._by_group.items() if v != incident_id}
        inc.timeline.append(
            TimelineEvent(
                at_s,
                "resolved",
                f"resolved at {inc.sev}, {len(inc.alerts)} alert(s) carried",
                {"sev": str(inc.sev), "alerts": len(inc.alerts)},
            )
        )
        return inc
