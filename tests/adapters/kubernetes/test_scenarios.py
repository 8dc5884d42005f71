"""The phantom-XID storm and the 512-node hang, mirrored through the Kubernetes adapter.

Each scenario runs on the twin as ``firedrill respond`` runs it. Every operation the control plane
(the remediation controller, the training runbook, the responder) applied to the twin is then
sent, in the same order, through ``KubernetesFleet`` to a replaying apiserver seeded with the
cluster the twin's fleet would be (docs/kubernetes.md's layout). The adapter must map every one
of them, compute the same inverse the twin recorded, send only schema-valid bodies, and leave
every touched node with the taints, labels and cordon the twin ended with. In advise mode the
same operations go out as server-side dry runs and nothing changes.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.model import operations as ops
from firedrill.scenario.run import ScenarioRun, run_scenario
from firedrill.specfile import load_scenario
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld, embedded_world
from tests.adapters.kubernetes.cluster import seed_from_fleet
from tests.adapters.kubernetes.conftest import Cluster, make_cluster

ROOT = Path(__file__).resolve().parents[3]


@cache  # deterministic: one run per scenario serves every test here
def _run(name: str) -> tuple[ScenarioRun, Twin]:
    spec, fleet, slo, policy = load_scenario(ROOT / "examples" / "scenarios" / f"{name}.yaml")
    fresh = Twin(fleet, spec.seed, hours_hint=spec.duration_s / 3600.0)  # the cluster at t=0
    return run_scenario(spec, fleet, slo, policy, make_world=embedded_world), fresh


def _twin(run: ScenarioRun) -> Twin:
    """The embedded twin the scenario ran on (its journal is what the control plane applied)."""
    assert isinstance(run.world, TwinWorld)
    return run.world.twin


def _control_plane(run: ScenarioRun) -> list[ops.Applied]:
    """What the control plane applied: the twin's journal less the scenario's own injections."""
    injected = Counter(op for _, _, op in run.applied)
    out = []
    for a in _twin(run).journal:
        if injected[a.op]:
            injected[a.op] -= 1
            continue
        out.append(a)
    return out


def _cluster(validator: SchemaValidator, fresh: Twin, *, dry_run: bool = False) -> Cluster:
    c = make_cluster(validator, dry_run=dry_run)
    jobsets = [(j.name, j.queue) for j in fresh.training.jobsets()]
    seed_from_fleet(c.server, fresh, jobsets, sorted(fresh.training.queues()))
    return c


def _mirror(c: Cluster, applied: list[ops.Applied]) -> None:
    for a in applied:
        inverse = c.fleet.apply(a.op)
        assert inverse == a.inverse, (a.at_s, a.op)


def _sequence(applied: list[ops.Applied]) -> list[str]:
    return [f"{type(a.op).__name__} {getattr(a.op, 'node', getattr(a.op, 'jobset', ''))}"
            for a in applied]  # fmt: skip


@pytest.mark.parametrize("name", ["exporter-upgrade-storm", "training-hang-512"])
def test_the_control_plane_sequence_is_the_same_through_the_kubernetes_adapter(
    name: str, validator: SchemaValidator
) -> None:
    run, fresh = _run(name)
    applied = _control_plane(run)
    c = _cluster(validator, fresh)
    _mirror(c, applied)
    assert c.server.violations == []
    assert [r.outcome for r in c.fleet.journal] == ["applied"] * len(applied)
    assert _sequence(applied) == [
        f"{type(r.op).__name__} {getattr(r.op, 'node', getattr(r.op, 'jobset', ''))}"
        for r in c.fleet.journal
    ]
    # every node the control plane touched ends as the twin left it
    touched = sorted({a.op.node for a in applied if hasattr(a.op, "node")})
    assert touched
    for node in touched:
        twin_view, k8s_view = _twin(run).node(node), c.fleet.node(node)
        assert k8s_view.cordoned == twin_view.cordoned, node
        assert set(k8s_view.taints) == set(twin_view.taints), node
        mine = "gpu.corp/quarantine"
        assert {kv for kv in twin_view.labels if kv[0].startswith(mine)} == {
            kv for kv in k8s_view.labels if kv[0].startswith(mine)
        }


def test_the_storm_stops_at_the_budget_and_each_quarantine_is_four_requests(
    validator: SchemaValidator,
) -> None:
    run, fresh = _run("exporter-upgrade-storm")
    applied = _control_plane(run)
    kinds = Counter(type(a.op).__name__ for a in applied)
    quarantines = sum(1 for a in run.controller.state.actions if a.action == "quarantine")
    assert quarantines == 7  # minHealthy binds: 7 of 76 nodes, then the controller pages
    assert kinds["Taint"] == kinds["Drain"] == quarantines
    c = _cluster(validator, fresh)
    _mirror(c, applied)
    taints = [r for r in c.fleet.journal if isinstance(r.op, ops.Taint)]
    assert len(taints) == 7
    for r in taints:
        (w,) = r.writes
        assert (w.method, w.target.plural, w.status) == ("PATCH", "nodes", 200)
    drains = [r for r in c.fleet.journal if isinstance(r.op, ops.Drain)]
    evictions = [w for r in drains for w in r.writes if w.target.subresource == "eviction"]
    assert evictions  # the serving pods on the quarantined nodes went through the Eviction API
    assert all(w.status == 201 for w in evictions)
    jobs = [w for r in c.fleet.journal for w in r.writes if w.target.plural == "jobs"]
    assert len(jobs) == kinds["RebootNode"] + kinds["RunBurnIn"]


def test_the_hang_suspends_quarantines_and_resumes_off_the_bad_node(
    validator: SchemaValidator,
) -> None:
    run, fresh = _run("training-hang-512")
    applied = _control_plane(run)
    assert _sequence(applied) == [
        "SuspendJobSet pretrain-405b",
        "Taint gpu-use1-train-h100-train-0293",
        "Label gpu-use1-train-h100-train-0293",
        "ResumeJobSet pretrain-405b",
    ]
    c = _cluster(validator, fresh)
    _mirror(c, applied)
    js = c.server.get("jobset.x-k8s.io", "jobsets", "pretrain-405b", "train")
    assert js["spec"]["suspend"] is False
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == ["gpu-use1-train-h100-train-0293"]
    assert run.extra["training"]["pretrain-405b"]["resumed_on_excluded_node"] is False


@pytest.mark.parametrize("name", ["exporter-upgrade-storm", "training-hang-512"])
def test_in_advise_mode_the_same_operations_are_server_side_dry_runs(
    name: str, validator: SchemaValidator
) -> None:
    run, fresh = _run(name)
    applied = _control_plane(run)
    c = _cluster(validator, fresh, dry_run=True)
    rv = c.server.rv
    for a in applied:
        c.fleet.apply(a.op)
    writes = [w for r in c.fleet.journal for w in r.writes]
    assert writes
    assert all(w.dry_run for w in writes)
    assert {r.outcome for r in c.fleet.journal} == {"dry_run"}
    assert c.server.rv == rv  # the cluster is as it was
    assert c.server.violations == []
