"""A Medik8s NodeHealthCheck equivalent to a remediation policy.

What NodeHealthCheck can express: the node selector, ``minHealthy`` and the unhealthy conditions
with the duration each must hold, plus the remediation template. What it cannot, and firedrill
enforces itself (say so to whoever deploys the manifest): the per-cell hourly quarantine budget,
flapping detection (twice in 90 minutes), the quarantined-fraction budget, per-XID actions
(reset versus reboot versus never drain), burn-in before return, and paging once when a budget
stops automation.
"""

from __future__ import annotations

from typing import Any

from firedrill.remediate.policy import QUARANTINING, PolicySpec

NOT_EXPRESSIBLE = (
    "max quarantines per cell per hour (budgets.max_quarantines_per_cell_hour)",
    "flapping: a node remediated twice within budgets.flapping_window_s is held",
    "quarantined-fraction budget (budgets.quarantined_fraction)",
    "per-XID actions: reset vs reboot vs track/ticket/app-level (never drain)",
    "burn-in (dcgmi diag -r 3 and an NCCL all-reduce) before untaint and uncordon",
    "one page (QuarantineRateAnomalous) when a budget stops automation in a cell",
    "dry-run",
)


def node_health_check(policy: PolicySpec, *, name: str, cell: str | None = None) -> dict[str, Any]:
    hold_s = int(policy.timings.hold_observations * policy.timings.evaluation_interval_s)
    conditions: list[dict[str, Any]] = [{"type": "Ready", "status": "False", "duration": "300s"}]
    if any(a in QUARANTINING for a in policy.xids.values()) and policy.modules.xid:
        conditions.append({"type": "GpuXidCritical", "status": "True", "duration": f"{hold_s}s"})
    if policy.modules.ecc and policy.fields.ecc_dbe in QUARANTINING:
        conditions.append({"type": "GpuEccDoubleBit", "status": "True", "duration": f"{hold_s}s"})
    if policy.modules.pcie:
        conditions.append(
            {"type": "GpuPcieReplayStorm", "status": "True", "duration": f"{hold_s}s"}
        )
    labels = dict(policy.selector)
    if cell is not None:
        labels["topology.corp/cell"] = cell
    return {
        "apiVersion": "remediation.medik8s.io/v1alpha1",
        "kind": "NodeHealthCheck",
        "metadata": {
            "name": name,
            "annotations": {
                "firedrill.dev/enforced-outside-nhc": "; ".join(NOT_EXPRESSIBLE),
                "firedrill.dev/dry-run": str(policy.dry_run).lower(),
            },
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "minHealthy": f"{round(policy.budgets.min_healthy * 100)}%",
            "unhealthyConditions": conditions,
            "remediationTemplate": {
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediationTemplate",
                "namespace": "medik8s",
                "name": policy.remediation_template,
            },
        },
    }
