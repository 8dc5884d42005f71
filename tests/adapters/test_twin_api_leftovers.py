"""``/v1/injected`` after a clean run lists only real leftovers, not nodes the twin scaled out.

Sending all of a model's traffic to one cell makes the autoscaler take spare nodes; they join
with their cell's versions. Once the route is restored nothing is left behind, so the leftover
check must come back empty, while a version a drill really changed on a joined node still shows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.adapters.twin_api import ControlApi
from firedrill.model import operations as ops
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
TOKEN = "t" * 43


@pytest.fixture
def scaled_out() -> Iterator[tuple[Twin, RemoteTwin, list[str]]]:
    twin = Twin(load_fleet(FLEET), 1, hours_hint=1.0)
    lock = threading.Lock()
    api = ControlApi(twin, lock, TOKEN)
    before = {n.name for n in twin.nodes}
    with MetricsServer(lambda: "", api=api.handle) as server:
        remote = RemoteTwin(server.url, TOKEN)
        weights = tuple((c, 100 if c == "use1-a" else 0) for c in twin.cell_names)
        undo = remote.apply(ops.SetRouteWeights("llm-70b", weights))
        remote.advance(1800.0)  # the autoscaler asks for spare nodes; they join
        remote.apply(undo)
        remote.advance(60.0)
        joined = [n.name for n in twin.nodes if n.name not in before]
        yield twin, remote, joined


def test_nodes_the_twin_scaled_out_are_not_leftovers(
    scaled_out: tuple[Twin, RemoteTwin, list[str]],
) -> None:
    _, remote, joined = scaled_out
    assert joined, "the scenario must make the twin scale out"
    assert remote.injected() == []


def test_a_version_changed_on_a_joined_node_is_still_a_leftover(
    scaled_out: tuple[Twin, RemoteTwin, list[str]],
) -> None:
    _, remote, joined = scaled_out
    node = joined[0]
    remote.apply(ops.SetNodeVersion(node, "driver", "999.1"))
    found = [(i["kind"], i["target"], i["now"]) for i in remote.injected()]
    assert found == [("version", f"{node} driver", "999.1")]
