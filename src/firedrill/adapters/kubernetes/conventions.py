"""The names, labels and annotations firedrill reads and writes on a cluster (docs/kubernetes.md).

One frozen value, so a deployment states its layout once (namespaces, ConfigMaps, images) and a
test can build a cluster that follows the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Conventions"]

# Labels and annotations firedrill owns (the ``firedrill.dev/`` prefix) or reads.
LABEL_CELL = "topology.corp/cell"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_POOL = "topology.corp/pool"
LABEL_ROLE = "gpu.corp/role"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_WORKLOAD_CLASS = "firedrill.dev/workload-class"  # inference | training
LABEL_EJECTED = "firedrill.dev/ejected"  # the router skips a replica labelled "true"
LABEL_POD_QUARANTINE = "ir.corp/quarantine"
LABEL_REMEDIATION = "firedrill.dev/remediation"  # reset | reboot | burn-in (on the Jobs we create)
LABEL_REMEDIATION_NODE = "firedrill.dev/node"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_VERSION_PREFIX = "versions.firedrill.dev/"  # versions.firedrill.dev/driver: 550.90
ANNOTATION_GPUS = "firedrill.dev/gpu-indices"  # "0,1": the GPUs a pod is bound to
ANNOTATION_CHANGE_STREAM = "firedrill.dev/change-stream"
ANNOTATION_CHANGE_SUBJECT = "firedrill.dev/change-subject"
ANNOTATION_CHANGE_VALUE = "firedrill.dev/change-value"
ANNOTATION_KEDA_PAUSED = "autoscaling.keda.sh/paused-replicas"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Conventions:
    """Where firedrill finds (and puts) things on one cluster."""

    serving_namespace: str = "serve"  # Deployments {model}-{cell} and ScaledObjects, same names
    training_namespace: str = "train"  # JobSets
    router_namespace: str = "router"
    router_configmap: str = "firedrill-router"  # weights.{model} (JSON), quarantine.{cell}
    flags_namespace: str = "agents"
    flags_configmap: str = "toolgw-flags"  # one key per kill-switch flag
    remediation_namespace: str = "firedrill-node-ops"  # reset / reboot / burn-in Jobs (privileged)
    field_manager: str = "firedrill"
    remediation_image: str = "nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04"
    remediation_service_account: str = "firedrill-node-remediation"
    quarantine_taint: str = "gpu.corp/quarantine"

    def deployment(self, model: str, cell: str) -> str:
        return f"{model}-{cell}"
