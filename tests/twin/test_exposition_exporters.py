"""The twin's /metrics, as a real vLLM / dcgm-exporter fleet writes it, checked by promtool.

A scrape of the demo fleet is rendered the way ``twin serve`` renders it (``exporter_labels``
then ``to_prometheus_text``) and held to the reference lists (``firedrill.model.exporters``):
each exporter family's name, type, help text, labels and ``le`` boundaries. ``promtool check
metrics`` must find nothing but what it finds in the real exporters' own output too: the colon
of vLLM's names and dcgm-exporter's counters without ``_total``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from firedrill.model.exporters import (
    FIREDRILL_TARGET_LABELS,
    KUBE_STATE_METRICS,
    SCRAPE_TARGET_LABELS,
    MetricFamily,
    dcgm_catalog,
    vllm_catalog,
)
from firedrill.model.series import Series, labels_of
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.exposition import exporter_labels, to_openmetrics, to_prometheus_text

ROOT = Path(__file__).resolve().parents[2]
CATALOG: dict[str, MetricFamily] = {
    f.name: f
    for cat in (vllm_catalog("0.11.0"), dcgm_catalog("4.5.3-4.8.2"), KUBE_STATE_METRICS)
    for f in cat.families
}
# What promtool's linter says of the real exporters' own names, and of three twin-only series
# that count GPU-hours (a cost, not a duration).
ALLOWED_LINT = (
    (re.compile(r"^vllm:"), "metric names should not contain ':'"),
    (re.compile(r"^DCGM_FI_DEV_(PCIE_REPLAY_COUNTER|ECC_DBE_VOL_TOTAL)$"), 'should have "_total"'),
    (re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER$"), "should not include type 'counter'"),
    (re.compile(r"^firedrill_jobset_gpu_hours_"), 'use base unit "seconds" instead of "hours"'),
)


def _gpu_series(name: str, value: float) -> Series:
    # As the engine writes DCGM fields (its _gpu_labels): sparse, only once a field is set.
    labels = labels_of(Hostname="use1-a-h100-0001", gpu="3", cell="use1-a", region="us-east-1")
    return Series(name, labels, np.array([0.0, 15.0]), np.array([0.0, value]))


@pytest.fixture(scope="module")
def scrape() -> str:
    spec = load_fleet(ROOT / "examples/fleet.yaml")
    twin = Twin(spec, 0, hours_hint=1.0)
    for _ in range(round(300 / spec.dt_s)):
        twin.step()
    t = twin.store.times[-1]
    series = [
        Series(s.name.split("|", 1)[0], s.labels, s.t_s, s.values)
        for name in twin.series_names()
        for s in twin.query(name, start_s=t, end_s=t)
    ]
    series += [
        _gpu_series("DCGM_FI_DEV_XID_ERRORS", 79.0),
        _gpu_series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 5000.0),
        _gpu_series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
        _gpu_series("DCGM_FI_DEV_GPU_TEMP", 92.0),
    ]
    return to_prometheus_text(exporter_labels(series))


def test_promtool_check_metrics_finds_only_what_the_real_exporters_get(scrape: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found; install the Debian package prometheus", pytrace=False)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=scrape, capture_output=True, text=True, timeout=120
    )
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert findings, "promtool found nothing at all: was the exposition empty?"
    unexpected = []
    for line in findings:
        name, _, problem = line.partition(" ")
        if not any(pat.search(name) and msg in problem for pat, msg in ALLOWED_LINT):
            unexpected.append(line)
    assert unexpected == []
    assert not any("no help text" in line for line in findings)


def _families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_exporter_families_are_the_real_ones(scrape: str) -> None:
    families = _families(scrape)
    checked = 0
    for name, fam in families.items():
        real = CATALOG.get(name) or CATALOG.get(name + "_total")
        if name.startswith(("vllm:", "DCGM_", "http_", "kube_")):
            assert real is not None, f"{name}: no such family in the reference"
        if real is None:
            assert fam.documentation, name  # twin-only families have help text too
            continue
        checked += 1
        assert fam.type == real.kind, name
        assert fam.documentation == real.help, name
        allowed = real.labels | SCRAPE_TARGET_LABELS | FIREDRILL_TARGET_LABELS | {"le"}
        if name.startswith("http_"):
            allowed |= {"model_name"}  # copied from the pod by the generated ServiceMonitor
        for s in fam.samples:
            extra = {k for k in s.labels if k not in allowed and not real.has_label(k)}
            assert not extra, (name, sorted(extra))
        if real.kind == "histogram":
            les = {s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")}
            assert les == {repr(b) for b in real.buckets} | {"+Inf"}, name
    assert checked >= 10
    ttft = families["vllm:time_to_first_token_seconds"]
    assert all(s.labels.get("engine") == "0" for s in ttft.samples)
    xid = families["DCGM_FI_DEV_XID_ERRORS"].samples[0].labels
    assert xid["device"] == "nvidia3"
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", xid["UUID"])


def test_dcgm_counters_keep_their_real_names(scrape: str) -> None:
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in scrape
    assert "\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in scrape
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in scrape
    assert "# TYPE vllm:request_success_total counter\n" in scrape


def test_openmetrics_keeps_vllm_names() -> None:
    series = exporter_labels(
        [
            Series(
                "vllm:num_requests_running",
                labels_of(model_name="llm-70b", cell="a", region="r"),
                np.array([0.0]),
                np.array([3.0]),
            )
        ]
    )
    text = to_openmetrics(series, at_s=0.0, with_timestamps=False)
    assert '\nvllm:num_requests_running{cell="a",engine="0",' in text
    (fam,) = openmetrics_parser.text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
    assert fam.documentation == CATALOG["vllm:num_requests_running"].help
