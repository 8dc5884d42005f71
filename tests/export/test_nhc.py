"""The NodeHealthCheck export mirrors the policy and says what firedrill enforces instead."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.export.nhc import NOT_EXPRESSIBLE, node_health_check
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
