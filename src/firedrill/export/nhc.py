"""A Medik8s NodeHealthCheck equivalent to a remediation policy.

What NodeHealthCheck can express: the node selector, ``minHealthy`` and the unhealthy conditions
with the duration each must hold, plus the remediation template. What it cannot, and firedrill
enforces itself (say so to whoever deploys the manifest): the per-cell hourly quarantine budget,
flapping detection (twice in 90 minutes), the quarantined-fraction budget, per-XID actions
(reset versus reboot versus never drain), burn-in before return, and paging once when a budget
stops automation.

NodeHealthCheck only reads node conditions; something on the node must set them. ``Ready`` is the
kubelet's. The GPU conditions are firedrill's names, and no agent sets them out of the box: each
needs a node agent that reads DCGM (or the kernel log for XIDs) and patches the node's status, such
as node-problem-detector with a custom-plugin monitor, or NVSentinel's health monitors with their
condition names mapped onto these. ``CONDITION_SOURCES`` says which, and the manifest carries it
(``firedrill.dev/condition-sources``) so whoever deploys it knows what else must run.
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


CONDITION_SOURCES: dict[str, str] = {
    "Ready": "kubelet (built in)",
    "GpuXidCritical": (
        "a node agent reading XIDs (kernel log NVRM lines or DCGM_FI_DEV_XID_ERRORS): "
        "node-problem-detector custom-plugin monitor, or NVSentinel's syslog/GPU health monitor "
        "mapped to this name; not set by anything by default"
    ),
    "GpuEccDoubleBit": (
        "a node agent reading DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (dcgmi or the DCGM exporter): "
        "node-problem-detector custom-plugin monitor or NVSentinel's GPU health monitor mapped to "
        "this name; not set by anything by default"
    ),
    "GpuPcieReplayStorm": (
        "a node agent reading DCGM_FI_DEV_PCIE_REPLAY_COUNTER over 5 minutes: "
        "node-problem-detector custom-plugin monitor; not set by anything by default"
    ),
}


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
                "firedrill.dev/condition-sources": "; ".join(
                    f"{c['type']}: {CONDITION_SOURCES[c['type']]}" for c in conditions
                ),
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
