"""The same adapter flows against a live cluster: run by ``make e2e-kind`` only.

Skipped unless ``FIREDRILL_E2E_KUBECONFIG`` names a kubeconfig (the kind cluster the target
creates, with the upstream CRDs applied and deploy/base installed). A skip here is "not run",
never a pass: docs/kubernetes.md says which flows have run against a live apiserver.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from firedrill.adapters.kubernetes.client import connect
from firedrill.adapters.kubernetes.conductor import WorkflowConductor
from firedrill.adapters.kubernetes.fleet import KubernetesFleet
from firedrill.adapters.kubernetes.lease import LeaderElector, LeaseConfig
from firedrill.export.chaos_mesh import chaos_workflow
from firedrill.model import operations as ops
from firedrill.specfile import load_drill

KUBECONFIG = os.environ.get("FIREDRILL_E2E_KUBECONFIG")
pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="no live cluster (make e2e-kind)")
ROOT = Path(__file__).resolve().parents[3]


def _fleet(dry_run: bool) -> KubernetesFleet:
    conn = connect(Path(str(KUBECONFIG)))
    return KubernetesFleet(conn.client, conn.transport, dry_run=dry_run)


def test_quarantine_a_kind_node_dry_run_then_for_real_then_undo() -> None:
    f = _fleet(dry_run=True)
    node = f.node_views()[-1].name
    before = f.node(node)
    for op in (ops.Taint(node, "gpu.corp/quarantine", "e2e"), ops.Cordon(node)):
        f.apply(op)
    assert f.node(node) == before  # the server-side dry run changed nothing
    live = _fleet(dry_run=False)
    undo = [live.apply(ops.Taint(node, "gpu.corp/quarantine", "e2e")), live.apply(ops.Cordon(node))]
    assert live.node(node).cordoned
    for inv in reversed(undo):
        live.apply(inv)
    assert live.node(node).taints == before.taints
    assert live.node(node).cordoned == before.cordoned


def test_lease_election_on_the_apiserver() -> None:
    conn = connect(Path(str(KUBECONFIG)))
    config = LeaseConfig(namespace="firedrill-system", name="firedrill-e2e")
    a = LeaderElector(conn, "e2e-a", lambda: datetime.now(UTC), config)
    b = LeaderElector(conn, "e2e-b", lambda: datetime.now(UTC), config)
    assert a.step() is True
    assert b.step() is False
    a.release()
    assert b.step() is True


def test_the_l5_workflow_is_created_and_deleted() -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    export = chaos_workflow(loaded.spec, loaded.fleet)
    conn = connect(Path(str(KUBECONFIG)))

    class Tick:
        t = 0.0

        def now_s(self) -> float:
            return self.t

        def advance(self, s: float) -> None:
            self.t += s

    with tempfile.TemporaryDirectory() as tmp:
        result = WorkflowConductor(conn, Tick(), Path(tmp)).run(
            loaded.spec, export, lambda t: "e2e" if t >= 30 else None, run_by="e2e"
        )
    assert result.created
    assert result.deleted
