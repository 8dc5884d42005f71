"""A cluster laid out the way docs/kubernetes.md says, in the replaying apiserver.

``seed_small`` builds a handful of objects for unit tests; ``seed_from_twin`` builds the cluster
a twin's fleet would be on a real cluster (every node with its labels, versions and GPUs, every
serving replica as a pod on its node, Deployments, ScaledObjects, PodDisruptionBudgets, the
router and flag ConfigMaps, JobSets and ClusterQueues), so a scenario's operations can be
mirrored through the adapter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from firedrill.adapters.kubernetes import conventions as cv
from firedrill.adapters.kubernetes.conventions import Conventions
from firedrill.model.state import NodeView
from tests.adapters.kubernetes.apiserver import FakeApiServer

C = Conventions()
Obj = dict[str, Any]


def node(v: NodeView) -> Obj:
    labels = dict(v.labels)
    labels.update(
        {
            cv.LABEL_CELL: v.cell,
            cv.LABEL_REGION: v.region,
            cv.LABEL_POOL: v.pool,
            cv.LABEL_ROLE: v.role,
            cv.LABEL_HOSTNAME: v.name,
        }
    )
    spec: Obj = {}
    if v.cordoned:
        spec["unschedulable"] = True
    if v.taints:
        spec["taints"] = [{"key": k, "value": val, "effect": e} for k, val, e in v.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": v.name,
            "labels": labels,
            "annotations": {f"{cv.ANNOTATION_VERSION_PREFIX}{c}": ver for c, ver in v.versions},
        },
        "spec": spec,
        "status": {
            "capacity": {cv.GPU_RESOURCE: str(v.gpus)},
            "allocatable": {cv.GPU_RESOURCE: str(v.gpus)},
            "conditions": [{"type": "Ready", "status": "True" if v.ready else "False"}],
        },
    }


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = C.serving_namespace,
    klass: str = "inference",
    app: str = "llm-70b",
    cell: str = "use1-a",
    gpus: Sequence[int] = (0,),
    owner: str = "ReplicaSet",
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {cv.LABEL_WORKLOAD_CLASS: klass, "app": app, "cell": cell},
            "annotations": {cv.ANNOTATION_GPUS: ",".join(map(str, gpus))},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": owner, "name": f"{app}-{cell}", "uid": "u1"}
            ],
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.6.3",
                    "resources": {"limits": {cv.GPU_RESOURCE: str(len(gpus))}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def deployment(model: str, cell: str, replicas: int, image: str = "vllm/vllm-openai:v0.6.3") -> Obj:
    labels = {"app": model, "cell": cell}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": C.deployment(model, cell),
            "namespace": C.serving_namespace,
            "labels": labels,
            "annotations": {cv.ANNOTATION_CHANGE_STREAM: "serving_image"},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "server", "image": image}]},
            },
        },
        "status": {"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas},
    }


def scaled_object(model: str, cell: str) -> Obj:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": C.deployment(model, cell), "namespace": C.serving_namespace},
        "spec": {"scaleTargetRef": {"name": C.deployment(model, cell)}},
    }


def pdb(
    model: str, cell: str, *, max_unavailable: int | None = None, min_available: int | None = None
) -> Obj:
    spec: Obj = {"selector": {"matchLabels": {"app": model, "cell": cell}}}
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    if min_available is not None:
        spec["minAvailable"] = min_available
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": C.deployment(model, cell), "namespace": C.serving_namespace},
        "spec": spec,
    }


def configmap(name: str, namespace: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def jobset(name: str, *, replicas: int = 4, queue: str = "training", suspend: bool = False) -> Obj:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": C.training_namespace,
            "labels": {"kueue.x-k8s.io/queue-name": queue},
        },
        "spec": {
            "suspend": suspend,
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"labels": {cv.LABEL_WORKLOAD_CLASS: "training"}},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {
                                            "name": "trainer",
                                            "image": "nvcr.io/nvidia/pytorch:24.09-py3",
                                            "resources": {"limits": {cv.GPU_RESOURCE: "8"}},
                                        }
                                    ],
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def cluster_queue(name: str) -> Obj:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {}},
    }


def seed_common(server: FakeApiServer, weights: dict[str, dict[str, int]]) -> None:
    server.add(
        configmap(
            C.router_configmap,
            C.router_namespace,
            {f"weights.{m}": json.dumps(w, sort_keys=True) for m, w in weights.items()},
        )
    )
    server.add(configmap(C.flags_configmap, C.flags_namespace, {"tenant.acme.tools": "on"}))


def seed_small(server: FakeApiServer) -> None:
    """Three nodes in one cell, pods of both classes and a DaemonSet pod, a JobSet, a queue."""
    for i in range(3):
        server.add(
            node(
                NodeView(
                    name=f"gpu-{i}",
                    region="us-east-1",
                    cell="use1-a",
                    pool="h100-serve",
                    role="serve",
                    gpus=8,
                    ready=True,
                    cordoned=False,
                    taints=(),
                    labels=(("nvidia.com/gpu.present", "true"),),
                    versions=(("driver", "550.90.07"), ("dcgm_exporter", "3.3.8-3.6.0")),
                )
            )
        )
    server.add(pod("llm-a", "gpu-0", gpus=(0, 1, 2, 3)))
    server.add(pod("llm-b", "gpu-0", gpus=(4, 5, 6, 7)))
    server.add(pod("llm-c", "gpu-1", gpus=(0,)))
    server.add(
        pod("train-0", "gpu-0", namespace=C.training_namespace, klass="training", app="pretrain")
    )
    server.add(
        pod(
            "dcgm-exporter-x",
            "gpu-0",
            namespace="gpu-operator",
            klass="inference",
            owner="DaemonSet",
        )
    )
    server.add(deployment("llm-70b", "use1-a", 3))
    server.add(scaled_object("llm-70b", "use1-a"))
    server.add(pdb("llm-70b", "use1-a", max_unavailable=2))
    server.add(jobset("pretrain"))
    server.add(cluster_queue("training"))
    seed_common(server, {"llm-70b": {"use1-a": 100, "use1-b": 100}})


def seed_from_fleet(
    server: FakeApiServer,
    fleet: Any,
    jobsets: Sequence[tuple[str, str]] = (),
    queues: Sequence[str] = (),
) -> None:
    """The cluster a fleet (any ``Fleet``: here a twin at t=0) would be: nodes and their pods.

    ``jobsets`` are (name, queue) pairs; ``queues`` the Kueue ClusterQueues.
    """
    for v in fleet.node_views():
        server.add(node(v))
        for name in fleet.pods_on(v.name):
            server.add(pod(name, v.name, app="serving", cell=v.cell))
    for name, queue in jobsets:
        server.add(jobset(name, queue=queue))
    for q in queues:
        server.add(cluster_queue(q))
    seed_common(server, {})
