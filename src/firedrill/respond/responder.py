"""The responder: propose levers in the rollback order (advise) or apply the allowed ones (auto).

Mitigate before root cause, and verify every mitigation. At each evaluation step of a run, for
every open incident the responder acts on:

1. a **runbook** turns the incident's symptom, tags and ranked suspects into ordered candidates:
   levers (cheapest and smallest first, the reference's rollback order) and, where people reach
   for them under pressure, the unsafe shortcuts to refuse. The responder is given its runbooks,
   keyed by symptom kind: ``firedrill.respond.runbooks.RUNBOOKS`` is the one registry, a literal
   (serving and node-layer runbooks here; quality, KV, prefill/decode, egress in their modules);
2. each candidate is **vetted** through ``levers``: the owner of its kind approves it (decision
   rights are config: ``ResponderPolicy.decides``), a fleet-wide lever also needs the second
   approver, the guards it requires run (scale-in paused before traffic moves in a registry or
   hydrate incident, drain headroom with the cold-cache penalty, signed and attested rollback
   targets), and containment never widens access. A lever that fails is journalled *refused*,
   with the reason;
3. in **advise** mode every vetted lever is journalled *proposed*; in **auto** mode the kinds the
   policy allows are applied through the ``Fleet`` port (the inverse recorded first), behind a
   two-person break-glass grant where the kind is outside the on-call role, and the rest are
   proposed;
4. an applied lever is **verified** by watching the symptom (the incident's short-window burn
   rate, or its alerts) for ``verify.window``. Cleared: the lever is verified and the incident
   mitigated. Not cleared by the end of the window: it is undone (its inverse applied) and the
   next candidate is tried, up to ``max_levers``.

Comms run alongside: a SEV1/2 incident gets its first status update drafted within the 15-minute
deadline (a miss is recorded with how late), a status-page entry per product × region (never a
cell or node), channel text redacted, and an update every 30 minutes after.

Everything is driven by the caller's clock (``observe(now_s, ...)``); nothing here reads time or
randomness, so a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Annotated, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from firedrill.detect.evaluator import BurnRateEvaluator
from firedrill.detect.notify import Notification
from firedrill.detect.slo import duration_s
from firedrill.errors import FiredrillError
from firedrill.model.changes import ChangeEvent
from firedrill.model.identity import canonical_identity, same_person
from firedrill.model.series import Labels, label_value, labels_of
from firedrill.model.state import CellView
from firedrill.ports import Fleet, Signals
from firedrill.respond import levers as lv
from firedrill.respond.breakglass import (
    INCIDENT_COMMANDER,
    SECURITY_LEAD,
    Approval,
    BreakGlassBroker,
    BreakGlassError,
    Grant,
    SecurityPage,
)
from firedrill.respond.bundle import bundle_revert
from firedrill.respond.comms import (
    CommsError,
    CommsPlan,
    StatusPageEntry,
    Update,
    redact,
    status_page_entry,
)
from firedrill.respond.guards import (
    REGISTRY_TAGS,
    Approver,
    CapacityView,
    DigestCatalog,
    GuardResult,
    Role,
    UnsafeKind,
    UnsafeRequest,
    refused,
)
from firedrill.respond.incidents import Incident, IncidentBook, IncidentKind
from firedrill.respond.levers import (
    CATALOGUE,
    Lever,
    LeverJournalEntry,
    LeverKind,
    LeverStatus,
    RouteWeightParams,
)
from firedrill.respond.severity import Assessment, Sev, assess
from firedrill.respond.severity import Impact as _Impact
from firedrill.respond.suspects import (
    WINDOW_S,
    Suspect,
    Symptom,
    SymptomKind,
    drains,
    rank,
    source_cell,
)

Mode = Literal["advise", "auto"]
Duration = Annotated[str, Field(pattern=r"^[0-9]{1,9}(s|m|h|d)$")]
DECLARED_ALERT = "IncidentDeclared"
REGION_CELL = "region:"  # region-scoped incidents carry cell="region:<name>"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # day zero of a run's clock, for "due 04:15 UTC" lines

# The tempting shortcuts of a registry or hydrate incident, refused with the safe path.
REGISTRY_SHORTCUTS: tuple[UnsafeKind, ...] = (
    "public_mirror",
    "admission_ignore",
    "widen_bucket_iam",
    "disable_signature_checks",
)


# ---------------------------------------------------------------------------------------------
# runbooks


@dataclass(frozen=True)
class Candidate:
    """One step of a runbook: a lever to pull (or a shortcut to refuse) and why it is next.

    A ``prerequisite`` lever (pinning the scalers before traffic moves) is not a mitigation on its
    own: it is applied and kept, never verified against the symptom, never undone by the loop.
    """

    request: Lever | UnsafeRequest
    reason: str
    prerequisite: bool = False


@dataclass(frozen=True)
class RunbookContext:
    """What a runbook sees: the incident's symptom, its suspects, and the fleet to read."""

    incident_id: str
    symptom: Symptom
    suspects: tuple[Suspect, ...]
    fleet: Fleet
    at_s: float
    tags: frozenset[str] = field(default_factory=frozenset)  # "registry", "hydrate", "security"
    alertnames: tuple[str, ...] = ()
    alerts: tuple[Labels, ...] = ()
    applied: frozenset[tuple[object, ...]] = frozenset()  # ``lever_key``s applied and held now
    signals: Signals | None = None  # series to read (golden set, per-role utilisation)
    catalog: DigestCatalog | None = None  # published digests, for rollback targets
    own_changes: frozenset[ChangeEvent] = frozenset()  # what the responder's levers changed

    @property
    def causes(self) -> tuple[Suspect, ...]:
        """Suspects that changed before onset, most likely first, the responder's own levers
        left out.

        A lever the responder pulled is a mitigation, undone only by its own verification: as a
        cause it would be reverted by the next incident's runbook (a bundle revert at another
        cell's onset ranks as the likeliest cause, and reverting it puts the bad config back).
        It stays among the suspects, where the record of what changed shows it.
        """
        return tuple(
            s for s in self.suspects if s.before_onset and s.change not in self.own_changes
        )

    def region_cells(self) -> tuple[CellView, ...]:
        """The cells of the incident's region."""
        return tuple(c for c in self.fleet.cells() if c.region == self.symptom.region)

    def label_values(self, key: str) -> tuple[str, ...]:
        """Distinct values of one label over the incident's alerts, first seen first."""
        return tuple(dict.fromkeys(v for a in self.alerts for k, v in a if k == key and v))


Runbook = Callable[[RunbookContext], Sequence[Candidate]]


def _serving(view: CellView) -> dict[str, int]:
    """Ready replicas per model a cell serves."""
    return {rc.model: rc.ready for rc in view.replicas if rc.desired > 0 or rc.ready > 0}


def registry_steps(ctx: RunbookContext) -> list[Candidate]:
    """Registry/hydrate: pin scale-in, keep traffic on warm capacity, refuse the shortcuts."""
    cells = ctx.region_cells()
    out = [
        Candidate(
            Lever("scaler_pause", c.name),
            f"{'/'.join(sorted(ctx.tags & REGISTRY_TAGS))} incident in {ctx.symptom.region}: "
            f"pin {c.name}'s scalers first; warm capacity that scales in cannot be hydrated back",
            prerequisite=True,
        )
        for c in cells
        if _serving(c)
    ]
    models = sorted({m for c in cells for m in _serving(c)})
    for model in models:
        current = {c.name: dict(c.route_weights).get(model, 0) for c in cells}
        warm = {c.name: _serving(c).get(model, 0) for c in cells if current[c.name] > 0}
        if not warm or sum(warm.values()) == 0:
            continue
        weights = tuple(sorted(warm.items()))
        if all(current[c] == w for c, w in weights):
            continue  # the route already follows warm capacity
        out.append(
            Candidate(
                Lever("route_weight", model, RouteWeightParams(weights)),
                f"route {model} in {ctx.symptom.region} by warm (ready) replicas, so no cell "
                "needs a scale-out that would hydrate from the registry",
            )
        )
    who = "on-call under pressure"
    out += [
        Candidate(
            UnsafeRequest(kind, ctx.symptom.region, who),
            f"tempting shortcut during a {'/'.join(sorted(ctx.tags & REGISTRY_TAGS))} incident",
        )
        for kind in REGISTRY_SHORTCUTS
    ]
    return out


def _demand_levers(ctx: RunbookContext, top: Suspect) -> list[Candidate]:
    """A demand shift is capacity, not a regression: put warm capacity back under the traffic."""
    change = top.change
    moved_from = source_cell(change) or (change.cell if drains(change) else None)
    if moved_from is None or moved_from == ctx.symptom.cell:
        return []
    views = {c.name: c for c in ctx.fleet.cells()}
    src = views.get(moved_from)
    model = change.subject
    if src is None or src.quarantined or _serving(src).get(model, 0) == 0:
        return []
    try:
        before = int(float(change.before))
    except ValueError:
        return []
    back = max(1, before // 2)  # the drain's steps in reverse: 0 -> 50% first
    lever = Lever("route_weight", model, RouteWeightParams(((moved_from, back),)))
    if dict(src.route_weights).get(model, 0) >= back and lever_key(lever) not in ctx.applied:
        return []  # someone already put the weight back
    return [
        Candidate(
            lever,
            f"capacity, not rollback: {moved_from} was drained and its {model} traffic moved into "
            f"{ctx.symptom.cell}; put {moved_from}'s warm replicas back at weight {back} "
            f"(50% of {before})",
        )
    ]


def serving_runbook(ctx: RunbookContext) -> list[Candidate]:
    """Inference SLO burn: what changed decides the first lever; a sick cell drains last."""
    if ctx.tags & REGISTRY_TAGS:
        return registry_steps(ctx)
    out: list[Candidate] = []
    causes = ctx.causes
    if causes:
        top = causes[0]
        c = top.change
        if top.stream == "demand":
            out += _demand_levers(ctx, top)
        elif top.stream == "bundle":
            # the bundle label goes back before any traffic moves (the rollback order), whether
            # the storm it causes shows first as KV tickets or as the burn they lead to
            found = bundle_revert((top,))
            if found is not None:
                out.append(Candidate(*found))
        elif top.stream in ("weights", "serving_image"):
            out.append(
                Candidate(
                    Lever("rollout_abort", c.subject),
                    f"{top.stream} change {c.before} -> {c.after} before onset: abort the "
                    "rollout, stable back to 100%",
                )
            )
        elif top.stream == "node_layer" and c.detail == "driver" and c.before:
            out.append(
                Candidate(
                    Lever("driver_rollback", c.cell, lv.DriverParams(c.before)),
                    f"driver {c.after} rolled out in {c.cell} before onset: back to {c.before} "
                    "(the slowest lever, last)",
                )
            )
    demand_top = bool(causes) and causes[0].stream == "demand"
    in_cell = not ctx.symptom.cell.startswith(REGION_CELL)
    if ctx.symptom.kind in ("availability", "kv_oom") and not demand_top and in_cell:
        out.append(
            Candidate(
                Lever("cell_drain", ctx.symptom.cell),
                f"take {ctx.symptom.cell}'s traffic to the rest of its region in steps, "
                "after the headroom check",
            )
        )
    return out


def node_layer_runbook(ctx: RunbookContext) -> list[Candidate]:
    """Node-layer symptoms: the controller quarantines nodes; a driver rollout rolls back last."""
    out: list[Candidate] = []
    for s in ctx.causes[:1]:
        c = s.change
        if s.stream == "node_layer" and c.detail == "driver" and c.before:
            out.append(
                Candidate(
                    Lever("driver_rollback", c.cell, lv.DriverParams(c.before)),
                    f"driver {c.after} on {s.count} node(s) of {c.cell} before onset: back to "
                    f"{c.before}",
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# policy


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_ROSTER: dict[str, Role] = {
    "ic-oncall": "incident_commander",
    "ops-oncall": "ops_lead",
    "comms-oncall": "comms_lead",
    "capacity-lead": "capacity_lead",
    "model-owner": "model_owner",
    "security-lead": "security_lead",
}
# Who decides each lever: the model owner rolls back weights, the capacity lead signs off drains
# and route weights, the security lead owns kill switches.
DEFAULT_DECIDES: dict[LeverKind, Role] = {
    "kill_switch": "security_lead",
    "pod_quarantine": "security_lead",
    "bundle_revert": "model_owner",
    "route_weight": "capacity_lead",
    "cell_drain": "capacity_lead",
    "cell_quarantine": "ops_lead",
    "scaler_pause": "capacity_lead",
    "rollout_abort": "model_owner",
    "digest_rollback": "model_owner",
    "queue_hold": "ops_lead",
    "jobset_suspend": "ops_lead",
    "node_quarantine": "ops_lead",
    "driver_rollback": "ops_lead",
    "pd_rebalance": "capacity_lead",
}


class VerifyPolicy(_Strict):
    """How an applied lever is judged: the symptom must clear within ``window``."""

    window: Duration = "10m"
    # burn_below: the incident's cells burn at most ``burn_rate`` x the error budget over
    # ``burn_window`` (incidents without a burn-rate alert fall back to alerts_resolved);
    # alerts_resolved: none of the incident's page alerts is still firing.
    rule: Literal["burn_below", "alerts_resolved"] = "burn_below"
    burn_rate: Annotated[float, Field(gt=0)] = 1.0
    burn_window: Duration = "5m"

    @property
    def window_s(self) -> float:
        return duration_s(self.window)

    @property
    def burn_window_s(self) -> float:
        return duration_s(self.burn_window)


class CommsPolicy(_Strict):
    """When the comms lead's first draft lands, and where the channel's redactions point."""

    draft_after: Duration = "5m"  # after the incident reaches SEV1/2; the deadline is 15 min
    audit_query_url: str = "https://audit.corp/query?incident={incident}"

    @property
    def draft_after_s(self) -> float:
        return duration_s(self.draft_after)


class Declaration(_Strict):
    """An incident a person declares (a registry outage announced by its owners, say)."""

    at: Duration
    region: str
    cell: str | None = None  # None: the whole region (cell "region:<name>")
    title: str
    sev: Literal["SEV1", "SEV2", "SEV3", "SEV4"] = "SEV2"
    symptom: SymptomKind = "availability"
    tags: list[Literal["registry", "hydrate", "security"]] = []
    product: str = ""

    @property
    def at_s(self) -> float:
        return duration_s(self.at)


class ResponderPolicy(_Strict):
    """The responder's policy: mode, people, decision rights, verification and comms."""

    mode: Mode = "advise"
    roster: dict[str, Role] = Field(default_factory=lambda: dict(DEFAULT_ROSTER))
    decides: dict[LeverKind, Role] = Field(default_factory=lambda: dict(DEFAULT_DECIDES))
    second_approver: Role = "incident_commander"  # signs fleet-wide levers with the owner
    # Kinds auto mode may apply; everything else is proposed. A cell drain is stepped under the
    # capacity lead and is always proposed.
    auto_apply: list[LeverKind] = ["scaler_pause", "route_weight", "rollout_abort", "queue_hold"]
    # Kinds outside the on-call role: applying one needs a two-person break-glass grant. The
    # catalogue's own (``levers.BREAKGLASS_KINDS``) need one whatever this lists: a policy can
    # add kinds, never remove them (``needs_breakglass``).
    breakglass: list[LeverKind] = ["digest_rollback", "driver_rollback", "cell_quarantine"]
    breakglass_ttl: Duration = "1h"
    verify: VerifyPolicy = VerifyPolicy()
    max_levers: Annotated[int, Field(ge=1, le=20)] = 3  # proposed or applied, per incident
    comms: CommsPolicy = CommsPolicy()
    declare: list[Declaration] = []
    act_on: list[IncidentKind] = ["cell", "security"]

    @model_validator(mode="after")
    def _rights_fit_the_catalogue(self) -> ResponderPolicy:
        for kind, role in self.decides.items():
            allowed = CATALOGUE[kind].decided_by
            if role not in allowed:
                raise ValueError(
                    f"decides.{kind}: {role} cannot decide {kind} (decided by "
                    f"{' or '.join(sorted(allowed))})"
                )
        if "cell_drain" in self.auto_apply:
            raise ValueError(
                "auto_apply: cell_drain goes in steps under the capacity lead; it is proposed"
            )
        names = [canonical_identity(n) for n in self.roster]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError("roster: every person has one distinct, non-empty name")
        return self

    @property
    def breakglass_ttl_s(self) -> float:
        return duration_s(self.breakglass_ttl)

    def needs_breakglass(self, kind: LeverKind) -> bool:
        """Whether applying ``kind`` needs a break-glass grant: the catalogue's or the policy's."""
        return kind in lv.BREAKGLASS_KINDS or kind in self.breakglass


# ---------------------------------------------------------------------------------------------
# watching the symptom


class SymptomProbe(Protocol):
    """Reads the symptom an applied lever is judged by."""

    def burn_rate(self, cells: Collection[str], window_s: float) -> float | None:
        """Worst burn rate (x the error budget) over the cells' SLOs; None without data."""
        ...

    def firing(self) -> Collection[Labels]:
        """Alerts firing now."""
        ...


class EvaluatorProbe:
    """A ``SymptomProbe`` over the run's burn-rate evaluator and its notifier's firing set."""

    def __init__(self, burn: BurnRateEvaluator, firing: Callable[[], Collection[Labels]]) -> None:
        self._burn = burn
        self._firing = firing

    def burn_rate(self, cells: Collection[str], window_s: float) -> float | None:
        if not self._burn.started:
            return None
        idx = [i for i, (c, _) in enumerate(self._burn.cells) if c in cells]
        if not idx:
            return None
        worst: float | None = None
        for o in self._burn.spec.objectives:
            vals = self._burn.error_ratio(o, window_s)[idx]
            vals = vals[np.isfinite(vals)]
            if vals.size:
                rate = float(vals.max()) / o.budget
                worst = rate if worst is None else max(worst, rate)
        return worst

    def firing(self) -> Collection[Labels]:
        return self._firing()


# ---------------------------------------------------------------------------------------------
# the journal


@dataclass(frozen=True)
class LeverRecord:
    """One lever of an incident: the pull's journal entry and what verification found."""

    incident: str
    entry: LeverJournalEntry
    candidate_reason: str
    prerequisite: bool = False
    verified: bool | None = None  # None: not applied, or a prerequisite
    verified_at_s: float | None = None
    verify_detail: str = ""
    undo: LeverJournalEntry | None = None  # the inverse applied when verification failed
    breakglass: str | None = None  # the grant id it was applied under
    baseline: float | None = None  # the symptom when it was applied
    key: tuple[object, ...] = ()  # the candidate it came from (kind, target, params)
    shared_from: str | None = None  # another incident applied this very lever
    lever: Lever | None = None  # the request (None for a refused shortcut)

    @property
    def applied(self) -> bool:
        return self.entry.status == "applied"


@dataclass(frozen=True)
class CommsRecord:
    """One status update: the deadline it answered, the status-page entry and channel text."""

    update: Update
    status_page: StatusPageEntry | None
    channel_text: str
    redacted: tuple[str, ...]
    refused: str = ""  # why the status-page entry was refused, if it was


@dataclass
class _State:
    records: list[LeverRecord] = field(default_factory=list)
    pending: int | None = None  # index of the applied record under verification
    done: bool = False
    comms: CommsPlan | None = None
    comms_from_s: float | None = None  # when the incident reached SEV1/2
    updates: list[CommsRecord] = field(default_factory=list)
    pages: list[SecurityPage] = field(default_factory=list)
    grants: list[Grant] = field(default_factory=list)


def lever_key(request: Lever | UnsafeRequest) -> tuple[object, ...]:
    """Identity of a candidate: the same lever asked twice is tried once."""
    return _key(request)


def _key(request: Lever | UnsafeRequest) -> tuple[object, ...]:
    if isinstance(request, UnsafeRequest):
        return ("unsafe", request.kind, request.target)
    return (request.kind, request.target, repr(request.params))


@dataclass(frozen=True)
class _Declared(Assessment):
    """A severity a person declared rather than measured."""

    why: str = ""

    @property
    def reason(self) -> str:
        return self.why


_WHAT: Mapping[SymptomKind, str] = {
    "ttft": "latency",
    "availability": "error rates",
    "kv_oom": "errors and latency",
    "quality": "answer quality problems",
    "xid": "reduced capacity",
    "egress": "a security issue",
    "pd_imbalance": "latency",
    "training_stall": "stalled training",
}


# ---------------------------------------------------------------------------------------------
# the responder


Classifier = Callable[[list[Labels]], SymptomKind]


class Responder:
    """Runs the policy over a run's incidents, one evaluation step at a time."""

    def __init__(
        self,
        policy: ResponderPolicy,
        fleet: Fleet,
        *,
        probe: SymptomProbe,
        classify: Classifier,
        signals: Signals | None = None,
        capacity: CapacityView | None = None,
        catalog: DigestCatalog | None = None,
        book: IncidentBook | None = None,
        epoch: datetime = EPOCH,
        runbooks: Mapping[SymptomKind, Runbook],
    ) -> None:
        self.policy = policy
        self.fleet = fleet
        self.probe = probe
        self.classify = classify
        self.signals = signals
        self.capacity = capacity
        self.catalog = catalog
        self.book = book if book is not None else IncidentBook()
        self.epoch = epoch
        self._runbooks = runbooks
        self.broker = BreakGlassBroker()
        self._states: dict[str, _State] = {}
        self._seen = 0
        self._declared: dict[str, Declaration] = {}
        self._pending_declarations = sorted(policy.declare, key=lambda d: d.at_s)
        # lever key -> the incident that applied it and its entry (other incidents share it)
        self._applied_by: dict[tuple[object, ...], tuple[str, LeverJournalEntry]] = {}
        # the fleet changes the responder's own pulls and undos made (its mitigations)
        self._own_changes: set[ChangeEvent] = set()

    # --- reading ----------------------------------------------------------------------------

    def records(self, incident_id: str) -> list[LeverRecord]:
        """Every lever the responder journalled for an incident, in order."""
        state = self._states.get(incident_id)
        return list(state.records) if state else []

    def updates(self, incident_id: str) -> list[CommsRecord]:
        state = self._states.get(incident_id)
        return list(state.updates) if state else []

    def comms_plan(self, incident_id: str) -> CommsPlan | None:
        state = self._states.get(incident_id)
        return state.comms if state else None

    def security_pages(self, incident_id: str) -> list[SecurityPage]:
        state = self._states.get(incident_id)
        return list(state.pages) if state else []

    def grants(self, incident_id: str) -> list[Grant]:
        """Break-glass grants the incident's levers were applied under."""
        state = self._states.get(incident_id)
        return list(state.grants) if state else []

    def tags(self, inc: Incident) -> frozenset[str]:
        """Tags that change the runbook: a declaration's, a hydrate alert, a registry cut."""
        tags: set[str] = set()
        decl = self._declared.get(inc.id)
        if decl is not None:
            tags.update(decl.tags)
        names = {label_value(a, "alertname") for a in inc.alerts}
        if "HydrateOrigin5xx" in names:
            tags.add("hydrate")
        if inc.kind == "security":
            tags.add("security")
        since = max(0.0, inc.opened_at_s - WINDOW_S)
        for c in self.fleet.changes(since_s=since):
            if _registry_cut(c, inc.region) and c.at_s <= inc.opened_at_s:
                tags.add("registry")
        return frozenset(tags)

    def symptom(self, inc: Incident) -> Symptom:
        decl = self._declared.get(inc.id)
        kind = decl.symptom if decl is not None else self.classify(list(inc.alerts))
        return Symptom(kind, inc.opened_at_s, inc.cell, inc.region)

    # --- the loop ---------------------------------------------------------------------------

    def observe(self, now_s: float, notifications: Sequence[Notification]) -> None:
        """One evaluation step: ingest what was sent since the last call, then act."""
        new = list(notifications[self._seen :])
        self._seen = len(notifications)
        for n in sorted(new, key=lambda n: n.at_s):
            self._declare_until(n.at_s)
            self.book.ingest(n)
        self._declare_until(now_s)
        self.broker.reap(now_s)
        for inc in self.book.incidents:
            if inc.status == "resolved" or inc.kind not in self.policy.act_on:
                continue
            state = self._states.setdefault(inc.id, _State())
            self._comms(inc, state, now_s)
            self._act(inc, state, now_s)

    def _declare_until(self, at_s: float) -> None:
        while self._pending_declarations and self._pending_declarations[0].at_s <= at_s:
            d = self._pending_declarations.pop(0)
            self._declare(d, max(d.at_s, 0.0))

    def _declare(self, d: Declaration, at_s: float) -> None:
        cell = d.cell or f"{REGION_CELL}{d.region}"
        labels = labels_of(
            alertname=DECLARED_ALERT,
            severity="page",
            team="incident-command",
            cell=cell,
            region=d.region,
            product=d.product,
            summary=d.title,
        )
        n = Notification(
            receiver="page",
            group_key=(cell, DECLARED_ALERT),
            alertname=DECLARED_ALERT,
            cell=cell,
            at_s=at_s,
            alerts=(labels,),
            resolved=(),
        )
        update = self.book.ingest(n)
        for inc_id in update.opened or update.joined:
            inc = self.book.get(inc_id)
            self._declared[inc_id] = d
            inc.title = d.title
            sev = Sev[d.sev]
            axes = assess(_Impact(), self.book.matrix).axes
            inc.severity.raise_to(
                _Declared(sev, axes, "users", f"declared {d.sev}: {d.title}"), at_s
            )

    # --- comms ------------------------------------------------------------------------------

    def _comms(self, inc: Incident, state: _State, now_s: float) -> None:
        if inc.sev > Sev.SEV2 and state.comms is None:
            return
        if state.comms is None:
            first = next(
                (h.at_s for h in inc.severity.history if h.applied and h.sev <= Sev.SEV2), now_s
            )
            state.comms = CommsPlan(inc.id, inc.sev, first)
            state.comms_from_s = first
        elif inc.sev < state.comms.sev:
            state.comms.escalate(inc.sev, now_s)
        plan = state.comms
        start = state.comms_from_s if state.comms_from_s is not None else now_s
        if not plan.updates:
            if now_s < start + self.policy.comms.draft_after_s:
                return
        else:
            due = plan.next_update_due_s
            if due is None or now_s < due or inc.status == "resolved":
                return
        self._post(inc, state, plan, now_s)

    def _post(self, inc: Incident, state: _State, plan: CommsPlan, now_s: float) -> None:
        symptom = self.symptom(inc)
        products = list(
            dict.fromkeys(
                label_value(a, "product") for a in inc.alerts if label_value(a, "product")
            )
        )
        product = ", ".join(products) or "ML platform"
        region = inc.region or "all regions"
        what = _WHAT.get(symptom.kind, "a problem")
        if not plan.updates:
            text = f"Investigating {what} for {product} in {region}."
        else:
            applied = [r for r in state.records if r.applied and not r.prerequisite]
            verified = [r for r in applied if r.verified]
            if verified:
                text = f"A mitigation is in place for {product} in {region}; we are monitoring."
            elif applied:
                text = f"Mitigating {what} for {product} in {region}; next update in 30 minutes."
            else:
                text = f"Still investigating {what} for {product} in {region}."
        entry: StatusPageEntry | None = None
        why = ""
        try:
            entry = status_page_entry(
                product,
                region,
                text,
                known_cells=[c.name for c in self.fleet.cells()],
                known_nodes=[n.name for n in self.fleet.node_views()],
            )
        except CommsError as exc:
            why = str(exc)
        url = self.policy.comms.audit_query_url.replace("{incident}", inc.id)
        channel = redact(f"{inc.id} ({inc.sev}) {inc.title}: {text}", url)
        update = plan.post(text, now_s)
        state.updates.append(
            CommsRecord(update, entry, channel.text, tuple(channel.kinds), refused=why)
        )

    # --- levers -----------------------------------------------------------------------------

    def _act(self, inc: Incident, state: _State, now_s: float) -> None:
        if state.pending is not None:
            self._verify(inc, state, now_s)
            if state.pending is not None:
                return
        if state.done:
            return
        ctx = self._context(inc, now_s)
        fn = self._runbooks.get(ctx.symptom.kind)
        if fn is None:
            return
        tried = {r.key for r in state.records}
        for cand in fn(ctx):
            if _key(cand.request) in tried:
                continue
            if isinstance(cand.request, UnsafeRequest):
                # A shortcut is refused whenever it comes up, even while a lever is verified.
                tried.add(_key(cand.request))
                entry = lv.refuse(cand.request, at_s=now_s)
                state.records.append(
                    LeverRecord(inc.id, entry, cand.reason, key=_key(cand.request))
                )
                continue
            if state.pending is not None or self._budget_left(state) <= 0:
                continue  # one lever at a time; later ones wait for its verification
            tried.add(_key(cand.request))
            record = self._pull(inc, state, cand, cand.request, now_s)
            state.records.append(record)
            if record.applied and not cand.prerequisite:
                if record.shared_from is None:
                    self._applied_by[_key(cand.request)] = (inc.id, record.entry)
                state.pending = len(state.records) - 1

    def _budget_left(self, state: _State) -> int:
        used = sum(1 for r in state.records if r.entry.status != "refused" and not r.prerequisite)
        return self.policy.max_levers - used

    def _context(self, inc: Incident, now_s: float) -> RunbookContext:
        symptom = self.symptom(inc)
        since = max(0.0, inc.opened_at_s - WINDOW_S)
        suspects: list[Suspect] = []
        if inc.kind != "security" and not symptom.cell.startswith(REGION_CELL):
            suspects = rank(self.fleet.changes(since_s=since), symptom)[:5]
        return RunbookContext(
            incident_id=inc.id,
            symptom=symptom,
            suspects=tuple(suspects),
            fleet=self.fleet,
            at_s=now_s,
            tags=self.tags(inc),
            alertnames=tuple(dict.fromkeys(label_value(a, "alertname") for a in inc.alerts)),
            alerts=tuple(inc.alerts),
            applied=frozenset(self._applied_by),
            signals=self.signals,
            catalog=self.catalog,
            own_changes=frozenset(self._own_changes),
        )

    def _approvers(self, lever: Lever) -> tuple[Approver, ...]:
        """The owner of the lever's kind from the roster, plus the second approver if fleet-wide."""
        owner_role = self.policy.decides.get(lever.kind)
        spec = CATALOGUE[lever.kind]
        roles: list[Role] = [owner_role] if owner_role else sorted(spec.decided_by)[:1]
        if lv.scope_of(lever) == "fleet":
            roles += [self.policy.second_approver, *sorted(spec.fleet_roles)]
        out: list[Approver] = []
        for role in dict.fromkeys(roles):
            person = next(
                (
                    name
                    for name, r in sorted(self.policy.roster.items())
                    if r == role
                    and canonical_identity(name) not in {canonical_identity(a.name) for a in out}
                ),
                None,
            )
            if person is not None:
                out.append(Approver(person, role))
        return tuple(out)

    def roles_needed(self, lever: Lever) -> tuple[Role, ...]:
        """The roles that must approve ``lever``: its owner, plus the second approver (and the
        kind's fleet roles) when it edits fleet-wide state."""
        spec = CATALOGUE[lever.kind]
        owner_role = self.policy.decides.get(lever.kind)
        roles: list[Role] = [owner_role] if owner_role else sorted(spec.decided_by)[:1]
        if lv.scope_of(lever) == "fleet":
            roles += [self.policy.second_approver, *sorted(spec.fleet_roles)]
        return tuple(dict.fromkeys(roles))

    def checks(self, incident_id: str, lever: Lever) -> list[GuardResult]:
        """Run the guards ``lever`` requires for an incident now (a pull re-runs them)."""
        inc = self.book.get(incident_id)
        return self._checks(inc, self._states.setdefault(inc.id, _State()), lever)

    def _checks(self, inc: Incident, state: _State, lever: Lever) -> list[GuardResult]:
        spec = CATALOGUE[lever.kind]
        checks: list[GuardResult] = []
        if "scale_in_paused" in spec.requires:
            applied = [r.entry for r in self._all_records() if r.applied and r.undo is None]
            try:
                checks.append(
                    lv.scale_in_check(
                        lever, self.fleet, incident_tags=self.tags(inc), journal=applied
                    )
                )
            except FiredrillError as exc:
                checks.append(refused("scale_in_paused", f"cannot check scale-in: {exc}"))
        if "drain_headroom" in spec.requires:
            if self.signals is None or self.capacity is None:
                checks.append(refused("drain_headroom", "no signals to check drain headroom"))
            else:
                try:
                    plan = lv.drain_check(lever, self.fleet, self.signals, self.capacity)
                    checks.append(plan.result)
                except FiredrillError as exc:
                    checks.append(refused("drain_headroom", f"cannot check headroom: {exc}"))
        if "rollback_target" in spec.requires:
            if self.catalog is None:
                checks.append(refused("rollback_target", "no digest catalog to check against"))
            else:
                try:
                    checks.append(lv.rollback_check(lever, self.catalog))
                except FiredrillError as exc:
                    checks.append(refused("rollback_target", f"cannot check target: {exc}"))
        return checks

    def _all_records(self) -> list[LeverRecord]:
        return [r for s in self._states.values() for r in s.records]

    def _pull(
        self, inc: Incident, state: _State, cand: Candidate, lever: Lever, now_s: float
    ) -> LeverRecord:
        approvers = self._approvers(lever)
        checks = self._checks(inc, state, lever)
        vetted = lv.pull(
            lever,
            self.fleet,
            approvers=approvers,
            at_s=now_s,
            reason=cand.reason,
            checks=checks,
            dry_run=True,
        )
        base = LeverRecord(
            inc.id,
            vetted,
            cand.reason,
            prerequisite=cand.prerequisite,
            key=_key(lever),
            lever=lever,
        )
        if vetted.status != "proposed":
            return base
        held = self._applied_by.get(_key(lever))
        if held is not None and held[0] != inc.id:
            # One lever, two incidents (the receivers of one drain): share it, verify it here too.
            shared = replace(held[1], reason=f"applied under {held[0]}: {cand.reason}")
            return replace(base, entry=shared, shared_from=held[0])
        auto = self.policy.mode == "auto" and lever.kind in self.policy.auto_apply
        if not auto:
            why = (
                "advise mode: proposed"
                if self.policy.mode == "advise"
                else f"auto mode does not apply {lever.kind}: proposed"
            )
            return replace(base, entry=replace(vetted, reason=f"{cand.reason} ({why})"))
        grant: str | None = None
        if self.policy.needs_breakglass(lever.kind):
            grant_or_why = self._breakglass(inc, state, lever, cand, now_s)
            if not grant_or_why[0]:
                # Refused without a grant, and security hears of the attempt all the same.
                why = grant_or_why[1]
                state.pages.append(
                    SecurityPage(
                        now_s,
                        "",
                        "responder",
                        f"{lever.kind} on {lever.target}",
                        inc.sev if inc.sev is not Sev.NONE else Sev.SEV4,
                        f"{lever.kind} on {lever.target} needs break-glass and has no grant: "
                        f"refused ({why})",
                    )
                )
                refusal = replace(
                    vetted,
                    status="refused",
                    reason=f"break-glass refused: {why}; security paged",
                )
                return replace(base, entry=refusal)
            grant = grant_or_why[1]
        baseline = self._symptom_value(inc)
        entry = self._tracked(
            now_s,
            lambda: lv.pull(
                lever,
                self.fleet,
                approvers=approvers,
                at_s=now_s,
                reason=cand.reason,
                checks=checks,
                dry_run=False,
            ),
        )
        return replace(base, entry=entry, breakglass=grant, baseline=baseline)

    def _tracked(self, now_s: float, act: Callable[[], LeverJournalEntry]) -> LeverJournalEntry:
        """Apply a pull or an undo, and remember the fleet changes it made as the responder's.

        The fleet stamps its changes on its own clock, which is the clock ``observe`` is driven
        by; the two reads bracket only the operations applied here.
        """
        before = set(self.fleet.changes(since_s=now_s))
        entry = act()
        self._own_changes.update(c for c in self.fleet.changes(since_s=now_s) if c not in before)
        return entry

    def _breakglass(
        self, inc: Incident, state: _State, lever: Lever, cand: Candidate, now_s: float
    ) -> tuple[bool, str]:
        """Request, approve (two people) and use a grant; (True, grant id) or (False, why)."""
        roster = sorted(self.policy.roster.items())
        requester = next((n for n, r in roster if r == "ops_lead"), None)
        if requester is None:
            return False, "no ops lead on the roster to request break-glass"
        sev = inc.sev if inc.sev is not Sev.NONE else Sev.SEV4
        try:
            req = self.broker.request(
                identity=f"breakglass:{requester}",
                scope=f"{lever.kind}:{'fleet' if lever.target == lv.FLEET_WIDE else lever.target}",
                reason=f"{inc.id}: {cand.reason}",
                requested_by=requester,
                at_s=now_s,
                sev=sev,
                ttl_s=self.policy.breakglass_ttl_s,
            )
            grant = None
            approved: list[Approval] = []
            for role in (INCIDENT_COMMANDER, SECURITY_LEAD):
                who = next(
                    (
                        n
                        for n, r in roster
                        if r == role
                        and not same_person(n, requester)
                        and not any(same_person(n, a.approver) for a in approved)
                    ),
                    None,
                )
                if who is None:
                    return False, f"no {role} on the roster to approve it (two-person rule)"
                grant = self.broker.approve(req.request_id, who, role, now_s)
                approved.append(Approval(who, role, now_s))
            if grant is None:
                return False, "two approvals did not issue a grant"
            use = self.broker.use(grant.grant_id, f"{lever.kind} on {lever.target}", now_s)
        except BreakGlassError as exc:
            return False, exc.reason
        state.pages.append(use.page)
        state.grants.append(grant)
        return True, grant.grant_id

    # --- verification -----------------------------------------------------------------------

    def _cells(self, inc: Incident) -> tuple[str, ...]:
        if inc.cell.startswith(REGION_CELL):
            region = inc.cell[len(REGION_CELL) :]
            return tuple(c.name for c in self.fleet.cells() if c.region == region)
        return (inc.cell,)

    def _has_burn(self, inc: Incident) -> bool:
        """Judge by burn rate: the incident has a burn alert, or was declared (its users' SLOs)."""
        return inc.id in self._declared or any(label_value(a, "burn_tier") for a in inc.alerts)

    def _symptom_value(self, inc: Incident) -> float | None:
        if self.policy.verify.rule == "burn_below" and self._has_burn(inc):
            return self.probe.burn_rate(self._cells(inc), self.policy.verify.burn_window_s)
        return float(len(self._page_alerts_firing(inc)))

    def _page_alerts_firing(self, inc: Incident) -> list[Labels]:
        firing = set(self.probe.firing())
        return [
            a
            for a in inc.alerts
            if a in firing and label_value(a, "severity") in ("page", "security")
        ]

    def _cleared(self, inc: Incident) -> tuple[bool, str]:
        v = self.policy.verify
        if v.rule == "burn_below" and self._has_burn(inc):
            rate = self.probe.burn_rate(self._cells(inc), v.burn_window_s)
            if rate is None:
                return False, "no burn-rate data yet"
            ok = rate <= v.burn_rate
            return (
                ok,
                f"burn {rate:.1f}x over {v.burn_window} ({'<=' if ok else '>'} {v.burn_rate:g}x)",
            )
        firing = self._page_alerts_firing(inc)
        return not firing, f"{len(firing)} page alert(s) still firing"

    def _verify(self, inc: Incident, state: _State, now_s: float) -> None:
        assert state.pending is not None
        i = state.pending
        rec = state.records[i]
        if now_s <= rec.entry.at_s:
            return  # judged from the next evaluation on, never at the instant it was applied
        ok, detail = self._cleared(inc)
        if ok:
            state.records[i] = replace(
                rec, verified=True, verified_at_s=now_s, verify_detail=f"cleared: {detail}"
            )
            state.pending = None
            state.done = True
            if inc.status == "open":
                self.book.mitigate(inc.id, now_s, by=f"responder: {rec.entry.kind}")
            return
        if now_s - rec.entry.at_s < self.policy.verify.window_s - 1e-9:
            return
        if rec.shared_from is not None:  # its owner decides whether to undo it
            state.records[i] = replace(
                rec,
                verified=False,
                verified_at_s=now_s,
                verify_detail=f"not cleared within {self.policy.verify.window}: {detail} "
                f"(held by {rec.shared_from})",
            )
            state.pending = None
            return
        back = self._tracked(
            now_s,
            lambda: lv.undo(
                rec.entry,
                self.fleet,
                approvers=rec.entry.approvers,
                at_s=now_s,
                reason=f"symptom not cleared within {self.policy.verify.window}: {detail}",
            ),
        )
        state.records[i] = replace(
            rec,
            verified=False,
            verified_at_s=now_s,
            verify_detail=f"not cleared within {self.policy.verify.window}: {detail}",
            undo=back,
        )
        self._applied_by.pop(rec.key, None)
        state.pending = None


def _registry_cut(c: ChangeEvent, region: str) -> bool:
    """A cell cut from its region's registry (the twin's ``Partition(cell-registry)``)."""
    return (
        c.stream == "network_policy"
        and c.subject.startswith("cell-registry:")
        and c.subject.endswith(f"/{region}")
        and c.after == "cut"
    )


LEVER_STATUSES: tuple[LeverStatus, ...] = ("applied", "proposed", "refused")
