"""Run a scenario on the twin: timeline → detection → notifications → remediation → chains.

Everything runs on the twin's simulated clock in evaluation steps (the scrape interval): apply the
timeline entries that are due, advance the twin, evaluate the burn-rate and cause alerts, feed
them (and the controller's own budget pages) to the in-process Alertmanager, let the remediation
controller observe and act, then flush the notifications that are due.
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
from firedrill.ports import Fleet
from firedrill.remediate.controller import RemediationController
from firedrill.remediate.policy import PolicySpec
from firedrill.remediate.training import StallDetector, run_hang_runbook
from firedrill.respond.responder import EPOCH, EvaluatorProbe, Mode, Responder, ResponderPolicy
from firedrill.scenario.chains import Chain, trace_chains
from firedrill.scenario.command import symptom_kind
from firedrill.scenario.spec import ScenarioSpec, TimelineEntry
from firedrill.twin.engine import Twin

ProgressFn = Callable[[float], None]


@dataclass
class ScenarioRun:
    spec: ScenarioSpec
    twin: Twin
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


def expand(entry: TimelineEntry, twin: Twin) -> list[ops.Operation]:
    """The operations one timeline entry stands for (a cell expands over its nodes)."""
    if entry.cell is None:
        return [entry.operation()]
    nodes = [
        v.name
        for v in twin.node_views(cell=entry.cell)
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
    progress: ProgressFn | None = None,
    mode: Mode | None = None,
) -> ScenarioRun:
    twin = Twin(fleet, spec.seed, hours_hint=spec.duration_s / 3600.0)
    fleet_port: Fleet = twin
    burn = BurnRateEvaluator(slo, twin)
    causes = CauseEvaluator(slo, twin)
    quality = QualityEvaluator(slo.quality, twin)
    imbalance = PdImbalanceEvaluator(slo.prefill_decode, twin)
    security = SecurityEvaluator(slo, twin)
    notifier = Notifier(slo.routing)
    controller = RemediationController(policy, fleet_port)
    run = ScenarioRun(spec, twin, controller, notifier)
    run.responder = _responder(spec, fleet, twin, burn, notifier, mode)
    timeline = sorted(spec.timeline, key=lambda e: e.at_s)
    step = fleet.scrape_interval_s
    paged: set[str] = set()
    stall = StallDetector(twin, gpu_hour_usd=fleet.gpu_hour_usd) if fleet.training else None
    run.extra["training"] = {}
    i = 0
    burn.evaluate()
    causes.evaluate()
    quality.evaluate()
    imbalance.evaluate()
    security.evaluate()
    while twin.t < spec.duration_s - 1e-9:
        while i < len(timeline) and timeline[i].at_s <= twin.t + 1e-9:
            for op in expand(timeline[i], twin):
                twin.apply(op)
                run.applied.append((twin.t, timeline[i], op))
            i += 1
        twin.advance(min(step, spec.duration_s - twin.t))
        now = twin.t
        evs = burn.evaluate() + causes.evaluate() + quality.evaluate() + imbalance.evaluate()
        evs += security.evaluate()
        for ev in evs:
            run.alerts.append(ev)
            if ev.state == "firing":
                notifier.fire(ev.at_s, ev.labels)
            else:
                notifier.resolve(ev.at_s, ev.labels)
        controller.observe(now, twin)
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
                    records = twin.training.flight_recorder(sp.jobset)
                    rep = run_hang_runbook(
                        twin, twin.training, sp.jobset, records, gpu_hour_usd=fleet.gpu_hour_usd
                    )
                    entry.update(
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
    twin.flush_ttft()
    run.chains = trace_chains(run)
    return run


def _responder(
    spec: ScenarioSpec,
    fleet: FleetSpec,
    twin: Twin,
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
        twin,
        probe=EvaluatorProbe(burn, lambda: notifier.firing),
        classify=symptom_kind,
        signals=twin,
        capacity=twin,
        catalog=twin,
        epoch=EPOCH + timedelta(hours=fleet.start_hour_utc),
    )
