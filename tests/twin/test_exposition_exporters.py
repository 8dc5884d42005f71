"""The twin's /metrics, as a real vLLM / dcgm-exporter fleet writes it, checked by promtool.

A scrape of the demo fleet (inference and training JobSets) and one of the prefill/decode fleet
are rendered the way ``twin serve`` renders them (``exporter_labels`` then
``to_prometheus_text``), after operations that make every sparse family appear too (each DCGM
field, a thermal GPU, a quarantine taint, a cordon, a node label): every family the twin writes
is in them. They are held to the reference lists (``firedrill.model.exporters``): each exporter
family's name, type, help text, labels and ``le`` boundaries. ``promtool check metrics`` must
find nothing but what it finds in the real exporters' own output too (the colon of vLLM's names
and dcgm-exporter's counters without ``_total``): every firedrill family is clean.
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

from firedrill.model import operations as ops
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
from firedrill.twin.operations import QUARANTINE_TAINT
from firedrill.twin.remediation import DCGM_NAMES

ROOT = Path(__file__).resolve().parents[2]
CATALOG: dict[str, MetricFamily] = {
    f.name: f
    for cat in (vllm_catalog("0.11.0"), dcgm_catalog("4.5.3-4.8.2"), KUBE_STATE_METRICS)
    for f in cat.families
}
# What promtool's linter says of the real exporters' own names; firedrill's own get nothing.
ALLOWED_LINT = (
    (re.compile(r"^vllm:"), "metric names should not contain ':'"),
    (
        re.compile(r"^DCGM_FI_DEV_(PCIE_REPLAY_COUNTER|ECC_DBE_VOL_TOTAL|POWER_VIOLATION)$"),
        'should have "_total"',
    ),
    (re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER$"), "should not include type 'counter'"),
)
FLEETS = ("examples/fleet.yaml", "examples/fleet-pd.yaml")


def _sparse_families_appear(twin: Twin) -> None:
    """Operations after which the families written only on an event have a series."""
    node = twin.nodes[0].name
    for fid in DCGM_NAMES:
        twin.apply(ops.InjectDcgmField(node, 3, fid, 1.0))
    twin.apply(ops.InjectThermal(node, 2))
    twin.apply(ops.Taint(node, QUARANTINE_TAINT, "xid79", "NoSchedule"))
    twin.apply(ops.Cordon(twin.nodes[1].name))
    twin.apply(ops.Label(twin.nodes[2].name, "gpu.corp/burn-in", "passed"))


def _scrape(fleet: str) -> tuple[str, set[str]]:
    """One scrape of ``fleet`` after 5 minutes, and the name of every family the twin wrote."""
    spec = load_fleet(ROOT / fleet)
    twin = Twin(spec, 0, hours_hint=1.0)
    for k in range(round(300 / spec.dt_s)):
        if k == 10:
            _sparse_families_appear(twin)
        twin.step()
    t = twin.store.times[-1]
    series = [
        Series(s.name.split("|", 1)[0], s.labels, s.t_s, s.values)
        for name in twin.series_names()
        for s in twin.query(name, start_s=t, end_s=t)
    ]
    written = {k.split("|", 1)[0] for k in twin.store.families} | set(twin.store.sparse)
    return to_prometheus_text(exporter_labels(series)), written


@pytest.fixture(scope="module")
def scrapes() -> dict[str, tuple[str, set[str]]]:
    return {fleet: _scrape(fleet) for fleet in FLEETS}


@pytest.fixture(scope="module")
def scrape(scrapes: dict[str, tuple[str, set[str]]]) -> str:
    return scrapes[FLEETS[0]][0]


def test_every_family_the_twin_writes_is_in_a_scrape(
    scrapes: dict[str, tuple[str, set[str]]],
) -> None:
    exposed: set[str] = set()
    for text, written in scrapes.values():
        names = set(_families(text))
        exposed |= names
        assert {re.sub(r"_(total|bucket|count|sum)$", "", w) for w in written} <= names
    # the families that exist only on some fleets or after an event are among them
    assert set(DCGM_NAMES.values()) <= exposed
    assert {"kube_node_spec_taint", "kube_node_spec_unschedulable", "kube_node_labels"} <= exposed
    assert {"gpu_quarantine_actions", "firedrill_pd_replicas", "kueue_pending_workloads"} <= exposed
    assert any(n.startswith("firedrill_jobset_") and "gpu_seconds" in n for n in exposed)


@pytest.mark.parametrize("fleet", FLEETS)
def test_promtool_check_metrics_finds_only_what_the_real_exporters_get(
    scrapes: dict[str, tuple[str, set[str]]], fleet: str
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found; install the Debian package prometheus", pytrace=False)
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=scrapes[fleet][0],
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert findings, "promtool found nothing at all: was the exposition empty?"
    unexpected = []
    for line in findings:
        name, _, problem = line.partition(" ")
        if not any(pat.search(name) and msg in problem for pat, msg in ALLOWED_LINT):
            unexpected.append(line)
    assert unexpected == []
    assert not any(line.startswith(("firedrill_", "gpu_", "kube")) for line in findings)
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
