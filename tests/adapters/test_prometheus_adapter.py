"""``PrometheusSignals`` and ``AlertmanagerClient`` against the real servers on loopback, and their
error paths (down, 5xx, bad query, malformed answers) through httpx's ``MockTransport``."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from firedrill.adapters.alertmanager import AlertmanagerClient
from firedrill.adapters.clock import WallClock
from firedrill.adapters.prometheus import PrometheusSignals, selector
from firedrill.errors import BadQueryError, SignalsUnavailable
from tests.adapters.test_twin_serve import free_port, stop_process, wait_for


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping itself every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found: install the Debian package (make tools)", pytrace=False)
    work = tmp_path_factory.mktemp("prom")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "self", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (work / "log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        client = PrometheusSignals(url, retries=1)
        wait_for(
            "Prometheus to scrape itself twice",
            lambda: _samples(client) >= 2,
            timeout_s=30,
        )
        yield url
    finally:
        stop_process(proc)
        log.close()


def _samples(client: PrometheusSignals) -> int:
    try:
        return int(client.vector('count_over_time(up{job="self"}[1m])')[0].value)
    except (SignalsUnavailable, BadQueryError, IndexError):
        return 0


def test_the_signals_port_reads_a_real_prometheus(prometheus: str) -> None:
    with PrometheusSignals(prometheus, step_s=1) as p:
        assert "up" in p.series_names()
        t, labels, values = p.instant("up", {"job": "self"})
        assert abs(t - time.time()) < 5
        assert [dict(lab)["job"] for lab in labels] == ["self"]
        assert values.tolist() == [1.0]
        now = time.time()
        series = p.query("up", {"job": "self"}, start_s=now - 10, end_s=now)
        assert len(series) == 1
        assert series[0].name == "up"
        assert series[0].label("instance").startswith("127.0.0.1:")
        assert series[0].t_s.size >= 2
        assert set(series[0].values.tolist()) == {1.0}
        assert p.query("up", {"job": "nobody"}, start_s=now - 10, end_s=now) == []


def test_a_bad_query_is_a_bad_query_error_not_retried(prometheus: str) -> None:
    slept: list[float] = []
    with PrometheusSignals(prometheus, sleep=slept.append) as p:
        with pytest.raises(BadQueryError, match="bad_data") as caught:
            p.vector("sum(rate(up[1m])")
        assert caught.value.status == 400
        assert slept == []


def test_a_prometheus_that_is_down_is_unavailable_after_retries() -> None:
    slept: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    p = PrometheusSignals(url, retries=3, backoff_s=0.1, sleep=slept.append)
    with pytest.raises(SignalsUnavailable, match="after 3 attempt") as caught:
        p.vector("up")
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert slept == [0.1, 0.2]  # exponential back-off between the attempts


def _mock(handler: httpx.MockTransport) -> PrometheusSignals:
    return PrometheusSignals("http://prom.test", transport=handler, sleep=lambda _: None)


def test_5xx_is_retried_then_succeeds_and_retry_after_is_honoured() -> None:
    calls: list[int] = []
    slept: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(503, headers={"Retry-After": "2"}, text="overloaded")
        return httpx.Response(
            200,
            json={
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [{"metric": {"__name__": "up", "cell": "a"}, "value": [1.0, "1"]}],
                },
            },
        )

    p = PrometheusSignals(
        "http://prom.test", transport=httpx.MockTransport(handler), sleep=slept.append
    )
    assert [s.label("cell") for s in p.vector("up")] == ["a"]
    assert len(calls) == 2
    assert slept == [2.0]


def test_timeouts_and_malformed_answers_map_to_firedrill_errors() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(SignalsUnavailable, match="timed out") as caught:
        _mock(httpx.MockTransport(timeout)).vector("up")
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)

    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>")

    with pytest.raises(BadQueryError, match="did not answer JSON"):
        _mock(httpx.MockTransport(garbage)).vector("up")

    def wrong_shape(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "matrix", "result": []}}
        )

    with pytest.raises(BadQueryError, match="expected a vector"):
        _mock(httpx.MockTransport(wrong_shape)).vector("up")


def test_selectors_escape_values_and_refuse_bad_names() -> None:
    assert selector("up", {"b": 'x"y', "a": "1"}) == 'up{a="1",b="x\\"y"}'
    with pytest.raises(BadQueryError):
        selector("up}or{", {})
    with pytest.raises(BadQueryError):
        selector("up", {"a b": "1"})


def test_the_wall_clock_reads_real_time_from_its_epoch() -> None:
    clock = WallClock(epoch_unix_s=time.time() - 100)
    assert 99 < clock.now_s() < 110
    slept: list[float] = []
    WallClock(sleep=slept.append).advance(2.5)
    assert slept == [2.5]
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail("Alertmanager not found: install prometheus-alertmanager", pytrace=False)
    port, cluster = free_port(), free_port()
    config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "am.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        probe = AlertmanagerClient(url, retries=1)
        wait_for("Alertmanager to be ready", probe.ready, timeout_s=20)
        yield url
    finally:
        stop_process(proc)
        log.close()


def test_alerts_and_silences_on_a_real_alertmanager(alertmanager: str) -> None:
    labels = {"alertname": "CellAvailabilityBurnFast", "cell": "use1-a", "severity": "page"}
    posted = httpx.post(f"{alertmanager}/api/v2/alerts", json=[{"labels": labels}], timeout=5)
    assert posted.status_code == 200
    with AlertmanagerClient(alertmanager) as am:
        wait_for("the alert to be held", lambda: len(am.alerts({"cell": "use1-a"})) == 1)
        (held,) = am.alerts({"cell": "use1-a"})
        assert held.label("alertname") == "CellAvailabilityBurnFast"
        assert held.state == "active"
        sid = am.silence(
            {"cell": "use1-a"}, created_by="Alice", comment="draining use1-a", duration_s=600
        )
        (silence,) = [s for s in am.silences() if s.id == sid]
        assert silence.created_by == "Alice"
        assert silence.matchers == (("cell", "use1-a"),)
        wait_for("the alert to be silenced", lambda: am.alerts({"cell": "use1-a"}) == [])
        assert am.alerts({"cell": "use1-a"}, active_only=False)[0].silenced_by == (sid,)
        am.expire(sid)
        with pytest.raises(BadQueryError):
            am.silence({}, created_by="Alice", comment="x", duration_s=60)
