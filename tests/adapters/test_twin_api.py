"""The twin's control API and ``RemoteTwin``: the ports over HTTP, with a bearer token.

The server runs in this process (a ``MetricsServer`` with the API mounted, as ``twin serve`` does)
on a free loopback port; the kill test in tests/drill/test_recover.py runs it as its own process.
"""

from __future__ import annotations

import json
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.remote_twin import RemoteTwin, load_token
from firedrill.adapters.twin_api import (
    ControlApi,
    control_api,
    is_loopback,
    read_token_file,
    write_token_file,
)
from firedrill.errors import OperationError, RemoteWorldError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET = Path(__file__).resolve().parents[1] / "drill" / "fleet-small.yaml"
TOKEN = "t" * 43


@pytest.fixture
def served() -> Iterator[tuple[Twin, RemoteTwin]]:
    twin = Twin(load_fleet(FLEET), 3, hours_hint=1.0)
    api = ControlApi(twin, threading.Lock(), TOKEN)
    server = MetricsServer(lambda: "", api=api.handle)
    with server:
        yield twin, RemoteTwin(server.url, TOKEN)


def test_the_ports_over_http_answer_what_the_twin_answers(
    served: tuple[Twin, RemoteTwin],
) -> None:
    twin, remote = served
    remote.advance(120.0)
    assert remote.now_s() == twin.now_s() == 120.0
    assert remote.cells() == list(twin.cells())
    assert remote.node_views(cell="usw2-a") == list(twin.node_views(cell="usw2-a"))
    node = twin.node_views(cell="use1-a")[0].name
    assert remote.node(node) == twin.node(node)
    assert remote.pods_on(node) == list(twin.pods_on(node))
    assert remote.burn_in_result(node) is None
    assert remote.series_names() == list(twin.series_names())
    match = {"cell": "use1-a", "model_name": "llm-70b"}
    (got,) = remote.query("vllm:num_requests_running", match, start_s=0.0, end_s=120.0)
    (want,) = twin.query("vllm:num_requests_running", match, start_s=0.0, end_s=120.0)
    assert got.labels == want.labels
    np.testing.assert_array_equal(got.t_s, want.t_s)
    np.testing.assert_array_equal(got.values, want.values)
    t, labels, values = remote.instant("vllm:num_requests_running")
    t2, labels2, values2 = twin.instant("vllm:num_requests_running")
    assert (t, list(labels)) == (t2, list(labels2))
    np.testing.assert_array_equal(values, values2)
    remote.apply(ops.SetRouteWeights("llm-70b", (("use1-a", 0),)))
    assert remote.changes(since_s=0.0) == list(twin.changes(since_s=0.0))
    assert remote.changes(since_s=0.0)[0].subject == "llm-70b"


def test_apply_returns_the_inverse_and_injected_shows_what_differs(
    served: tuple[Twin, RemoteTwin],
) -> None:
    twin, remote = served
    node = twin.node_views(cell="use1-a")[0].name
    assert remote.injected() == []
    east_west = ("us-east-1", "us-west-2")
    applied: list[tuple[ops.Operation, ops.Operation]] = [
        (ops.Partition("region-region", *east_west), ops.Heal("region-region", *east_west)),
        (ops.PauseReplication(*east_west), ops.ResumeReplication(*east_west)),
        (ops.DenyCapacity("us-west-2"), ops.AllowCapacity("us-west-2")),
        (ops.InjectDcgmField(node, 2, 230, 7.0), ops.ClearDcgmField(node, 2, 230, 0.0)),
        (ops.Cordon(node), ops.Uncordon(node)),
    ]
    for op, inverse in applied:
        assert remote.inverse_of(op) == inverse  # changes nothing ...
    assert remote.injected() == []
    for op, inverse in applied:
        assert remote.apply(op) == inverse  # ... apply does
    found = {(i["kind"], i["target"]): (i["baseline"], i["now"]) for i in remote.injected()}
    assert found == {
        ("partition", "region-region us-east-1/us-west-2"): (None, "cut"),
        ("replication_paused", "us-east-1->us-west-2"): (None, "paused"),
        ("capacity_denied", "us-west-2"): (None, "denied"),
        ("dcgm", f"{node} gpu2 field230"): (0.0, 7.0),
        ("cordon", node): (None, True),
    }
    for _, inverse in reversed(applied):
        remote.apply(inverse)
    assert remote.injected() == []


def test_state_the_twin_changes_by_itself_is_not_a_leftover(
    served: tuple[Twin, RemoteTwin],
) -> None:
    twin, remote = served
    node = twin.node_views(cell="usw2-a")[1].name
    twin.dcgm[(twin.node_index[node], 0, 230)] = 4.0  # a background fault, not the API
    assert remote.injected() == []
    remote.apply(ops.InjectDcgmField(node, 0, 230, 9.0))
    assert [(i["baseline"], i["now"]) for i in remote.injected()] == [(4.0, 9.0)]
    remote.apply(ops.ClearDcgmField(node, 0, 230, 4.0))
    assert remote.injected() == []


def test_a_bad_operation_is_refused_with_its_reason_and_nothing_applied(
    served: tuple[Twin, RemoteTwin],
) -> None:
    twin, remote = served
    with pytest.raises(UnknownTargetError) as unknown:
        remote.apply(ops.DenyCapacity("mars-1"))
    assert (unknown.value.kind, unknown.value.name) == ("region", "mars-1")
    with pytest.raises(OperationError, match="replicas must be >= 0"):
        remote.apply(ops.SetReplicas("llm-70b", "use1-a", -1))
    with pytest.raises(OperationError, match="route weight"):
        remote.apply(ops.SetRouteWeights("llm-70b", (("use1-a", -5),)))
    assert twin.journal == []
    assert remote.injected() == []
    status, body = _post(remote.url + "/v1/apply", {"op": "Cordon", "args": {"node": 3}})
    assert status == 400
    assert body["kind"] == "bad_request"
    assert "Cordon.node: expected a string" in body["error"]
    status, body = _post(remote.url + "/v1/advance", {"seconds": -1})
    assert status == 400
    assert "seconds must be within" in body["error"]
    assert twin.now_s() == 0.0


def _post(url: str, data: object, token: str = TOKEN) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_the_token_is_required(served: tuple[Twin, RemoteTwin]) -> None:
    twin, remote = served
    intruder = RemoteTwin(remote.url, "x" * 43)
    with pytest.raises(RemoteWorldError, match="refused the control token") as info:
        intruder.apply(ops.DenyCapacity("us-east-1"))
    assert info.value.status == 401
    status, _ = _post(remote.url + "/v1/apply", {"op": "Noop", "args": {}}, token="")
    assert status == 401
    with urllib.request.urlopen(remote.url + "/metrics", timeout=5) as response:
        assert response.status == 200  # scraping stays open
    assert twin.capacity_denied == set()


def test_an_unreachable_twin_is_a_clear_error() -> None:
    with MetricsServer(lambda: "") as server:
        url = server.url
    with pytest.raises(RemoteWorldError, match=f"cannot reach the twin at {url}") as info:
        RemoteTwin(url, TOKEN).now_s()
    assert info.value.status is None
    with pytest.raises(RemoteWorldError, match="http"):
        RemoteTwin("127.0.0.1:9400", TOKEN)


def test_a_server_without_the_api_says_so() -> None:
    with MetricsServer(lambda: "") as server, pytest.raises(RemoteWorldError, match="404"):
        RemoteTwin(server.url, TOKEN).now_s()


def test_the_token_file_is_private_and_fresh(tmp_path: Path) -> None:
    path = tmp_path / "state" / "twin-token"
    first = write_token_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    second = write_token_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first != second
    assert len(second) >= 32
    assert read_token_file(path) == second
    assert load_token(path, environ={}) == second
    assert load_token(path, environ={"FIREDRILL_TWIN_TOKEN": "from-env"}) == "from-env"
    with pytest.raises(RemoteWorldError, match="cannot read the control token"):
        load_token(tmp_path / "absent", environ={})


def test_the_token_file_is_never_written_through_a_link_or_into_a_directory(
    tmp_path: Path,
) -> None:
    from firedrill.errors import UnsafePathError

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    link = tmp_path / "twin-token"
    link.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_token_file(link)
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_token_file(dangling)
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "dir").mkdir()
    with pytest.raises(UnsafePathError, match="not a regular file"):
        write_token_file(tmp_path / "dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "dir", "twin-token", "victim"]


def test_the_api_is_on_by_default_only_on_loopback(tmp_path: Path) -> None:
    twin = Twin(load_fleet(FLEET), 0, record=False)
    lock = threading.Lock()
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    token = tmp_path / "token"
    assert control_api(twin, lock, host="0.0.0.0", enabled=None, token_file=token) is None
    assert not token.exists()
    assert control_api(twin, lock, host="127.0.0.1", enabled=False, token_file=token) is None
    assert control_api(twin, lock, host="0.0.0.0", enabled=True, token_file=token) is not None
    assert control_api(twin, lock, host="127.0.0.1", enabled=None, token_file=token) is not None


def test_competing_pullers_and_their_freeze_are_leftovers_until_undone(
    served: tuple[Twin, RemoteTwin],
) -> None:
    _, remote = served
    undo = [
        remote.apply(ops.StartPullers("eval-sweep", "us-west-2", 4, 140.0, "eval")),
        remote.apply(ops.FreezePullers("us-west-2", True)),
    ]
    assert {(i["kind"], i["target"]) for i in remote.injected()} == {("recovery", "pullers")}
    for inverse in reversed(undo):
        remote.apply(inverse)
    assert remote.injected() == []


def test_the_world_ports_over_http_answer_what_the_embedded_adapter_answers(
    served: tuple[Twin, RemoteTwin],
) -> None:
    """Capacity, digests and history: the served twin and ``TwinWorld`` agree, value for value."""
    twin, remote = served
    world = TwinWorld(twin)
    node = twin.node_views(cell="use1-a")[0].name
    remote.apply(ops.InjectDcgmField(node, 0, 230, 79.0))  # XID 79: the replica on it goes
    remote.apply(ops.PromoteDigest("llm-70b", "us-east-1", "sha256:" + "c7" * 32))
    remote.advance(300.0)
    remote.settle()
    models = sorted({rc.model for c in twin.cells() for rc in c.replicas})
    for cell in (c.name for c in twin.cells()):
        for model in models:
            assert remote.max_rps_per_replica(model, cell) == world.max_rps_per_replica(model, cell)
            assert remote.cold_cache_penalty(model, cell) == world.cold_cache_penalty(model, cell)
    assert remote.capacity_errors() == world.capacity_errors()
    for model in models:
        assert remote.published(model) == list(world.published(model))
    assert len(remote.published("llm-70b")) == 2
    digest = remote.published("llm-70b")[-1].digest
    assert remote.digest_record(digest) == world.digest_record(digest)
    assert remote.digest_record("sha256:" + "00" * 32) is None
    for region in sorted({c.region for c in twin.cells()}):
        assert remote.serving_digests(region) == list(world.serving_digests(region))
    assert remote.serving_digests("us-east-1")
    assert remote.unsigned_replicas_admitted() == world.unsigned_replicas_admitted()
    faults = remote.fault_events(since_s=0.0)
    assert faults == list(world.fault_events(since_s=0.0))
    assert any(f.node == node and f.label == "xid79" for f in faults)
    moves = remote.replica_transitions(since_s=0.0)
    assert moves == list(world.replica_transitions(since_s=0.0))
    assert any(m.node == node and m.from_state == "ready" for m in moves)
    assert remote.replica_transitions(since_s=200.0) == list(
        world.replica_transitions(since_s=200.0)
    )
    with pytest.raises(UnknownTargetError):
        remote.max_rps_per_replica("no-such-model", "use1-a")
    with pytest.raises(UnknownTargetError):
        remote.published("no-such-model")
    with pytest.raises(UnknownTargetError):
        remote.serving_digests("no-such-region")
    with pytest.raises(RemoteWorldError, match="exactly one of 'model' or 'digest'"):
        remote._call("GET", "/v1/digests")
