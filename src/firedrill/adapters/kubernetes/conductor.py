"""The drill conductor on a cluster: one Chaos Mesh Workflow, created, watched, deleted.

``chaos_workflow`` (export/chaos_mesh.py) turns a drill into one Workflow that carries the
timeline. The conductor makes it real, the way the twin runner does with its injections:

1. a journal is created whose target is ``kubernetes:NAMESPACE/NAME`` and the intent
   ``CreateChaosWorkflow`` is written with its inverse ``DeleteChaosWorkflow`` (and fsync'd)
   *before* the Workflow is created;
2. the Workflow is created through the API (``dryRun=All`` first when advising: then nothing is
   created and the journal finishes at once);
3. the stop conditions are evaluated every step on the caller's signals (Prometheus, through the
   ``Signals`` port); the first that fires deletes the Workflow (Chaos Mesh then ends every chaos
   it created: the auto-revert) and the journal finishes ``aborted``; otherwise the Workflow is
   deleted at the duration cap, after its own deadlines ended it, and the journal finishes
   ``passed`` (the timeline ran to its end; the hypothesis is judged elsewhere);
4. if the conductor dies in between, ``gameday recover`` finds the unfinished journal and deletes
   the Workflow through ``world_for_target``: a 404 means it is already gone, which is success.

An L0 drill has no Workflow; conducting it is refused (a tabletop injects nothing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import ApiError

from firedrill.adapters.journal_file import Journal
from firedrill.adapters.kubernetes.client import Connection, connect
from firedrill.adapters.kubernetes.errors import KubernetesError
from firedrill.adapters.kubernetes.resources import Workflow
from firedrill.drill.spec import DrillSpec
from firedrill.errors import OperationError, UnknownTargetError
from firedrill.export.chaos_mesh import ChaosWorkflowExport
from firedrill.model import operations as ops
from firedrill.model.operations import Operation
from firedrill.ports import Clock

__all__ = [
    "TARGET_PREFIX",
    "ConductorResult",
    "WorkflowConductor",
    "WorkflowWorld",
    "parse_target",
    "world_for_target",
]

TARGET_PREFIX = "kubernetes:"
StopCheck = Callable[[float], str | None]  # seconds since T0 -> the stop condition that fired


def target_of(namespace: str, name: str) -> str:
    return f"{TARGET_PREFIX}{namespace}/{name}"


def parse_target(target: str) -> tuple[str, str]:
    """``kubernetes:NAMESPACE/NAME`` -> (namespace, name)."""
    rest = target.removeprefix(TARGET_PREFIX)
    namespace, _, name = rest.partition("/")
    if not target.startswith(TARGET_PREFIX) or not namespace or not name:
        raise OperationError(f"not a Kubernetes Workflow target: {target!r}")
    return namespace, name


@dataclass(frozen=True)
class ConductorResult:
    workflow: str
    namespace: str
    journal: Path
    created: bool
    deleted: bool
    stopped_by: str | None  # the stop condition that fired, if one did
    at_s: float  # when the Workflow was deleted (seconds since T0)
    verdict: str


class WorkflowWorld:
    """What recovery needs on a cluster: apply ``DeleteChaosWorkflow`` (idempotently)."""

    def __init__(self, conn: Connection, *, now_s: Callable[[], float] = lambda: 0.0) -> None:
        self.conn = conn
        self._now = now_s

    def apply(self, op: Operation) -> Operation:
        match cast(object, op):
            case ops.DeleteChaosWorkflow(namespace=ns, name=name):
                delete_workflow(self.conn, ns, name)
                return cast(Operation, ops.CreateChaosWorkflow(ns, name))
        raise OperationError(f"a cluster drill's journal only reverts Workflows, not {op!r}")

    def now_s(self) -> float:
        return self._now()


def delete_workflow(conn: Connection, namespace: str, name: str) -> bool:
    """Delete the Workflow; False if it was already gone (404 is success: nothing is left)."""
    api: Any = conn.client
    try:
        api.delete(Workflow, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        raise KubernetesError(
            str(exc.status.message),
            status=exc.status.code,
            reason=str(exc.status.reason or ""),
            method="DELETE",
        ) from exc
    except httpx2.TransportError as exc:
        raise KubernetesError(f"workflow {namespace}/{name}: {exc}", status=None) from exc
    return True


def world_for_target(target: str, *, conn: Connection | None = None) -> WorkflowWorld:
    """The world ``gameday recover`` reverts a cluster drill's journal through."""
    parse_target(target)  # refuse a malformed target before connecting
    return WorkflowWorld(conn if conn is not None else connect())


class WorkflowConductor:
    """Creates a drill's Workflow, deletes it on a stop condition or at the cap, journals both."""

    def __init__(
        self,
        conn: Connection,
        clock: Clock,
        journal_dir: Path,
        *,
        step_s: float = 15.0,
        dry_run: bool = False,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.journal_dir = journal_dir
        self.step_s = step_s
        self.dry_run = dry_run

    def run(
        self, spec: DrillSpec, export: ChaosWorkflowExport, stop: StopCheck, *, run_by: str
    ) -> ConductorResult:
        if export.workflow is None:
            raise OperationError(
                f"drill {spec.name} ({spec.rung}) has no Workflow: nothing to conduct "
                "(a tabletop injects nothing)"
            )
        cap = spec.duration_cap_s
        if cap is None:
            raise OperationError(f"drill {spec.name} has no duration cap")
        wf = export.workflow
        ns, name = wf["metadata"]["namespace"], wf["metadata"]["name"]
        digest = hashlib.sha256(json.dumps(wf, sort_keys=True).encode()).hexdigest()
        start = self.clock.now_s()
        journal = Journal.create(
            self.journal_dir,
            drill=spec.name,
            spec_sha256=digest,
            seed=spec.seed,
            run_by=run_by,
            target=target_of(ns, name),
        )
        with journal:
            create = cast(Operation, ops.CreateChaosWorkflow(ns, name))
            delete = cast(Operation, ops.DeleteChaosWorkflow(ns, name))
            key = journal.intend(create, delete, 0.0)  # durable before anything is created
            api: Any = self.conn.client
            try:
                api.create(Workflow.from_dict(wf), namespace=ns, dry_run=self.dry_run)
            except ApiError as exc:  # the intent stays open: recovery deletes whatever exists
                if exc.status.code == 404:
                    raise UnknownTargetError("namespace or Workflow CRD", ns) from exc
                raise KubernetesError(
                    str(exc.status.message),
                    status=exc.status.code,
                    reason=str(exc.status.reason or ""),
                    method="POST",
                ) from exc
            except httpx2.TransportError as exc:
                raise KubernetesError(f"creating workflow {ns}/{name}: {exc}", status=None) from exc
            if self.dry_run:
                journal.reverted(key, 0.0)  # a server-side dry run created nothing
                journal.finish("passed")
                return ConductorResult(name, ns, journal.path, False, False, None, 0.0, "passed")
            journal.applied(key, 0.0)
            stopped: str | None = None
            while (t := self.clock.now_s() - start) < cap:
                stopped = stop(t)
                if stopped is not None:
                    break
                self.clock.advance(min(self.step_s, cap - t))
            at = self.clock.now_s() - start
            deleted = delete_workflow(self.conn, ns, name)
            journal.reverted(key, at)
            verdict = "aborted" if stopped is not None else "passed"
            journal.finish(verdict)
        return ConductorResult(name, ns, journal.path, True, deleted, stopped, at, verdict)
