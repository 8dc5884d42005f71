"""Every object firedrill sends or renders, checked against the real schemas before it counts.

Core kinds (Node, Pod, Eviction, Job, ConfigMap, Lease, Role, ...) are checked with
kubernetes-validate's strict schemas for the newest Kubernetes it knows. Custom resources are
checked against the ``openAPIV3Schema`` of the upstream CustomResourceDefinition the cluster
would serve (JobSet, Kueue, Chaos Mesh incl. Workflow/Schedule, Kyverno, PrometheusRule,
ServiceMonitor/PodMonitor, NodeHealthCheck), read from a directory of unmodified CRD files.
The check is strict, as the apiserver's strict field validation is: an object that declares
properties accepts no others unless the schema says ``x-kubernetes-preserve-unknown-fields``.
The CRD's own ``metadata`` schema is only ``type: object``, so object metadata is checked here
the way the apiserver checks it (DNS-1123 names, label keys and values).

An unknown kind is a problem, not a pass: a body nobody can check is reported as such.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

__all__ = ["SchemaValidator", "crd_directory"]

KUBERNETES_VERSION = "1.37"
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
Obj = dict[str, Any]


def crd_directory(start: Path, env: Mapping[str, str]) -> Path | None:
    """The upstream CRDs: ``$FIREDRILL_CRD_DIR``, else ``shared/reference/crds`` above ``start``."""
    if env.get("FIREDRILL_CRD_DIR"):
        path = Path(env["FIREDRILL_CRD_DIR"])
        return path if path.is_dir() else None
    for parent in [start, *start.parents]:
        candidate = parent / "shared" / "reference" / "crds"
        if candidate.is_dir():
            return candidate
    return None


def _strict(schema: Any) -> Any:
    """``additionalProperties: false`` wherever properties are declared and unknowns not kept."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        if out.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        if out.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def _core_validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator | None:
    """kubernetes-validate's strict schema for a core kind, compiled once (its own ``validate``
    reads the definitions file on every call)."""
    version = [v for v in kv.all_versions() if kv.major_minor(v) <= KUBERNETES_VERSION][-1]
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = kv.schema_contents(f"{folder}/{kind.lower()}-{api}.json", KUBERNETES_VERSION)
    except FileNotFoundError:
        return None
    definitions = kv.schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry: Any = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


@cache
def _load_crd(path: Path) -> Obj:
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open() as fh:
        data: Obj = yaml.load(fh, Loader=loader)
    return data


def _metadata_problems(meta: Any) -> list[str]:
    if not isinstance(meta, dict):
        return ["metadata: not an object"]
    out = []
    name = meta.get("name") or meta.get("generateName", "").rstrip("-") or ""
    if not name:
        out.append("metadata.name: missing")
    elif len(name) > 253 or not DNS_1123_SUBDOMAIN.match(name):
        out.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    for where in ("labels", "annotations"):
        for k in meta.get(where) or {}:
            prefix, _, last = str(k).rpartition("/")
            if (prefix and not DNS_1123_SUBDOMAIN.match(prefix)) or not LABEL_NAME.match(last):
                out.append(f"metadata.{where}: bad key {k!r}")
            if len(last) > 63:
                out.append(f"metadata.{where}: key {k!r} longer than 63")
    for k, v in (meta.get("labels") or {}).items():
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            out.append(f"metadata.labels[{k}]: bad value {v!r}")
    return out


@dataclass
class SchemaValidator:
    """Checks objects against kubernetes-validate (core kinds) and upstream CRDs (the rest)."""

    crd_dir: Path | None = None
    _crds: dict[tuple[str, str], dict[str, jsonschema.Draft202012Validator]] = field(
        default_factory=dict
    )
    checked: dict[str, int] = field(default_factory=dict)  # kind -> objects checked

    def __post_init__(self) -> None:
        if self.crd_dir is None:
            return
        for path in sorted(self.crd_dir.glob("*.yaml")):
            crd = _load_crd(path)
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            versions = {
                v["name"]: jsonschema.Draft202012Validator(
                    _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
                )
                for v in spec["versions"]
                if v.get("served", True)
            }
            self._crds[(spec["group"], spec["names"]["kind"])] = versions

    @property
    def custom_kinds(self) -> list[str]:
        return sorted(f"{g}/{k}" for g, k in self._crds)

    def problems(self, obj: Obj) -> list[str]:
        """What is wrong with ``obj`` (empty: it fits its schema)."""
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = str(api_version).rpartition("/")
        self.checked[kind] = self.checked.get(kind, 0) + 1
        if (group, kind) in self._crds:
            versions = self._crds[(group, kind)]
            if version not in versions:
                return [f"{api_version} {kind}: the CRD serves {sorted(versions)}, not {version}"]
            body = {k: v for k, v in obj.items() if k != "metadata"}
            errors = sorted(versions[version].iter_errors(body), key=lambda e: list(e.path))
            out = [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors]
            return out + _metadata_problems(obj.get("metadata"))
        validator = _core_validator(str(kind), str(api_version))
        if validator is None:
            return [f"{api_version} {kind}: no schema to check it against"]
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
        out = [f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors]
        return out + _metadata_problems(obj.get("metadata"))

    def check_all(self, objs: Iterable[Obj]) -> list[str]:
        out = []
        for o in objs:
            name = (o.get("metadata") or {}).get("name", "?")
            out += [f"{o.get('kind')}/{name}: {p}" for p in self.problems(o)]
        return out
