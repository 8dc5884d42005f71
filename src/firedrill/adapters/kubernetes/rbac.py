"""Least-privilege RBAC derived from the requests the adapter actually sends.

Nobody writes firedrill's Roles by hand. The deployment's flows (the controller's remediation,
the responder's levers, the conductor's Workflow) run against the replaying apiserver; every
``ApiCall`` they make becomes a ``Permission`` (API group, resource or subresource, RBAC verb,
namespace or cluster-wide), and ``rbac_manifests`` turns a component's permissions into one
ClusterRole for what is cluster-scoped (nodes, ClusterQueues, and lists across namespaces) and
one Role per namespace for the rest, each bound to the component's ServiceAccount. No wildcard
can appear (every verb and resource is one that was used) and nothing is bound to cluster-admin.
A dry-run request is authorised exactly like the real one, so advising needs the same grants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from firedrill.adapters.kubernetes.transport import ApiCall

__all__ = ["Permission", "allows", "permissions", "rbac_manifests"]


@dataclass(frozen=True)
class Permission:
    group: str
    resource: str  # plural, or plural/subresource
    verb: str
    namespace: str | None  # None: cluster-scoped, or across every namespace


def permissions(calls: Iterable[ApiCall]) -> set[Permission]:
    """What the apiserver had to authorise for these requests."""
    out = set()
    for c in calls:
        t = c.target
        resource = t.plural if t.subresource is None else f"{t.plural}/{t.subresource}"
        out.add(Permission(t.group, resource, c.verb, t.namespace))
    return out


def _rules(perms: Iterable[Permission]) -> list[dict[str, Any]]:
    by: dict[tuple[str, str], set[str]] = {}
    for p in perms:
        by.setdefault((p.group, p.resource), set()).add(p.verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
        for (group, resource), verbs in sorted(by.items())
    ]


def rbac_manifests(
    component: str, namespace: str, perms: Iterable[Permission]
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole(+Binding) and Roles(+Bindings) granting exactly ``perms``."""
    name = f"firedrill-{component}"
    perms = sorted(set(perms), key=lambda p: (p.namespace or "", p.group, p.resource, p.verb))
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    labels = {"app.kubernetes.io/name": "firedrill", "app.kubernetes.io/component": component}
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        }
    ]
    cluster = [p for p in perms if p.namespace is None]
    if cluster:
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name, "labels": labels},
                "rules": _rules(cluster),
            }
        )
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name, "labels": labels},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [subject],
            }
        )
    for ns in sorted({p.namespace for p in perms if p.namespace is not None}):
        rules = _rules(p for p in perms if p.namespace == ns)
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "rules": rules,
            }
        )
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [subject],
            }
        )
    return out


def allows(manifests: Iterable[dict[str, Any]], account: str, p: Permission) -> bool:
    """Whether the RBAC objects grant ``account`` (``ns/name``) permission ``p`` (no wildcards
    are honoured: a wildcard grant is exactly what must never be needed)."""
    docs = list(manifests)
    ns, _, sa = account.partition("/")
    bound: list[tuple[str, str, str | None]] = []  # (kind, role name, binding namespace)
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if any(
            s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace") == ns
            for s in d.get("subjects", [])
        ):
            where = d["metadata"].get("namespace") if d["kind"] == "RoleBinding" else None
            bound.append((d["roleRef"]["kind"], d["roleRef"]["name"], where))
    for kind, role, where in bound:
        if p.namespace is None and where is not None:
            continue  # a RoleBinding grants inside its namespace only
        if where is not None and p.namespace != where:
            continue
        for d in docs:
            if d["kind"] != kind or d["metadata"]["name"] != role:
                continue
            if kind == "Role" and d["metadata"].get("namespace") != where:
                continue
            for rule in d.get("rules", []):
                if (
                    p.group in rule.get("apiGroups", [])
                    and p.resource in rule.get("resources", [])
                    and p.verb in rule.get("verbs", [])
                ):
                    return True
    return False
