"""An apiserver that answers through ``httpx2.MockTransport``: enough of Kubernetes to be honest.

No apiserver can run here, so the adapter's traffic is replayed against this one. It keeps
objects by (group, plural, namespace, name) with a cluster-wide ``resourceVersion`` counter and
answers the way the apiserver's API conventions say, with ``Status`` bodies of the same shape:

- GET / LIST (``labelSelector`` equality terms, ``fieldSelector`` ``spec.nodeName`` and
  ``metadata.name``), watches (``watch=true``: events after ``resourceVersion``, a BOOKMARK when
  ``allowWatchBookmarks=true``, an ERROR event with a 410 ``Expired`` Status when the requested
  version is older than the compaction point);
- POST (``generateName`` gets a counter suffix; 409 ``AlreadyExists``), DELETE, merge PATCH
  (RFC 7386) with the ``metadata.resourceVersion`` precondition (409 ``Conflict``);
- ``dryRun=All``: validated and answered, never stored, no version bump;
- the Eviction subresource honours PodDisruptionBudgets (``minAvailable`` / ``maxUnavailable``,
  integers): a refused eviction is a 429 ``TooManyRequests``, as the apiserver sends;
- scripted failures: ``fail(METHOD, PATH_REGEX, status, times)`` for 403/409/429/500 and outages;
- every body it would store is checked by ``validate`` (the real schemas, see schemas.py), the
  resulting object after a patch included; violations are answered 422 ``Invalid`` and kept in
  ``violations`` so a test can assert there were none.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import httpx2

from firedrill.adapters.kubernetes.transport import parse_path

Obj = dict[str, Any]
Validator = Callable[[Obj], list[str]]

KINDS = {
    ("", "nodes"): ("v1", "Node", False),
    ("", "pods"): ("v1", "Pod", True),
    ("", "configmaps"): ("v1", "ConfigMap", True),
    ("apps", "deployments"): ("apps/v1", "Deployment", True),
    ("batch", "jobs"): ("batch/v1", "Job", True),
    ("policy", "poddisruptionbudgets"): ("policy/v1", "PodDisruptionBudget", True),
    ("coordination.k8s.io", "leases"): ("coordination.k8s.io/v1", "Lease", True),
    ("jobset.x-k8s.io", "jobsets"): ("jobset.x-k8s.io/v1alpha2", "JobSet", True),
    ("kueue.x-k8s.io", "clusterqueues"): ("kueue.x-k8s.io/v1beta2", "ClusterQueue", False),
    ("keda.sh", "scaledobjects"): ("keda.sh/v1alpha1", "ScaledObject", True),
    ("chaos-mesh.org", "workflows"): ("chaos-mesh.org/v1alpha1", "Workflow", True),
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def status(code: int, reason: str, message: str, **details: Any) -> httpx2.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    headers = {"Content-Type": "application/json"}
    if code == 429:
        headers["Retry-After"] = "1"
    return httpx2.Response(code, headers=headers, content=json.dumps(body).encode())


def ok(obj: Obj, code: int = 200) -> httpx2.Response:
    return httpx2.Response(
        code, headers={"Content-Type": "application/json"}, content=json.dumps(obj).encode()
    )


@dataclass
class Failure:
    method: str
    path: re.Pattern[str]
    status: int  # 0: the connection fails (an outage)
    times: int
    reason: str


@dataclass
class FakeApiServer:
    validate: Validator | None = None
    objects: dict[tuple[str, str, str, str], Obj] = field(default_factory=dict)
    rv: int = 100
    events: list[tuple[int, str, str, str, Obj]] = field(default_factory=list)  # rv,type,grp,plural
    compacted: int = 0
    failures: list[Failure] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    generated: int = 0

    # -- setup ----------------------------------------------------------------------------------
    def add(self, obj: Obj) -> Obj:
        group = obj["apiVersion"].rpartition("/")[0]
        plural = next(p for (g, p), (_, k, _) in KINDS.items() if k == obj["kind"] and g == group)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if KINDS[(group, plural)][2] else ""
        self._store(group, plural, ns, obj, "ADDED")
        return obj

    def get(self, group: str, plural: str, name: str, namespace: str = "") -> Obj:
        return self.objects[(group, plural, namespace, name)]

    def fail(
        self, method: str, path: str, status_code: int, *, times: int = 1, reason: str = ""
    ) -> None:
        self.failures.append(Failure(method, re.compile(path), status_code, times, reason))

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def compact(self) -> None:
        """Forget events older than now (a watch from before answers 410 Gone)."""
        self.compacted = self.rv
        self.events.clear()

    # -- internals ------------------------------------------------------------------------------
    def _store(self, group: str, plural: str, ns: str, obj: Obj, kind: str) -> None:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{self.rv}")
        meta.setdefault("creationTimestamp", "2026-12-03T12:00:00Z")
        meta.setdefault("generation", 1)
        self.objects[(group, plural, ns, meta["name"])] = obj
        self.events.append((self.rv, kind, group, plural, copy.deepcopy(obj)))

    def _check(self, obj: Obj) -> list[str]:
        if self.validate is None:
            return []
        problems = self.validate(obj)
        self.violations.extend(
            f"{obj.get('kind')}/{obj['metadata'].get('name')}: {p}" for p in problems
        )
        return problems

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        for f in self.failures:
            if f.times > 0 and f.method == request.method and f.path.search(path):
                f.times -= 1
                if f.status == 0:
                    raise httpx2.ConnectError("connection refused", request=request)
                reasons = {
                    403: "Forbidden",
                    409: "Conflict",
                    429: "TooManyRequests",
                    500: "InternalError",
                    503: "ServiceUnavailable",
                }
                return status(
                    f.status, f.reason or reasons.get(f.status, "Unknown"), f"scripted {f.status}"
                )
        query = dict(parse_qsl(request.url.query.decode(), keep_blank_values=True))
        t = parse_path(path)
        ns = t.namespace or ""
        body: Obj = json.loads(request.content) if request.content else {}
        dry = query.get("dryRun") == "All"
        key = (t.group, t.plural, ns, t.name or "")
        if (t.group, t.plural) not in KINDS:
            return status(
                404, "NotFound", f"the server could not find the requested resource {path}"
            )
        if request.method == "GET":
            if t.name is None:
                if query.get("watch") == "true":
                    return self._watch(t.group, t.plural, ns, query)
                return self._list(t.group, t.plural, ns, query)
            obj = self.objects.get(key)
            return ok(obj) if obj else status(404, "NotFound", f'{t.plural} "{t.name}" not found')
        if request.method == "POST":
            if t.subresource == "eviction":
                return self._evict(ns, t.name or "", body, dry)
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if "name" not in meta:
                self.generated += 1
                meta["name"] = f"{meta['generateName']}{self.generated:05d}"
            if KINDS[(t.group, t.plural)][2]:
                meta["namespace"] = ns
            key = (t.group, t.plural, ns, meta["name"])
            if key in self.objects:
                return status(409, "AlreadyExists", f'{t.plural} "{meta["name"]}" already exists')
            if self._check(obj):
                return status(422, "Invalid", f"{obj['kind']} is invalid")
            if not dry:
                self._store(t.group, t.plural, ns, obj, "ADDED")
            return ok(obj, 201)
        if request.method == "DELETE":
            obj = self.objects.get(key)
            if obj is None:
                return status(404, "NotFound", f'{t.plural} "{t.name}" not found')
            if not dry:
                del self.objects[key]
                self.rv += 1
                self.events.append((self.rv, "DELETED", t.group, t.plural, copy.deepcopy(obj)))
            return ok({"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if request.method == "PATCH":
            ctype = request.headers.get("content-type", "")
            if ctype != "application/merge-patch+json":
                return status(415, "UnsupportedMediaType", ctype)
            if t.subresource == "scale":
                obj = self.objects.get(key)
                if obj is None:
                    return status(404, "NotFound", f'{t.plural} "{t.name}" not found')
                new = merge_patch(obj, {"spec": {"replicas": body["spec"]["replicas"]}})
                if not dry:
                    new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
                    self._store(t.group, t.plural, ns, new, "MODIFIED")
                scale = {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {"name": t.name, "namespace": ns},
                    "spec": {"replicas": body["spec"]["replicas"]},
                }
                return ok(scale)
            obj = self.objects.get(key)
            if obj is None:
                return status(404, "NotFound", f'{t.plural} "{t.name}" not found')
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != obj["metadata"]["resourceVersion"]:
                return status(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {t.plural} "
                    f'"{t.name}": the object has been modified; please apply your '
                    "changes to the latest version and try again",
                )
            new = merge_patch(obj, body)
            new["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            if self._check(new):
                return status(422, "Invalid", f"{obj['kind']} is invalid")
            if not dry:
                if new.get("spec") != obj.get("spec"):
                    new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
                self._store(t.group, t.plural, ns, new, "MODIFIED")
            return ok(new)
        return status(405, "MethodNotAllowed", request.method)

    def _match(self, obj: Obj, query: dict[str, str]) -> bool:
        labels = obj["metadata"].get("labels") or {}
        for term in filter(None, query.get("labelSelector", "").split(",")):
            k, _, v = term.partition("=")
            if labels.get(k) != v:
                return False
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            k, _, v = term.partition("=")
            if k == "spec.nodeName" and (obj.get("spec") or {}).get("nodeName") != v:
                return False
            if k == "metadata.name" and obj["metadata"]["name"] != v:
                return False
        return True

    def _list(self, group: str, plural: str, ns: str, query: dict[str, str]) -> httpx2.Response:
        api_version, kind, _ = KINDS[(group, plural)]
        items = [
            o
            for (g, p, n, _), o in sorted(self.objects.items())
            if g == group and p == plural and (ns in ("", n)) and self._match(o, query)
        ]
        return ok(
            {
                "apiVersion": api_version,
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    def _watch(self, group: str, plural: str, ns: str, query: dict[str, str]) -> httpx2.Response:
        since = int(query.get("resourceVersion") or 0)
        lines = []
        if since and since < self.compacted:
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 410,
                "reason": "Expired",
                "message": f"too old resource version: {since} ({self.compacted})",
                "metadata": {},
            }
            lines.append(json.dumps({"type": "ERROR", "object": gone}))
        else:
            for rv, kind, g, p, obj in self.events:
                if (
                    g == group
                    and p == plural
                    and rv > since
                    and (ns in ("", obj["metadata"].get("namespace", "")))
                    and self._match(obj, query)
                ):
                    lines.append(json.dumps({"type": kind, "object": obj}))
            if query.get("allowWatchBookmarks") == "true":
                api_version, kind, _ = KINDS[(group, plural)]
                bookmark = {
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": {"resourceVersion": str(self.rv)},
                }
                lines.append(json.dumps({"type": "BOOKMARK", "object": bookmark}))
        return httpx2.Response(
            200,
            headers={"Content-Type": "application/json"},
            content=("\n".join(lines) + "\n").encode(),
        )

    def _evict(self, ns: str, name: str, body: Obj, dry: bool) -> httpx2.Response:
        if self._check(body):
            return status(422, "Invalid", "Eviction is invalid")
        pod = self.objects.get(("", "pods", ns, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        labels = pod["metadata"].get("labels") or {}
        for (g, p, n, _), pdb in self.objects.items():
            if (g, p) != ("policy", "poddisruptionbudgets") or n != ns:
                continue
            sel = (pdb["spec"].get("selector") or {}).get("matchLabels") or {}
            if any(labels.get(k) != v for k, v in sel.items()):
                continue
            healthy = sum(
                1
                for (g2, p2, n2, _), o in self.objects.items()
                if (g2, p2, n2) == ("", "pods", ns)
                and all((o["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
            )
            spec = pdb["spec"]
            if "minAvailable" in spec:
                allowed = healthy - int(spec["minAvailable"])
            else:
                allowed = int(spec.get("maxUnavailable", 0)) - pdb.get("_evicted", 0)
            if allowed <= 0:
                return status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    causes=[
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb['metadata']['name']}"
                            " needs more healthy pods",
                        }
                    ],
                )
            if not dry:
                pdb["_evicted"] = pdb.get("_evicted", 0) + 1
        if not dry:
            del self.objects[("", "pods", ns, name)]
            self.rv += 1
            self.events.append((self.rv, "DELETED", "", "pods", copy.deepcopy(pod)))
        return ok({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, 201)
