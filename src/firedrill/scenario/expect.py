"""Checking a scenario's expectations against what the run did."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from firedrill.scenario.command import command
from firedrill.scenario.incident_check import IncidentCheck, evaluate_incident
from firedrill.scenario.security_check import SecurityCheck, evaluate_security
from firedrill.scenario.series_check import SeriesCheck, evaluate_series
from firedrill.scenario.spec import (
    ActionCheck,
    AlertCheck,
    BlockedCheck,
    ChainCheck,
    ChangeCheck,
    Check,
    NotificationCheck,
    QuarantineCounterCheck,
    TrainingCheck,
)

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun


@dataclass(frozen=True)
class CheckResult:
    check: str
    passed: bool
    expected: str
    observed: str


def _range(n: int, lo: int, hi: int | None) -> bool:
    return n >= lo and (hi is None or n <= hi)


def _bounds(lo: int, hi: int | None) -> str:
    return f">= {lo}" if hi is None else f"{lo}..{hi}"


def evaluate(run: ScenarioRun, checks: list[Check]) -> list[CheckResult]:
    out: list[CheckResult] = []
    incidents: list[dict[str, Any]] | None = None  # incident command, built once if asked
    t0 = min((e.at_s for e in run.spec.timeline), default=0.0)
    for c in checks:
        match c:
            case NotificationCheck():
                n = sum(
                    1
                    for x in run.notifications
                    if x.receiver == c.receiver
                    and (c.alertname is None or x.alertname == c.alertname)
                )
                what = f"{c.receiver} notifications" + (f" of {c.alertname}" if c.alertname else "")
                out.append(
                    CheckResult(what, _range(n, c.min, c.max), _bounds(c.min, c.max), str(n))
                )
            case AlertCheck():
                ts = [
                    a.at_s for a in run.alerts if a.alertname == c.alertname and a.state == "firing"
                ]
                if c.fired:
                    ok = bool(ts) and (c.within_s is None or min(ts) - t0 <= c.within_s)
                    seen = f"first at {min(ts) - t0:.0f} s" if ts else "never fired"
                    exp = "fires" + (f" within {c.within_s:g} s" if c.within_s else "")
                else:
                    ok, seen, exp = not ts, f"{len(ts)} firings", "never fires"
                out.append(CheckResult(f"alert {c.alertname}", ok, exp, seen))
            case ActionCheck():
                n = sum(
                    1
                    for a in run.controller.state.actions
                    if a.action == c.action and (c.reason is None or a.reason == c.reason)
                )
                out.append(
                    CheckResult(
                        f"action {c.action}", _range(n, c.min, c.max), _bounds(c.min, c.max), str(n)
                    )
                )
            case BlockedCheck():
                n = sum(
                    1
                    for b in run.controller.state.blocked
                    if c.budget is None or b.budget == c.budget
                )
                what = "blocked" + (f" by {c.budget}" if c.budget else "")
                out.append(
                    CheckResult(what, _range(n, c.min, c.max), _bounds(c.min, c.max), str(n))
                )
            case ChainCheck():
                chains = run.chains
                if c.broken_at is not None:
                    ok = any(ch.broken_at == c.broken_at for ch in chains)
                    exp = f"a chain broken at {c.broken_at}"
                elif c.reached is not None:
                    ok = any(
                        s.name == c.reached and s.status == "ok" for ch in chains for s in ch.stages
                    )
                    exp = f"a chain reaching {c.reached}"
                else:
                    ok = bool(chains) and all(ch.broken_at is None for ch in chains)
                    exp = "every chain complete"
                seen = ", ".join(
                    f"{ch.kind}@{ch.node}: {ch.broken_at or 'complete'}" for ch in chains
                )
                out.append(CheckResult("chain", ok, exp, seen or "no chains"))
            case ChangeCheck():
                ch = run.world.changes(since_s=0.0, cell=c.cell)
                n = sum(1 for x in ch if x.stream == c.stream)
                out.append(
                    CheckResult(f"{c.stream} change in {c.cell}", n > 0, "visible", f"{n} events")
                )
            case QuarantineCounterCheck():
                world = run.world
                n = sum(
                    v
                    for node, v in world.quarantine_actions().items()
                    if world.node(node).cell == c.cell
                )
                out.append(
                    CheckResult(
                        f"gpu_quarantine_actions_total in {c.cell}",
                        n == c.value,
                        str(c.value),
                        str(n),
                    )
                )
            case TrainingCheck():
                rep = run.extra.get("training", {}).get(c.jobset)
                ok = rep is not None and all(
                    (not want) or bool(rep.get(key))
                    for want, key in (
                        (c.rank_named, "rank"),
                        (c.suspended, "suspended_at_s"),
                        (c.resumed_elsewhere, "resumed_at_s"),
                    )
                )
                if ok and rep is not None and c.resumed_elsewhere:
                    ok = not rep.get("resumed_on_excluded_node", True)
                out.append(
                    CheckResult(
                        f"training runbook {c.jobset}", ok, "named, suspended, resumed", str(rep)
                    )
                )
            case IncidentCheck():
                incidents = command(run) if incidents is None else incidents
                out.append(CheckResult(*evaluate_incident(c, incidents, run)))
            case SeriesCheck():
                out.append(CheckResult(*evaluate_series(c, run)))
            case SecurityCheck():
                out.append(CheckResult(*evaluate_security(c, run)))
    return out
