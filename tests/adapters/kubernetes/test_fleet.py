"""``KubernetesFleet`` against a replaying apiserver: each operation's calls, inverse and outcome.

Every body the adapter sends (and every object a patch produces) is checked against the real
schemas by the apiserver fixture; a test fails on any violation.
"""

from __future__ import annotations

import pytest

from firedrill.adapters.kubernetes import conventions as cv
from firedrill.adapters.kubernetes.errors import KubernetesError
from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from tests.adapters.kubernetes.apiserver import Obj
from tests.adapters.kubernetes.cluster import pdb, seed_small
from tests.adapters.kubernetes.conftest import Cluster, make_cluster
from tests.shapes import dig

QK = "gpu.corp/quarantine"


def _node(c: Cluster, name: str = "gpu-0") -> Obj:
    return c.server.get("", "nodes", name)


def test_quarantine_then_inverses_restore_the_node(cluster: Cluster) -> None:
    seed_small(cluster.server)
    before = _node(cluster)
    f = cluster.fleet
    inverses = [
        f.apply(ops.Taint("gpu-0", QK, "xid79")),
        f.apply(ops.Label("gpu-0", "gpu.corp/quarantine-reason", "xid79")),
        f.apply(ops.Label("gpu-0", "gpu.corp/quarantine-ticket", "TKT-00001")),
        f.apply(ops.Cordon("gpu-0")),
    ]
    assert inverses == [
        ops.Untaint("gpu-0", QK, "NoSchedule"),
        ops.Label("gpu-0", "gpu.corp/quarantine-reason", None),
        ops.Label("gpu-0", "gpu.corp/quarantine-ticket", None),
        ops.Uncordon("gpu-0"),
    ]
    n = _node(cluster)
    assert n["spec"]["taints"] == [{"key": QK, "value": "xid79", "effect": "NoSchedule"}]
    assert n["spec"]["unschedulable"] is True
    assert n["metadata"]["labels"]["gpu.corp/quarantine-ticket"] == "TKT-00001"
    view = f.node("gpu-0")
    assert view.cordoned
    assert view.taints == ((QK, "xid79", "NoSchedule"),)
    assert dict(view.versions)["dcgm_exporter"] == "3.3.8-3.6.0"
    for inv in reversed(inverses):
        f.apply(inv)
    after = _node(cluster)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    # the taint patch carried the version it read: optimistic concurrency, not last-writer-wins
    taint_call = f.journal[0].writes[0]
    assert taint_call.method == "PATCH"
    assert taint_call.content_type == "application/merge-patch+json"
    assert dig(taint_call.body, "metadata", "resourceVersion")
    assert [r.outcome for r in f.journal] == ["applied"] * 8


def test_a_retaint_records_the_old_value_as_its_inverse(cluster: Cluster) -> None:
    seed_small(cluster.server)
    f = cluster.fleet
    f.apply(ops.Taint("gpu-1", QK, "xid48", "NoExecute"))
    assert f.apply(ops.Taint("gpu-1", QK, "xid79")) == ops.Taint("gpu-1", QK, "xid48", "NoExecute")
    assert f.apply(ops.Untaint("gpu-1", QK)) == ops.Taint("gpu-1", QK, "xid79", "NoSchedule")
    assert f.inverse_of(ops.Untaint("gpu-1", QK)) == ops.Noop("no such taint")


def test_drain_evicts_the_named_classes_through_the_eviction_api_and_keeps_daemonsets(
    cluster: Cluster,
) -> None:
    seed_small(cluster.server)
    f = cluster.fleet
    assert f.apply(ops.Drain("gpu-0", ("inference",))) == ops.Uncordon("gpu-0")
    evictions = [c for c in f.journal[0].writes if c.path.endswith("/eviction")]
    assert [c.path for c in evictions] == [
        "/api/v1/namespaces/serve/pods/llm-a/eviction",
        "/api/v1/namespaces/serve/pods/llm-b/eviction",
    ]
    assert all(dig(c.body, "kind") == "Eviction" for c in evictions)
    left = {k[3] for k in cluster.server.objects if k[:2] == ("", "pods")}
    assert {"dcgm-exporter-x", "train-0", "llm-c"} <= left  # DaemonSet, training, other node
    assert "llm-a" not in left
    f.apply(ops.Drain("gpu-0", ("training",)))
    assert "train-0" not in {k[3] for k in cluster.server.objects if k[:2] == ("", "pods")}


def test_a_pdb_that_forbids_the_eviction_is_a_typed_partial_outcome(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.objects.pop(("policy", "poddisruptionbudgets", "serve", "llm-70b-use1-a"))
    cluster.server.add(pdb("llm-70b", "use1-a", min_available=3))  # 3 pods, none may go
    f = cluster.fleet
    with pytest.raises(KubernetesError) as err:
        f.apply(ops.Drain("gpu-0", ("inference",)))
    assert err.value.outcome == "throttled"
    rec = f.journal[-1]
    assert rec.outcome == "partial"  # the cordon landed: the record says so, with its inverse
    assert rec.inverse == ops.Uncordon("gpu-0")
    assert any("PodDisruptionBudget" in n and "serve/llm-a" in n for n in rec.notes)
    # each eviction was tried, refused 429, retried after Retry-After, then reported
    refused = [c for c in rec.calls if c.path.endswith("/eviction")]
    assert {c.status for c in refused} == {429}
    assert cluster.slept
    assert set(cluster.slept) == {1.0}
    assert _node(cluster)["spec"]["unschedulable"] is True


def test_advise_mode_sends_every_write_as_a_server_side_dry_run(validator: SchemaValidator) -> None:
    c = make_cluster(validator, dry_run=True)
    seed_small(c.server)
    before = {k: dict(v) for k, v in c.server.objects.items()}
    rv = c.server.rv
    f = c.fleet
    f.apply(ops.Taint("gpu-0", QK, "xid79"))
    f.apply(ops.Drain("gpu-0"))
    f.apply(ops.SuspendJobSet("pretrain"))
    f.apply(ops.SetQueueStopPolicy("training", "HoldAndDrain"))
    f.apply(ops.RunBurnIn("gpu-1"))
    f.apply(ops.SetFlag("tenant.acme.tools", "off"))
    writes = [w for r in f.journal for w in r.writes]
    assert len(writes) >= 8
    assert all(w.dry_run for w in writes)
    assert {r.outcome for r in f.journal} == {"dry_run"}
    assert c.server.rv == rv  # nothing stored
    assert c.server.objects.keys() == before.keys()
    assert c.server.violations == []  # validated all the same


def test_jobset_suspend_and_resume_with_excluded_nodes(cluster: Cluster) -> None:
    seed_small(cluster.server)
    f = cluster.fleet
    assert f.apply(ops.SuspendJobSet("pretrain")) == ops.ResumeJobSet("pretrain", ())
    assert f.inverse_of(ops.SuspendJobSet("pretrain")) == ops.Noop("already suspended")
    inv = f.apply(ops.ResumeJobSet("pretrain", ("gpu-2",)))
    assert inv == ops.SuspendJobSet("pretrain")
    js = cluster.server.get("jobset.x-k8s.io", "jobsets", "pretrain", "train")
    assert js["spec"]["suspend"] is False
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": cv.LABEL_HOSTNAME, "operator": "NotIn", "values": ["gpu-2"]}]}
    ]
    # running with gpu-2 excluded: resuming with another exclusion records the old one
    assert f.inverse_of(ops.ResumeJobSet("pretrain", ("gpu-1",))) == ops.ResumeJobSet(
        "pretrain", ("gpu-2",)
    )
    assert f.inverse_of(ops.ResumeJobSet("pretrain", ("gpu-2",))) == ops.Noop("not suspended")
    with pytest.raises(UnknownTargetError):
        f.inverse_of(ops.ResumeJobSet("pretrain", ("no-such-node",)))


def test_queue_hold_replicas_scaler_routes_flags_and_pods(cluster: Cluster) -> None:
    seed_small(cluster.server)
    f = cluster.fleet
    s = cluster.server
    assert f.apply(ops.SetQueueStopPolicy("training", "Hold")) == ops.SetQueueStopPolicy(
        "training", None
    )
    assert s.get("kueue.x-k8s.io", "clusterqueues", "training")["spec"]["stopPolicy"] == "Hold"
    assert f.apply(ops.SetQueueStopPolicy("training", None)) == ops.SetQueueStopPolicy(
        "training", "Hold"
    )
    assert s.get("kueue.x-k8s.io", "clusterqueues", "training")["spec"]["stopPolicy"] == "None"

    assert f.apply(ops.SetReplicas("llm-70b", "use1-a", 5)) == ops.SetReplicas(
        "llm-70b", "use1-a", 3
    )
    assert s.get("apps", "deployments", "llm-70b-use1-a", "serve")["spec"]["replicas"] == 5
    assert f.journal[-1].writes[0].path.endswith("/deployments/llm-70b-use1-a/scale")

    assert f.apply(ops.PauseScaler("llm-70b", "use1-a", 5)) == ops.UnpauseScaler(
        "llm-70b", "use1-a"
    )
    so = s.get("keda.sh", "scaledobjects", "llm-70b-use1-a", "serve")
    assert so["metadata"]["annotations"][cv.ANNOTATION_KEDA_PAUSED] == "5"
    assert f.apply(ops.UnpauseScaler("llm-70b", "use1-a")) == ops.PauseScaler(
        "llm-70b", "use1-a", 5
    )
    assert cluster.unchecked == {"ScaledObject"}  # no upstream KEDA schema here: reported

    inv = f.apply(ops.SetRouteWeights("llm-70b", (("use1-a", 50),)))
    assert inv == ops.SetRouteWeights("llm-70b", (("use1-a", 100),))
    cells = {cv_.name: cv_ for cv_ in f.cells()}
    assert dict(cells["use1-a"].route_weights) == {"llm-70b": 50}
    assert cells["use1-a"].replicas[0].desired == 5
    assert f.apply(ops.QuarantineCell("use1-a")) == ops.UnquarantineCell("use1-a")
    assert f.cells()[0].quarantined

    assert f.apply(ops.SetFlag("tenant.acme.tools", "off")) == ops.SetFlag(
        "tenant.acme.tools", "on"
    )
    assert f.apply(ops.SetFlag("egress.deny-all", "true")) == ops.SetFlag("egress.deny-all", None)
    assert f.apply(ops.SetFlag("egress.deny-all", None)) == ops.SetFlag("egress.deny-all", "true")
    data = s.get("", "configmaps", "toolgw-flags", "agents")["data"]
    assert data == {"tenant.acme.tools": "off"}

    assert f.pods_on("gpu-0", 5) == ["llm-b"]
    assert f.apply(ops.EjectReplica("llm-b")) == ops.UnejectReplica("llm-b")
    assert f.apply(ops.QuarantinePod("llm-a")) == ops.UnquarantinePod("llm-a")
    assert (
        s.get("", "pods", "llm-a", "serve")["metadata"]["labels"][cv.LABEL_POD_QUARANTINE] == "true"
    )
    assert f.apply(ops.KillPod("llm-c")) == ops.Noop("a killed pod is restarted by its controller")
    assert ("", "pods", "serve", "llm-c") not in s.objects


def test_remediation_jobs_and_the_burn_in_result(cluster: Cluster) -> None:
    seed_small(cluster.server)
    f = cluster.fleet
    assert f.apply(ops.ResetGpu("gpu-1", 3)) == ops.Noop("a reset cannot be undone")
    f.apply(ops.RebootNode("gpu-1"))
    f.apply(ops.RunBurnIn("gpu-1"))
    jobs = [o for k, o in cluster.server.objects.items() if k[:2] == ("batch", "jobs")]
    by_action = {j["metadata"]["labels"][cv.LABEL_REMEDIATION]: j for j in jobs}
    assert set(by_action) == {"reset", "reboot", "burn-in"}
    reset = by_action["reset"]["spec"]["template"]["spec"]
    assert reset["nodeName"] == "gpu-1"
    assert reset["containers"][0]["command"] == ["nvidia-smi", "--gpu-reset", "-i", "3"]
    assert {"operator": "Exists"} in reset["tolerations"]  # runs on the quarantined node
    assert f.burn_in_result("gpu-1") is None  # not finished
    burn = by_action["burn-in"]
    burn["status"] = {
        "completionTime": "2026-12-03T12:20:00Z",
        "conditions": [{"type": "Complete", "status": "True", "reason": "Completed"}],
    }
    result = f.burn_in_result("gpu-1")
    assert result is not None
    at, passed, detail = result
    assert passed
    assert burn["metadata"]["name"] in detail
    assert at == pytest.approx(1_796_300_400.0)  # seconds since the fleet's epoch (1970)
    with pytest.raises(UnknownTargetError):
        f.apply(ops.ResetGpu("gpu-1", 8))  # no ninth GPU: refused before any write


def test_conflicts_are_retried_on_a_fresh_read(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/nodes/gpu-0$", 409, times=1)
    cluster.fleet.apply(ops.Taint("gpu-0", QK, "xid79"))
    rec = cluster.fleet.journal[-1]
    assert rec.outcome == "applied"
    assert [c.status for c in rec.writes] == [409, 200]
    assert [c.method for c in rec.calls].count("GET") >= 2  # read again before retrying


def test_conflicts_that_persist_fail_with_a_journal_line(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/nodes/gpu-0$", 409, times=10)
    with pytest.raises(KubernetesError) as err:
        cluster.fleet.apply(ops.Taint("gpu-0", QK, "xid79"))
    assert err.value.outcome == "conflict"
    assert err.value.status == 409
    rec = cluster.fleet.journal[-1]
    assert rec.outcome == "failed"
    assert rec.inverse == ops.Untaint("gpu-0", QK, "NoSchedule")
    assert "409" in rec.error
    assert "taints" not in _node(cluster)["spec"]


def test_forbidden_is_not_retried(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/jobsets/pretrain$", 403)
    with pytest.raises(KubernetesError) as err:
        cluster.fleet.apply(ops.SuspendJobSet("pretrain"))
    assert err.value.outcome == "forbidden"
    assert err.value.reason == "Forbidden"
    rec = cluster.fleet.journal[-1]
    assert [c.status for c in rec.writes] == [403]
    assert rec.outcome == "failed"


def test_throttling_waits_for_retry_after(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/nodes/gpu-2$", 429, times=2)
    cluster.fleet.apply(ops.Cordon("gpu-2"))
    assert cluster.slept == [1.0, 1.0]
    assert [c.status for c in cluster.fleet.journal[-1].writes] == [429, 429, 200]


def test_server_errors_retry_idempotent_patches_but_never_a_create(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/nodes/gpu-2$", 500, times=1)
    cluster.fleet.apply(ops.Cordon("gpu-2"))
    assert cluster.slept == [0.5]
    cluster.server.fail("POST", r"/jobs$", 500, times=1)
    with pytest.raises(KubernetesError) as err:
        cluster.fleet.apply(ops.RunBurnIn("gpu-2"))
    assert err.value.outcome == "server_error"
    assert [c.status for c in cluster.fleet.journal[-1].writes] == [500]  # once: no duplicate Job


def test_an_outage_is_unreachable_with_the_request_journalled(cluster: Cluster) -> None:
    seed_small(cluster.server)
    cluster.server.fail("PATCH", r"/nodes/gpu-2$", 0, times=3)
    with pytest.raises(KubernetesError) as err:
        cluster.fleet.apply(ops.Cordon("gpu-2"))
    assert err.value.outcome == "unreachable"
    assert err.value.status is None
    rec = cluster.fleet.journal[-1]
    assert rec.outcome == "failed"
    assert rec.inverse == ops.Uncordon("gpu-2")
    assert [(c.method, c.status, c.reason) for c in rec.writes] == [("PATCH", 0, "Unreachable")] * 3


def test_unknown_targets_and_unmapped_operations_are_refused_before_any_write(
    cluster: Cluster,
) -> None:
    seed_small(cluster.server)
    with pytest.raises(UnknownTargetError):
        cluster.fleet.apply(ops.Cordon("no-such-node"))
    with pytest.raises(OperationError, match="no Kubernetes mapping"):
        cluster.fleet.apply(ops.Partition("region-region", "us-east-1", "us-west-2"))
    assert cluster.writes() == []


def test_a_proxy_error_page_is_a_typed_server_error(cluster: Cluster) -> None:
    import httpx2

    seed_small(cluster.server)
    original = cluster.server.handle
    calls = {"n": 0}

    def gateway(request: httpx2.Request) -> httpx2.Response:
        if request.method == "PATCH":
            calls["n"] += 1
            return httpx2.Response(502, headers={"Content-Type": "text/html"}, content=b"<html>")
        return original(request)

    cluster.fleet.transport.inner = httpx2.MockTransport(gateway)  # a proxy in front of it
    with pytest.raises(KubernetesError) as err:
        cluster.fleet.apply(ops.Cordon("gpu-2"))
    assert err.value.outcome == "server_error"
    assert err.value.status == 502
    assert calls["n"] == 3  # an idempotent patch, retried before giving up
    assert cluster.fleet.journal[-1].outcome == "failed"


def test_a_long_running_recorder_keeps_the_newest_calls_and_the_journal_stays_right(
    cluster: Cluster,
) -> None:
    seed_small(cluster.server)
    t = cluster.fleet.transport
    t.keep = 5
    for _ in range(10):
        cluster.fleet.node_views()
    assert len(t.calls) <= 10
    assert t.mark() == 10
    cluster.fleet.apply(ops.Cordon("gpu-2"))
    rec = cluster.fleet.journal[-1]
    assert [c.method for c in rec.calls] == ["GET", "PATCH"]  # its own calls, nothing older
