"""A live world's scenario reads come from the control endpoint, in the run's seconds.

The live world's second 0 is the twin's ``offset_s``: every time the control endpoint answers
(audit records, compensations, the change journal, a JobSet's checkpoint and start) is moved back
by it, a window asked for is moved forward, and the one operation that names a time
(``RunCompensations``) is moved forward on its way to the twin and back in the journal. The twin
is a real one behind the control API in this process; no signal is read, so Prometheus is a
transport that refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from firedrill.adapters.clock import ScaledClock, TimeMap
from firedrill.adapters.live_world import LiveWorld
from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.prometheus import PrometheusSignals
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.adapters.twin_api import ControlApi
from firedrill.model import operations as ops
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
TOKEN = "l" * 43
OFFSET_S = 120.0
HASH = "sha256:" + "cd" * 32


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.fixture
def live() -> Iterator[tuple[TwinWorld, LiveWorld]]:
    twin = Twin(load_fleet(FLEET), 6, hours_hint=1.0)
    twin.advance(OFFSET_S)  # the fleet ran before the scenario started
    api = ControlApi(twin, threading.Lock(), TOKEN)
    time_map = TimeMap(anchor_unix_s=0.0, anchor_run_s=0.0, speed=1.0)
    with MetricsServer(lambda: "", api=api.handle) as server:
        signals = PrometheusSignals(
            "http://127.0.0.1:9", time_map=time_map, transport=httpx.MockTransport(_refuse)
        )
        clock = ScaledClock(time_map, start_s=0.0, time_fn=lambda: 0.0, sleep=lambda _: None)
        world = LiveWorld(
            RemoteTwin(server.url, TOKEN), signals, clock, offset_s=OFFSET_S,
            scrape_interval_wall_s=0.5,
        )  # fmt: skip
        yield TwinWorld(twin), world


def test_a_scenarios_reads_on_a_live_world_are_in_run_seconds(
    live: tuple[TwinWorld, LiveWorld],
) -> None:
    twin, world = live
    world.apply(ops.InjectPromptInjection("acme", "use1-a", HASH, "write", 0.5, 1.0))
    world.apply(ops.InjectExfiltration("acme", "use1-a", 2.0))
    world.apply(ops.InjectHang("pretrain-405b", 3))
    twin.twin.advance(300.0)  # the fleet's own time moves on (run seconds 0..300)
    world.apply(ops.RunCompensations("acme", since_s=10.0))
    (on_twin,) = [a.op for a in twin.operations() if isinstance(a.op, ops.RunCompensations)]
    assert on_twin.since_s == 10.0 + OFFSET_S  # the twin reads its own seconds
    journal = world.operations()
    assert [a.at_s for a in journal] == [a.at_s - OFFSET_S for a in twin.operations()]
    assert journal[0].at_s == 0.0
    (in_run,) = [a.op for a in journal if isinstance(a.op, ops.RunCompensations)]
    assert in_run.since_s == 10.0

    egress = world.egress_records(start_s=0.0, end_s=300.0, tenant="acme")
    want = twin.egress_records(start_s=OFFSET_S, end_s=OFFSET_S + 300.0, tenant="acme")
    assert [r.at_s for r in egress] == [r.at_s - OFFSET_S for r in want]
    assert egress
    assert min(r.at_s for r in egress) >= 0.0
    assert world.sandbox.egress_records(start_s=0.0, end_s=300.0, tenant="acme") == egress
    calls = world.tool_records(start_s=0.0, end_s=300.0, tenant="acme")
    want_calls = twin.tool_records(start_s=OFFSET_S, end_s=OFFSET_S + 300.0, tenant="acme")
    assert [r.at_s for r in calls] == [r.at_s - OFFSET_S for r in want_calls]
    compensations = world.sandbox.compensations(tenant="acme")
    assert [(c.at_s, c.completed_at_s) for c in compensations] == [
        (c.at_s - OFFSET_S, c.completed_at_s - OFFSET_S)
        for c in twin.sandbox.compensations(tenant="acme")
    ]
    assert compensations
    assert world.sandbox.complete_since_s() == twin.sandbox.complete_since_s()  # -inf stays
    assert world.sandbox.warm_pool("acme") == twin.sandbox.warm_pool("acme")

    job = world.jobset("pretrain-405b")
    embedded = twin.jobset("pretrain-405b")
    assert job.started_at_s == embedded.started_at_s - OFFSET_S
    assert job.checkpoint_at_s == embedded.checkpoint_at_s - OFFSET_S
    assert job.step == embedded.step
    assert world.flight_recorder("pretrain-405b") == list(twin.flight_recorder("pretrain-405b"))
    assert world.flags() == dict(twin.flags())
    assert world.fleet_spec() == twin.fleet_spec()
    assert world.rollout_view("llm-70b") == twin.rollout_view("llm-70b")
    assert world.quarantined_pods() == twin.quarantined_pods()
    assert world.quarantine_actions() == dict(twin.quarantine_actions())
