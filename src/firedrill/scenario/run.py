"""Run a scenario on a world: timeline → detection → notifications → remediation → chains.

The world (the embedded twin, typically) is chosen by the caller and handed in as a factory;
everything here reads and acts through the ports. Everything runs on the world's clock in
evaluation steps (the scrape interval): apply the timeline entries that are due, advance the
world, evaluate the burn-rate and cause alerts, feed them (and the controller's own budget pages)
to the in-process Alertmanager, let the remediation controller observe and act, then flush the
notifications that are due.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from firedrill.detect.causes import CauseEvaluator
from firedrill.detect.evaluator import AlertEvent, BurnRateEvaluator
from firedrill.detect.golden import QualityEvaluator
from firedrill.detect.imbalance import PdImbalanceEvaluator
from firedrill.detect.notify import Notification, Notifier
from firedrill.detect.security import SecurityEvaluator
from firedrill.detect.slo import SloSpec
from firedrill.model import operations as ops
from firedrill.model.series import labels_of
from firedrill.model.spec import FleetSpec
from firedrill.ports import ScenarioWorld, ScenarioWorldFactory
from firedrill.remediate.controller import RemediationController
from firedrill.remediate.policy import PolicySpec
from firedrill.remediate.training import StallDetector, StepRecord, run_hang_runbook
from firedrill.respond.incidents import IncidentBook
from firedrill.respond.responder import EPOCH, EvaluatorProbe, Mode, Responder, ResponderPolicy
from firedrill.respond.runbooks import RUNBOOKS
from firedrill.respond.severity import severity_for
from firedrill.scenario.chains import Chain, ChainSources, trace_chains
from firedrill.scenario.command import symptom_kind
from firedrill.scenario.spec import ScenarioSpec, TimelineEntry

ProgressFn = Callable[[float], None]


@dataclass
class ScenarioRun:
    spec: ScenarioSpec
    world: ScenarioWorld
    controller: RemediationController
    notifier: Notifier
    alerts: list[AlertEvent] = field(default_factory=list)
    applied: list[tuple[float, TimelineEntry, ops.Operation]] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    responder: Responder | None = None

    @property
    def notifications(self) -> list[Notification]:
        return self.notifier.notifications


def expand(entry: TimelineEntry, world: ScenarioWorld) -> list[ops.Operation]:
    """The operations one timeline entry stands for (a cell expands over its nodes)."""
    if entry.cell is None:
        return [entry.operation()]
    nodes = [
        v.name
        for v in world.node_views(cell=entry.cell)
        if entry.pool is None or v.pool == entry.pool
    ]
    count = max(1, round(len(nodes) * entry.share))
    return [entry.operation(node=n) for n in nodes[:count]]


def run_scenario(
    spec: ScenarioSpec,
    fleet: FleetSpec,
    slo: SloSpec,
    policy: PolicySpec,
    *,
    make_world: ScenarioWorldFactory,
    progress: ProgressFn | None = None,
    mode: Mode | None = None,
) -> ScenarioRun:
    """Run ``spec`` on a fresh world from ``make_world`` (seeded from the scenario)."""
    world = make_world(fleet, spec.seed, spec.duration_s / 3600.0)
    burn = BurnRateEvaluator(slo, world)
    causes = CauseEvaluator(slo, world)
    quality = QualityEvaluator(slo.quality, world)
    imbalance = PdImbalanceEvaluator(slo.prefill_decode, world)
    security = SecurityEvaluator(slo, world)
    notifier = Notifier(slo.routing)
    controller = RemediationController(policy, world)
    run = ScenarioRun(spec, world, controller, notifier)
    run.responder = _responder(spec, fleet, world, burn, notifier, mode)
    timeline = sorted(spec.timeline, key=lambda e: e.at_s)
    step = fleet.scrape_interval_s
    paged: set[str] = set()
    stall = StallDetector(world, gpu_hour_usd=fleet.gpu_hour_usd) if fleet.training else None
    run.extra["training"] = {}
    i = 0
    burn.evaluate()
    causes.evaluate()
    quality.evaluate()
    imbalance.evaluate()
    security.evaluate()
    backfill_at = _backfill_at(timeline, step)
    while world.now_s() < spec.duration_s - 1e-9:
        if "alert_history_s" not in run.extra and world.now_s() + 1e-9 >= backfill_at:
            # the windows see the steady state as far back as the longest one, as they would on
            # a Prometheus that has been scraping the fleet for days (as drills do)
            run.extra["alert_history_s"] = round(burn.backfill(), 3)
        while i < len(timeline) and timeline[i].at_s <= world.now_s() + 1e-9:
            for op in expand(timeline[i], world):
                world.apply(op)
                run.applied.append((world.now_s(), timeline[i], op))
            i += 1
        world.advance(min(step, spec.duration_s - world.now_s()))
        now = world.now_s()
        evs = burn.evaluate() + causes.evaluate() + quality.evaluate() + imbalance.evaluate()
        evs += security.evaluate()
        for ev in evs:
            run.alerts.append(ev)
            if ev.state == "firing":
                notifier.fire(ev.at_s, ev.labels)
            else:
                notifier.resolve(ev.at_s, ev.labels)
        controller.observe(now, world)
        for page in controller.state.pages:
            if page.cell in paged:
                continue
            paged.add(page.cell)
            labels = labels_of(
                alertname=page.alertname,
                severity="page",
                team="gpu-fleet",
                cell=page.cell,
                region=page.region,
                budget=page.budget,
            )
            run.alerts.append(AlertEvent(page.at_s, page.alertname, "firing", labels, 0.0))
            notifier.fire(page.at_s, labels)
        if stall is not None:
            for sp in stall.evaluate():
                labels = labels_of(
                    alertname=sp.alertname,
                    severity=sp.severity,
                    team="training",
                    cell=sp.cell,
                    region=sp.region,
                    jobset=sp.jobset,
                    gpus=str(sp.gpus),
                )
                run.alerts.append(
                    AlertEvent(sp.at_s, sp.alertname, "firing", labels, sp.usd_per_hour)
                )
                notifier.fire(sp.at_s, labels)
                entry: dict[str, Any] = {
                    "page": sp.summary,
                    "gpu_hours_burning": sp.gpu_hours_burned,
                }
                if spec.training_runbook:
                    records = world.flight_recorder(sp.jobset)
                    rep = run_hang_runbook(
                        world, world, sp.jobset, records, gpu_hour_usd=fleet.gpu_hour_usd
                    )
                    entry.update(
                        jobset=sp.jobset,
                        runbook_steps=[_runbook_step(step) for step in rep.steps],
                        rank=rep.rank,
                        node=rep.node,
                        excluded=list(rep.excluded),
                        suspended_at_s=rep.suspended_at_s,
                        resumed_at_s=rep.resumed_at_s,
                        resumed_from_step=rep.resumed_from_step,
                        steps_lost=rep.steps_lost,
                        gpu_hours_lost=rep.gpu_hours_lost,
                        usd_lost=rep.usd_lost,
                        resumed_on_excluded_node=bool(set(rep.excluded) & set(rep.placement)),
                    )
                run.extra["training"][sp.jobset] = entry
        notifier.tick(now)
        if run.responder is not None:
            run.responder.observe(now, notifier.notifications)
        if progress is not None:
            progress(now)
    world.settle()
    run.chains = trace_chains(
        ChainSources(
            world=world,
            applied=[(at, op) for at, _, op in run.applied],
            alerts=run.alerts,
            controller=controller,
            end_s=world.now_s(),
        )
    )
    return run


def _backfill_at(timeline: list[TimelineEntry], step_s: float) -> float:
    """When to backfill the alerts' history: at the last evaluation before the first entry.

    Entries at 0 s are the state the scenario starts from (capacity already denied, a flag
    already set): they land before the first step, so the steady state sampled after them is
    what the alerts have been seeing for days. The first entry after 0 s is the first event,
    and the history is backfilled from the evaluations before it; without one, as soon as there
    are two evaluations to take a rate from. An event within the first step leaves no steady
    state to continue, and the report says so (``alert_history_s`` 0).
    """
    first = next((e.at_s for e in timeline if e.at_s > 0), None)
    return step_s if first is None else first - step_s


def _runbook_step(step: StepRecord) -> dict[str, Any]:
    """One applied step of the hang runbook: when, which operation, on what."""
    target = getattr(step.op, "node", None) or getattr(step.op, "jobset", "")
    return {"at_s": step.at_s, "op": type(step.op).__name__, "target": target}


def _responder(
    spec: ScenarioSpec,
    fleet: FleetSpec,
    world: ScenarioWorld,
    burn: BurnRateEvaluator,
    notifier: Notifier,
    mode: Mode | None,
) -> Responder | None:
    """The scenario's responder, or one in ``mode`` with the default policy; None if neither."""
    if spec.responder is None and mode is None:
        return None
    policy = spec.responder if spec.responder is not None else ResponderPolicy()
    if mode is not None and mode != policy.mode:
        policy = policy.model_copy(update={"mode": mode})
    return Responder(
        policy,
        world,
        book=IncidentBook(severity_for(fleet.gpu_hour_usd, spec.severity)),
        probe=EvaluatorProbe(burn, lambda: notifier.firing),
        classify=symptom_kind,
        signals=world,
        capacity=world,
        catalog=world,
        epoch=EPOCH + timedelta(hours=fleet.start_hour_utc),
        runbooks=RUNBOOKS,
    )
