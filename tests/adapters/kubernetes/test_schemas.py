"""The schema checker itself: it catches what the apiserver would refuse, and it checks every
other manifest firedrill writes for a cluster against the upstream CRDs (PrometheusRule,
NodeHealthCheck, Schedule), not only what the adapter sends."""

from __future__ import annotations

import copy
from pathlib import Path

from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.detect.rules import generate
from firedrill.detect.slo import SloSpec
from firedrill.export.nhc import node_health_check
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_spec

ROOT = Path(__file__).resolve().parents[3]


def test_generated_prometheus_rules_fit_the_operator_crd(validator: SchemaValidator) -> None:
    for slo in ("slo.yaml", "slo-train.yaml"):
        spec = load_spec(ROOT / "examples" / slo, SloSpec)
        rule = generate(spec).prometheus_rule(name="firedrill-slo")
        assert validator.problems(rule) == [], slo
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"  # not a duration
    assert validator.problems(broken)


def test_the_checker_refuses_what_the_apiserver_would(validator: SchemaValidator) -> None:
    nhc = node_health_check(PolicySpec(), name="gpu")
    assert validator.problems(nhc) == []
    assert validator.problems({**nhc, "apiVersion": "remediation.medik8s.io/v1beta9"})  # no such
    assert any("metadata.name" in p for p in validator.problems(
        {**nhc, "metadata": {"name": "Not_A_DNS_Name"}}))  # fmt: skip
    assert any("labels" in p for p in validator.problems(
        {**nhc, "metadata": {"name": "gpu", "labels": {"a": "x" * 64}}}))  # fmt: skip
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert validator.problems(unknown) == ["example.com/v1 Widget: no schema to check it against"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": 3}]}}  # fmt: skip
    assert validator.problems(pod)
    assert validator.checked["Pod"] >= 1
