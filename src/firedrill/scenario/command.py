"""Incident command over a scenario run: incidents, suspects, levers, postmortem facts.

The notifications of a run open incidents (one per cell group; tripwires their own); for each,
the changes of the last six hours are ranked as suspects against the incident's symptom, the
first lever of the top suspect is proposed (advise mode: nothing is applied here), the
remediation the controller and the training runbook already did in the incident's cell is
journaled as applied automation, and the postmortem's timings are measured from the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from firedrill.model import operations as ops
from firedrill.model.series import Labels
from firedrill.respond.incidents import STALLED_JOB_ALERT, Incident, IncidentBook, impact_of
from firedrill.respond.severity import SevMatrix, assess, severity_for
from firedrill.respond.suspects import (
    Symptom,
    SymptomKind,
    cell_skew,
    rank,
    recommend,
    skew_evidence,
)
from firedrill.scenario.responder_report import responder_extras, responder_levers

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun

WINDOW_S = 6 * 3600.0
# The lever a top suspect's stream points to (the reference's rollback order).
STREAM_LEVER = {
    "demand": ("route_weight", "cell"),
    "bundle": ("bundle_revert", "fleet"),
    "weights": ("rollout_abort", "model"),
    "serving_image": ("rollout_abort", "model"),
    "node_layer": ("driver_rollback", "cell"),
    "network_policy": ("kill_switch", "tenant"),
}
AUTOMATION_LEVER = {
    "quarantine": "node_quarantine",
    "eject": "pod_quarantine",
}
# The operations each applied lever put on the world (their inverses are read from its journal).
AUTOMATION_OPS: dict[str, tuple[type[Any], ...]] = {
    "quarantine": (ops.Taint, ops.Label, ops.Drain),
    "eject": (ops.EjectReplica,),
}


def symptom_kind(alerts: list[Labels]) -> SymptomKind:
    names = [dict(a).get("alertname", "") for a in alerts]
    if any(dict(a).get("severity") == "security" for a in alerts):
        return "egress"
    # quality does not wait behind latency; a cause ticket naming the serving state explains a
    # TTFT burn better than the burn does (the prefill/decode split, the KV cache)
    if "ModelQualityBurn" in names:
        return "quality"
    if "PrefillDecodeImbalance" in names:
        return "pd_imbalance"
    if any(n in ("KVCacheHigh", "VllmPreemptions") for n in names):
        return "kv_oom"
    if any("TTFT" in n or "Goodput" in n or n == "PodTTFTHigh" for n in names):
        return "ttft"
    if any("Availability" in n for n in names):
        return "availability"
    if STALLED_JOB_ALERT in names:
        return "training_stall"
    return "xid"


def command(run: ScenarioRun) -> list[dict[str, Any]]:
    """Open incidents from the run's notifications and describe each as the JSON contract has it."""
    if run.responder is not None:  # the responder's book: declared incidents, mitigations
        return [_report(run, inc) for inc in run.responder.book.incidents]
    book = IncidentBook(severity_matrix(run))
    for n in sorted(run.notifications, key=lambda n: n.at_s):
        book.ingest(n)
    return [_report(run, inc) for inc in book.incidents]


def severity_matrix(run: ScenarioRun) -> SevMatrix:
    """The run's severity matrix: the scenario's thresholds at the fleet's GPU-hour price."""
    if run.responder is not None:
        return run.responder.book.matrix
    return severity_for(run.world.fleet_spec().gpu_hour_usd, run.spec.severity)


def _start_s(run: ScenarioRun, inc: Incident) -> float:
    """When the trouble began: the last timeline operation before the incident opened."""
    before = [at for at, _, _ in run.applied if at <= inc.opened_at_s]
    return max(before) if before else inc.opened_at_s


def _report(run: ScenarioRun, inc: Incident) -> dict[str, Any]:
    world = run.world
    kind = run.responder.symptom(inc).kind if run.responder else symptom_kind(inc.alerts)
    symptom = Symptom(kind, inc.opened_at_s, inc.cell, inc.region)
    changes = world.changes(since_s=max(0.0, inc.opened_at_s - WINDOW_S))
    suspects = rank(changes, symptom)[:5] if inc.kind != "security" else []
    advice = recommend(suspects, symptom) if suspects else ""
    levers: list[dict[str, Any]] = []
    causes = [s for s in suspects if s.before_onset]
    if run.responder is not None:
        levers += responder_levers(run.responder, inc)
    elif causes:
        lever, scope = STREAM_LEVER.get(causes[0].stream, ("route_weight", "cell"))
        levers.append(
            {
                "kind": lever,
                "scope": scope,
                "at_s": inc.opened_at_s,
                "status": "proposed",
                "reason": advice,
                "approvers": [],
            }
        )
    acted = [
        a
        for a in run.controller.state.actions
        if a.cell == inc.cell and a.at_s >= inc.opened_at_s - 300 and a.action in AUTOMATION_LEVER
    ]
    for a in acted:
        levers.append(
            {
                "kind": AUTOMATION_LEVER[a.action],
                "scope": "cell",
                "at_s": a.at_s,
                "status": "proposed" if a.dry_run else "applied",
                "reason": f"remediation controller: {a.reason} on {a.node}",
                "approvers": ["automation"],
                **({} if a.dry_run else _undo(run, a.at_s, _target(a), AUTOMATION_OPS[a.action])),
            }
        )
    blocked = [b for b in run.controller.state.blocked if b.cell == inc.cell]
    training = [
        t
        for js, t in run.extra.get("training", {}).items()
        if "suspended_at_s" in t and world.jobset(js).cell == inc.cell
    ]
    for t in training:
        levers += _hang_runbook_levers(run, t)
    applied = sorted(
        lv["at_s"]
        for lv in levers
        if lv["status"] == "applied" and (run.responder is None or lv.get("verified"))
    )
    mitigated = applied[0] if applied else None
    resolved = next((e.at_s for e in inc.timeline if e.kind == "resolved"), None)
    if resolved is None and not inc.firing:
        resolved = max((e.at_s for e in inc.timeline), default=None)
    start = _start_s(run, inc)
    assessment = assess(impact_of(inc.alerts), severity_matrix(run))
    items: list[dict[str, str]] = []
    if blocked:
        items.append(
            {
                "kind": "automation_guardrail",
                "text": f"review the {blocked[0].budget} budget that held remediation "
                f"in {inc.cell} ({len(blocked)} actions not taken): {_budget_config(run)}",
            }
        )
    for t in training:
        items.append(
            {
                "kind": "runbook_step",
                "text": f"{t['jobset']}: burn in {t['node']} (rank {t['rank']}, quarantined by "
                f"the hang runbook) before it rejoins; {t['steps_lost']:.0f} steps were lost "
                "since the last checkpoint: review the checkpoint interval",
            }
        )
    if kind == "ttft" and causes and causes[0].stream == "demand":
        items.append(
            {"kind": "game_day_scenario", "text": "drill the drain: headroom incl. cold cache"}
        )
    if not items:
        items.append(
            {"kind": "runbook_step", "text": f"record the first lever for {kind} in {inc.cell}"}
        )
    return {
        "id": inc.id,
        "kind": inc.kind,
        "cell": inc.cell,
        "region": inc.region,
        "title": inc.title,
        "sev": str(inc.sev),
        "axes": {
            axis: {"level": str(r.level), "value": r.value, "reason": r.reason}
            for axis, r in assessment.axes.items()
        },
        "deciding_axis": assessment.deciding_axis,
        "sev_history": [_history(h) for h in inc.severity.history],
        "alerts": len(inc.alerts),
        # what changed, with skew: node-layer versions across the incident's GPU nodes
        "version_skew": (skew := _skew(run, inc)),
        "skew_evidence": skew_evidence(skew),
        "timeline": [
            {"at_s": e.at_s, "kind": e.kind, "text": e.text, "data": dict(e.data)}
            for e in inc.timeline
        ],
        "suspects": [
            {
                "stream": s.stream,
                "change": f"{s.change.subject}: {s.change.before} -> {s.change.after}",
                "cell": s.change.cell,
                "at_s": s.at_s,
                "score": round(s.score, 4),
                "evidence": s.evidence,
            }
            for s in suspects
        ],
        "recommendation": advice,
        "levers": levers,
        "opened_at_s": inc.opened_at_s,
        "mitigated_at_s": mitigated,
        "resolved_at_s": resolved,
        "postmortem": {
            "ttd_s": inc.opened_at_s - start,
            "ttm_s": None if mitigated is None else mitigated - start,
            "ttr_s": None if resolved is None else resolved - start,
            "gpu_hours_lost": sum(float(t.get("gpu_hours_lost", 0.0)) for t in training),
            "requests_failed": _requests_failed(run, inc, start),
            "action_items": items,
        },
        **(responder_extras(run.responder, inc) if run.responder is not None else {}),
    }


def _budget_config(run: ScenarioRun) -> str:
    """The policy lines that keep automation from becoming the outage."""
    b = run.controller.policy.budgets
    return (
        f"budgets.min_healthy {b.min_healthy:g} (NodeHealthCheck minHealthy {b.min_healthy:.0%}) "
        f"and budgets.max_quarantines_per_cell_hour {b.max_quarantines_per_cell_hour} "
        "(QuarantineRateAnomalous pages) stop a bad exporter from cordoning the cell"
    )


def _target(a: Any) -> str:
    """The node a quarantine acted on, or the pod an eject took out (its detail starts with it)."""
    return str(a.detail).split(":", 1)[0] if a.action == "eject" else str(a.node)


def _hang_runbook_levers(run: ScenarioRun, t: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hang runbook's levers in the order it pulled them: the JobSet suspended, then each
    hung node quarantined (taint and label), each at the time it was applied."""
    verified = t.get("resumed_at_s") is not None  # training progresses again
    out: list[dict[str, Any]] = []
    for step in t.get("runbook_steps", ()):
        if step["op"] == "SuspendJobSet":
            out.append(
                {
                    "kind": "jobset_suspend",
                    "scope": "cell",
                    "at_s": step["at_s"],
                    "status": "applied",
                    "reason": f"hang runbook: rank {t['rank']} on {t['node']} excluded",
                    "approvers": ["automation"],
                    "verified": verified,
                    **_undo(run, step["at_s"], None, (ops.SuspendJobSet,)),
                }
            )
        elif step["op"] == "Taint":
            node = step["target"]
            out.append(
                {
                    "kind": "node_quarantine",
                    "scope": "cell",
                    "at_s": step["at_s"],
                    "status": "applied",
                    "reason": f"hang runbook: {node} holds hung rank(s), kept out of the gang",
                    "approvers": ["automation"],
                    "verified": verified,
                    **_undo(run, step["at_s"], node, (ops.Taint, ops.Label)),
                }
            )
    for n, lever in enumerate(out, 1):
        lever["order"] = n  # the runbook's own order (levers at the same second included)
    return out


def _undo(
    run: ScenarioRun, at_s: float, target: str | None, kinds: tuple[type[Any], ...]
) -> dict[str, Any]:
    """The operations an applied lever put on the world at ``at_s`` (on ``target``; any when None)
    and their inverses, recorded by the world before each was applied, in undo order."""
    done = [
        e
        for e in run.world.operations()
        if e.at_s == at_s
        and isinstance(e.op, kinds)
        and (target is None or target in (getattr(e.op, f, None) for f in ("node", "pod")))
    ]
    return {
        "operations": [_operation(e.op) for e in done],
        "inverse": [_operation(e.inverse) for e in reversed(done)],
    }


def _operation(op: ops.Operation) -> dict[str, Any]:
    return {"op": type(op).__name__, "args": asdict(op)}


def _skew(run: ScenarioRun, inc: Incident) -> dict[str, dict[str, int]]:
    """Nodes per driver, node image and DCGM exporter version in the incident's cell (its
    region's cells for a region-wide incident)."""
    region_wide = inc.cell.startswith("region:")
    cells = [
        c.name
        for c in run.world.cells()
        if c.name == inc.cell or (region_wide and c.region == inc.region)
    ]
    return cell_skew(n for c in cells for n in run.world.node_views(cell=c))


def _history(h: Any) -> dict[str, Any]:
    return {
        "at_s": h.at_s,
        "sev": str(h.sev),
        "axis": h.axis,
        "reason": h.reason,
        "applied": h.applied,
    }


def _requests_failed(run: ScenarioRun, inc: Incident, start: float) -> int:
    """5xx in the incident's cell from the start of trouble to the end of the run."""
    total = 0.0
    for s in run.world.query(
        "http_requests_total",
        {"cell": inc.cell, "status": "5xx"},
        start_s=start,
        end_s=run.world.now_s(),
    ):
        if s.values.size:
            total += float(s.values[-1] - s.values[0])
    return int(total)
