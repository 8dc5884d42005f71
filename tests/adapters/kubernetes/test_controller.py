"""``firedrill controller``: leader election on a Lease, the policy acting through the cluster's
API (or advising with server-side dry runs), its probes and metrics, and the Prometheus reader."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from typer.testing import CliRunner

from firedrill.adapters.kubernetes import client as client_mod
from firedrill.adapters.kubernetes import signals as signals_mod
from firedrill.adapters.kubernetes.client import Connection
from firedrill.adapters.kubernetes.lease import LeaderElector, LeaseConfig
from firedrill.adapters.kubernetes.operator import ControllerProcess, ProbeServer
from firedrill.adapters.kubernetes.schemas import SchemaValidator
from firedrill.adapters.kubernetes.signals import PrometheusSignals, SignalsError
from firedrill.cli import app
from firedrill.model.series import Labels, Series, labels_of
from firedrill.model.state import NodeView
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_spec
from tests.adapters.kubernetes.cluster import node, seed_common
from tests.adapters.kubernetes.conftest import Cluster, make_cluster

ROOT = Path(__file__).resolve().parents[3]
LEASE = ("coordination.k8s.io", "leases", "firedrill-system", "firedrill-controller")


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


class FakeSignals:
    """DCGM's XID gauge: ``xid`` on (node, gpu 0) from ``since`` on, 0 elsewhere."""

    def __init__(self, clock: Clock, nodes: Sequence[str]) -> None:
        self.clock = clock
        self.nodes = list(nodes)
        self.xid: dict[str, tuple[datetime, float]] = {}

    def series_names(self) -> Sequence[str]:
        return ["DCGM_FI_DEV_XID_ERRORS"]

    def query(
        self, name: str, matchers: Mapping[str, str] | None = None, *, start_s: float, end_s: float
    ) -> Sequence[Series]:
        return []

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        if name != "DCGM_FI_DEV_XID_ERRORS":
            return 0.0, [], np.array([], dtype=np.float64)
        labels = [labels_of(Hostname=n, gpu="0") for n in self.nodes]
        values = []
        for n in self.nodes:
            since, v = self.xid.get(n, (self.clock.t + timedelta(days=1), 0.0))
            values.append(v if self.clock.t >= since else 0.0)
        return 0.0, labels, np.array(values, dtype=np.float64)


def _seed_cell(c: Cluster, count: int = 20) -> list[str]:
    names = [f"gpu-{i:02d}" for i in range(count)]
    for n in names:
        c.server.add(
            node(
                NodeView(n, "us-east-1", "use1-a", "h100", "serve", 8, True, False, (),
                         (("nvidia.com/gpu.present", "true"),), ())
            )
        )  # fmt: skip
    seed_common(c.server, {})
    return names


def _conn(c: Cluster) -> Connection:
    return Connection(c.fleet.client, c.fleet.transport)


def test_one_leader_takeover_after_expiry_and_races_lost_cleanly(cluster: Cluster) -> None:
    clock = Clock()
    a = LeaderElector(_conn(cluster), "replica-a", clock, LeaseConfig(duration_s=15))
    b = LeaderElector(_conn(cluster), "replica-b", clock, LeaseConfig(duration_s=15))
    assert a.step() is True
    assert b.step() is False
    lease = cluster.server.objects[LEASE]["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("replica-a", 0)
    clock.advance(5)
    assert a.step() is True  # renewed
    assert b.step() is False
    clock.advance(16)  # a stopped renewing: its lease expired
    assert a.is_leader is False  # a knows it cannot act any more without renewing
    assert b.step() is True
    lease = cluster.server.objects[LEASE]["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("replica-b", 1)
    assert a.step() is False  # b holds it and renewed just now
    # two candidates racing for an expired lease: the loser's write is a 409
    clock.advance(20)
    cluster.server.fail("PATCH", r"/leases/firedrill-controller$", 409)
    assert a.step() is False
    assert a.last_error.startswith("409")
    assert a.step() is True  # the next round wins fairly (b never renewed)
    assert cluster.server.violations == []  # every Lease body fit coordination.k8s.io/v1


def test_a_leader_that_cannot_renew_stops_acting(cluster: Cluster) -> None:
    clock = Clock()
    a = LeaderElector(_conn(cluster), "replica-a", clock, LeaseConfig(renew_deadline_s=10))
    assert a.step() is True
    cluster.server.fail("GET", r"/leases/", 0, times=5)
    clock.advance(5)
    assert a.step() is True  # unreachable, but within the renew deadline
    clock.advance(6)
    assert a.step() is False  # past it: a follower until it renews
    assert a.last_error.startswith("unreachable")


@pytest.mark.parametrize("advise", [False, True])
def test_the_leader_quarantines_through_the_api_the_standby_does_nothing(
    advise: bool, validator: SchemaValidator
) -> None:
    cluster = make_cluster(validator)
    clock = Clock()
    names = _seed_cell(cluster)
    signals = FakeSignals(clock, names)
    signals.xid["gpu-03"] = (clock.t + timedelta(seconds=30), 79.0)
    policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec)
    leader = ControllerProcess(
        policy, _conn(cluster), signals, LeaderElector(_conn(cluster), "a", clock),
        now=clock, advise=advise,
    )  # fmt: skip
    standby_cluster = Connection(cluster.fleet.client, cluster.fleet.transport)
    standby = ControllerProcess(
        policy, standby_cluster, signals, LeaderElector(standby_cluster, "b", clock),
        now=clock, advise=advise,
    )  # fmt: skip
    for _ in range(8):
        clock.advance(policy.timings.evaluation_interval_s)
        leader.tick()
        standby.tick()
    assert leader.elector.is_leader
    assert not standby.elector.is_leader
    assert standby.fleet.journal == []  # the standby never acted
    ops_done = [type(r.op).__name__ for r in leader.fleet.journal]
    assert ops_done[:4] == ["Taint", "Label", "Label", "Drain"]
    writes = [w for r in leader.fleet.journal for w in r.writes]
    n = cluster.server.get("", "nodes", "gpu-03")
    if advise:
        assert all(w.dry_run for w in writes)
        assert "taints" not in n["spec"]  # advising changed nothing
    else:
        assert not any(w.dry_run for w in writes)
        assert n["spec"]["taints"][0]["key"] == "gpu.corp/quarantine"
        assert n["spec"]["unschedulable"] is True
    assert cluster.server.violations == []
    text = _scrape(leader)
    assert "firedrill_controller_leader 1.0" in text
    assert 'firedrill_controller_actions_total{action="quarantine",cell="use1-a"} 1.0' in text
    assert (
        'gpu_quarantine_actions_total{cell="use1-a",node="gpu-03",region="us-east-1"} 1.0' in text
    )
    assert "firedrill_controller_leader 0.0" in _scrape(standby)


def _scrape(p: ControllerProcess) -> str:
    server = ProbeServer(p, host="127.0.0.1", port=0).start()
    try:
        return httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    finally:
        server.stop()


def test_probes_say_when_the_controller_is_ready_and_alive(cluster: Cluster) -> None:
    clock = Clock()
    names = _seed_cell(cluster)
    policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec)
    p = ControllerProcess(
        policy, _conn(cluster), FakeSignals(clock, names),
        LeaderElector(_conn(cluster), "a", clock), now=clock,
    )  # fmt: skip
    server = ProbeServer(p, host="127.0.0.1", port=0).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert httpx.get(f"{base}/readyz").status_code == 503  # no tick yet
        assert httpx.get(f"{base}/healthz").status_code == 200  # starting
        p.tick()
        assert httpx.get(f"{base}/readyz").status_code == 200
        cluster.server.fail("GET", r"/leases/", 0, times=50)
        clock.advance(15)
        p.tick()  # renewal failed but within the deadline: still leads, reads fine
        clock.advance(15)
        p.tick()  # past the renew deadline: a follower that cannot reach the apiserver
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 503
        assert "unreachable" in ready.text
        clock.advance(60)  # no tick for four intervals: stale
        assert httpx.get(f"{base}/healthz").status_code == 503
        assert httpx.get(f"{base}/nope").status_code == 404
    finally:
        server.stop()


def _prometheus(handler: httpx.MockTransport, clock: Clock) -> PrometheusSignals:
    return PrometheusSignals(
        "http://prometheus.invalid", now=clock, epoch=clock.t, transport=handler
    )


def test_the_prometheus_reader_speaks_the_http_api() -> None:
    clock = Clock()
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "gpu-1", "gpu": "0"},
                 "value": [clock.t.timestamp(), "79"]},
                {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "gpu-0", "gpu": "0"},
                 "value": [clock.t.timestamp(), "0"]},
            ]}})  # fmt: skip

    sig = _prometheus(httpx.MockTransport(answer), clock)
    clock.advance(30)
    t, labels, values = sig.instant("DCGM_FI_DEV_XID_ERRORS", {"gpu": "0"})
    assert t == 30.0
    assert [dict(x)["Hostname"] for x in labels] == ["gpu-0", "gpu-1"]
    assert values.tolist() == [0.0, 79.0]
    assert seen[0].url.params["query"] == 'DCGM_FI_DEV_XID_ERRORS{gpu="0"}'


def test_a_failing_prometheus_is_an_error_never_an_empty_healthy_answer() -> None:
    clock = Clock()
    bad = httpx.MockTransport(
        lambda r: httpx.Response(
            422, json={"status": "error", "errorType": "bad_data", "error": "parse error"}
        )
    )
    with pytest.raises(SignalsError, match="bad_data") as err:
        _prometheus(bad, clock).instant("DCGM_FI_DEV_XID_ERRORS")
    assert err.value.status == 422

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(SignalsError, match="unreachable") as err:
        _prometheus(httpx.MockTransport(down), clock).instant("DCGM_FI_DEV_XID_ERRORS")
    assert err.value.status is None


def test_the_command_ticks_once_against_the_cluster(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed_cell(cluster)
    monkeypatch.setattr(client_mod, "connect", lambda config=None, **_kw: _conn(cluster))

    def answer(request: httpx.Request) -> httpx.Response:
        data = {"resultType": "vector", "result": []}
        return httpx.Response(200, json={"status": "success", "data": data})

    class Replayed(PrometheusSignals):
        def __init__(self, url: str, *, now: Callable[[], datetime], epoch: datetime) -> None:
            super().__init__(url, now=now, epoch=epoch, transport=httpx.MockTransport(answer))

    monkeypatch.setattr(signals_mod, "PrometheusSignals", Replayed)
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["controller", str(ROOT / "examples" / "policy.yaml"), "--prometheus",
         "http://prometheus.invalid", "--once", "--identity", "ctl-0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary == {"advise": True, "error": "", "identity": "ctl-0", "leader": True,
                       "ready": True, "requests": summary["requests"]}  # fmt: skip
    assert cluster.server.objects[LEASE]["spec"]["holderIdentity"] == "ctl-0"
    bad = runner.invoke(app, ["controller", "/no/such/policy.yaml", "--prometheus", "http://x"])
    assert bad.exit_code == 4


def test_the_running_controller_keeps_a_node_cache_and_sees_node_layer_changes(
    cluster: Cluster,
) -> None:
    import copy

    clock = Clock()
    names = _seed_cell(cluster, 3)
    policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec)
    p = ControllerProcess(
        policy, _conn(cluster), FakeSignals(clock, names),
        LeaderElector(_conn(cluster), "a", clock), now=clock,
    )  # fmt: skip

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if p.ticks == 1:  # the exporter is upgraded on one node between two ticks
            n = copy.deepcopy(cluster.server.get("", "nodes", "gpu-01"))
            n["metadata"]["annotations"]["versions.firedrill.dev/dcgm_exporter"] = "3.3.9-3.6.1"
            cluster.server._store("", "nodes", "", n, "MODIFIED")

    p.run(lambda: p.ticks >= 200 or (p.ticks >= 3 and p.informer.events >= 1), sleep)
    assert p.informer.events >= 1
    (change,) = p.fleet.changes(since_s=0.0, cell="use1-a")
    assert (change.stream, change.subject, change.after, change.detail) == (
        "node_layer", "gpu-01", "3.3.9-3.6.1", "dcgm_exporter"
    )  # fmt: skip
    assert p.fleet.node_cache is not None  # node views come from the informer's cache
    lists = [c for c in cluster.fleet.transport.calls if c.path == "/api/v1/nodes" and not c.watch]
    assert len(lists) == 1  # one LIST at start; the ticks read the cache
    released = cluster.server.objects[
        ("coordination.k8s.io", "leases", "firedrill-system", "firedrill-controller")
    ]
    assert "holderIdentity" not in released["spec"]  # given up on the way out


def test_a_new_leader_counts_the_nodes_it_finds_quarantined_against_the_floor(
    cluster: Cluster,
) -> None:
    clock = Clock()
    names = _seed_cell(cluster, 20)
    for n in ("gpu-05", "gpu-06"):  # quarantined by the previous leader
        cluster.server.get("", "nodes", n)["spec"]["taints"] = [
            {"key": "gpu.corp/quarantine", "value": "xid79", "effect": "NoSchedule"}
        ]
    signals = FakeSignals(clock, names)
    signals.xid["gpu-03"] = (clock.t, 79.0)
    policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec)  # minHealthy 0.9
    p = ControllerProcess(
        policy, _conn(cluster), signals, LeaderElector(_conn(cluster), "b", clock),
        now=clock, advise=False,
    )  # fmt: skip
    for _ in range(4):
        clock.advance(15)
        p.tick()
    assert p.controller is not None
    assert sorted(p.controller.quarantined()) == ["gpu-05", "gpu-06"]
    # 20 nodes, 2 already out: a third would leave 85% < 90%, so the floor refuses it and pages
    assert [b.budget for b in p.controller.state.blocked] == ["min_healthy"]
    assert [pg.budget for pg in p.controller.state.pages] == ["min_healthy"]
    assert "taints" not in cluster.server.get("", "nodes", "gpu-03")["spec"]
