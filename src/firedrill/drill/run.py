"""Run a game day: steady state, inject on the timeline, observe, stop or recover, measure, judge.

The loop runs on the world's clock in evaluation steps (15 s by default) and talks to the world
only through its ports (``Fleet``, ``Signals``, ``Clock``), so the embedded twin and a remote one
run the same drill:

1. **steady state** — before the first injection the hypothesis must already hold (no stop
   condition true, no page firing for the target, state clauses within bounds); otherwise the
   drill is refused (``SteadyStateError``) and nothing is injected;
2. **inject** — each injection expands to typed operations at its time; each operation's inverse
   is computed from the fleet's state and written to the journal (durably) *before* it is
   applied; an injection with a ``duration`` is reverted when it expires;
3. **observe and respond** — every step the burn-rate and cause alerts are evaluated and routed
   (Alertmanager semantics), incidents open, the remediation controller acts, and the drill's
   on-call fails over through the levers with their guards (``failover``);
4. **stop** — stop conditions are evaluated every step; the first that fires reverts every
   injection and every lever the response pulled, without a human, and the run is ``aborted``;
5. **measure and judge** — the RTO to users served within SLO and its five terms (``rto``), the
   hydrate curve, the security floor, hidden dependencies, failback; each hypothesis clause is
   judged (``hypothesis``), findings get owners, and the verdict is ``passed``, ``failed`` or
   ``aborted``.

Same spec, seed and jitter give the same report, byte for byte: time comes from the world's
clock, randomness from the seed, and the report holds no wall-clock value.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from firedrill.detect.causes import CauseEvaluator
from firedrill.detect.evaluator import AlertEvent, BurnRateEvaluator
from firedrill.detect.notify import Notification, Notifier
from firedrill.detect.slo import SloSpec
from firedrill.drill import expr, inject, recovery
from firedrill.drill.failover import Failover, SteppedDrain
from firedrill.drill.findings import Findings
from firedrill.drill.hypothesis import Measurements, compare, judge
from firedrill.drill.observe import Observer
from firedrill.drill.rto import HydrateWatch, RtoMarks, SloTracker, measured_s, terms
from firedrill.drill.spec import (
    BadDigest,
    CellDrain,
    DrillSpec,
    HydrateStorm,
    Injection,
    NewDigestDuringPause,
    RegionBlackhole,
)
from firedrill.drill.stop import StopConditions, StopState
from firedrill.errors import FiredrillError
from firedrill.model import operations as ops
from firedrill.model.series import Labels, labels_of
from firedrill.model.spec import FleetSpec
from firedrill.ports import DrillWorld, IntentJournal, Signals, WorldFactory
from firedrill.remediate.controller import RemediationController
from firedrill.remediate.policy import PolicySpec
from firedrill.respond import levers
from firedrill.respond.guards import Approver, GuardResult, plan_cell_drain
from firedrill.respond.incidents import IncidentBook
from firedrill.respond.levers import Lever, LeverJournalEntry
from firedrill.respond.severity import severity_for

ProgressFn = Callable[[float], None]
DEFAULT_TTFT_THRESHOLD_S = 2.0
DEFAULT_AVAILABILITY = 0.999
SLO_WINDOW_S = 60.0  # users served within SLO: judged over this window
DRAIN_HOLD_S = 300.0  # a cell drain holds each step this long (reference 000: 5 min)
_NON_FAULTS = (BadDigest, NewDigestDuringPause)  # probes: they do not start the RTO clock


World = DrillWorld  # what a drill runs against (the embedded twin, or a served one)
JournalPort = IntentJournal  # the durable intent journal, as the runner uses it


class SteadyStateError(FiredrillError):
    """The hypothesis did not hold before T0: the drill is refused and nothing was injected."""

    def __init__(self, reasons: Sequence[str], at_s: float) -> None:
        self.reasons = tuple(reasons)
        self.at_s = at_s
        super().__init__("steady state does not hold before T0: " + "; ".join(reasons))


@dataclass(frozen=True)
class Jitter:
    """A seed-driven perturbation for repeated runs: injection times ± ``injection_s`` and
    ``demand_noise`` added to every product's per-minute demand noise."""

    seed: int
    injection_s: float = 30.0
    demand_noise: float = 0.02


@dataclass
class DrillResult:
    """The run's report (the JSON contract, key order fixed) and the world it ran on."""

    report: dict[str, Any]
    world: World

    @property
    def verdict(self) -> str:
        return str(self.report["verdict"])

    def to_json(self) -> str:
        return json.dumps(self.report, indent=2, sort_keys=False, allow_nan=False) + "\n"


@dataclass
class _Active:
    """Something applied that the drill must revert: one injected operation or one lever pull."""

    label: str
    kind: str  # injection | lever
    at_s: float
    operations: tuple[ops.Operation, ...]
    inverses: tuple[ops.Operation, ...]
    keys: tuple[int | None, ...]
    injection: int | None = None  # index in the spec
    entry: LeverJournalEntry | None = None
    reverted_at_s: float | None = None


@dataclass
class _Scheduled:
    at_s: float
    index: int
    injection: Injection


@dataclass
class _Run:
    """The mutable state of one run (kept together so the phases stay small functions)."""

    spec: DrillSpec
    fleet_spec: FleetSpec
    slo: SloSpec
    world: World
    journal: JournalPort | None
    seed: int
    model: str
    regions: list[str]
    observer: Observer
    timeline: list[dict[str, Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    active: list[_Active] = field(default_factory=list)
    reverted: list[dict[str, Any]] = field(default_factory=list)
    injected: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    lever_entries: list[LeverJournalEntry] = field(default_factory=list)
    alerts: list[AlertEvent] = field(default_factory=list)
    applied_ops: list[tuple[float, ops.Operation]] = field(default_factory=list)
    drains: list[SteppedDrain] = field(default_factory=list)
    charts: dict[str, Any] = field(default_factory=dict)
    used_nodes: set[str] = field(default_factory=set)
    # (model, region) -> the drill's promotions there, oldest first: the pre-drill digest is
    # restored only when the last of them is reverted, and an expired one under a newer one
    # changes nothing (the newer promotion superseded it)
    promotions: dict[tuple[str, str], list[_Active]] = field(default_factory=dict)
    baseline_digest: dict[tuple[str, str], ops.Operation] = field(default_factory=dict)
    # seconds of history the burn-rate windows saw at the first injection (backfill included)
    alert_history_s: float | None = None

    def now(self) -> float:
        return round(self.world.now_s(), 6)

    def event(self, kind: str, text: str, **extra: Any) -> None:
        self.timeline.append({"at_s": self.now(), "kind": kind, "text": text, **extra})

    def mark(self, kind: str, label: str) -> None:
        self.markers.append({"at_s": self.now(), "label": label, "kind": kind})

    # -- applying with the journal ---------------------------------------------------------------
    def apply(self, op: ops.Operation, label: str, injection: int | None) -> _Active | None:
        """Record the inverse durably, then apply; a refused operation leaves nothing behind."""
        now = self.now()
        try:
            inverse = self.world.inverse_of(op)
        except FiredrillError as exc:
            self.refused.append(f"{label}: {type(op).__name__} refused: {exc}")
            self.event("refused", f"{label}: {type(op).__name__} refused: {exc}")
            return None
        layer = (op.model, op.region) if isinstance(op, ops.PromoteDigest) else None
        if layer is not None:
            for r in self.regions:  # every region's pre-drill digest (a promotion replicates)
                self.baseline_digest.setdefault(
                    (layer[0], r), self.world.inverse_of(ops.RestoreDigest(layer[0], r, ""))
                )
            inverse = self.baseline_digest[layer]
        key = self.journal.intend(op, inverse, now) if self.journal is not None else None
        try:
            self.world.apply(op)
        except FiredrillError as exc:
            if self.journal is not None and key is not None:
                self.journal.reverted(key, now)  # never applied: nothing to recover
            self.refused.append(f"{label}: {type(op).__name__} failed: {exc}")
            self.event("refused", f"{label}: {type(op).__name__} failed: {exc}")
            return None
        if self.journal is not None and key is not None:
            self.journal.applied(key, now)
        self.applied_ops.append((now, op))
        act = _Active(label, "injection", now, (op,), (inverse,), (key,), injection)
        self.active.append(act)
        if layer is not None:
            self.promotions.setdefault(layer, []).append(act)
        return act

    def _undo_promotion(self, act: _Active) -> tuple[ops.Operation, ...]:
        """What reverts a promotion, given the drill's other promotions of the model.

        The region gets back the digest of the newer promotion still in force there, or its
        pre-drill digest; so does every other region the promotion replicated to meanwhile.
        """
        op = act.operations[0]
        assert isinstance(op, ops.PromoteDigest)
        layers = self.promotions.get((op.model, op.region), [])
        top = bool(layers) and layers[-1] is act
        if act in layers:
            layers.remove(act)
        if not top:
            return ()  # superseded by a newer promotion: nothing to put back yet
        out: list[ops.Operation] = []
        if layers:
            newer = layers[-1].operations[0]
            assert isinstance(newer, ops.PromoteDigest)
            out.append(ops.RestoreDigest(newer.model, newer.region, newer.digest))
        else:
            out.append(act.inverses[0])
        for r in self.regions:
            if r == op.region or self.promotions.get((op.model, r)):
                continue
            now = self.world.inverse_of(ops.RestoreDigest(op.model, r, ""))
            if isinstance(now, ops.RestoreDigest) and now.digest == op.digest:
                out.append(self.baseline_digest[(op.model, r)])  # it replicated there
        return tuple(out)

    def pull(
        self,
        lever: Lever,
        checks: Sequence[GuardResult],
        approvers: Sequence[Approver],
        reason: str,
    ) -> LeverJournalEntry:
        """Pull a lever through its guards, journalling each operation's inverse first."""
        now = self.now()
        keys: list[int | None] = []
        planned: tuple[ops.Operation, ...] = ()
        try:
            planned = levers.operations(lever, self.world)
            inverses = [self.world.inverse_of(op) for op in planned]
        except FiredrillError:
            planned, inverses = (), []
        if self.journal is not None:
            keys = [
                self.journal.intend(op, inv, now) for op, inv in zip(planned, inverses, strict=True)
            ]
        entry = levers.pull(
            lever, self.world, approvers=approvers, at_s=now, reason=reason, checks=checks
        )
        self.lever_entries.append(entry)
        if entry.status == "applied":
            self.applied_ops.extend((now, op) for op in entry.ops)
        if self.journal is not None:
            for k in keys:
                if k is None:
                    continue
                if entry.status == "applied":
                    self.journal.applied(k, now)
                else:
                    self.journal.reverted(k, now)
        label = f"{lever.kind} {lever.target}"
        if entry.status == "applied":
            self.active.append(
                _Active(label, "lever", now, entry.ops, entry.inverses, tuple(keys), entry=entry)
            )
            self.event("lever", f"{label}: {reason}", status="applied")
            if lever.kind == "route_weight":
                self.mark("shift", label)
        else:
            self.event("lever", f"{label} refused: {entry.reason}", status="refused")
        return entry

    def revert(self, act: _Active, reason: str) -> None:
        if act.reverted_at_s is not None:
            return
        now = self.now()
        if act.entry is not None:
            back = levers.undo(
                act.entry, self.world, approvers=act.entry.approvers, at_s=now, reason=reason
            )
            self.lever_entries.append(back)
            ok = back.status == "applied"
            if not ok:  # approvals or guards refused the undo: restore by the inverses anyway
                for inv in reversed(act.inverses):
                    try:
                        self.world.apply(inv)
                        ok = True
                    except FiredrillError as exc:
                        self.refused.append(f"undo {act.label} failed: {exc}")
                        ok = False
        else:
            ok = True
            inverses: tuple[ops.Operation, ...] = act.inverses
            if len(act.operations) == 1 and isinstance(act.operations[0], ops.PromoteDigest):
                inverses = tuple(reversed(self._undo_promotion(act)))
            for undo_op in reversed(inverses):
                try:
                    self.world.apply(undo_op)
                except FiredrillError as exc:
                    self.refused.append(f"revert {act.label} failed: {exc}")
                    ok = False
        if self.journal is not None and ok:
            for k in act.keys:
                if k is not None:
                    self.journal.reverted(k, now)
        act.reverted_at_s = now
        self.reverted.append(
            {
                "label": act.label,
                "kind": act.kind,
                "applied_at_s": act.at_s,
                "reverted_at_s": now,
                "inverse": [_op_text(i) for i in act.inverses],
                "ok": ok,
            }
        )
        self.event("revert", f"{act.label}: {reason}")

    def revert_all(self, reason: str) -> None:
        for act in reversed(self.active):
            self.revert(act, reason)
        if self.active:
            self.mark("revert", f"reverted {len(self.active)}: {reason}")


# -- small helpers ---------------------------------------------------------------------------------


def _op_text(op: ops.Operation) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(op).items())
    return f"{type(op).__name__}({fields})"


def _round(x: float | None, nd: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return None
    return round(float(x), nd)


def _spec_digest(spec: DrillSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def _objective_numbers(slo: SloSpec, model: str) -> tuple[float, float]:
    """(TTFT threshold s, allowed error ratio) of the model's SLOs."""
    ttft = DEFAULT_TTFT_THRESHOLD_S
    avail = DEFAULT_AVAILABILITY
    for o in slo.objectives:
        if o.model != model:
            continue
        if o.sli == "ttft":
            ttft = o.ttft_threshold_s
        elif o.sli == "availability":
            avail = o.target
    return ttft, 1.0 - avail


def _effective_fleet(spec: DrillSpec, fleet: FleetSpec, jitter: Jitter | None) -> FleetSpec:
    update: dict[str, Any] = {}
    if spec.start_hour_utc is not None:
        update["start_hour_utc"] = spec.start_hour_utc
    if jitter is not None and jitter.demand_noise > 0:
        update["products"] = [
            p.model_copy(update={"noise": min(1.0, p.noise + jitter.demand_noise)})
            for p in fleet.products
        ]
    return fleet.model_copy(update=update) if update else fleet


def _schedule(spec: DrillSpec, jitter: Jitter | None) -> list[_Scheduled]:
    cap = spec.duration_cap_s or 0.0
    rng = random.Random(jitter.seed) if jitter is not None else None
    out: list[_Scheduled] = []
    for i, inj in enumerate(spec.injections):
        at = inj.at_s
        if rng is not None and jitter is not None and jitter.injection_s > 0:
            at = at + rng.uniform(-jitter.injection_s, jitter.injection_s)
            at = round(min(max(at, 60.0), max(cap - 1.0, 60.0)), 3)
        out.append(_Scheduled(at, i, inj))
    return sorted(out, key=lambda s: (s.at_s, s.index))


def _t0(schedule: Sequence[_Scheduled]) -> float | None:
    faults = [s.at_s for s in schedule if not isinstance(s.injection, _NON_FAULTS)]
    if faults:
        return min(faults)
    return schedule[0].at_s if schedule else None


def plan(
    spec: DrillSpec, fleet: FleetSpec, *, make_world: WorldFactory, seed: int | None = None
) -> dict[str, Any]:
    """The drill's plan (L0 tabletop): each injection with the operations it would apply now,
    on a fresh world from ``make_world`` (nothing is applied to it)."""
    fleet_eff = _effective_fleet(spec, fleet, None)
    twin = make_world(fleet_eff, spec.seed if seed is None else seed, 0.01)
    schedule = _schedule(spec, None)
    t0 = _t0(schedule)
    used: set[str] = set()
    rows: list[dict[str, Any]] = []
    for s in schedule:
        if isinstance(s.injection, CellDrain):
            operations = [f"cell_drain lever on {s.injection.cell}: 100 -> 50 -> 0, headroom first"]
        else:
            expanded = inject.expand(
                s.injection, s.index, drill=spec.name, fleet=twin, spec=fleet_eff,
                model=spec.target.model, used_nodes=used,
            )  # fmt: skip
            operations = [_op_text(op) for op in expanded]
        rows.append(
            {
                "at_s": s.at_s,
                "injection": inject.describe(s.injection),
                "duration_s": s.injection.duration_s,
                "operations": operations,
            }
        )
    rto = spec.rto
    return {
        "drill": spec.name,
        "rung": spec.rung,
        "target": spec.target.model_dump(),
        "survivor": list(spec.survivor),
        "duration_cap_s": spec.duration_cap_s,
        "t0_s": t0,
        "hypothesis": [
            {"clause": h.clause, "metric": h.metric, "expected": f"{h.op} {h.value:g}"}
            for h in spec.hypothesis
        ],
        "rto": None if rto is None else {"budget_s": rto.budget_s, "planned": rto.terms.seconds()},
        "stop_conditions": [{"name": c.name, "kind": c.kind} for c in spec.stop_conditions],
        "injections": rows,
        "abort_owner": spec.abort_owner,
    }


# -- the run ---------------------------------------------------------------------------------------


def world_args(
    spec: DrillSpec, fleet: FleetSpec, *, seed: int | None = None, jitter: Jitter | None = None
) -> tuple[FleetSpec, int, float]:
    """The fleet (with the jitter's demand noise), the twin's seed and the hours of the world a
    run of ``spec`` gets: ``run_drill`` builds its world from them, an ensemble builds R."""
    run_seed = spec.seed if seed is None else seed
    twin_seed = run_seed
    if jitter is not None:
        twin_seed = int(np.random.SeedSequence([run_seed, jitter.seed]).generate_state(1)[0])
    return (
        _effective_fleet(spec, fleet, jitter),
        twin_seed,
        (spec.duration_cap_s or 0.0) / 3600.0 + 0.05,
    )


def run_drill(
    spec: DrillSpec,
    fleet: FleetSpec,
    slo: SloSpec,
    policy: PolicySpec,
    *,
    seed: int | None = None,
    jitter: Jitter | None = None,
    journal: JournalPort | None = None,
    world: World | None = None,
    make_world: WorldFactory | None = None,
    progress: ProgressFn | None = None,
    spec_sha256: str | None = None,
) -> DrillResult:
    """Run ``spec`` on ``world``, or on a fresh one from ``make_world`` (the embedded twin, as the
    caller chooses it) seeded from the run's seed and jitter; see the module doc."""
    if spec.rung == "L0":
        raise FiredrillError("an L0 drill is a tabletop: print its plan, inject nothing")
    cap = spec.duration_cap_s
    if cap is None:
        raise FiredrillError("a drill needs a duration cap")
    run_seed = spec.seed if seed is None else seed
    fleet_eff, twin_seed, hours = world_args(spec, fleet, seed=seed, jitter=jitter)
    if world is None:
        if make_world is None:
            raise FiredrillError("a drill needs a world to run on (or a factory for one)")
        world = make_world(fleet_eff, twin_seed, hours)
    model = spec.target.model
    regions = [r.name for r in fleet_eff.regions]
    observer = Observer(world, model, regions)
    run = _Run(spec, fleet_eff, slo, world, journal, run_seed, model, regions, observer)
    try:
        report = _drive(run, policy, jitter, progress, spec_sha256 or _spec_digest(spec))
    except SteadyStateError:
        if journal is not None:
            journal.finish("aborted")
        raise
    except BaseException:
        run.revert_all("the drill stopped on an error")  # never leave an injection behind
        raise
    if journal is not None:
        journal.finish(report["verdict"])
    return DrillResult(report, world)


def _approvers(spec: DrillSpec) -> tuple[tuple[Approver, ...], tuple[Approver, ...]]:
    failover = (
        Approver(spec.responder("incident_commander"), "incident_commander"),
        Approver(spec.responder("ops_lead"), "ops_lead"),
    )
    drain = (Approver(spec.responder("capacity_lead"), "capacity_lead"),)
    return failover, drain


def _drive(
    run: _Run,
    policy: PolicySpec,
    jitter: Jitter | None,
    progress: ProgressFn | None,
    digest: str,
) -> dict[str, Any]:
    spec, world, obs = run.spec, run.world, run.observer
    cap = spec.duration_cap_s or 0.0
    step = spec.evaluation_step_s
    burn = BurnRateEvaluator(run.slo, world)
    causes = CauseEvaluator(run.slo, world)
    notifier = Notifier(run.slo.routing)
    controller = RemediationController(policy, world)
    book = IncidentBook(severity_for(run.fleet_spec.gpu_hour_usd, spec.severity), paid_products=())
    failover_approvers, drain_approvers = _approvers(spec)
    failover: Failover | None = None
    if spec.survivor and spec.target.region is not None:
        failover = Failover(
            world, run.model, spec.target.region, spec.decide_latency_s, failover_approvers,
            run.pull, steps=tuple(spec.shift.steps), step_hold_s=spec.shift.step_hold_s,
        )  # fmt: skip
    ttft_s, allowed = _objective_numbers(run.slo, run.model)
    tracker = SloTracker(
        obs, run.regions, ttft_s, allowed, window_s=SLO_WINDOW_S,
        hold_s=spec.rto.slo_hold_s if spec.rto is not None else 120.0,
    )  # fmt: skip
    firing: set[Labels] = set()
    stops = StopConditions(spec.stop_conditions, obs, world, world.now_s, lambda: sorted(firing))
    schedule = _schedule(spec, jitter)
    t0 = _t0(schedule)
    first_at = schedule[0].at_s if schedule else cap
    pending = list(schedule)
    expiries: list[tuple[float, _Active]] = []
    extra_ops: list[tuple[float, ops.Operation, str]] = []
    if spec.competing_pullers or spec.freeze_competitors:
        extra_ops = [(float(at), op, "competing pullers") for at, op in recovery.puller_ops(spec)]
        extra_ops.sort(key=lambda x: x[0])
    hydrate_regions = list(spec.survivor) or _storm_regions(spec, run.fleet_spec)
    hydrate_watch = (
        HydrateWatch(obs, hydrate_regions, after_s=t0 or 0.0) if hydrate_regions else None
    )
    steady_checked = False
    stopped: StopState | None = None
    failback: recovery.Failback | None = None
    failback_started = False
    paged: set[str] = set()

    def drain_burn_rates(cells: Sequence[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        for o in run.slo.objectives:
            if o.model != run.model or o.sli != "ttft" or not burn.started:
                continue
            ratios = burn.error_ratio(o, 300.0)
            for (cell, _region), r in zip(burn.cells, ratios, strict=False):
                if cell in cells and not math.isnan(float(r)):
                    out[cell] = max(out.get(cell, 0.0), float(r) / o.budget)
        return out

    def start_injection(s: _Scheduled) -> None:
        label = f"#{s.index} {inject.describe(s.injection)}"
        if isinstance(s.injection, CellDrain):
            _start_drain(run, s.injection, drain_approvers, drain_burn_rates)
            run.injected.append({"index": s.index, "label": label, "at_s": run.now()})
            run.event("injection", label)
            run.mark("injection", label)
            return
        try:
            expanded = inject.expand(
                s.injection, s.index, drill=spec.name, fleet=world, spec=run.fleet_spec,
                model=run.model, used_nodes=run.used_nodes,
            )  # fmt: skip
        except FiredrillError as exc:
            run.refused.append(f"{label}: {exc}")
            run.event("refused", f"{label}: {exc}")
            return
        applied = [a for a in (run.apply(op, label, s.index) for op in expanded) if a]
        run.injected.append(
            {"index": s.index, "label": label, "at_s": run.now(), "operations": len(applied)}
        )
        run.event("injection", label, operations=len(applied))
        run.mark("injection", label)
        d = s.injection.duration_s
        if d is not None:
            expiries.extend((run.now() + d, a) for a in applied)
            expiries.sort(key=lambda x: x[0])

    def due_times() -> list[float]:
        out = [s.at_s for s in pending]
        out += [t for t, a in expiries if a.reverted_at_s is None]
        out += [t for t, _, _ in extra_ops]
        if failover is not None and (due := failover.next_due_s()) is not None:
            out.append(due)
        out += [d for dr in run.drains if (d := dr.next_due_s()) is not None]
        return out

    def act_due() -> None:
        nonlocal steady_checked, failback, failback_started
        now = run.now()
        while pending and pending[0].at_s <= now + 1e-6:
            if not steady_checked:
                _steady_state(run, stops, notifier, tracker, now)
                steady_checked = True
                run.event("steady_state", "hypothesis holds before T0: injecting")
            start_injection(pending.pop(0))
        while extra_ops and extra_ops[0][0] <= now + 1e-6:
            _, op, label = extra_ops.pop(0)
            run.apply(op, label, None)
        for t, a in list(expiries):
            if t <= now + 1e-6 and a.reverted_at_s is None:
                run.revert(a, "injection duration over")
                expiries.remove((t, a))
                if spec.failback.enabled and not failback_started and "region_blackhole" in a.label:
                    failback = _start_failback(run)
                    failback_started = True
        if failover is not None:
            failover.tick(now)
        for dr in run.drains:
            was = dr.refusal
            dr.tick(now)
            if dr.refusal is not None and dr.refusal != was:
                run.refused.append(f"cell_drain {dr.cell} step refused: {dr.refusal}")
        if (
            spec.failback.enabled
            and not failback_started
            and spec.failback.start_s is not None
            and now + 1e-6 >= spec.failback.start_s
        ):
            failback = _start_failback(run)
            failback_started = True
        if failback is not None and not failback.done:
            failback.tick(now)

    # t = 0: the first readings, what Prometheus sees before anything happens
    burn.evaluate()
    causes.evaluate()
    obs.sample(run.now())
    while run.now() < cap - 1e-6 and stopped is None:
        start = run.now()
        end = min(start + step, cap)
        if run.alert_history_s is None and first_at <= end + 1e-6:
            # the windows see the steady state as far back as the longest one, as they would on
            # a Prometheus that has been scraping the fleet for days
            run.alert_history_s = burn.backfill()
        act_due()
        # sub-steps: events due inside this evaluation step happen at their own time
        while True:
            nxt = [t for t in due_times() if start + 1e-6 < t < end - 1e-6 and t > run.now() + 1e-6]
            if not nxt:
                break
            world.advance(min(nxt) - run.now())
            act_due()
        world.advance(end - run.now())
        now = run.now()
        for ev in burn.evaluate() + causes.evaluate():
            run.alerts.append(ev)
            if ev.state == "firing":
                notifier.fire(ev.at_s, ev.labels)
                firing.add(ev.labels)
            else:
                notifier.resolve(ev.at_s, ev.labels)
                firing.discard(ev.labels)
        controller.observe(now, world)
        for page in controller.state.pages:
            if page.cell in paged:
                continue
            paged.add(page.cell)
            labels = labels_of(
                alertname=page.alertname, severity="page", team="gpu-fleet", cell=page.cell,
                region=page.region, budget=page.budget,
            )  # fmt: skip
            run.alerts.append(AlertEvent(page.at_s, page.alertname, "firing", labels, 0.0))
            notifier.fire(page.at_s, labels)
            firing.add(labels)
        for n in notifier.tick(now):
            _notified(run, book, n, failover)
        obs.sample(now)
        if hydrate_watch is not None:
            hydrate_watch.update(now)
        if t0 is not None and now >= t0 - 1e-6 and steady_checked:
            floor = _floor(run, failover, t0)
            tracker.update(now, floor, [None, *run.regions])
        _chart_point(run, now)
        if steady_checked:
            stopped = stops.check(now)
            if stopped is not None:
                what = f"stop condition '{stopped.name}' fired ({_round(stopped.value)})"
                run.event("stop", what)
                run.mark("stop", stopped.name)
                run.revert_all(f"aborted: {what}")
        if progress is not None:
            progress(now)
    if not steady_checked and pending:
        raise SteadyStateError(["the duration cap ended before the first injection"], run.now())
    run.revert_all("duration cap reached" if stopped is None else "aborted")
    world.settle()
    return _report(
        run, digest=digest, t0=t0 or 0.0, first_at=first_at, stopped=stops, fired=stopped,
        failover=failover, tracker=tracker, hydrate_watch=hydrate_watch, controller=controller,
        book=book, failback=failback, hydrate_regions=hydrate_regions,
    )  # fmt: skip


def _storm_regions(spec: DrillSpec, fleet: FleetSpec) -> list[str]:
    """The region a hydrate storm re-hydrates in (what the hydrate measures watch)."""
    out: list[str] = []
    for inj in spec.injections:
        if isinstance(inj, HydrateStorm):
            region = next(
                (r.name for r in fleet.regions for c in r.cells if c.name == inj.cell), None
            )
            if region is not None and region not in out:
                out.append(region)
    return out


def _floor(run: _Run, failover: Failover | None, t0: float) -> float | None:
    """The earliest users can count as served again: after the last shift step of a failover."""
    if failover is None:
        return t0
    return failover.last_shift_s if failover.shifted else None


def _notified(run: _Run, book: IncidentBook, n: Notification, failover: Failover | None) -> None:
    if n.receiver == "page" and n.alerts:
        run.event("page", f"{n.alertname} {n.cell}".strip(), receiver=n.receiver)
    update = book.ingest(n)
    for inc_id in update.opened:
        inc = book.get(inc_id)
        run.event("incident", f"{inc.id} opened: {inc.title} ({inc.sev.name})")
    if failover is not None:
        failover.notify(n)


def _start_drain(
    run: _Run,
    inj: CellDrain,
    approvers: tuple[Approver, ...],
    burn_rates: Callable[[Sequence[str]], dict[str, float]],
) -> None:
    model = inj.model or run.model
    views = list(run.world.cells())
    here = next((v for v in views if v.name == inj.cell), None)
    weight = dict(here.route_weights).get(model, 0) if here is not None else 0
    drain_plan = plan_cell_drain(
        inj.cell, cells=views, signals=run.world, capacity=run.world, models=(model,)
    )
    dr = SteppedDrain(
        fleet=run.world, cell=inj.cell, model=model, weight=int(weight), plan=drain_plan,
        hold_s=DRAIN_HOLD_S, approvers=approvers, pull=run.pull, burn_rates=burn_rates,
        started_s=run.now(),
    )  # fmt: skip
    if dr.refusal is not None:
        run.refused.append(f"cell_drain {inj.cell} refused: {dr.refusal}")
        run.event("lever", f"cell_drain {inj.cell} refused: {dr.refusal}", status="refused")
    run.drains.append(dr)


def _steady_state(
    run: _Run, stops: StopConditions, notifier: Notifier, tracker: SloTracker, now: float
) -> None:
    """Refuse to start when the hypothesis does not already hold (nothing is injected)."""
    reasons: list[str] = []
    for name, value in stops.already_true():
        reasons.append(f"stop condition '{name}' is already true ({_round(value)})")
    for labels in notifier.firing:
        d = dict(labels)
        if d.get("severity") == "page" and d.get("model_name", run.model) == run.model:
            reasons.append(f"{d.get('alertname')} is paging in {d.get('cell', '?')}")
    obs = run.observer
    window = max(now, 1.0)
    for h in run.spec.hypothesis:
        regions = [h.region] if h.region else list(run.regions)
        if h.metric == "ttft_p99_s":
            vals = [obs.ttft_p99(r, window) for r in regions]
            seen = max((v for v in vals if not math.isnan(v)), default=math.nan)
        elif h.metric == "kv_usage_max":
            seen = max(
                (float(s.kv_max[obs.region_index(r)]) for s in obs.samples for r in regions),
                default=math.nan,
            )
        elif h.metric in ("error_ratio", "paid_5xx_ratio"):
            seen = obs.error_ratio(h.region, window)
        else:
            continue
        if not math.isnan(seen) and not compare(seen, h.op, h.value):
            reasons.append(
                f"'{h.clause}' does not hold before T0: {h.metric} {seen:.4g} (expected "
                f"{h.op} {h.value:g})"
            )
    if reasons:
        run.event("steady_state", "refused: " + "; ".join(reasons))
        raise SteadyStateError(reasons, now)


def _start_failback(run: _Run) -> recovery.Failback | None:
    """The controlled failback (``drill.recovery.Failback``), when the drill asks for one."""
    spec = run.spec
    run.event("failback", "controlled failback starts")
    run.mark("failback", "failback starts")
    if spec.target.region is None:
        run.refused.append("failback: the drill names no target region to fail back to")
        return None

    def apply(op: ops.Operation) -> ops.Operation:
        act = run.apply(op, "failback", None)
        if act is None:
            raise FiredrillError(f"failback: {type(op).__name__} was refused")
        return act.inverses[0]

    return recovery.Failback(
        spec.failback,
        fleet=run.world,
        signals=run.world,
        model=run.model,
        primary=spec.target.region,
        survivor=list(spec.survivor),
        slo=run.slo,
        apply=apply,
    )


def _chart_point(run: _Run, now: float) -> None:
    obs = run.observer
    ch = run.charts
    last = obs.latest()
    if last is None:
        return
    k = len(obs.samples) - 1
    for r in run.regions:
        i = obs.region_index(r)
        ch.setdefault("ttft_p99", {}).setdefault(r, []).append(
            [now, _round(obs.ttft_p99(r, SLO_WINDOW_S))]
        )
        ch.setdefault("kv_usage", {}).setdefault(r, []).append([now, _round(float(last.kv_max[i]))])
        ch.setdefault("hydrate_gbps", {}).setdefault(r, []).append(
            [now, _round(obs.gbps_per_node(r, k))]
        )
        ch.setdefault("ready_replicas", {}).setdefault(r, []).append([now, float(last.ready[i])])


# -- after the run ---------------------------------------------------------------------------------


def _digest_facts(world: World, spec: DrillSpec) -> dict[str, Any]:
    """The admission facts a drill judges, read through the ``Digests`` and ``Capacity`` ports:
    replicas admitted unsigned, whether the survivors' live replicas all run signed, attested
    digests their registry holds (None without a survivor), and refused node requests."""
    regions = {c.region for c in world.cells()}
    survivors = [s for s in dict.fromkeys(spec.survivor) if s in regions]
    attested = all(
        d.signed and d.attested and d.held for s in survivors for d in world.serving_digests(s)
    )
    return {
        "unsigned_admitted": world.unsigned_replicas_admitted(),
        "survivor_digest_attested": attested if survivors else None,
        "capacity_errors": world.capacity_errors(),
    }


def _chains(run: _Run, controller: RemediationController) -> list[dict[str, Any]]:
    """For GPU-fault injections: how far each detection-to-ready chain got."""
    gpu_ops = (ops.InjectDcgmField, ops.InjectLinkFlap, ops.InjectThermal)
    applied = [(t, op) for t, op in run.applied_ops if isinstance(op, gpu_ops)]
    if not applied:
        return []
    from firedrill.scenario.chains import ChainSources, trace_chains

    sources = ChainSources(
        world=run.world, applied=applied, alerts=list(run.alerts), controller=controller,
        end_s=run.world.now_s(), background=False,
    )  # fmt: skip
    return [c.to_json() for c in trace_chains(sources) if c.origin == "injection"]


def _report(
    run: _Run,
    *,
    digest: str,
    t0: float,
    first_at: float,
    stopped: StopConditions,
    fired: StopState | None,
    failover: Failover | None,
    tracker: SloTracker,
    hydrate_watch: HydrateWatch | None,
    controller: RemediationController,
    book: IncidentBook,
    failback: recovery.Failback | None,
    hydrate_regions: Sequence[str],
) -> dict[str, Any]:
    spec, obs, world = run.spec, run.observer, run.world
    end = run.now()
    page_s = failover.first_page_s if failover is not None else _first_page(run, t0)
    marks = RtoMarks(
        t0_s=t0,
        page_s=page_s,
        first_lever_s=failover.first_lever_s if failover is not None else None,
        last_shift_s=failover.last_shift_s if failover is not None else None,
        scale_out_s=hydrate_watch.scale_out_s if hydrate_watch is not None else None,
        hydrated_s=hydrate_watch.hydrated_s if hydrate_watch is not None else None,
        users_s=tracker.achieved(None),
    )
    rto_terms = terms(marks)
    measured = measured_s(marks)
    budget = spec.rto.budget_s if spec.rto is not None else None
    planned = spec.rto.terms.seconds() if spec.rto is not None else {}
    posture = (
        budget is not None
        and rto_terms.get("hydrate_s") is not None
        and float(rto_terms["hydrate_s"] or 0.0) > budget
    )
    facts = _digest_facts(world, spec)
    # hydrate measurement, per watched region
    hydrate: dict[str, dict[str, Any]] = {}
    for r in hydrate_regions:
        stats: dict[str, Any] = dict(
            recovery.hydrate_stats(world, region=r, model=run.model, start_s=t0, end_s=end)
        )
        tts = tracker.achieved(r)
        stats["time_to_slo_s"] = None if tts is None else _round(tts - t0)
        hydrate[r] = {k: _clean(v) for k, v in stats.items()}
    hydrate_s: dict[str, float | None] = {}
    if hydrate_watch is not None and hydrate_watch.scale_out_s is not None:
        done = hydrate_watch.hydrated_s
        for r in hydrate_regions:
            hydrate_s[r] = None if done is None else _round(done - hydrate_watch.scale_out_s)

    def time_to_slo(region: str | None) -> float | None:
        at = tracker.achieved(region)
        return None if at is None else at - t0

    def evaluate_expr(text: str) -> float:
        return expr.scalar_of(expr.evaluate(text, world, world.now_s))

    # hidden cross-region dependencies (a clause can count them, a finding names each)
    dependencies: list[dict[str, Any]] = []
    cut = [i.region for i in spec.injections if isinstance(i, RegionBlackhole)]
    if cut:
        dependencies = [
            {k: _clean(v) for k, v in dict(d).items()}
            for d in recovery.dependency_findings(
                run.fleet_spec, world, cut=cut, start_s=t0, end_s=end
            )
        ]
    actions = [a for a in controller.state.actions if a.at_s >= t0 - 1e-6 and not a.dry_run]
    m = Measurements(
        observer=obs,
        t0_s=t0,
        end_s=end,
        rto_s=measured,
        time_to_slo=time_to_slo,
        hydrate=hydrate,
        hydrate_s=hydrate_s,
        unsigned_admitted=facts["unsigned_admitted"],
        nodes_drained=sum(1 for a in actions if a.action == "drain"),
        replicas_ejected=sum(1 for a in actions if a.action == "eject"),
        survivor_digest_attested=facts["survivor_digest_attested"],
        crossing_services=[str(d["service"]) for d in dependencies] if cut else None,
        evaluate_expr=evaluate_expr,
    )
    clauses = [judge(h, m) for h in spec.hypothesis]
    chains = _chains(run, controller)
    # what drill.recovery adds: dependencies, the security floor, failback steps
    security = [
        {k: _clean(v) for k, v in dict(c).items()}
        for c in recovery.security_floor(world, spec, list(run.applied_ops), start_s=0.0, end_s=end)
    ]
    admission = _admission(world)
    failback_json: dict[str, Any] = {"steps": []}
    if failback is not None:
        failback_json = dict(failback.result())
    verdict, reason = _verdict(spec, clauses, fired, measured, budget, run.refused)
    findings = Findings(spec)
    findings.collect(
        clauses=clauses, rto_terms=rto_terms, planned=planned, measured=measured, budget=budget,
        posture=posture, fired=fired, refused=run.refused, chains=chains,
        dependencies=dependencies, security=security, unsigned=facts["unsigned_admitted"],
        capacity_errors=facts["capacity_errors"], survivors=list(spec.survivor),
        failover_refusals=failover.refusals if failover is not None else [],
    )  # fmt: skip
    ch = run.charts
    ch["markers"] = sorted(run.markers, key=lambda x: (x["at_s"], x["kind"], x["label"]))
    ttft_s, _ = _objective_numbers(run.slo, run.model)
    ch["slo_ttft_s"] = ttft_s
    kv_limits = [h.value for h in spec.hypothesis if h.metric == "kv_usage_max"]
    if kv_limits:
        ch["kv_limit"] = min(kv_limits)
    ch["survivor"] = list(spec.survivor)
    ch["stop_thresholds"] = [
        {"name": s.name, "value": s.to_json()["threshold"], "chart": _stop_chart(s)}
        for s in stopped.states
        if s.to_json()["threshold"] is not None and _stop_chart(s) is not None
    ]
    users = tracker.achieved(None)
    if users is not None:
        run.timeline.append(
            {"at_s": _round(users), "kind": "slo", "text": "users served within SLO (held)"}
        )
    report: dict[str, Any] = {
        "drill": spec.name,
        "rung": spec.rung,
        "seed": run.seed,
        "spec_sha256": digest,
        "verdict": verdict,
        "reason": reason,
        "run_by": spec.run_by,
        "runbook_author": spec.runbook_author,
        "abort_owner": spec.abort_owner,
        "target": spec.target.model_dump(),
        "survivor": list(spec.survivor),
        "t0_s": _round(t0),
        "steady_state_s": _round(first_at),
        "alert_history_s": _round(run.alert_history_s),
        "end_s": _round(end),
        "hypothesis": clauses,
        "rto": {
            "budget_s": budget,
            "measured_s": _round(measured),
            "within_budget": None
            if budget is None
            else (measured is not None and measured <= budget),
            "terms": {k: _round(v) for k, v in rto_terms.items()},
            "planned": planned,
            "posture_problem": posture,
            "marks": {
                "t0_s": _round(marks.t0_s),
                "page_s": _round(marks.page_s),
                "first_lever_s": _round(marks.first_lever_s),
                "last_shift_s": _round(marks.last_shift_s),
                "scale_out_s": _round(marks.scale_out_s),
                "hydrated_s": _round(marks.hydrated_s),
                "users_served_s": _round(marks.users_s),
            },
        },
        "stop_conditions": [_clean_map(s.to_json()) for s in stopped.states],
        "reverted": {
            "all": all(r["ok"] for r in run.reverted)
            and all(a.reverted_at_s is not None for a in run.active),
            "injections": run.reverted,
        },
        "injected": run.injected,
        "security_floor": security,
        "admission": {**admission, "unsigned_admitted": facts["unsigned_admitted"]},
        "hydrate": hydrate.get(hydrate_regions[0], {}) if hydrate_regions else {},
        "hydrate_by_region": hydrate,
        "failback": failback_json,
        "dependencies": dependencies,
        "findings": findings.items,
        "chains": chains,
        "levers": [_lever_json(e) for e in run.lever_entries],
        "incidents": [
            {
                "id": i.id,
                "cell": i.cell,
                "region": i.region,
                "opened_at_s": i.opened_at_s,
                "sev": i.sev.name,
                "title": i.title,
            }
            for i in book.incidents
        ],
        "refused": run.refused,
        "timeline": sorted(run.timeline, key=lambda e: e["at_s"] or 0.0),
        "charts": ch,
    }
    return report


def _first_page(run: _Run, t0: float) -> float | None:
    pages = [e["at_s"] for e in run.timeline if e["kind"] == "page" and e["at_s"] >= t0 - 1e-6]
    return min(pages) if pages else None


def _stop_chart(s: StopState) -> str | None:
    return {"ttft_p99": "ttft_p99", "kv_usage": "kv_usage"}.get(s.condition.kind)


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return _round(v, 6)
    if isinstance(v, np.floating | np.integer):
        return _round(float(v), 6)
    return v


def _clean_map(d: dict[str, object]) -> dict[str, object]:
    return {k: _clean(v) for k, v in d.items()}


def _admission(signals: Signals) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for decision in ("admit", "deny"):
        _, _, values = signals.instant(
            "firedrill_admission_decisions_total", {"decision": decision}
        )
        out["admitted" if decision == "admit" else "denied"] = int(np.nansum(values))
    return out


def _lever_json(e: LeverJournalEntry) -> dict[str, Any]:
    return {
        "kind": e.kind,
        "target": e.target,
        "scope": e.scope,
        "status": e.status,
        "reason": e.reason,
        "at_s": _round(e.at_s),
        "approvers": [f"{a.name} ({a.role})" for a in e.approvers],
        "ops": [_op_text(op) for op in e.ops],
        "inverses": [_op_text(op) for op in e.inverses],
    }


def _verdict(
    spec: DrillSpec,
    clauses: Sequence[dict[str, Any]],
    fired: StopState | None,
    measured: float | None,
    budget: float | None,
    refused: Sequence[str],
) -> tuple[str, str]:
    if fired is not None:
        return "aborted", f"stop condition '{fired.name}' fired at T+{fired.fired_at_s:.0f}s"
    failed = [c["clause"] for c in clauses if not c["passed"]]
    why: list[str] = []
    if refused:
        why.append(f"the drill did not run as written ({len(refused)} refused: {refused[0]})")
    if failed:
        why.append(f"{len(failed)} of {len(clauses)} clauses failed: " + "; ".join(failed))
    if budget is not None:
        if measured is None:
            why.append("users were never served within SLO again (RTO not met)")
        elif measured > budget:
            why.append(f"measured RTO {measured:.0f}s exceeds the {budget:.0f}s budget")
    if why:
        return "failed", "; ".join(why)
    held = f"{len(clauses)} clause(s) held"
    if measured is not None and budget is not None:
        held += f"; RTO {measured:.0f}s within the {budget:.0f}s budget"
    return "passed", held
