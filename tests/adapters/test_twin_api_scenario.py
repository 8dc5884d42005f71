"""What a scenario reads beyond a drill, over the served twin's control API.

JobSets and their flight recorders, the sandboxes' audit records and compensations, the change
journal, flags, quarantines and the fleet spec: ``RemoteTwin`` answers each with what the
embedded adapter (``TwinWorld``) answers on the same twin, typed; bad arguments get a 4xx with a
reason (and the same exception types the embedded twin raises), and a malformed answer is an
error naming the field, never a half-read record. The server runs in this process, as in
tests/adapters/test_twin_api.py.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from firedrill.adapters.metrics_server import MetricsServer
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.adapters.twin_api import ControlApi
from firedrill.drill.journal import decode_applied, encode_applied
from firedrill.errors import JournalError, RemoteWorldError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"  # tenants and a JobSet
TOKEN = "s" * 43
HASH = "sha256:" + "ab" * 32


@pytest.fixture
def served() -> Iterator[tuple[TwinWorld, RemoteTwin]]:
    twin = Twin(load_fleet(FLEET), 5, hours_hint=1.0)
    api = ControlApi(twin, threading.Lock(), TOKEN)
    with MetricsServer(lambda: "", api=api.handle) as server:
        yield TwinWorld(twin), RemoteTwin(server.url, TOKEN)


def _get(url: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def test_a_scenarios_reads_over_http_answer_what_the_embedded_adapter_answers(
    served: tuple[TwinWorld, RemoteTwin],
) -> None:
    world, remote = served
    assert remote.sandbox.complete_since_s() == world.sandbox.complete_since_s() == -math.inf
    remote.apply(ops.InjectExfiltration("acme", "use1-a", 2.0))
    remote.apply(ops.InjectPromptInjection("acme", "use1-a", HASH, "write", 0.5, 0.5))
    remote.apply(ops.InjectHang("pretrain-405b", 17))
    remote.advance(240.0)
    remote.apply(ops.RunCompensations("acme", 0.0))
    remote.apply(ops.SetFlag("acme.max_side_effect", "read"))
    pod = next(r.pod for r in world.egress_records(start_s=0.0, end_s=240.0, tenant="acme"))
    remote.apply(ops.QuarantinePod(pod))
    node = world.node_views(cell="use1-a")[0].name
    remote.apply(ops.Taint(node, "gpu.corp/quarantine", "xid"))
    remote.advance(30.0)

    for tenant in (None, "acme", "globex"):
        for start_s, end_s in ((0.0, 270.0), (100.0, 200.0)):
            egress = remote.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)
            assert egress == list(world.egress_records(start_s=start_s, end_s=end_s, tenant=tenant))
            calls = remote.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)
            assert calls == list(world.tool_records(start_s=start_s, end_s=end_s, tenant=tenant))
            assert remote.sandbox.egress_records(start_s=start_s, end_s=end_s, tenant=tenant) == (
                egress
            )
        assert remote.sandbox.compensations(tenant=tenant) == list(
            world.sandbox.compensations(tenant=tenant)
        )
    assert any(r.dest_class == "base64-subdomain" for r in remote.egress_records(
        start_s=0.0, end_s=270.0, tenant="acme"
    ))  # fmt: skip
    assert remote.sandbox.compensations(tenant="acme")  # the injected writes were compensated
    assert remote.sandbox.complete_since_s() == world.sandbox.complete_since_s()
    for tenant in ("acme", "globex"):
        assert remote.sandbox.warm_pool(tenant) == world.sandbox.warm_pool(tenant)
    assert remote.sandbox.has_pod(pod)
    assert world.sandbox.has_pod(pod)
    assert not remote.sandbox.has_pod("sbx-tenant-acme/no-such-pod")

    assert remote.operations() == list(world.operations())
    assert [type(a.op).__name__ for a in remote.operations()][-2:] == ["QuarantinePod", "Taint"]
    remote.apply(ops.SetFlag("proxy.deny_all", "true"))  # the journal is read from where it was
    assert remote.operations() == list(world.operations())
    assert remote.flags() == dict(world.flags())
    assert remote.flags()["proxy.deny_all"] == "true"
    assert remote.quarantined_pods() == world.quarantined_pods() == frozenset({pod})
    assert remote.quarantine_actions() == dict(world.quarantine_actions())
    assert remote.fleet_spec() == world.fleet_spec()
    for model in ("llm-70b", "llm-8b"):
        assert remote.rollout_view(model) == world.rollout_view(model)

    hung = remote.jobset("pretrain-405b")
    assert hung == world.jobset("pretrain-405b")
    assert hung.gpu_hours_lost == world.jobset("pretrain-405b").gpu_hours_lost
    ranks = remote.flight_recorder("pretrain-405b")
    assert ranks == list(world.flight_recorder("pretrain-405b"))
    assert len(ranks) == hung.ranks


def test_bad_arguments_are_refused_with_a_reason(served: tuple[TwinWorld, RemoteTwin]) -> None:
    world, remote = served
    with pytest.raises(UnknownTargetError) as unknown:
        remote.jobset("no-such-jobset")
    assert (unknown.value.kind, unknown.value.name) == ("jobset", "no-such-jobset")
    with pytest.raises(UnknownTargetError):
        remote.flight_recorder("no-such-jobset")
    with pytest.raises(UnknownTargetError) as unknown:
        remote.egress_records(start_s=0.0, end_s=10.0, tenant="initech")
    assert (unknown.value.kind, unknown.value.name) == ("tenant", "initech")
    with pytest.raises(UnknownTargetError):
        remote.sandbox.warm_pool("initech")
    with pytest.raises(UnknownTargetError):
        remote.rollout_view("no-such-model")
    base = remote.url + "/v1/"
    for path, reason in (
        ("egress?start_s=0", "missing query parameter 'end_s'"),
        ("egress?start_s=x&end_s=1", "'start_s' must be a number"),
        ("tool_calls?start_s=0&end_s=inf", "'end_s' must be finite"),
        ("tool_calls?start_s=10&end_s=1", "end_s (1) is before start_s (10)"),
        ("jobset", "missing query parameter 'name'"),
        ("flight_recorder", "missing query parameter 'jobset'"),
        ("rollout", "missing query parameter 'model'"),
        ("warm_pool", "missing query parameter 'tenant'"),
        ("sandbox_pod", "missing query parameter 'pod'"),
        ("operations?since=-1", "'since' is a count of operations"),
        ("operations?since=3", "'since' is 3, but only 0 operations were applied"),
    ):
        status, body = _get(base + path)
        assert status == 400, path
        assert reason in str(body["error"]), (path, body)
    assert world.operations() == []  # reads change nothing


def test_a_malformed_answer_is_an_error_naming_the_field() -> None:
    applied = ops.Applied(ops.Cordon("n1"), ops.Uncordon("n1"), 12.0, ("by the runbook",))
    assert decode_applied(json.loads(json.dumps(encode_applied(applied)))) == applied
    good = encode_applied(applied)
    for bad, reason in (
        ({**good, "at_s": "noon"}, "at_s is a number"),
        ({**good, "notes": [1]}, "notes are strings"),
        ({**good, "extra": 1}, "has no ['extra']"),
        ({**good, "inverse": {"op": "Cordon", "args": {"node": 3}}}, "Cordon.node"),
        ([], "is an object"),
    ):
        with pytest.raises(JournalError, match=reason.replace("[", r"\[").replace("]", r"\]")):
            decode_applied(bad)

    def answer(body: dict[str, object]) -> MetricsServer:
        def handle(method: str, target: str, headers: object, data: bytes) -> tuple[int, str, str]:
            return 200, json.dumps(body), "application/json"

        return MetricsServer(lambda: "", api=handle)

    record = {"at_s": 1.0, "tenant": "acme", "dest_class": "elsewhere"}
    with (
        answer({"records": [record]}) as server,
        pytest.raises(RemoteWorldError, match="malformed egress record list"),
    ):
        RemoteTwin(server.url, TOKEN).egress_records(start_s=0.0, end_s=1.0)
    with answer({"flags": {"a": 1}}) as server, pytest.raises(RemoteWorldError, match="'a'"):
        RemoteTwin(server.url, TOKEN).flags()
    with (
        answer({"fleet": {"name": 3}}) as server,
        pytest.raises(RemoteWorldError, match="malformed fleet spec"),
    ):
        RemoteTwin(server.url, TOKEN).fleet_spec()
