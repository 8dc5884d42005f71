"""The custom resources firedrill touches, as lightkube generic resources (one place for versions).

The versions are the storage versions of the upstream CRDs the tests validate against
(``jobset.x-k8s.io/v1alpha2``, ``kueue.x-k8s.io/v1beta2``, ``chaos-mesh.org/v1alpha1``); KEDA's
``ScaledObject`` is only ever patched in its metadata (the paused-replicas annotation).
"""

from __future__ import annotations

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

__all__ = ["ClusterQueue", "JobSet", "ScaledObject", "Workflow"]

JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
ClusterQueue = create_global_resource("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues")
ScaledObject = create_namespaced_resource("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects")
Workflow = create_namespaced_resource("chaos-mesh.org", "v1alpha1", "Workflow", "workflows")
