"""The event hub: ids increase, a reconnect replays what it missed, a subscriber too far behind
has its stream ended (never a stream that silently stops receiving)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from firedrill.web import events
from firedrill.web.events import EventHub


def test_a_reconnect_replays_only_what_came_after_its_last_event() -> None:
    hub = EventHub()
    for i in range(3):
        hub.publish("incident.updated", f"INC-000{i}", {"n": i})

    async def read() -> list[str]:
        out = []
        stream = hub.stream(last_id=1)
        assert isinstance(stream, AsyncGenerator)  # closed below, as a server closes it
        async for chunk in stream:
            out.append(chunk)
            if len(out) == 3:
                break
        await stream.aclose()
        return out

    retry, second, third = asyncio.run(read())
    assert retry.startswith("retry:")
    assert second.startswith("id: 2\nevent: incident.updated\n")
    assert '"incident": "INC-0002"' in third


def test_a_subscriber_too_far_behind_has_its_stream_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "QUEUE", 3)
    hub = EventHub()

    async def run() -> list[str]:
        stream = hub.stream(last_id=None)
        got = [await stream.__anext__()]  # subscribed
        for i in range(10):
            hub.publish("timeline", "INC-0001", {"n": i})
        await asyncio.sleep(0.05)  # let the loop deliver
        assert hub.subscribers == 0
        got += [chunk async for chunk in stream]
        return got

    chunks = asyncio.run(run())
    assert len(chunks) < 10  # it ended instead of waiting forever
    assert all(c.startswith(("retry:", "id: ")) for c in chunks)
