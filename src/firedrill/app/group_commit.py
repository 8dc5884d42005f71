"""Group commit: webhook calls that arrive while one commit is under way share the next one.

An alert ``firedrill serve`` acknowledges must be on disk first (``store.db``: SQLite fsyncs its
write-ahead log at every commit, PostgreSQL's ``synchronous_commit`` is on by default). A commit
per call pays that wait, the duplicate check and the INSERT once per call, in turn, behind one
lock: under load a call waited for every call queued ahead of it. Here one writer thread takes
every call queued when it is free (up to ``max_alerts`` alerts), routes them in order through
``IncidentService.ingest_many`` in one transaction, and only after that transaction committed
answers each call with its own result. Nothing waits on purpose for company: an idle service
commits a lone call at once, a busy one commits bigger groups.

Failures stay per call: when a group's transaction fails, nothing of it is stored (the service
rebuilds its book from the store), and each call of the group is then tried again on its own,
so one call the store refuses does not fail the others, and each gets its own answer (a result,
or the error the web layer turns into a 4xx/5xx). A call is never answered before its alerts
are committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

from firedrill.app.serve import ServeError
from firedrill.app.webhook import WebhookPayload

log = logging.getLogger("firedrill.serve")

MAX_GROUP_ALERTS: Final = 5000  # alerts per transaction: bounds a commit's time and memory
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Ingests(Protocol[R_co]):
    """What the writer needs of the service: a call alone, or several in one transaction."""

    def ingest(self, payload: WebhookPayload) -> R_co: ...

    def ingest_many(self, payloads: Sequence[WebhookPayload]) -> Sequence[R_co]: ...


@dataclass
class _Call(Generic[R]):
    payload: WebhookPayload
    future: Future[R] = field(default_factory=Future)


class GroupCommit(Generic[R]):
    """One writer thread; ``submit`` queues a call and returns a future of its result."""

    def __init__(
        self, service: Ingests[R], *, max_alerts: int = MAX_GROUP_ALERTS, autostart: bool = True
    ) -> None:
        """``autostart``: the first ``submit`` starts the writer (else only ``start`` does)."""
        if max_alerts < 1:
            raise ValueError("max_alerts must be at least 1")
        self._service = service
        self._max_alerts = max_alerts
        self._queue: list[_Call[R]] = []
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._autostart = autostart
        self.groups = 0  # transactions committed (or tried): for metrics and benchmarks
        self.calls = 0

    def start(self) -> None:
        """Start the writer thread (once; the first ``submit`` starts it too)."""
        with self._wake:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="firedrill-group-commit", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then stop the writer."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def submit(self, payload: WebhookPayload) -> Future[R]:
        """Queue one webhook call; its future resolves once its group committed (or failed)."""
        call: _Call[R] = _Call(payload)
        with self._wake:
            if self._closing:
                raise ServeError("shutting down: no more alerts accepted", status=503)
            if self._autostart:
                self._start_locked()
            self._queue.append(call)
            self._wake.notify()
        return call.future

    @property
    def queued(self) -> int:
        """Calls waiting for a commit (the one under way not included)."""
        with self._wake:
            return len(self._queue)

    def _take(self) -> list[_Call[R]] | None:
        with self._wake:
            while not self._queue:
                if self._closing:
                    return None
                self._wake.wait()
            group = [self._queue[0]]
            alerts = len(group[0].payload.alerts)
            for call in self._queue[1:]:
                alerts += len(call.payload.alerts)
                if alerts > self._max_alerts:
                    break
                group.append(call)
            del self._queue[: len(group)]
            return group

    def _run(self) -> None:
        while (group := self._take()) is not None:
            self.groups += 1
            self.calls += len(group)
            self._commit(group)

    def _commit(self, group: list[_Call[R]]) -> None:
        try:
            results = self._service.ingest_many([c.payload for c in group])
        except Exception as exc:  # noqa: BLE001 - handed to the callers, whatever it is
            if len(group) == 1:
                group[0].future.set_exception(exc)
                return
            log.info("a group of %d webhook calls failed (%s): each on its own", len(group), exc)
            for call in group:
                try:
                    call.future.set_result(self._service.ingest(call.payload))
                except Exception as one:  # noqa: BLE001 - this call's own answer
                    call.future.set_exception(one)
            return
        for call, result in zip(group, results, strict=True):
            call.future.set_result(result)
