"""The NodeHealthCheck export mirrors the policy and says what firedrill enforces instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from firedrill.adapters.kubernetes.schemas import SchemaValidator, crd_directory
from firedrill.cli import app
from firedrill.export.nhc import CONDITION_SOURCES, NOT_EXPRESSIBLE, node_health_check
from firedrill.remediate.policy import Budgets, Fields, Modules, PolicySpec, Timings

runner = CliRunner()


def test_manifest_mirrors_the_policy() -> None:
    policy = PolicySpec(budgets=Budgets(min_healthy=0.85), timings=Timings(hold_observations=4))
    m = node_health_check(policy, name="gpu-nodes-use1-a", cell="use1-a")
    assert m["apiVersion"] == "remediation.medik8s.io/v1alpha1"
    assert m["kind"] == "NodeHealthCheck"
    spec = m["spec"]
    assert spec["minHealthy"] == "85%"
    assert spec["selector"]["matchLabels"] == {
        "nvidia.com/gpu.present": "true",
        "topology.corp/cell": "use1-a",
    }
    types = {c["type"]: c for c in spec["unhealthyConditions"]}
    assert types["Ready"] == {"type": "Ready", "status": "False", "duration": "300s"}
    assert types["GpuXidCritical"]["duration"] == "60s"  # 4 observations x 15 s
    assert spec["remediationTemplate"]["kind"] == "SelfNodeRemediationTemplate"
    assert "flapping" in m["metadata"]["annotations"]["firedrill.dev/enforced-outside-nhc"]


def test_disabled_or_unmapped_conditions_are_left_out() -> None:
    policy = PolicySpec(fields=Fields(ecc_dbe=None), modules=Modules(pcie=False))
    types = [c["type"] for c in node_health_check(policy, name="x")["spec"]["unhealthyConditions"]]
    assert "GpuEccDoubleBit" not in types
    assert "GpuPcieReplayStorm" not in types
    assert "GpuXidCritical" in types


def test_cli_writes_yaml_with_the_enforced_outside_list() -> None:
    result = runner.invoke(app, ["export", "nhc", "examples/policy.yaml", "--name", "gpu"])
    assert result.exit_code == 0, result.output
    for line in NOT_EXPRESSIBLE:
        assert line in result.stdout
    doc = yaml.safe_load(result.stdout)
    assert doc["metadata"]["name"] == "gpu"
    assert doc["spec"]["minHealthy"] == "90%"


def test_schemas_for_every_spec() -> None:
    for kind, key in (("policy", "budgets"), ("scenario", "timeline"), ("slo", "objectives")):
        result = runner.invoke(app, ["schema", kind])
        assert result.exit_code == 0
        assert key in json.loads(result.stdout)["properties"]


def test_the_manifest_fits_the_upstream_crd_and_names_who_sets_each_condition() -> None:
    crds = crd_directory(Path(__file__).resolve().parents[2], os.environ)
    if crds is None:
        pytest.skip("upstream CRDs not found: set FIREDRILL_CRD_DIR to shared/reference/crds")
    validator = SchemaValidator(crds)
    m = node_health_check(PolicySpec(), name="gpu-nodes-use1-a", cell="use1-a")
    assert validator.problems(m) == []
    sources = m["metadata"]["annotations"]["firedrill.dev/condition-sources"]
    for cond in m["spec"]["unhealthyConditions"]:
        assert f"{cond['type']}: {CONDITION_SOURCES[cond['type']]}" in sources
    assert "kubelet" in CONDITION_SOURCES["Ready"]
    assert all("not set by anything by default" in v for k, v in CONDITION_SOURCES.items()
               if k != "Ready")  # fmt: skip
    broken = json.loads(json.dumps(m))
    broken["spec"]["unhealthyConditions"][0]["duration"] = "five minutes"
    assert validator.problems(broken)  # the CRD's duration pattern catches it
