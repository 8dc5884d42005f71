"""List-then-watch caches of cluster objects, and "what changed" read from them.

An ``Informer`` lists a kind once (remembering the list's ``resourceVersion``), then watches from
that version with ``allowWatchBookmarks=true``: every event moves the version on, bookmarks
included, so a reconnect resumes where the last stream stopped instead of replaying or polling.
When the apiserver answers 410 Gone (the version was compacted away) the informer lists again
and replaces its cache: objects deleted while it was away disappear, which a bare re-watch would
miss. The fleet reads nodes from this cache instead of listing on every call.

Change events come from the objects themselves (docs/kubernetes.md, "what changed"):

- a node whose ``versions.firedrill.dev/<component>`` annotation changes is a ``node_layer``
  change (driver, firmware, kernel, node image, GPU operator, DCGM exporter);
- any watched object annotated ``firedrill.dev/change-stream: <stream>`` whose
  ``metadata.generation`` grows is a change in that stream; its subject is
  ``firedrill.dev/change-subject`` (or its name) and its before/after values are
  ``firedrill.dev/change-value`` (or, for a workload, its first container image).

lightkube's public ``watch()`` does not pass ``allowWatchBookmarks``; the informer builds the same
request through lightkube's request preparation with that parameter added.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube import ApiError, Client
from lightkube.core.resource import Resource
from lightkube.types import OnErrorAction, OnErrorResult

from firedrill.adapters.kubernetes import conventions as cv
from firedrill.model.changes import CHANGE_STREAMS, ChangeEvent, ChangeStream

__all__ = ["Informer", "change_events"]

Obj = dict[str, Any]


def _key(o: Obj) -> str:
    meta = o.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def _ann(o: Obj | None) -> dict[str, str]:
    return dict(((o or {}).get("metadata") or {}).get("annotations") or {})


def _labels(o: Obj | None) -> dict[str, str]:
    return dict(((o or {}).get("metadata") or {}).get("labels") or {})


def _image(o: Obj | None) -> str:
    pod = (((o or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or []
    return str(containers[0].get("image", "")) if containers else ""


def change_events(old: Obj | None, new: Obj, at_s: float) -> list[ChangeEvent]:
    """The change events one observed update stands for (none for a first sighting)."""
    if old is None:
        return []
    out: list[ChangeEvent] = []
    labels = _labels(new)
    region, cell = (
        labels.get(cv.LABEL_REGION, ""),
        labels.get(cv.LABEL_CELL) or labels.get("cell", "*"),
    )
    name = str(new["metadata"]["name"])
    if new.get("kind") == "Node":
        before, after = _ann(old), _ann(new)
        for key in sorted(set(before) | set(after)):
            if not key.startswith(cv.ANNOTATION_VERSION_PREFIX):
                continue
            if before.get(key) != after.get(key):
                component = key.removeprefix(cv.ANNOTATION_VERSION_PREFIX)
                out.append(
                    ChangeEvent(
                        at_s=at_s,
                        stream="node_layer",
                        region=region,
                        cell=cell,
                        subject=name,
                        before=before.get(key, ""),
                        after=after.get(key, ""),
                        detail=component,
                    )
                )
        return out
    stream = _ann(new).get(cv.ANNOTATION_CHANGE_STREAM)
    gen_old = int((old.get("metadata") or {}).get("generation") or 0)
    gen_new = int((new.get("metadata") or {}).get("generation") or 0)
    if stream is None or gen_new <= gen_old:
        return out
    if stream not in CHANGE_STREAMS:
        return out  # a typo in the annotation is not a change stream
    known: ChangeStream = stream
    value_old = _ann(old).get(cv.ANNOTATION_CHANGE_VALUE) or _image(old)
    value_new = _ann(new).get(cv.ANNOTATION_CHANGE_VALUE) or _image(new)
    out.append(
        ChangeEvent(
            at_s=at_s,
            stream=known,
            region=region,
            cell=cell,
            subject=_ann(new).get(cv.ANNOTATION_CHANGE_SUBJECT, name),
            before=value_old,
            after=value_new,
            detail=f"{new.get('kind')} {_key(new)} generation {gen_old} -> {gen_new}",
        )
    )
    return out


@dataclass
class Informer:
    """A cache of one kind, kept by list + watch (resourceVersion, bookmarks, relist on 410)."""

    client: Client
    resource: type[Resource]
    namespace: str | None = None
    on_change: Callable[[Obj | None, Obj], None] | None = None
    server_timeout_s: int = 60
    max_errors: int = 5
    sleep: Callable[[float], None] = field(default=lambda _s: None)
    items: dict[str, Obj] = field(default_factory=dict)
    resource_version: str = ""
    lists: int = 0
    bookmarks: int = 0
    events: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def relist(self) -> None:
        """List everything and replace the cache (first sync, and after a 410 Gone)."""
        api: Any = self.client
        listing = api.list(self.resource, namespace=self.namespace)
        items = {_key(o.to_dict()): o.to_dict() for o in listing}
        with self._lock:
            self.resource_version = str(listing.resourceVersion)
            self.items = items
            self.lists += 1

    def values(self) -> list[Obj]:
        with self._lock:
            return [self.items[k] for k in sorted(self.items)]

    def run(self, stop: Callable[[], bool]) -> None:
        """Sync, then watch until ``stop()``; relist whenever the watched version is gone."""
        self.relist()
        self.follow(stop)

    def follow(self, stop: Callable[[], bool]) -> None:
        """Watch from the synced version until ``stop()`` (relisting after a 410)."""
        while not stop():
            if self._watch(stop):
                self.relist()

    def _watch(self, stop: Callable[[], bool]) -> bool:
        """Watch from the current version; True when it was gone (410) and a relist is due."""
        gone = False

        def on_error(exc: Exception, count: int) -> OnErrorResult:
            nonlocal gone
            if isinstance(exc, ApiError) and exc.status.code == 410:
                gone = True
                return OnErrorResult(OnErrorAction.STOP)
            if count >= self.max_errors:
                return OnErrorResult(OnErrorAction.RAISE)
            return OnErrorResult(OnErrorAction.RETRY, sleep=min(2.0**count, 30.0))

        inner: Any = self.client._client  # lightkube's request layer (see the module docstring)
        request = inner.prepare_request(
            "list",
            res=self.resource,
            namespace=self.namespace,
            watch=True,
            params={
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": self.server_timeout_s,
            },
        )
        for kind, obj in inner.watch(request, on_error=on_error):
            data: Obj = obj.to_dict()
            rv = (data.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            old: Obj | None = None
            with self._lock:
                if kind == "BOOKMARK":
                    self.bookmarks += 1
                elif kind == "DELETED":
                    self.events += 1
                    self.items.pop(_key(data), None)
                else:
                    self.events += 1
                    key = _key(data)
                    old = self.items.get(key)
                    self.items[key] = data
            if kind in ("ADDED", "MODIFIED") and self.on_change is not None:
                self.on_change(old, data)
            if stop():
                return False
        return gone
