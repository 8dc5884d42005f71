"""The scenario run as a report (the ``respond --json`` contract, ``scenario.result``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from firedrill.detect.monitor import event_dict
from firedrill.model.jsontypes import JsonObject
from firedrill.scenario.command import command
from firedrill.scenario.expect import CheckResult
from firedrill.scenario.result import RespondReport, plain

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun


def to_json(run: ScenarioRun, checks: list[CheckResult], *, spec_sha256: str) -> JsonObject:
    st = run.controller.state
    world = run.world
    return {
        "scenario": run.spec.name,
        "seed": run.spec.seed,
        "spec_sha256": spec_sha256,
        "sim_seconds": world.now_s(),
        "timeline": [
            {"at_s": at, "op": type(op).__name__, "args": asdict(op), "note": entry.note}
            for at, entry, op in run.applied
        ],
        "notifications": [
            {
                "receiver": n.receiver,
                "alertname": n.alertname,
                "cell": n.cell,
                "at_s": n.at_s,
                "alerts": len(n.alerts),
                "resolved": len(n.resolved),
                "group_key": list(n.group_key),
            }
            for n in run.notifications
        ],
        "alerts": [event_dict(a) for a in run.alerts],
        "remediation": {
            "dry_run": run.controller.policy.dry_run,
            "actions": [asdict(a) for a in st.actions],
            "blocked": [asdict(b) for b in st.blocked],
            "pages": [asdict(p) for p in st.pages],
            "paused_cells": run.controller.paused_cells,
            "quarantine_actions_total": dict(world.quarantine_actions()),
            "chains": [c.to_json() for c in run.chains],
        },
        "training": run.extra.get("training", {}),
        "alert_history_s": run.extra.get("alert_history_s"),
        "incidents": command(run),
        "changes": [asdict(c) for c in world.changes(since_s=0.0)],
        "expectations": [asdict(c) for c in checks],
        "passed": all(c.passed for c in checks),
    }


def respond_report(
    run: ScenarioRun, checks: list[CheckResult], *, spec_sha256: str
) -> RespondReport:
    """The run's report, typed (validated in its JSON form)."""
    return RespondReport.from_json(plain(to_json(run, checks, spec_sha256=spec_sha256)))
