"""The controller's reader against a real Prometheus on loopback, and the controller acting on it.

A tiny exporter serves dcgm-exporter's XID gauge (labels ``Hostname`` and ``gpu``, as the DCGM
exporter writes them); a real Prometheus scrapes it every second; ``PrometheusSignals`` reads it
back through the HTTP API, and the controller, leading on the replaying apiserver, quarantines
the node whose GPU reports XID 79.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from firedrill.adapters.kubernetes.client import Connection
from firedrill.adapters.kubernetes.lease import LeaderElector
from firedrill.adapters.kubernetes.operator import ControllerProcess
from firedrill.adapters.kubernetes.signals import PrometheusSignals, SignalsError
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_spec
from tests.adapters.kubernetes.conftest import Cluster
from tests.adapters.kubernetes.test_controller import _seed_cell

ROOT = Path(__file__).resolve().parents[3]
EXPOSITION = (
    "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
    'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-00",gpu="0"} 0\n'
    'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-01",gpu="0"} 79\n'
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = EXPOSITION.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("prometheus")
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed: the live reader test did not run")
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "dcgm",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address={url.removeprefix('http://')}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"{url}/api/v1/query", params={"query": "DCGM_FI_DEV_XID_ERRORS"})
                if r.status_code == 200 and len(r.json()["data"]["result"]) == 2:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus never scraped the exporter"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        exporter.shutdown()
        log.close()


def _now() -> datetime:
    return datetime.now(UTC)


def test_the_reader_reads_dcgm_series_from_prometheus(prometheus: str) -> None:
    start = _now()
    sig = PrometheusSignals(prometheus, now=_now, epoch=start)
    t, labels, values = sig.instant("DCGM_FI_DEV_XID_ERRORS")
    assert t >= 0.0
    by_host = {dict(lab)["Hostname"]: v for lab, v in zip(labels, values, strict=True)}
    assert by_host == {"gpu-00": 0.0, "gpu-01": 79.0}
    assert "DCGM_FI_DEV_XID_ERRORS" in sig.series_names()
    (one,) = sig.query("DCGM_FI_DEV_XID_ERRORS", {"Hostname": "gpu-01"}, start_s=0.0, end_s=0.0)
    assert one.t_s.tolist() == [pytest.approx(0.0, abs=1e-3)]  # seconds since the epoch
    assert set(one.values.tolist()) == {79.0}
    with pytest.raises(SignalsError, match="bad_data"):
        sig.instant("DCGM_FI_DEV_XID_ERRORS{")  # a broken selector is an error, not "healthy"


def test_the_controller_quarantines_what_prometheus_reports(
    prometheus: str, cluster: Cluster
) -> None:
    _seed_cell(cluster, 20)
    conn = Connection(cluster.fleet.client, cluster.fleet.transport)
    policy = load_spec(ROOT / "examples" / "policy.yaml", PolicySpec)
    signals = PrometheusSignals(prometheus, now=_now, epoch=_now())
    p = ControllerProcess(
        policy, conn, signals, LeaderElector(conn, "a", _now), now=_now, advise=False
    )
    for _ in range(policy.timings.hold_observations + 1):
        p.tick()
        time.sleep(0.05)
    assert p.ready(), p.last_error
    taints = cluster.server.get("", "nodes", "gpu-01")["spec"].get("taints", [])
    assert taints == [{"key": "gpu.corp/quarantine", "value": "xid79", "effect": "NoSchedule"}]
    assert "taints" not in cluster.server.get("", "nodes", "gpu-00")["spec"]
