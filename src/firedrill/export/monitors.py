"""The ServiceMonitor (vLLM) and PodMonitor (dcgm-exporter) that put ``cell`` and ``region`` on
real series.

Every generated rule aggregates ``by (cell, region)``, and no exporter writes either label: vLLM
writes ``model_name`` and ``engine``, dcgm-exporter the GPU and its host. On a real fleet they
come from the scrape: prometheus-operator turns these manifests into scrape configs whose
relabelings copy the labels of the node a target runs on (``attachMetadata.node``) into target
labels, which Prometheus then attaches to every series of the target. A third label is copied for
the availability SLI: vLLM's ``http_*`` series carry no ``model_name``, so the ServiceMonitor
reads the served model from a pod annotation and, after the scrape, writes it as ``model_name``
onto exactly the series that lack one (the engine series keep vLLM's own).

``honorLabels`` stays false (prometheus-operator's default): dcgm-exporter's own ``pod`` and
``namespace`` (the GPU's workload) are then kept as ``exported_pod`` / ``exported_namespace``, as
the reference describes. Pure: values in, mappings out; the CLI writes them as YAML.
"""

from __future__ import annotations

import re
from typing import Any

from firedrill.detect.slo import ScrapeSpec

__all__ = ["meta_label", "pod_monitor", "service_monitor"]

API_VERSION = "monitoring.coreos.com/v1"
# A target label that only carries the annotation to the metric relabeling; dropped there.
SERVED_MODEL = "firedrill_served_model"


def meta_label(kind: str, key: str) -> str:
    """The service-discovery label of a Kubernetes label or annotation key.

    Prometheus replaces every character outside ``[a-zA-Z0-9_]`` with ``_``:
    ``topology.kubernetes.io/region`` on a node is ``__meta_kubernetes_node_label_topology_
    kubernetes_io_region``.
    """
    return f"__meta_kubernetes_{kind}_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _metadata(name: str, scrape: ScrapeSpec) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": scrape.namespace,
        "labels": {"app.kubernetes.io/managed-by": "firedrill"},
    }


def _cell_and_region(scrape: ScrapeSpec) -> list[dict[str, Any]]:
    return [
        {
            "action": "replace",
            "sourceLabels": [meta_label("node_label", scrape.cell_node_label)],
            "targetLabel": "cell",
        },
        {
            "action": "replace",
            "sourceLabels": [meta_label("node_label", scrape.region_node_label)],
            "targetLabel": "region",
        },
    ]


def service_monitor(scrape: ScrapeSpec, *, name: str = "firedrill-vllm") -> dict[str, Any]:
    """A ServiceMonitor for vLLM's OpenAI-compatible servers (metrics on the API port)."""
    endpoint: dict[str, Any] = {
        "port": scrape.vllm_port,
        "path": "/metrics",
        "interval": scrape.interval,
        "honorLabels": False,
        "relabelings": [
            *_cell_and_region(scrape),
            {
                "action": "replace",
                "sourceLabels": [meta_label("pod_annotation", scrape.served_model_annotation)],
                "targetLabel": SERVED_MODEL,
            },
        ],
        "metricRelabelings": [
            # Only series without a model_name of their own (vLLM's http_*): the source is
            # "<model_name>;<served model>", which matches ^;(.+)$ only when the first is empty.
            {
                "action": "replace",
                "sourceLabels": ["model_name", SERVED_MODEL],
                "separator": ";",
                "regex": ";(.+)",
                "targetLabel": "model_name",
                "replacement": "$1",
            },
            {"action": "labeldrop", "regex": SERVED_MODEL},
        ],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ServiceMonitor",
        "metadata": _metadata(name, scrape),
        "spec": {
            "attachMetadata": {"node": True},
            "namespaceSelector": {"any": True},
            "selector": {"matchLabels": dict(scrape.vllm_selector)},
            "endpoints": [endpoint],
        },
    }


def pod_monitor(scrape: ScrapeSpec, *, name: str = "firedrill-dcgm-exporter") -> dict[str, Any]:
    """A PodMonitor for dcgm-exporter's DaemonSet pods (one per GPU node)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": _metadata(name, scrape),
        "spec": {
            "attachMetadata": {"node": True},
            "namespaceSelector": {"any": True},
            "selector": {"matchLabels": dict(scrape.dcgm_selector)},
            "podMetricsEndpoints": [
                {
                    "port": scrape.dcgm_port,
                    "path": "/metrics",
                    "interval": scrape.interval,
                    "honorLabels": False,
                    "relabelings": _cell_and_region(scrape),
                }
            ],
        },
    }
