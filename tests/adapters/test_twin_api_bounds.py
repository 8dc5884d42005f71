"""The control API checks every argument before applying anything, and never waits forever.

A bad argument (NaN, an infinity, a 20-digit replica count, a negative GPU) is a 400 naming the
field; the twin's state is exactly what it was, ``/v1/injected`` still answers, and the server
keeps serving. A client that connects and never sends its request (or its announced body) is cut
off after the server's socket timeout instead of holding a thread.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from firedrill.adapters import metrics_server
from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.twin_api import ControlApi, _static_state
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin

FLEET = Path(__file__).resolve().parents[1] / "drill" / "fleet-small.yaml"
TOKEN = "t" * 43


@pytest.fixture
def served() -> Iterator[tuple[Twin, str]]:
    twin = Twin(load_fleet(FLEET), 3, hours_hint=1.0)
    api = ControlApi(twin, threading.Lock(), TOKEN)
    with MetricsServer(lambda: "", api=api.handle) as server:
        yield twin, server.url


def _call(url: str, body: bytes | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body, method="GET" if body is None else "POST")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _snapshot(twin: Twin) -> tuple[object, ...]:
    return (
        _static_state(twin),
        dict(twin.dcgm),
        twin.desired.tolist(),
        [n.link_down for n in twin.nodes],
        list(twin.journal),
    )


NODE = "{node}"  # filled with a real node name
BAD_BODIES = {
    "thermal NaN": (
        '{"op": "InjectThermal", "args": {"node": "{node}", "gpu": 0, "slowdown": NaN}}',
        "InjectThermal.slowdown",
    ),
    "thermal infinity": (
        '{"op": "InjectThermal", "args": {"node": "{node}", "gpu": 1, "slowdown": Infinity}}',
        "InjectThermal.slowdown",
    ),
    "dcgm value NaN": (
        '{"op": "InjectDcgmField", "args": {"node": "{node}", "gpu": 0, "field_id": 230,'
        ' "value": NaN}}',
        "InjectDcgmField.value",
    ),
    "dcgm negative field": (
        '{"op": "InjectDcgmField", "args": {"node": "{node}", "gpu": 0, "field_id": -2,'
        ' "value": 1}}',
        "InjectDcgmField.field_id",
    ),
    "dcgm negative gpu": (
        '{"op": "InjectDcgmField", "args": {"node": "{node}", "gpu": -1, "field_id": 230,'
        ' "value": 1}}',
        "InjectDcgmField.gpu",
    ),
    "replicas 1e20": (
        '{"op": "SetReplicas", "args": {"model": "llm-70b", "cell": "use1-a",'
        ' "replicas": 100000000000000000000}}',
        "SetReplicas.replicas",
    ),
    "paused replicas 2**64": (
        '{"op": "PauseScaler", "args": {"model": "llm-70b", "cell": "use1-a",'
        f' "replicas": {2**64}}}}}',
        "PauseScaler.replicas",
    ),
    "route weight 1e30": (
        '{"op": "SetRouteWeights", "args": {"model": "llm-70b",'
        f' "weights": [["use1-a", {10**30}]]}}}}',
        "SetRouteWeights.weights",
    ),
    "serving errors infinity": (
        '{"op": "InjectServingErrors", "args": {"model": "llm-70b", "cell": "use1-a",'
        ' "fraction": -Infinity}}',
        "InjectServingErrors.fraction",
    ),
    "straggler NaN": (
        '{"op": "InjectStraggler", "args": {"jobset": "x", "rank": 0, "slowdown": NaN}}',
        "InjectStraggler.slowdown",
    ),
    "a 5000-digit integer": (
        '{"op": "SetReplicas", "args": {"model": "llm-70b", "cell": "use1-a",'
        f' "replicas": {"9" * 5000}}}}}',
        "not JSON",
    ),
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "a 400-digit float": (
        '{"op": "InjectDcgmField", "args": {"node": "{node}", "gpu": 0, "field_id": 230,'
        f' "value": {"9" * 400}}}}}',
        "InjectDcgmField.value",
    ),
}


NOT_JSON = {"a 5000-digit integer", "nested 100,000 deep", "a 400-digit float"}  # not decoded


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_a_bad_argument_is_a_400_and_changes_nothing(served: tuple[Twin, str], case: str) -> None:
    twin, url = served
    node = twin.node_views(cell="use1-a")[0].name
    body, names = BAD_BODIES[case]
    before = _snapshot(twin)
    for endpoint in ("/v1/inverse", "/v1/apply"):
        status, reply = _call(url + endpoint, body.replace(NODE, node).encode())
        assert status == 400, reply
        assert reply["kind"] == ("bad_request" if case in NOT_JSON else "operation")
        assert names in str(reply["error"])
    assert _snapshot(twin) == before
    status, injected = _call(url + "/v1/injected")
    assert status == 200
    assert injected["injected"] == []
    # the server still applies a good operation afterwards
    good = {"op": "InjectThermal", "args": {"node": node, "gpu": 0, "slowdown": 3.0}}
    status, _ = _call(url + "/v1/apply", json.dumps(good).encode())
    assert status == 200
    status, injected = _call(url + "/v1/injected")
    assert status == 200
    assert injected["injected"] == [
        {"kind": "thermal", "target": f"{node} gpu0", "baseline": False, "now": True}
    ]


def test_the_server_sets_a_socket_timeout() -> None:
    timeout = metrics_server._Handler.timeout
    assert timeout is not None
    assert 0 < timeout <= 30


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_client_that_never_sends_its_body_is_cut_off(
    served: tuple[Twin, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    twin, url = served
    monkeypatch.setattr(metrics_server._Handler, "timeout", 0.5)
    with _connect(url) as silent:  # announces 100 bytes, sends none
        silent.sendall(
            b"POST /v1/apply HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        t0 = time.monotonic()
        reply = _read_all(silent)
        waited = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.0 408"), reply
    assert waited < 5
    with _connect(url) as mute:  # never sends a request line at all
        t0 = time.monotonic()
        assert _read_all(mute) == b""
        assert time.monotonic() - t0 < 5
    assert twin.journal == []
    status, _ = _call(url + "/v1/now")
    assert status == 200
