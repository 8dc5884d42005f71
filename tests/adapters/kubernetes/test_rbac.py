"""The deployment's RBAC is exactly what the code uses: derived from the requests of its flows.

Each component's flows run against the replaying apiserver (advise mode and apply mode both: a
dry run is authorised like the real request). The permissions their requests needed are turned
into Roles by ``rbac_manifests``, and ``deploy/base/rbac.yaml`` must be byte for byte that output:
a code change that needs a new verb fails here until the manifests are regenerated
(``FIREDRILL_REGENERATE_RBAC=1 pytest tests/adapters/kubernetes/test_rbac.py``). The manifests
are then checked the other way too: every permission is granted, nothing else is, no wildcard,
no cluster-admin, no secrets, and every object fits its schema.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from firedrill.adapters.kubernetes.client import Connection
from firedrill.adapters.kubernetes.conductor import WorkflowConductor
from firedrill.adapters.kubernetes.lease import LeaderElector
from firedrill.adapters.kubernetes.operator import ControllerProcess
from firedrill.adapters.kubernetes.rbac import Permission, allows, permissions, rbac_manifests
from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.adapters.kubernetes.transport import ApiCall
from firedrill.export.chaos_mesh import chaos_workflow
from firedrill.model import operations as ops
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_drill, load_spec
from tests.adapters.kubernetes.cluster import seed_small
from tests.adapters.kubernetes.conftest import make_cluster
from tests.adapters.kubernetes.test_controller import Clock, FakeSignals
from tests.adapters.kubernetes.test_scenarios import _cluster, _control_plane, _run

ROOT = Path(__file__).resolve().parents[3]
RBAC = ROOT / "deploy" / "base" / "rbac.yaml"
NAMESPACE = "firedrill-system"
COMPONENTS = ("controller", "levers", "conductor")


def _controller_flow(validator: SchemaValidator) -> list[ApiCall]:
    calls: list[ApiCall] = []
    for advise in (False, True):
        c = make_cluster(validator, dry_run=advise)
        seed_small(c.server)  # gpu-0 runs inference, training and a DaemonSet pod
        conn = Connection(c.fleet.client, c.fleet.transport)
        clock = Clock()
        signals = FakeSignals(clock, ["gpu-0", "gpu-1", "gpu-2"])
        signals.xid["gpu-0"] = (clock.t, 79.0)
        policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec).model_copy(
            update={
                "budgets": PolicySpec().budgets.model_copy(
                    update={"min_healthy": 0.5, "quarantined_fraction": 0.5}
                )
            }
        )
        p = ControllerProcess(
            policy, conn, signals, LeaderElector(conn, "a", clock), now=clock, advise=advise
        )

        def six_ticks(p: ControllerProcess = p) -> bool:
            return p.ticks >= 6

        p.run(six_ticks, clock.advance)  # the informer's thread stops too
        f = p.fleet
        f.apply(ops.EjectReplica("llm-c"))  # a thermal straggler's replica leaves routing
        f.pods_on("gpu-1", 0)
        f.burn_in_result("gpu-0")
        f.apply(ops.Untaint("gpu-0", "gpu.corp/quarantine"))  # the return after burn-in
        f.apply(ops.Uncordon("gpu-0"))
        calls += c.fleet.transport.calls
    run, fresh = _run("exporter-upgrade-storm")
    storm = _cluster(validator, fresh)
    for a in _control_plane(run):
        storm.fleet.apply(a.op)
    return calls + storm.fleet.transport.calls


def _levers_flow(validator: SchemaValidator) -> list[ApiCall]:
    run, fresh = _run("training-hang-512")
    hang = _cluster(validator, fresh)
    for a in _control_plane(run):
        hang.fleet.apply(a.op)
    c = make_cluster(validator)
    seed_small(c.server)
    f = c.fleet
    for op in (
        ops.SetRouteWeights("llm-70b", (("use1-a", 50),)),
        ops.QuarantineCell("use1-a"),
        ops.UnquarantineCell("use1-a"),
        ops.PauseScaler("llm-70b", "use1-a", 3),
        ops.UnpauseScaler("llm-70b", "use1-a"),
        ops.SetReplicas("llm-70b", "use1-a", 4),
        ops.SetFlag("egress.deny-all", "true"),
        ops.QuarantinePod("llm-a"),
        ops.SetQueueStopPolicy("training", "HoldAndDrain"),
        ops.SuspendJobSet("pretrain"),
        ops.ResumeJobSet("pretrain", ("gpu-2",)),
        ops.Taint("gpu-1", "gpu.corp/quarantine", "nccl-hang"),
        ops.Label("gpu-1", "gpu.corp/quarantine-reason", "nccl-hang"),
    ):
        f.apply(op)
    with f.advise():
        f.apply(ops.SetFlag("egress.deny-all", None))
    f.cells()  # the responder's capacity view
    return hang.fleet.transport.calls + f.transport.calls


def _conductor_flow(validator: SchemaValidator, tmp: Path) -> list[ApiCall]:
    c = make_cluster(validator)
    conn = Connection(c.fleet.client, c.fleet.transport)
    loaded = load_drill(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    export = chaos_workflow(loaded.spec, loaded.fleet)

    class Tick:
        t = 0.0

        def now_s(self) -> float:
            return self.t

        def advance(self, s: float) -> None:
            self.t += s

    for dry_run in (False, True):
        WorkflowConductor(conn, Tick(), tmp, dry_run=dry_run).run(
            loaded.spec, export, lambda t: "stop" if t >= 60 else None, run_by="alice"
        )
    return c.fleet.transport.calls


@pytest.fixture(scope="module")
def derived(
    validator: SchemaValidator, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, frozenset[Permission]]:
    conductor = _conductor_flow(validator, tmp_path_factory.mktemp("journal"))
    return {
        "controller": frozenset(permissions(_controller_flow(validator))),
        "levers": frozenset(permissions(_levers_flow(validator))),
        "conductor": frozenset(permissions(conductor)),
    }


def _generated(derived: dict[str, frozenset[Permission]]) -> str:
    docs: list[dict[str, Any]] = []
    for component in COMPONENTS:
        docs += rbac_manifests(component, NAMESPACE, derived[component])
    header = (
        "# Generated from the requests firedrill's flows make (tests/adapters/kubernetes/"
        "test_rbac.py):\n# do not edit; regenerate with FIREDRILL_REGENERATE_RBAC=1.\n"
    )
    return header + "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def test_the_committed_rbac_is_exactly_what_the_flows_need(
    derived: dict[str, frozenset[Permission]],
) -> None:
    text = _generated(derived)
    if os.environ.get("FIREDRILL_REGENERATE_RBAC"):
        RBAC.write_text(text)
    assert RBAC.read_text() == text, "deploy/base/rbac.yaml is stale: regenerate it"
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    for component, perms in derived.items():
        account = f"{NAMESPACE}/firedrill-{component}"
        for p in perms:  # everything the code uses is granted ...
            assert allows(docs, account, p), (component, p)
        granted = {
            Permission(g, r, v, d["metadata"].get("namespace"))
            for d in docs
            if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"].endswith(component)
            for rule in d["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }
        assert granted == set(perms), component  # ... and nothing else


def test_least_privilege_no_wildcards_no_cluster_admin_no_secrets(
    validator: SchemaValidator, derived: dict[str, frozenset[Permission]]
) -> None:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    assert validator.check_all(docs) == []
    for d in docs:
        text = yaml.safe_dump(d)
        assert "'*'" not in text, d["metadata"]["name"]
        assert '"*"' not in text, d["metadata"]["name"]
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert d["roleRef"]["name"].startswith("firedrill-")
            assert d["roleRef"]["name"] != "cluster-admin"
        for rule in d.get("rules", []):
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate", "*"} & set(rule["verbs"])
    # the shapes the issue asks for, as the flows produced them
    ctl = {(p.resource, p.verb) for p in derived["controller"]}
    assert ("nodes", "patch") in ctl
    assert ("pods/eviction", "create") in ctl
    assert ("nodes", "watch") in ctl  # the node informer
    assert not any(
        p.resource in ("jobsets", "workflows", "configmaps") for p in derived["controller"]
    )
    chaos = derived["conductor"]
    assert {(p.group, p.resource, p.verb, p.namespace) for p in chaos} == {
        ("chaos-mesh.org", "workflows", "create", "chaos-system"),
        ("chaos-mesh.org", "workflows", "delete", "chaos-system"),
    }  # inject-only, in the chaos namespace only
    levers = {(p.resource, p.verb) for p in derived["levers"]}
    assert ("jobsets", "patch") in levers
    assert ("clusterqueues", "patch") in levers
    assert not any(v == "delete" for _, v in levers)


def test_a_grant_outside_a_rolebinding_namespace_is_not_a_grant() -> None:
    docs = rbac_manifests("x", NAMESPACE, [Permission("", "pods", "get", "serve")])
    assert allows(docs, f"{NAMESPACE}/firedrill-x", Permission("", "pods", "get", "serve"))
    assert not allows(docs, f"{NAMESPACE}/firedrill-x", Permission("", "pods", "get", "train"))
    assert not allows(docs, f"{NAMESPACE}/firedrill-x", Permission("", "pods", "get", None))
    assert not allows(docs, f"{NAMESPACE}/firedrill-y", Permission("", "pods", "get", "serve"))
    assert not allows(docs, f"{NAMESPACE}/firedrill-x", Permission("", "pods", "list", "serve"))
