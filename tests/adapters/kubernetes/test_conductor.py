"""The drill conductor on a cluster: the L5 Workflow created, stopped, and recovered by journal."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from firedrill.adapters.journal_file import read
from firedrill.adapters.kubernetes import conductor as conductor_mod
from firedrill.adapters.kubernetes.client import Connection
from firedrill.adapters.kubernetes.conductor import WorkflowConductor
from firedrill.cli import app
from firedrill.drill.spec import DrillSpec
from firedrill.errors import OperationError
from firedrill.export.chaos_mesh import ChaosWorkflowExport, chaos_workflow
from firedrill.specfile import load_drill
from tests.adapters.kubernetes.conftest import Cluster

ROOT = Path(__file__).resolve().parents[3]
WF = ("chaos-mesh.org", "workflows")
runner = CliRunner()


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now_s(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def _l5() -> tuple[DrillSpec, ChaosWorkflowExport]:
    loaded = load_drill(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    return loaded.spec, chaos_workflow(loaded.spec, loaded.fleet)


def _conn(c: Cluster) -> Connection:
    return Connection(c.fleet.client, c.fleet.transport)


def _workflows(c: Cluster) -> list[str]:
    return [k[3] for k in c.server.objects if k[:2] == WF]


def test_a_stop_condition_deletes_the_workflow(cluster: Cluster, tmp_path: Path) -> None:
    spec, export = _l5()
    seen: list[float] = []

    def stop(t: float) -> str | None:
        seen.append(t)
        return "survivor-ttft-burn" if t >= 600 else None

    result = WorkflowConductor(_conn(cluster), FakeClock(), tmp_path).run(
        spec, export, stop, run_by="alice"
    )
    assert (result.stopped_by, result.at_s, result.verdict) == (
        "survivor-ttft-burn",
        600.0,
        "aborted",
    )
    assert result.created
    assert result.deleted
    assert _workflows(cluster) == []
    calls = [(c.method, c.target.plural, c.status) for c in cluster.fleet.transport.calls]
    assert calls == [("POST", "workflows", 201), ("DELETE", "workflows", 200)]
    assert cluster.server.violations == []  # the Workflow fit the upstream CRD on the way in
    state = read(result.journal)
    assert state.verdict == "aborted"
    assert state.header.target == "kubernetes:chaos-system/l5-region-blackhole-llm-70b"
    (intent,) = state.intents
    assert intent.applied
    assert intent.reverted
    assert type(intent.inverse).__name__ == "DeleteChaosWorkflow"
    assert seen == [i * 15.0 for i in range(41)]  # every step until it fired


def test_without_a_stop_the_workflow_is_deleted_at_the_cap(
    cluster: Cluster, tmp_path: Path
) -> None:
    spec, export = _l5()
    result = WorkflowConductor(_conn(cluster), FakeClock(), tmp_path, step_s=60.0).run(
        spec, export, lambda _t: None, run_by="alice"
    )
    assert (result.stopped_by, result.at_s, result.verdict) == (None, 3600.0, "passed")
    assert _workflows(cluster) == []


def test_advise_mode_creates_nothing(cluster: Cluster, tmp_path: Path) -> None:
    spec, export = _l5()
    result = WorkflowConductor(_conn(cluster), FakeClock(), tmp_path, dry_run=True).run(
        spec, export, lambda _t: None, run_by="alice"
    )
    assert not result.created
    (post,) = cluster.fleet.transport.calls
    assert post.dry_run
    assert post.method == "POST"
    assert _workflows(cluster) == []
    assert read(result.journal).verdict == "passed"


def test_l0_is_refused_it_injects_nothing(cluster: Cluster, tmp_path: Path) -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l0-tabletop.yaml")
    export = chaos_workflow(loaded.spec, loaded.fleet)
    with pytest.raises(OperationError, match="tabletop"):
        WorkflowConductor(_conn(cluster), FakeClock(), tmp_path).run(
            loaded.spec, export, lambda _t: None, run_by="alice"
        )
    assert cluster.fleet.transport.calls == []
    assert list(tmp_path.iterdir()) == []  # no journal either


def test_an_interrupted_conductor_is_recovered_by_gameday_recover(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, export = _l5()

    def crash(t: float) -> str | None:
        if t >= 300:
            raise KeyboardInterrupt  # the conductor dies mid-drill
        return None

    with pytest.raises(KeyboardInterrupt):
        WorkflowConductor(_conn(cluster), FakeClock(), tmp_path).run(
            spec, export, crash, run_by="alice"
        )
    assert _workflows(cluster) == ["l5-region-blackhole-llm-70b"]  # left injecting
    (path,) = tmp_path.iterdir()
    assert read(path).verdict is None
    # `gameday recover` reaches the cluster through the adapter (here: the replaying apiserver)
    monkeypatch.setattr(conductor_mod, "connect", lambda: _conn(cluster))
    result = runner.invoke(app, ["gameday", "recover", "--journal-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "recovered" in result.output
    assert "DeleteChaosWorkflow" in result.output
    assert _workflows(cluster) == []
    state = read(path)
    assert state.verdict == "recovered"
    assert all(i.reverted for i in state.intents)
    again = runner.invoke(app, ["gameday", "recover", "--journal-dir", str(tmp_path)])
    assert again.exit_code == 0
    assert "nothing to recover" in again.output


def test_recovery_of_a_workflow_already_gone_finishes_the_journal(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, export = _l5()

    def crash(t: float) -> str | None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        WorkflowConductor(_conn(cluster), FakeClock(), tmp_path).run(
            spec, export, crash, run_by="alice"
        )
    cluster.server.objects.clear()  # someone deleted it by hand
    monkeypatch.setattr(conductor_mod, "connect", lambda: _conn(cluster))
    result = runner.invoke(app, ["gameday", "recover", "--journal-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.iterdir()
    assert read(path).verdict == "recovered"


def test_an_unreachable_cluster_leaves_the_journal_open(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, export = _l5()
    with pytest.raises(KeyboardInterrupt):
        WorkflowConductor(_conn(cluster), FakeClock(), tmp_path).run(
            spec, export, lambda _t: (_ for _ in ()).throw(KeyboardInterrupt), run_by="alice"
        )
    cluster.server.fail("DELETE", r"/workflows/", 0, times=1)
    monkeypatch.setattr(conductor_mod, "connect", lambda: _conn(cluster))
    result = runner.invoke(app, ["gameday", "recover", "--journal-dir", str(tmp_path)])
    assert result.exit_code == 4
    (path,) = tmp_path.iterdir()
    assert read(path).verdict is None  # tried again next time
    assert _workflows(cluster) == ["l5-region-blackhole-llm-70b"]
    result = runner.invoke(app, ["gameday", "recover", "--journal-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert _workflows(cluster) == []


def _replayed_prometheus(monkeypatch: pytest.MonkeyPatch, firing: list[dict[str, str]]) -> None:
    """``PrometheusSignals`` answering from memory: ``ALERTS`` with ``firing``, nothing else."""
    import httpx

    from firedrill.adapters.kubernetes import signals as signals_mod

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params.get("query", "")
        result: list[dict[str, object]] = []
        if query.startswith("ALERTS"):
            result = [{"metric": {"__name__": "ALERTS", **m}, "value": [0, "1"]} for m in firing]
        data = {"resultType": "vector", "result": result}
        if request.url.path.endswith("query_range"):
            data = {"resultType": "matrix", "result": []}
        return httpx.Response(200, json={"status": "success", "data": data})

    class Replayed(signals_mod.PrometheusSignals):
        def __init__(self, url: str, *, now: Callable[[], datetime], epoch: datetime) -> None:
            super().__init__(url, now=now, epoch=epoch, transport=httpx.MockTransport(answer))

    monkeypatch.setattr(signals_mod, "PrometheusSignals", Replayed)


def test_conduct_stops_on_a_prometheus_alert_and_deletes_the_workflow(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from firedrill.adapters.kubernetes import client as client_mod

    monkeypatch.setattr(client_mod, "connect", lambda config=None, **_kw: _conn(cluster))
    _replayed_prometheus(
        monkeypatch,
        [{"alertname": "CellTTFTBurnFast", "alertstate": "firing", "region": "us-west-2"}],
    )
    drill = str(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    args = ["conduct", drill, "--prometheus", "http://prometheus.invalid",
            "--journal-dir", str(tmp_path), "--run-by", "alice"]  # fmt: skip
    advised = runner.invoke(app, args)  # the default: a server-side dry run, nothing created
    assert advised.exit_code == 0, advised.output
    assert '"created": false' in advised.stdout
    assert _workflows(cluster) == []
    result = runner.invoke(app, [*args, "--apply"])
    assert result.exit_code == 3, result.output  # aborted by a stop condition
    assert '"stopped_by": "survivor-ttft-burn"' in result.stdout
    assert _workflows(cluster) == []
    posts = [c for c in cluster.fleet.transport.calls if c.method == "POST"]
    assert [p.dry_run for p in posts] == [True, False]
    assert [c.method for c in cluster.fleet.transport.calls if c.method != "POST"] == ["DELETE"]
