"""``KubernetesFleet``: the ``Fleet`` port on a cluster's API, dry run first, journalled.

Each operation the remediation controller, the responder's levers and the drill conductor use maps
to API calls (docs/kubernetes.md has the table):

- ``Cordon``/``Uncordon``: merge patch of the Node's ``spec.unschedulable``;
- ``Taint``/``Untaint``: merge patch of ``spec.taints`` carrying the read ``resourceVersion``
  (a concurrent change is a 409, re-read and retried, never overwritten);
- ``Label``: merge patch of one label (``null`` removes it): the reason and ticket labels;
- ``Drain``: cordon, then one ``policy/v1`` Eviction per pod of the named workload classes
  (``firedrill.dev/workload-class``); DaemonSet and mirror pods stay. The apiserver refuses an
  eviction a PodDisruptionBudget forbids (429): it is retried after ``Retry-After`` and reported;
- ``SuspendJobSet``/``ResumeJobSet``: merge patch of ``spec.suspend``; a resume with excluded nodes
  also writes a required node anti-affinity (``kubernetes.io/hostname NotIn``) into every
  replicated job's pod template, which JobSet allows while suspended;
- ``SetQueueStopPolicy``: merge patch of the Kueue ClusterQueue's ``spec.stopPolicy``;
- ``SetReplicas``: the Deployment's ``scale`` subresource; ``PauseScaler``/``UnpauseScaler``: KEDA's
  ``autoscaling.keda.sh/paused-replicas`` annotation on the ScaledObject;
- ``SetRouteWeights``/``QuarantineCell``: keys of the router's ConfigMap; ``SetFlag``: a key of the
  kill-switch ConfigMap (``null`` removes it); both carry the read ``resourceVersion``;
- ``QuarantinePod``/``EjectReplica``: a pod label; ``KillPod``: a pod delete;
- ``ResetGpu``/``RebootNode``/``RunBurnIn``: a ``batch/v1`` Job pinned to the node (tolerating the
  quarantine taint) running ``nvidia-smi -r``, a reboot, or ``dcgmi diag -r 3``; the burn-in
  result is read back from that Job's status.

Every other operation (cloud, host or twin-only faults) is refused with an ``OperationError``
naming it: nothing is pretended.

The inverse of every operation is computed from the objects as read just before the first write,
exactly as the twin computes it, and the ``OpRecord`` holding it is appended to ``journal`` before
any write is sent. Each record then collects the exact ``ApiCall``s that went out for it, with
their answers: applied, dry run (advise mode: every write carries ``dryRun=All``), failed (nothing
written) or partial (some writes landed: the record says which, and the inverse undoes them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import httpx2
from lightkube import ApiError, Client
from lightkube.core.resource import Resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.policy_v1 import Eviction
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from firedrill.adapters.kubernetes import conventions as cv
from firedrill.adapters.kubernetes.conventions import Conventions
from firedrill.adapters.kubernetes.errors import KubernetesError
from firedrill.adapters.kubernetes.resources import ClusterQueue, JobSet, ScaledObject
from firedrill.adapters.kubernetes.transport import ApiCall, RecordingTransport
from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Operation
from firedrill.model.state import CellView, NodeView, ReplicaCounts

__all__ = ["KubernetesFleet", "OpRecord", "Outcome", "RetryPolicy"]

Obj = dict[str, Any]  # an API object as JSON (the wire format, never a domain object)
Outcome = Literal["intended", "applied", "dry_run", "failed", "partial"]
RETRYABLE = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a throttled (429) or failed (5xx) request is retried, and the waits (seconds)."""

    attempts: int = 3
    backoff_s: float = 1.0
    max_wait_s: float = 30.0


@dataclass(frozen=True)
class OpRecord:
    """The journal line of one operation: what, its inverse, the exact requests, the outcome."""

    seq: int
    op: Operation
    inverse: Operation
    at_s: float
    outcome: Outcome
    calls: tuple[ApiCall, ...] = ()
    error: str = ""
    notes: tuple[str, ...] = ()

    @property
    def writes(self) -> tuple[ApiCall, ...]:
        return tuple(c for c in self.calls if c.method in ("POST", "PUT", "PATCH", "DELETE"))


@dataclass
class _Pending:
    notes: list[str] = field(default_factory=list)


def _obj(resource: object) -> Obj:
    """An object lightkube decoded, back as JSON."""
    to_dict: Any = getattr(resource, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"not an API object: {type(resource).__name__}")
    data: Obj = to_dict()
    return data


def _meta(o: Obj) -> Obj:
    meta: Obj = o.get("metadata") or {}
    return meta


def _labels(o: Obj) -> dict[str, str]:
    return dict(_meta(o).get("labels") or {})


def _annotations(o: Obj) -> dict[str, str]:
    return dict(_meta(o).get("annotations") or {})


def _ready(node: Obj) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class KubernetesFleet:
    """The ``Fleet`` port over one cluster's API (lightkube ``Client`` on a recording transport)."""

    def __init__(
        self,
        client: Client,
        transport: RecordingTransport,
        *,
        conventions: Conventions | None = None,
        dry_run: bool = False,
        epoch: datetime | None = None,
        now: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.client = client
        # lightkube's overloads are per resource class; the adapter passes classes as values.
        self._api: Any = client
        self.transport = transport
        self.conv = conventions or Conventions()
        self.dry_run = dry_run
        self.epoch = epoch or datetime(1970, 1, 1, tzinfo=UTC)
        self._now = now
        self._sleep = sleep or (lambda _s: None)
        self.retry = retry or RetryPolicy()
        self.journal: list[OpRecord] = []
        self.changes_log: list[ChangeEvent] = []  # fed by a ChangeWatcher (watch.py)
        self.node_cache: Callable[[], Sequence[Obj]] | None = None  # a NodeCache, when watching

    # -- time ---------------------------------------------------------------------------------
    def _at_s(self) -> float:
        if self._now is None:
            return 0.0
        return (self._now() - self.epoch).total_seconds()

    def _seconds(self, when: datetime) -> float:
        return (when - self.epoch).total_seconds()

    # -- requests -----------------------------------------------------------------------------
    def _send(self, what: str, fn: Callable[[], Any], *, idempotent: bool = True) -> Any:
        """Call the API; map errors; retry 429 always and 5xx when the request is idempotent."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except ApiError as exc:
                status = int(exc.status.code or 0)
                reason = str(exc.status.reason or "")
                retry_after = _retry_after(exc)
                if status == 404:
                    kind, _, name = what.partition(" ")
                    raise UnknownTargetError(kind, name) from exc
                retryable = status == 429 or (idempotent and status in RETRYABLE)
                if retryable and attempt < self.retry.attempts:
                    self._sleep(self._wait_s(attempt, retry_after))
                    continue
                req = exc.request
                raise KubernetesError(
                    str(exc.status.message or what),
                    status=status,
                    reason=reason,
                    method=req.method if req is not None else "",
                    path=req.url.path if req is not None else "",
                    retry_after_s=retry_after,
                ) from exc
            except httpx2.HTTPStatusError as exc:  # an answer that is not a JSON Status
                status = exc.response.status_code
                if idempotent and status in RETRYABLE and attempt < self.retry.attempts:
                    self._sleep(self._wait_s(attempt, None))
                    continue
                raise KubernetesError(
                    f"{what}: HTTP {status}",
                    status=status,
                    method=exc.request.method,
                    path=exc.request.url.path,
                ) from exc
            except httpx2.TransportError as exc:
                if idempotent and attempt < self.retry.attempts:
                    self._sleep(self._wait_s(attempt, None))
                    continue
                raise KubernetesError(f"{what}: {exc}", status=None) from exc

    def _wait_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry.max_wait_s)
        return float(min(self.retry.backoff_s * 2 ** (attempt - 1), self.retry.max_wait_s))

    def _get(self, res: type[Resource], name: str, namespace: str | None, kind: str) -> Obj:
        return _obj(
            self._send(f"{kind} {name}", lambda: self._api.get(res, name, namespace=namespace))
        )

    def _list(
        self,
        res: type[Resource],
        *,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
        fields: dict[str, str] | None = None,
    ) -> list[Obj]:
        def call() -> list[Obj]:
            items = self._api.list(res, namespace=namespace, labels=labels, fields=fields)
            return [_obj(i) for i in items]

        out: list[Obj] = self._send(f"{res.__name__} list", call)
        return out

    def _patch(
        self,
        res: type[Resource],
        name: str,
        body: Obj,
        namespace: str | None,
        kind: str,
    ) -> None:
        self._send(
            f"{kind} {name}",
            lambda: self._api.patch(
                res,
                name,
                body,
                namespace=namespace,
                patch_type=PatchType.MERGE,
                field_manager=self.conv.field_manager,
                dry_run=self.dry_run,
            ),
        )

    # -- the Fleet port: operations -----------------------------------------------------------
    def apply(self, op: Operation) -> Operation:
        """Apply ``op`` (with ``dryRun=All`` in advise mode); journal it; return its inverse."""
        start = self.transport.mark()  # the record keeps the reads its inverse came from too
        inverse = self._inverse(op)
        seq = len(self.journal)
        self.journal.append(OpRecord(seq, op, inverse, self._at_s(), "intended"))
        pending = _Pending()
        try:
            self._apply(op, pending)
        except (KubernetesError, UnknownTargetError, OperationError) as exc:
            calls = self.transport.since(start)
            landed = any(
                c.method in ("POST", "PUT", "PATCH", "DELETE") and 200 <= c.status < 300
                for c in calls
            )
            outcome: Outcome = "partial" if landed else "failed"
            self.journal[seq] = replace(
                self.journal[seq],
                outcome=outcome,
                calls=calls,
                error=str(exc),
                notes=tuple(pending.notes),
            )
            raise
        self.journal[seq] = replace(
            self.journal[seq],
            outcome="dry_run" if self.dry_run else "applied",
            calls=self.transport.since(start),
            notes=tuple(pending.notes),
        )
        return inverse

    def inverse_of(self, op: Operation) -> Operation:
        return self._inverse(op)

    def _inverse(self, op: Operation) -> Operation:
        match op:
            case ops.Cordon(node=node) | ops.Drain(node=node):
                n = self._node(node)
                cordoned = bool((n.get("spec") or {}).get("unschedulable"))
                return ops.Noop("already cordoned") if cordoned else ops.Uncordon(node)
            case ops.Uncordon(node=node):
                n = self._node(node)
                cordoned = bool((n.get("spec") or {}).get("unschedulable"))
                return ops.Cordon(node) if cordoned else ops.Noop("not cordoned")
            case ops.Taint(node=node, key=key, effect=effect):
                had = self._taint(self._node(node), key)
                if had is not None:
                    return ops.Taint(node, key, had[0], had[1])
                return ops.Untaint(node, key, effect)
            case ops.Untaint(node=node, key=key):
                had = self._taint(self._node(node), key)
                return ops.Noop("no such taint") if had is None else ops.Taint(node, key, *had)
            case ops.Label(node=node, key=key):
                return ops.Label(node, key, _labels(self._node(node)).get(key))
            case ops.SuspendJobSet(jobset=name):
                js = self._jobset(name)
                if (js.get("spec") or {}).get("suspend"):
                    return ops.Noop("already suspended")
                return ops.ResumeJobSet(name, _excluded(js))
            case ops.ResumeJobSet(jobset=name, exclude_nodes=exclude):
                js = self._jobset(name)
                for node in exclude:
                    self._node(node)
                if (js.get("spec") or {}).get("suspend"):
                    return ops.SuspendJobSet(name)
                old = _excluded(js)
                return (
                    ops.Noop("not suspended")
                    if set(old) == set(exclude)
                    else (ops.ResumeJobSet(name, old))
                )
            case ops.SetQueueStopPolicy(queue=queue, policy=policy):
                if policy not in (None, "Hold", "HoldAndDrain"):
                    raise OperationError(f"unknown stopPolicy {policy!r}")
                cq = self._get(ClusterQueue, queue, None, "cluster queue")
                prev = (cq.get("spec") or {}).get("stopPolicy")
                return ops.SetQueueStopPolicy(queue, None if prev in (None, "None") else prev)
            case ops.SetReplicas(model=model, cell=cell):
                d = self._deployment(model, cell)
                return ops.SetReplicas(model, cell, int((d.get("spec") or {}).get("replicas", 1)))
            case ops.PauseScaler(model=model, cell=cell):
                prev = self._paused(model, cell)
                return (
                    ops.UnpauseScaler(model, cell)
                    if prev is None
                    else (ops.PauseScaler(model, cell, prev))
                )
            case ops.UnpauseScaler(model=model, cell=cell):
                prev = self._paused(model, cell)
                return (
                    ops.Noop("not paused") if prev is None else ops.PauseScaler(model, cell, prev)
                )
            case ops.SetRouteWeights(model=model, weights=weights):
                current = self._weights(self._router(), model)
                before: list[tuple[str, int]] = []
                for c, _ in weights:
                    if c not in current:
                        raise UnknownTargetError("route weight", f"{model}/{c}")
                    before.append((c, current[c]))
                return ops.SetRouteWeights(model, tuple(before))
            case ops.QuarantineCell(cell=cell):
                data = self._router().get("data") or {}
                quarantined = data.get(f"quarantine.{cell}") == "true"
                return ops.Noop("already") if quarantined else ops.UnquarantineCell(cell)
            case ops.UnquarantineCell(cell=cell):
                data = self._router().get("data") or {}
                quarantined = data.get(f"quarantine.{cell}") == "true"
                return ops.QuarantineCell(cell) if quarantined else ops.Noop("not quarantined")
            case ops.SetFlag(key=key):
                flags = self._get(
                    ConfigMap, self.conv.flags_configmap, self.conv.flags_namespace, "configmap"
                )
                return ops.SetFlag(key, (flags.get("data") or {}).get(key))
            case ops.QuarantinePod(pod=pod):
                p = self._pod(pod)
                on = _labels(p).get(cv.LABEL_POD_QUARANTINE) == "true"
                return ops.Noop("already") if on else ops.UnquarantinePod(pod)
            case ops.UnquarantinePod(pod=pod):
                p = self._pod(pod)
                on = _labels(p).get(cv.LABEL_POD_QUARANTINE) == "true"
                return ops.QuarantinePod(pod) if on else ops.Noop("not quarantined")
            case ops.EjectReplica(pod=pod):
                p = self._pod(pod)
                on = _labels(p).get(cv.LABEL_EJECTED) == "true"
                return ops.Noop("already ejected") if on else ops.UnejectReplica(pod)
            case ops.UnejectReplica(pod=pod):
                p = self._pod(pod)
                on = _labels(p).get(cv.LABEL_EJECTED) == "true"
                return ops.EjectReplica(pod) if on else ops.Noop("not ejected")
            case ops.KillPod(pod=pod):
                self._pod(pod)
                return ops.Noop("a killed pod is restarted by its controller")
            case ops.ResetGpu(node=node, gpu=gpu):
                n = self._node(node)
                if not 0 <= gpu < _gpus(n):
                    raise UnknownTargetError("gpu", f"{node}/{gpu}")
                return ops.Noop("a reset cannot be undone")
            case ops.RebootNode(node=node) | ops.RunBurnIn(node=node):
                self._node(node)
                return ops.Noop("cannot be undone")
            case ops.Noop():
                return ops.Noop("nothing to undo")
        raise OperationError(
            f"{type(op).__name__} has no Kubernetes mapping (a cloud, host or twin-only "
            "operation): see docs/kubernetes.md"
        )

    def _apply(self, op: Operation, pending: _Pending) -> None:
        c = self.conv
        match op:
            case ops.Cordon(node=node):
                self._patch(Node, node, {"spec": {"unschedulable": True}}, None, "node")
            case ops.Uncordon(node=node):
                self._patch(Node, node, {"spec": {"unschedulable": None}}, None, "node")
            case ops.Taint(node=node, key=key, value=value, effect=effect):
                self._edit_taints(node, key, (value, effect))
            case ops.Untaint(node=node, key=key):
                self._edit_taints(node, key, None)
            case ops.Label(node=node, key=key, value=value):
                self._patch(Node, node, {"metadata": {"labels": {key: value}}}, None, "node")
            case ops.Drain(node=node, classes=classes):
                self._drain(node, classes, pending)
            case ops.SuspendJobSet(jobset=name):
                self._patch(
                    JobSet, name, {"spec": {"suspend": True}}, c.training_namespace, "jobset"
                )
            case ops.ResumeJobSet(jobset=name, exclude_nodes=exclude):
                self._resume(name, exclude)
            case ops.SetQueueStopPolicy(queue=queue, policy=policy):
                self._patch(
                    ClusterQueue, queue, {"spec": {"stopPolicy": policy or "None"}}, None, "queue"
                )
            case ops.SetReplicas(model=model, cell=cell, replicas=replicas):
                self._send(
                    f"deployment {c.deployment(model, cell)}",
                    lambda: self._api.patch(
                        Deployment.Scale,
                        c.deployment(model, cell),
                        {"spec": {"replicas": replicas}},
                        namespace=c.serving_namespace,
                        patch_type=PatchType.MERGE,
                        field_manager=c.field_manager,
                        dry_run=self.dry_run,
                    ),
                )
            case ops.PauseScaler(model=model, cell=cell, replicas=replicas):
                pause: Obj = {
                    "metadata": {"annotations": {cv.ANNOTATION_KEDA_PAUSED: str(replicas)}}
                }
                name = c.deployment(model, cell)
                self._patch(ScaledObject, name, pause, c.serving_namespace, "scaledobject")
            case ops.UnpauseScaler(model=model, cell=cell):
                unpause: Obj = {"metadata": {"annotations": {cv.ANNOTATION_KEDA_PAUSED: None}}}
                name = c.deployment(model, cell)
                self._patch(ScaledObject, name, unpause, c.serving_namespace, "scaledobject")
            case ops.SetRouteWeights(model=model, weights=weights):
                router = self._router()
                merged = self._weights(router, model) | dict(weights)
                self._edit_configmap(
                    router, {f"weights.{model}": json.dumps(merged, sort_keys=True)}
                )
            case ops.QuarantineCell(cell=cell):
                self._edit_configmap(self._router(), {f"quarantine.{cell}": "true"})
            case ops.UnquarantineCell(cell=cell):
                self._edit_configmap(self._router(), {f"quarantine.{cell}": None})
            case ops.SetFlag(key=key, value=value):
                flags = self._get(ConfigMap, c.flags_configmap, c.flags_namespace, "configmap")
                self._edit_configmap(flags, {key: value})
            case ops.QuarantinePod(pod=pod):
                self._label_pod(pod, cv.LABEL_POD_QUARANTINE, "true")
            case ops.UnquarantinePod(pod=pod):
                self._label_pod(pod, cv.LABEL_POD_QUARANTINE, None)
            case ops.EjectReplica(pod=pod):
                self._label_pod(pod, cv.LABEL_EJECTED, "true")
            case ops.UnejectReplica(pod=pod):
                self._label_pod(pod, cv.LABEL_EJECTED, None)
            case ops.KillPod(pod=pod):
                ns, name = self._pod_ref(pod)
                self._send(
                    f"pod {pod}",
                    lambda: self._api.delete(
                        Pod, name, namespace=ns, grace_period=0, dry_run=self.dry_run
                    ),
                )
            case ops.ResetGpu(node=node, gpu=gpu):
                self._job(node, "reset", ["nvidia-smi", "--gpu-reset", "-i", str(gpu)])
            case ops.RebootNode(node=node):
                self._job(node, "reboot", ["chroot", "/host", "systemctl", "reboot"])
            case ops.RunBurnIn(node=node):
                self._job(node, "burn-in", ["dcgmi", "diag", "-r", "3"])
            case ops.Noop():
                pass
            case _:  # _inverse refused every other kind already
                raise OperationError(f"{type(op).__name__} has no Kubernetes mapping")

    # -- nodes, taints, drains ----------------------------------------------------------------
    def _node(self, name: str) -> Obj:
        return self._get(Node, name, None, "node")

    @staticmethod
    def _taint(node: Obj, key: str) -> tuple[str, ops.TaintEffect] | None:
        for t in (node.get("spec") or {}).get("taints") or []:
            if t.get("key") == key:
                return str(t.get("value") or ""), t.get("effect", "NoSchedule")
        return None

    def _edit_taints(self, node: str, key: str, new: tuple[str, str] | None) -> None:
        """Replace (or remove) one taint, guarded by the read resourceVersion; 409: read again."""
        for _ in range(self.retry.attempts):
            n = self._node(node)
            taints = [t for t in (n.get("spec") or {}).get("taints") or [] if t.get("key") != key]
            if new is not None:
                taints.append({"key": key, "value": new[0], "effect": new[1]})
            body = {
                "metadata": {"resourceVersion": _meta(n).get("resourceVersion")},
                "spec": {"taints": taints or None},
            }
            try:
                self._patch(Node, node, body, None, "node")
                return
            except KubernetesError as exc:
                if exc.outcome != "conflict":
                    raise
                last = exc
        raise last

    def _drain(self, node: str, classes: Sequence[str], pending: _Pending) -> None:
        n = self._node(node)
        if not (n.get("spec") or {}).get("unschedulable"):
            self._patch(Node, node, {"spec": {"unschedulable": True}}, None, "node")
        pods = self._list(Pod, namespace="*", fields={"spec.nodeName": node})
        blocked: list[str] = []
        evicted = 0
        for p in sorted(pods, key=lambda p: (_meta(p).get("namespace", ""), _meta(p)["name"])):
            meta = _meta(p)
            owners = {o.get("kind") for o in meta.get("ownerReferences") or []}
            if "DaemonSet" in owners or "kubernetes.io/config.mirror" in _annotations(p):
                continue  # DaemonSets stay (they hold the evidence); mirror pods can't be evicted
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            klass = _labels(p).get(cv.LABEL_WORKLOAD_CLASS)
            if klass not in classes:
                continue
            name, ns = str(meta["name"]), str(meta.get("namespace", "default"))
            eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=ns))
            try:
                self._evict(eviction, name, ns)
                evicted += 1
            except KubernetesError as exc:
                if exc.outcome != "throttled":
                    raise
                blocked.append(f"{ns}/{name}")
            except UnknownTargetError:
                continue  # gone on its own between the list and the eviction
        pending.notes.append(f"evicted {evicted} pod(s) of {','.join(classes)}")
        if blocked:
            pending.notes.append("blocked by a PodDisruptionBudget: " + ", ".join(blocked))
            raise KubernetesError(
                f"drain of {node} incomplete: {len(blocked)} eviction(s) refused by a "
                "PodDisruptionBudget (the node stays cordoned; drain again later)",
                status=429,
                reason="TooManyRequests",
            )

    def _evict(self, eviction: Eviction, name: str, ns: str) -> None:
        self._send(
            f"pod {ns}/{name}",
            lambda: self._api.create(eviction, name, namespace=ns, dry_run=self.dry_run),
        )

    # -- training --------------------------------------------------------------------------------
    def _jobset(self, name: str) -> Obj:
        return self._get(JobSet, name, self.conv.training_namespace, "jobset")

    def _resume(self, name: str, exclude: Sequence[str]) -> None:
        for _ in range(self.retry.attempts):
            js = self._jobset(name)
            spec = js.get("spec") or {}
            jobs = [_exclude_nodes(rj, exclude) for rj in spec.get("replicatedJobs") or []]
            body = {
                "metadata": {"resourceVersion": _meta(js).get("resourceVersion")},
                "spec": {"suspend": False, "replicatedJobs": jobs},
            }
            try:
                self._patch(JobSet, name, body, self.conv.training_namespace, "jobset")
                return
            except KubernetesError as exc:
                if exc.outcome != "conflict":
                    raise
                last = exc
        raise last

    # -- serving, routing, flags ------------------------------------------------------------------
    def _deployment(self, model: str, cell: str) -> Obj:
        name = self.conv.deployment(model, cell)
        return self._get(Deployment, name, self.conv.serving_namespace, "deployment")

    def _paused(self, model: str, cell: str) -> int | None:
        so = self._get(
            ScaledObject,
            self.conv.deployment(model, cell),
            self.conv.serving_namespace,
            "scaledobject",
        )
        value = _annotations(so).get(cv.ANNOTATION_KEDA_PAUSED)
        return None if value is None else int(value)

    def _router(self) -> Obj:
        c = self.conv
        return self._get(ConfigMap, c.router_configmap, c.router_namespace, "configmap")

    @staticmethod
    def _weights(router: Obj, model: str) -> dict[str, int]:
        raw = (router.get("data") or {}).get(f"weights.{model}")
        if raw is None:
            raise UnknownTargetError("model", model)
        return {str(k): int(v) for k, v in json.loads(raw).items()}

    def _edit_configmap(self, cm: Obj, data: dict[str, str | None]) -> None:
        meta = _meta(cm)
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "data": data}
        self._patch(ConfigMap, str(meta["name"]), body, meta.get("namespace"), "configmap")

    def _pod_ref(self, pod: str) -> tuple[str, str]:
        ns, _, name = pod.rpartition("/")
        return (ns or self.conv.serving_namespace), name

    def _pod(self, pod: str) -> Obj:
        ns, name = self._pod_ref(pod)
        return self._get(Pod, name, ns, "pod")

    def _label_pod(self, pod: str, key: str, value: str | None) -> None:
        ns, name = self._pod_ref(pod)
        self._patch(Pod, name, {"metadata": {"labels": {key: value}}}, ns, "pod")

    # -- node remediation Jobs ----------------------------------------------------------------
    def _job(self, node: str, action: str, command: list[str]) -> None:
        c = self.conv
        self._node(node)
        labels = {
            cv.LABEL_REMEDIATION: action,
            cv.LABEL_REMEDIATION_NODE: node,
            cv.LABEL_MANAGED_BY: "firedrill",
        }
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "generateName": f"firedrill-{action}-"[:50],
                "namespace": c.remediation_namespace,
                "labels": labels,
            },
            "spec": {
                "backoffLimit": 0,
                "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": node,
                        "restartPolicy": "Never",
                        "serviceAccountName": c.remediation_service_account,
                        "hostPID": action == "reboot",
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": action,
                                "image": c.remediation_image,
                                "command": command,
                                "securityContext": {"privileged": True},
                                **(
                                    {"volumeMounts": [{"name": "host", "mountPath": "/host"}]}
                                    if action == "reboot"
                                    else {}
                                ),
                            }
                        ],
                        **(
                            {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
                            if action == "reboot"
                            else {}
                        ),
                    },
                },
            },
        }
        job = Job.from_dict(body)
        # A create is not idempotent (generateName): never retried on a 5xx.
        self._send(
            f"node {node}",
            lambda: self._api.create(job, namespace=c.remediation_namespace, dry_run=self.dry_run),
            idempotent=False,
        )

    # -- the Fleet port: reads ------------------------------------------------------------------
    def _nodes(self, cell: str | None = None) -> list[Obj]:
        if self.node_cache is not None:
            nodes = list(self.node_cache())
            if cell is not None:
                nodes = [n for n in nodes if _labels(n).get(cv.LABEL_CELL) == cell]
            return nodes
        labels = {cv.LABEL_CELL: cell} if cell is not None else None
        return self._list(Node, labels=labels)

    def node(self, name: str) -> NodeView:
        return _node_view(self._node(name))

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        views = [_node_view(n) for n in self._nodes(cell)]
        return sorted(views, key=lambda v: v.name)

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        pods = self._list(
            Pod, namespace=self.conv.serving_namespace, fields={"spec.nodeName": node}
        )
        out = []
        for p in pods:
            if _labels(p).get(cv.LABEL_WORKLOAD_CLASS) != "inference":
                continue
            if gpu is not None:
                raw = _annotations(p).get(cv.ANNOTATION_GPUS, "")
                if str(gpu) not in {g.strip() for g in raw.split(",") if g.strip()}:
                    continue
            out.append(str(_meta(p)["name"]))
        return sorted(out)

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        jobs = self._list(
            Job,
            namespace=self.conv.remediation_namespace,
            labels={cv.LABEL_REMEDIATION: "burn-in", cv.LABEL_REMEDIATION_NODE: node},
        )
        done: list[tuple[datetime, bool, str]] = []
        for j in jobs:
            status = j.get("status") or {}
            for cond in status.get("conditions") or []:
                if cond.get("status") != "True" or cond.get("type") not in ("Complete", "Failed"):
                    continue
                at = _parse_time(status.get("completionTime") or cond.get("lastTransitionTime"))
                if at is None:
                    continue
                passed = cond["type"] == "Complete"
                detail = f"job {_meta(j)['name']}: {cond.get('reason') or cond['type']}"
                done.append((at, passed, detail))
        if not done:
            return None
        at, passed, detail = max(done, key=lambda d: d[0])
        return self._seconds(at), passed, detail

    def cells(self) -> Sequence[CellView]:
        nodes = self._nodes()
        by_cell: dict[str, tuple[str, int]] = {}
        for n in nodes:
            lab = _labels(n)
            cell = lab.get(cv.LABEL_CELL)
            if cell is None:
                continue
            region, count = by_cell.get(cell, (lab.get(cv.LABEL_REGION, ""), 0))
            by_cell[cell] = (region, count + 1)
        router = self._router()
        data = router.get("data") or {}
        weights: dict[str, dict[str, int]] = {}
        for key, raw in data.items():
            if key.startswith("weights."):
                for c, w in json.loads(raw).items():
                    weights.setdefault(str(c), {})[key.removeprefix("weights.")] = int(w)
        deploys = self._list(Deployment, namespace=self.conv.serving_namespace)
        replicas: dict[str, list[ReplicaCounts]] = {}
        for d in deploys:
            lab = _labels(d)
            cell, model = lab.get("cell"), lab.get("app")
            if cell is None or model is None:
                continue
            spec, status = d.get("spec") or {}, d.get("status") or {}
            desired = int(spec.get("replicas", 1))
            ready = int(status.get("readyReplicas") or 0)
            updated = int(status.get("updatedReplicas") or 0)
            replicas.setdefault(cell, []).append(
                ReplicaCounts(
                    model=model,
                    cell=cell,
                    desired=desired,
                    cold=max(0, desired - max(updated, ready)),
                    pulling=0,
                    loading=max(0, updated - ready),
                    warming=0,
                    ready=ready,
                    draining=max(0, int(status.get("replicas") or 0) - desired),
                )
            )
        return [
            CellView(
                name=cell,
                region=region,
                nodes=count,
                quarantined=data.get(f"quarantine.{cell}") == "true",
                replicas=tuple(sorted(replicas.get(cell, []), key=lambda r: r.model)),
                route_weights=tuple(sorted(weights.get(cell, {}).items())),
            )
            for cell, (region, count) in sorted(by_cell.items())
        ]

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        return [
            e
            for e in self.changes_log
            if e.at_s >= since_s and (cell is None or e.cell in (cell, "*"))
        ]

    # -- journal --------------------------------------------------------------------------------
    def requests(self) -> Iterator[ApiCall]:
        for rec in self.journal:
            yield from rec.calls

    @contextmanager
    def advise(self) -> Iterator[KubernetesFleet]:
        """Within the block every write goes with ``dryRun=All`` (advise mode)."""
        before = self.dry_run
        self.dry_run = True
        try:
            yield self
        finally:
            self.dry_run = before


def _retry_after(exc: ApiError) -> float | None:
    response = getattr(exc, "response", None)
    raw = response.headers.get("Retry-After") if response is not None else None
    if raw is None:
        details = exc.status.details
        seconds = getattr(details, "retryAfterSeconds", None) if details is not None else None
        return float(seconds) if seconds else None
    try:
        return float(raw)
    except ValueError:
        return None


def _gpus(node: Obj) -> int:
    cap = (node.get("status") or {}).get("capacity") or {}
    try:
        return int(cap.get(cv.GPU_RESOURCE, "0"))
    except ValueError:
        return 0


def _node_view(n: Obj) -> NodeView:
    meta = _meta(n)
    labels = _labels(n)
    taints = tuple(
        (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))
        for t in (n.get("spec") or {}).get("taints") or []
    )
    versions = tuple(
        sorted(
            (k.removeprefix(cv.ANNOTATION_VERSION_PREFIX), v)
            for k, v in _annotations(n).items()
            if k.startswith(cv.ANNOTATION_VERSION_PREFIX)
        )
    )
    return NodeView(
        name=str(meta["name"]),
        region=labels.get(cv.LABEL_REGION, ""),
        cell=labels.get(cv.LABEL_CELL, ""),
        pool=labels.get(cv.LABEL_POOL, ""),
        role=labels.get(cv.LABEL_ROLE, ""),
        gpus=_gpus(n),
        ready=_ready(n),
        cordoned=bool((n.get("spec") or {}).get("unschedulable")),
        taints=taints,
        labels=tuple(sorted(labels.items())),
        versions=versions,
    )


_HOSTNAME_TERM = {"key": cv.LABEL_HOSTNAME, "operator": "NotIn"}


def _excluded(jobset: Obj) -> tuple[str, ...]:
    """The nodes a JobSet may never run on: its replicated jobs' hostname NotIn terms."""
    out: set[str] = set()
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
        terms = (
            ((pod or {}).get("affinity") or {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
        )
        for term in terms:
            for e in term.get("matchExpressions") or []:
                if e.get("key") == cv.LABEL_HOSTNAME and e.get("operator") == "NotIn":
                    out.update(e.get("values") or [])
    return tuple(sorted(out))


def _exclude_nodes(rj: Obj, exclude: Sequence[str]) -> Obj:
    """A replicated job whose pods may not land on ``exclude`` (other affinity terms kept)."""
    rj = json.loads(json.dumps(rj))
    pod = rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
    spec = pod.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {})
    node_aff = affinity.setdefault("nodeAffinity", {})
    required = node_aff.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": [{}]}
    )
    terms = required.setdefault("nodeSelectorTerms", [{}]) or [{}]
    new_terms = []
    for term in terms:
        exprs = [
            e
            for e in term.get("matchExpressions") or []
            if not (e.get("key") == cv.LABEL_HOSTNAME and e.get("operator") == "NotIn")
        ]
        if exclude:
            exprs.append({**_HOSTNAME_TERM, "values": sorted(exclude)})
        new_term = {k: v for k, v in term.items() if k != "matchExpressions"}
        if exprs:
            new_term["matchExpressions"] = exprs
        new_terms.append(new_term)
    new_terms = [t for t in new_terms if t]
    if new_terms:
        required["nodeSelectorTerms"] = new_terms
    else:
        node_aff.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
        if not node_aff:
            affinity.pop("nodeAffinity", None)
        if not affinity:
            spec.pop("affinity", None)
    return rj
