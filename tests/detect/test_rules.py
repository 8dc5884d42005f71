"""Generated rules: accepted by promtool, alerts carry the labels routing needs, guards hold."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.detect.evaluator import BurnRateEvaluator, prom_increase
from firedrill.detect.rules import generate
from firedrill.detect.slo import Objective, SloSpec
from firedrill.model.series import Labels, Series, labels_of
from firedrill.specfile import load_spec

SLO = "examples/slo.yaml"


@pytest.fixture(scope="module")
def spec() -> SloSpec:
    return load_spec(SLO, SloSpec)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_promtool_accepts_the_rule_file(tmp_path: Path, spec: SloSpec) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(generate(spec).rule_file(), sort_keys=False, width=1000))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_prometheus_rule_manifest_has_the_same_groups(spec: SloSpec) -> None:
    rs = generate(spec)
    manifest = rs.prometheus_rule(name="slos")
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == rs.rule_file()["groups"]


def test_sloth_recording_names_and_burn_tier_labels(spec: SloSpec) -> None:
    rules = [r for g in generate(spec).groups for r in g["rules"]]
    records = {r["record"] for r in rules if "record" in r}
    for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d"):
        assert f"slo:sli_error:ratio_rate{w}" in records
    burn = [r for r in rules if r.get("alert", "").startswith("Cell")]
    assert len(burn) == 4 * len(spec.objectives)
    assert {r["labels"]["burn_tier"] for r in burn} == {"fast", "slow", "drift", "budget"}
    fast = next(r for r in burn if r["alert"] == "CellTTFTBurnFast")
    assert fast["labels"]["severity"] == "page"
    assert "> 0.144" in fast["expr"]  # 14.4 x (1 - 0.99)
    assert "ratio_rate1h" in fast["expr"]
    assert "ratio_rate5m" in fast["expr"]


UNIT_TEST = """
rule_files: [rules.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-a-0001",gpu="3",cell="use1-a",region="us-east-1"}'
        values: '0x20 79x40'
      - series: 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-a-0002",gpu="1",cell="use1-a",region="us-east-1"}'
        values: '0x20 13x40'
      - series: 'gpu_quarantine_actions_total{node="gpu-a-0001",cell="use1-a",region="us-east-1"}'
        values: '0+0x10 1+0x50'
      - series: 'gpu_quarantine_actions_total{node="gpu-a-0009",cell="use1-b",region="us-east-1"}'
        values: '0+1x60'
      - series: >-
          firedrill_sandbox_connections_total{dest_class="metadata",tenant="acme",
          cell="use1-a",region="us-east-1"}
        values: '0x20 1x40'
      - series: 'firedrill_registry_errors_total{code="503",region="us-east-1"}'
        values: '0+50x60'
    alert_rule_test:
      - eval_time: 10m
        alertname: DCGMXidFatal
        exp_alerts:
          - exp_labels: {severity: ticket, team: gpu-fleet, Hostname: gpu-a-0001, node: gpu-a-0001,
                         gpu: "3", cell: use1-a, region: us-east-1}
            exp_annotations: {summary: "XID 79 on gpu-a-0001 GPU 3"}
      - eval_time: 10m
        alertname: SandboxMetadataAccess
        exp_alerts:
          - exp_labels: {severity: security, team: security, tenant: acme, cell: use1-a,
                         region: us-east-1}
            exp_annotations: {summary: "A sandbox of acme reached the metadata endpoint"}
      - eval_time: 10m
        alertname: HydrateOrigin5xx
        exp_alerts:
          - exp_labels: {severity: ticket, team: release, code: "503", region: us-east-1,
                         cell: "region:us-east-1"}
            exp_annotations: {summary: "HydrateOrigin5xx in region:us-east-1"}
      - eval_time: 15m
        alertname: QuarantineRateAnomalous
        exp_alerts:
          - exp_labels: {severity: page, team: gpu-fleet, cell: use1-b, region: us-east-1}
            exp_annotations:
              summary: "Auto-remediation quarantined >20 nodes/h in use1-b: suspect exporter \\
                or rollout, consider pausing automation"
      - eval_time: 15m
        alertname: DCGMXidAppRepeated
        exp_alerts: []
"""


def test_cause_guardrail_and_security_alerts_in_the_real_rule_engine(
    tmp_path: Path, spec: SloSpec
) -> None:
    """XID 79 tickets with a node label, XID 13 alone does not; >20 quarantines/h in a cell
    pages; a sandbox reaching the metadata endpoint pages security; region alerts get a cell."""
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump(generate(spec).rule_file(), sort_keys=False, width=1000)
    )
    (tmp_path / "test.yml").write_text(UNIT_TEST)
    result = _promtool("test", "rules", str(tmp_path / "test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_aggregation_keeps_the_cell_label(spec: SloSpec) -> None:
    """An aggregation without ``cell`` would make an alert that inhibits fleet-wide."""
    for group in generate(spec).groups:
        for r in group["rules"]:
            for by in re.findall(r"by \(([^)]*)\)", r["expr"]):
                labels = {x.strip() for x in by.split(",")}
                adds_cell = "label_replace(" in r["expr"] and '"cell"' in r["expr"]
                assert "cell" in labels or adds_cell, (r.get("alert") or r.get("record"), by)


class FakeSignals:
    """Two counters per cell, advanced by the test: a minimal Signals for the evaluator."""

    def __init__(self, cells: Sequence[str]) -> None:
        self.t = 0.0
        self.cells = list(cells)
        self.ok = np.zeros(len(cells))
        self.bad = np.zeros(len(cells))

    def series_names(self) -> Sequence[str]:
        return ["http_requests_total"]

    def query(
        self, name: str, matchers: Mapping[str, str] | None = None, *, start_s: float, end_s: float
    ) -> Sequence[Series]:
        return []

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        status = (matchers or {}).get("status", "2xx")
        labels = [labels_of(cell=c, region="r", model_name="m", status=status) for c in self.cells]
        return self.t, labels, (self.bad if status == "5xx" else self.ok).copy()


def _availability_spec(min_events: int) -> SloSpec:
    return SloSpec(
        objectives=[
            Objective(
                name="a",
                product="p",
                model="m",
                sli="availability",
                target=0.999,
                min_events_per_hour=min_events,
            )
        ]
    )


def test_low_traffic_cell_does_not_page_on_one_failure_in_ten() -> None:
    sig = FakeSignals(["quiet", "busy"])
    ev = BurnRateEvaluator(_availability_spec(100), sig)
    fired: set[str] = set()
    for _ in range(240):  # one hour of 15 s evaluations
        sig.t += 15.0
        sig.ok += np.array([10 / 240, 2000 / 240])  # 10 vs 2,000 requests per hour
        sig.bad += np.array([1 / 240, 200 / 240])  # both at 10% errors
        fired |= {e.label("cell") for e in ev.evaluate() if e.state == "firing"}
    assert "busy" in fired
    assert "quiet" not in fired


def test_fast_burn_fires_within_the_workbook_time() -> None:
    # 100% errors: (1 - SLO) / error ratio x window x burn rate = 0.001 x 1 h x 14.4 = 52 s
    sig = FakeSignals(["c"])
    ev = BurnRateEvaluator(_availability_spec(0), sig)
    fired_at = None
    for _ in range(8):
        sig.t += 15.0
        sig.ok += 100.0
        ev.evaluate()
    start = sig.t
    while fired_at is None and sig.t < start + 600:
        sig.t += 15.0
        sig.bad += 100.0
        for e in ev.evaluate():
            if e.alertname == "CellAvailabilityBurnFast" and e.state == "firing":
                fired_at = sig.t - start
    assert fired_at is not None
    assert fired_at <= 60.0 + 15.0


def test_prom_increase_extrapolates_like_prometheus() -> None:
    # samples every 15 s covering the whole window: no extrapolation needed
    inc = prom_increase(np.array([0.0]), np.array([100.0]), 0.0, 300.0, 21, 0.0, 300.0)
    assert inc[0] == pytest.approx(100.0)
    # window starts 7.5 s before the first sample (< 1.1 x 15 s): extrapolate to the start
    inc = prom_increase(np.array([50.0]), np.array([150.0]), 7.5, 307.5, 21, 0.0, 307.5)
    assert inc[0] == pytest.approx(100.0 * 307.5 / 300.0)
    # a counter that starts near zero is not extrapolated past its zero crossing
    inc = prom_increase(np.array([1.0]), np.array([101.0]), 100.0, 400.0, 21, 0.0, 400.0)
    assert inc[0] == pytest.approx(100.0 * (300.0 + 3.0) / 300.0)
    # a single sample gives no value
    assert np.isnan(prom_increase(np.array([1.0]), np.array([1.0]), 5.0, 5.0, 1, 0.0, 5.0)[0])


runner = CliRunner()


def test_cli_generate_then_check(tmp_path: Path) -> None:
    result = runner.invoke(app, ["rules", "generate", SLO, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for f in ("rules.yml", "prometheusrule.yaml", "alertmanager.yml"):
        assert (tmp_path / f).is_file()
    result = runner.invoke(app, ["rules", "check", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "ok promtool" in result.output
    assert "ok amtool" in result.output


def test_cli_check_fails_on_a_broken_rule_file(tmp_path: Path) -> None:
    runner.invoke(app, ["rules", "generate", SLO, "--out", str(tmp_path)])
    (tmp_path / "rules.yml").write_text(
        "groups:\n- name: x\n  rules:\n  - alert: A\n    expr: sum(\n"
    )
    result = runner.invoke(app, ["rules", "check", str(tmp_path)])
    assert result.exit_code == 1
    assert "FAILED promtool" in result.output


def test_cli_bad_slo_spec_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "slo.yaml"
    bad.write_text(Path(SLO).read_text().replace("target: 0.999", "target: 1.5", 1))
    result = runner.invoke(app, ["rules", "generate", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 4
    line = next(i for i, ln in enumerate(bad.read_text().splitlines(), 1) if "1.5" in ln)
    assert f"slo.yaml:{line}" in result.output
    assert not (tmp_path / "o").exists()
