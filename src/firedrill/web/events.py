"""Incident and timeline changes as server-sent events, for the browser UI and anyone watching.

The service publishes from worker threads; each subscriber is an asyncio queue on the server's
event loop. Events carry increasing ids and the last ``BACKLOG`` are kept, so a client that
reconnects with ``Last-Event-ID`` misses nothing recent. A subscriber that falls ``QUEUE``
events behind is dropped (its stream ends; the browser reconnects and catches up).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

BACKLOG: Final = 1000
QUEUE: Final = 1000
HEARTBEAT_S: Final = 15.0


@dataclass(frozen=True)
class Event:
    id: int
    type: str
    incident: str | None
    data: Mapping[str, Any]

    def encode(self) -> str:
        body = json.dumps({"type": self.type, "incident": self.incident, **self.data}, default=str)
        return f"id: {self.id}\nevent: {self.type}\ndata: {body}\n\n"


class EventHub:
    """Fan-out of service events to SSE subscribers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 1
        self._backlog: deque[Event] = deque(maxlen=BACKLOG)
        self._subscribers: dict[
            int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event | None]]
        ] = {}
        self._ids = 0

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, type_: str, incident: str | None, data: Mapping[str, Any]) -> None:
        with self._lock:
            event = Event(self._next, type_, incident, dict(data))
            self._next += 1
            self._backlog.append(event)
            targets = list(self._subscribers.items())
        for key, (loop, queue) in targets:
            try:
                loop.call_soon_threadsafe(self._offer, key, queue, event)
            except RuntimeError:  # the loop closed
                self._subscribers.pop(key, None)

    def _offer(self, key: int, queue: asyncio.Queue[Event | None], event: Event) -> None:
        try:
            queue.put_nowait(event)
        except asyncio.QueueFull:  # too far behind: end its stream, it reconnects and catches up
            self._subscribers.pop(key, None)
            queue.get_nowait()
            queue.put_nowait(None)

    async def stream(
        self, last_id: int | None, *, incident: str | None = None
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=QUEUE)
        with self._lock:
            self._ids += 1
            key = self._ids
            backlog = [e for e in self._backlog if last_id is not None and e.id > last_id]
            self._subscribers[key] = (loop, queue)
        try:
            yield "retry: 2000\n\n"
            for e in backlog:
                if incident is None or e.incident == incident:
                    yield e.encode()
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if event is None:
                    return
                if incident is None or event.incident == incident:
                    yield event.encode()
        finally:
            self._subscribers.pop(key, None)
