"""What the real exporters emit, as data: names, types, labels, label values and buckets.

Generated rules are only worth loading if they select series a real fleet has, and the twin is
only worth trusting if its ``/metrics`` looks like that fleet's. Both are checked against this
catalog. Its source is the project's reference ``shared/reference/exporter-metrics.md`` (facts
read from vLLM, dcgm-exporter, prometheus-fastapi-instrumentator and kube-state-metrics at named
commits); every entry below restates a row of that document, nothing more. Where the document does
not say something (a metric's first release, say), the catalog does not claim it either. The
``# HELP`` texts are ours, written from the reference's description of each metric; only names,
labels, values and buckets are exact.

Versions are part of the facts: names drift between releases, so an SLO spec names the exporter
versions it targets (``SloSpec.exporters``) and ``vllm_catalog`` / ``dcgm_catalog`` answer for
exactly that version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

SOURCE = "shared/reference/exporter-metrics.md"

Kind = Literal["counter", "gauge", "histogram", "summary"]

# --- vLLM ----------------------------------------------------------------------------------------

# Oldest vLLM release the reference pins the names of (the TPOT rename, PR #24110, is in 0.11).
VLLM_MIN_VERSION = (0, 11)
VLLM_DEFAULT_VERSION = "0.11.0"
# vllm:time_per_output_token_seconds: deprecated in 0.11, hidden from 0.12 on.
_VLLM_TPOT_HIDDEN_FROM = (0, 12)
# finished_reason="repetition" arrived with repetition detection in 0.17.
_VLLM_REPETITION_FROM = (0, 17)

# Bucket boundaries, exactly (``le`` upper bounds, +Inf implied). Identical in every release the
# reference read (early 2025 to newest) unless ``--custom-histogram-buckets`` replaces a family.
VLLM_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
HTTP_DURATION_BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1.0)

FINISHED_REASONS = ("stop", "length", "abort", "error")
# prometheus-fastapi-instrumentator groups status codes by default.
HTTP_STATUS_GROUPS = ("2xx", "3xx", "4xx", "5xx")


@dataclass(frozen=True)
class MetricFamily:
    """One metric family as an exporter exposes it.

    ``name`` is the family name of the ``# TYPE`` line (a counter keeps its ``_total`` sample
    name here, as exporters in Go write it); ``labels`` are the exporter's own labels besides
    ``le``; ``label_values`` lists the only values a label can take where the exporter fixes them.
    """

    name: str
    kind: Kind
    help: str
    labels: frozenset[str]
    buckets: tuple[float, ...] = ()
    label_values: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    default_on: bool = True  # False: present only when the exporter's config enables it
    label_prefix: str = ""  # labels made from data (kube_node_labels' label_<key>)

    def has_label(self, label: str) -> bool:
        """Whether the exporter writes ``label`` on this family."""
        return label in self.labels or bool(
            self.label_prefix and label.startswith(self.label_prefix)
        )

    def sample_names(self) -> frozenset[str]:
        """Names of the samples this family exposes."""
        if self.kind == "histogram":
            return frozenset(f"{self.name}{s}" for s in ("_bucket", "_count", "_sum"))
        if self.kind == "summary":
            return frozenset({self.name, f"{self.name}_count", f"{self.name}_sum"})
        return frozenset({self.name})


@dataclass(frozen=True)
class Catalog:
    """The families one exporter of one version exposes."""

    exporter: str
    version: str
    families: tuple[MetricFamily, ...]

    def family_of(self, sample_name: str) -> MetricFamily | None:
        """The family exposing ``sample_name`` (``x_bucket`` belongs to histogram ``x``)."""
        for f in self.families:
            if sample_name in f.sample_names():
                return f
        return None


def _values(**kw: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
    return MappingProxyType({k: frozenset(v) for k, v in kw.items()})


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric components of a release string: ``"0.11.2"`` → ``(0, 11, 2)``."""
    m = re.match(r"^v?([0-9]+(?:\.[0-9]+)*)", text.strip())
    if m is None:
        raise ValueError(f"not a release version: {text!r}")
    return tuple(int(x) for x in m.group(1).split("."))


_VLLM_ENGINE = frozenset({"model_name", "engine"})


def vllm_catalog(version: str) -> Catalog:
    """vLLM's engine metrics and its HTTP layer's (prometheus-fastapi-instrumentator 8.0.2)."""
    v = parse_version(version)
    if v[:2] < VLLM_MIN_VERSION:
        raise ValueError(
            f"vLLM {version} is older than the oldest release whose metric names the reference "
            f"pins ({'.'.join(map(str, VLLM_MIN_VERSION))})"
        )
    reasons = FINISHED_REASONS + (("repetition",) if v[:2] >= _VLLM_REPETITION_FROM else ())
    fams: list[MetricFamily] = [
        MetricFamily(
            "vllm:num_requests_running", "gauge", "Requests in the engine's running batches.",
            _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:num_requests_waiting", "gauge",
            "Requests queued in the engine, not yet scheduled.", _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:kv_cache_usage_perc", "gauge", "Share of the KV cache in use, 0 to 1.",
            _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:request_success_total", "counter",
            "Requests the engine finished, by finish reason.",
            _VLLM_ENGINE | {"finished_reason"}, label_values=_values(finished_reason=reasons),
        ),
        MetricFamily(
            "vllm:num_preemptions_total", "counter", "Requests preempted by the engine.",
            _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:prompt_tokens_total", "counter", "Prompt tokens processed.",
            _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:generation_tokens_total", "counter", "Tokens generated.",
            _VLLM_ENGINE,
        ),
        MetricFamily(
            "vllm:time_to_first_token_seconds", "histogram",
            "Seconds from a request's arrival to its first output token.", _VLLM_ENGINE,
            buckets=VLLM_TTFT_BUCKETS_S,
        ),
        MetricFamily(
            "vllm:inter_token_latency_seconds", "histogram",
            "Seconds between consecutive output tokens, per engine step.", _VLLM_ENGINE,
            buckets=VLLM_ITL_BUCKETS_S,
        ),
        MetricFamily(
            "vllm:request_time_per_output_token_seconds", "histogram",
            "Mean seconds per output token of each finished request.", _VLLM_ENGINE,
            buckets=VLLM_ITL_BUCKETS_S,
        ),
        MetricFamily(
            "vllm:e2e_request_latency_seconds", "histogram",
            "Seconds from a request's arrival to its end.", _VLLM_ENGINE,
            buckets=VLLM_REQUEST_LATENCY_BUCKETS_S,
        ),
        MetricFamily(
            "vllm:request_queue_time_seconds", "histogram",
            "Seconds a request spent queued before running.", _VLLM_ENGINE,
            buckets=VLLM_REQUEST_LATENCY_BUCKETS_S,
        ),
        MetricFamily(
            "http_requests_total", "counter", "HTTP requests by route, method and status class.",
            frozenset({"handler", "method", "status"}),
            label_values=_values(status=HTTP_STATUS_GROUPS),
        ),
        MetricFamily(
            "http_request_duration_seconds", "histogram",
            "HTTP request seconds by route and method.", frozenset({"handler", "method"}),
            buckets=HTTP_DURATION_BUCKETS_S,
        ),
    ]  # fmt: skip
    if v[:2] < _VLLM_TPOT_HIDDEN_FROM:
        fams.append(
            MetricFamily(
                "vllm:time_per_output_token_seconds",
                "histogram",
                "Seconds between consecutive output tokens (the name before "
                "vllm:inter_token_latency_seconds).",
                _VLLM_ENGINE,
                buckets=VLLM_ITL_BUCKETS_S,
            )
        )
    return Catalog("vllm", version, tuple(fams))


# --- dcgm-exporter -------------------------------------------------------------------------------

# The release whose default-counters.csv the reference read (tag 4.5.3-4.8.2). Releases after it
# carry the host as ``hostname`` (#655); it and older ones as ``Hostname``.
DCGM_DEFAULT_VERSION = "4.5.3-4.8.2"
_DCGM_HOSTNAME_RENAMED_AFTER = (4, 5, 3)
_DCGM_MIN_VERSION = (4,)

_DCGM_GPU = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION",
     "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container"}
)  # fmt: skip

# (name, kind, help, default_on); help texts in our words, after the reference's meanings.
_DCGM_FIELDS: tuple[tuple[str, Kind, str, bool], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock, MHz.", True),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock, MHz.", True),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature, degrees C.", True),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature, degrees C.", True),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw, W.", True),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Energy used since boot, mJ.", True),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe replays (retries).", True),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization, percent.", True),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory copy utilization, percent.", True),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization, percent.", True),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization, percent.", True),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Code of the most recent XID (not a count).", True),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Free framebuffer memory, MiB.", True),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Used framebuffer memory, MiB.", True),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Reserved framebuffer memory, MiB.", True),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "NVLink traffic over all lanes.", True),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU licence status.", True),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Rows remapped after uncorrectable errors.", True),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Rows remapped after correctable errors.", True),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 when a row remap failed.", True),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
     "Share of time the graphics engine is busy, 0 to 1.", True),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Share of cycles the tensor pipe is busy, 0 to 1.", True),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Share of cycles device memory is moving data, 0 to 1.", True),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe bytes sent per second.",
     True),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe bytes received per second.",
     True),
    # Commented out in default-counters.csv: absent unless the operator's CSV enables them.
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit ECC errors since the driver loaded.",
     False),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit ECC errors since the driver loaded.",
     False),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Single-bit ECC errors over the GPU's life.",
     False),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Double-bit ECC errors over the GPU's life.",
     False),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Pages retired after single-bit errors.", False),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Pages retired after double-bit errors.", False),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Pages waiting to be retired.",
     False),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Time throttled by the power limit, ns.", False),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Time throttled by temperature, ns.", False),
    # Not in the CSV at all: only a custom CSV naming field 396 makes the exporter emit it.
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "1 when a row remap waits for a GPU reset.", False),
)  # fmt: skip


def dcgm_host_label(version: str) -> str:
    """The label carrying the node's name: ``Hostname`` up to 4.5.3-4.8.2, ``hostname`` after."""
    v = parse_version(version)
    return "Hostname" if v[:3] <= _DCGM_HOSTNAME_RENAMED_AFTER else "hostname"


def dcgm_catalog(version: str) -> Catalog:
    """dcgm-exporter's fields: the default CSV's, plus the commented-out ones (``default_on``
    False) a custom CSV can enable."""
    v = parse_version(version)
    if v[:1] < _DCGM_MIN_VERSION:
        raise ValueError(
            f"dcgm-exporter {version} is older than the 4.x releases whose counters the "
            "reference pins"
        )
    labels = _DCGM_GPU | {dcgm_host_label(version)}
    fams = [
        MetricFamily(
            name,
            kind,
            help_text,
            labels | ({"err_code", "err_msg"} if name == "DCGM_FI_DEV_XID_ERRORS" else set()),
            default_on=on,
        )
        for name, kind, help_text, on in _DCGM_FIELDS
    ]
    return Catalog("dcgm-exporter", version, tuple(fams))


def dcgm_optional_fields() -> tuple[str, ...]:
    """Fields a custom counters CSV can add (off in the default CSV)."""
    return tuple(name for name, _, _, on in _DCGM_FIELDS if not on)


# --- kube-state-metrics --------------------------------------------------------------------------

KUBE_STATE_METRICS = Catalog(
    "kube-state-metrics",
    "2.20",
    (
        MetricFamily(
            "kube_node_status_condition", "gauge", "A node's condition: 1 on its current status.",
            frozenset({"node", "condition", "status"}),
            label_values=_values(status=("true", "false", "unknown")),
        ),
        MetricFamily(
            "kube_node_spec_taint", "gauge", "A taint on a node (1 per taint).",
            frozenset({"node", "key", "value", "effect"}),
        ),
        MetricFamily(
            "kube_node_labels", "gauge", "A node's allow-listed labels as label_<key>.",
            frozenset({"node"}), label_prefix="label_",
        ),
        MetricFamily(
            "kube_node_spec_unschedulable", "gauge",
            "1 when a node is cordoned.", frozenset({"node"}),
        ),
        MetricFamily(
            "kube_pod_status_ready", "gauge",
            "A pod's Ready condition (true, false, unknown).",
            frozenset({"namespace", "pod", "uid", "condition"}),
        ),
        MetricFamily(
            "kube_deployment_status_replicas_available", "gauge",
            "Available replicas of a Deployment.",
            frozenset({"namespace", "deployment"}),
        ),
        MetricFamily(
            "kube_deployment_spec_replicas", "gauge",
            "Desired replicas of a Deployment.", frozenset({"namespace", "deployment"}),
        ),
    ),
)  # fmt: skip

# Labels a series gets at scrape time from a ServiceMonitor/PodMonitor target (prometheus-operator)
# and the ones firedrill's generated monitors add by relabeling.
SCRAPE_TARGET_LABELS = frozenset(
    {"namespace", "service", "pod", "container", "endpoint", "job", "instance"}
)
FIREDRILL_TARGET_LABELS = frozenset({"cell", "region"})
