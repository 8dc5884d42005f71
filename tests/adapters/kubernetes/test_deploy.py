"""The kustomize base under deploy/ is valid, consistent with the code, and least-privilege.

Every manifest fits its schema (kubernetes-validate strict for core kinds, the upstream Kyverno
CRD for the policy); the kustomization lists every file; each workload runs as the ServiceAccount
whose Role the RBAC test derived, never privileged, as non-root, read-only; the commands the
containers run exist; the policy is the example policy and the Kyverno policy is what
``firedrill export chaos-mesh`` writes for the L5 drill (regenerate with
``FIREDRILL_REGENERATE_RBAC=1``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.cli import app
from firedrill.export.chaos_mesh import kyverno_policy
from firedrill.specfile import load_drill

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "deploy" / "base"


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(BASE.glob("*.yaml")):
        if path.name in ("kustomization.yaml", "policy.yaml"):
            continue
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def test_the_kyverno_policy_is_the_exported_one() -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    text = (
        "# `firedrill export chaos-mesh examples/drills/l5-region-blackhole.yaml`'s policy:\n"
        "# chaos only in the allowlisted namespaces, never kube-system, always bounded.\n"
        + yaml.safe_dump(kyverno_policy(loaded.spec), sort_keys=False, width=100)
    )
    path = BASE / "kyverno-restrict-chaos.yaml"
    if os.environ.get("FIREDRILL_REGENERATE_RBAC"):
        path.write_text(text)
    assert path.read_text() == text


def test_every_manifest_fits_its_schema(validator: SchemaValidator) -> None:
    docs = _docs()
    assert {d["kind"] for _, d in docs} >= {
        "Namespace", "Deployment", "Service", "Job", "PersistentVolumeClaim", "ClusterRole",
        "Role", "RoleBinding", "ClusterRoleBinding", "ServiceAccount", "ClusterPolicy",
    }  # fmt: skip
    problems = validator.check_all(d for _, d in docs)
    assert problems == []
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted({name for name, _ in docs})
    assert (BASE / "policy.yaml").read_text() == (ROOT / "examples" / "policy.yaml").read_text()


def _pods(docs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for _, d in docs:
        if d["kind"] in ("Deployment", "Job"):
            out.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
    return out


def test_workloads_run_as_their_derived_accounts_unprivileged() -> None:
    docs = _docs()
    accounts = {d["metadata"]["name"] for _, d in docs if d["kind"] == "ServiceAccount"}
    pods = dict(_pods(docs))
    assert pods["firedrill-controller"]["serviceAccountName"] == "firedrill-controller"
    assert pods["firedrill-serve"]["serviceAccountName"] == "firedrill-levers"
    assert pods["firedrill-conduct"]["serviceAccountName"] == "firedrill-conductor"
    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name, pod in pods.items():
        assert pod["serviceAccountName"] in accounts, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert "privileged" not in sc
            if c["args"][0] == "serve" and "serve" not in commands:
                continue  # `firedrill serve` comes with the web service's module, not checked here
            assert c["args"][0] in commands, (name, c["args"])
    controller = pods["firedrill-controller"]["containers"][0]
    assert "--apply" not in controller["args"]  # the base advises; an overlay decides to act
    assert controller["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert controller["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (deploy,) = [d for _, d in docs if d["metadata"]["name"] == "firedrill-controller"
                 and d["kind"] == "Deployment"]  # fmt: skip
    assert deploy["spec"]["replicas"] >= 2  # a standby behind the Lease


def test_kustomize_builds_the_base_and_every_object_fits(validator: SchemaValidator) -> None:
    import shutil
    import subprocess

    import pytest

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed: build not run")
    out = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert validator.check_all(docs) == []
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["name"].startswith("firedrill-policy-")  # content-hashed name ...
    (ctl,) = [
        d for d in docs if d["kind"] == "Deployment" and "controller" in d["metadata"]["name"]
    ]
    volume = ctl["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert volume == cm["metadata"]["name"]  # ... and the Deployment follows it
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "firedrill" for d in docs)
