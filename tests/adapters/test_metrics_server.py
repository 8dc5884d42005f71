"""The /metrics endpoint, scraped over real HTTP on a loopback port."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus_text

from firedrill.adapters.metrics_server import MetricsServer, wants_openmetrics
from firedrill.model.series import Series, labels_of
from firedrill.twin.exposition import to_openmetrics, to_prometheus_text

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

SERIES = [
    Series(
        name="vllm:num_requests_waiting",
        labels=labels_of(model_name="llama-70b"),
        t_s=np.array([0.0, 15.0]),
        values=np.array([4.0, 2.0]),
    ),
    Series(
        name="http_requests_total",
        labels=labels_of(code="200"),
        t_s=np.array([0.0, 15.0]),
        values=np.array([10.0, 25.0]),
    ),
]


def parse_openmetrics(text: str) -> list[Metric]:
    return list(openmetrics_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("metrics-server")]


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    with MetricsServer(
        lambda: to_prometheus_text(SERIES),
        render_openmetrics=lambda: to_openmetrics(SERIES, at_s=15.0),
    ) as running:
        yield running


def test_serves_the_classic_text_format(server: MetricsServer) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.port > 0
    status, content_type, body = get(server.metrics_url)
    assert status == 200
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert body == to_prometheus_text(SERIES)
    families = {f.name: f for f in parse_prometheus_text(body)}
    assert families["http_requests"].type == "counter"
    assert [s.value for s in families["vllm:num_requests_waiting"].samples] == [2.0]


def test_serves_openmetrics_to_a_scraper_that_asks(server: MetricsServer) -> None:
    status, content_type, body = get(server.metrics_url, accept=PROMETHEUS_ACCEPT)
    assert status == 200
    assert content_type == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert body.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(body)}
    assert [s.value for s in families["http_requests"].samples] == [25]


def test_without_an_openmetrics_renderer_the_text_format_is_served() -> None:
    with MetricsServer(lambda: "up 1\n") as plain:
        status, content_type, body = get(plain.metrics_url, accept=PROMETHEUS_ACCEPT)
    assert (status, body) == (200, "up 1\n")
    assert content_type.startswith("text/plain; version=0.0.4")


def test_health_and_unknown_paths(server: MetricsServer) -> None:
    assert get(f"{server.url}/-/healthy")[0] == 200
    status, _, body = get(f"{server.url}/nope")
    assert status == 404
    assert "/nope" in body
    assert "/metrics" in body
    assert get(f"{server.url}/metrics?debug=1")[0] == 200


def test_a_failing_render_answers_500() -> None:
    def broken() -> str:
        raise ValueError("boom")

    with MetricsServer(broken) as failing:
        status, _, body = get(failing.metrics_url)
    assert status == 500
    assert "boom" not in body


def test_renders_on_every_scrape() -> None:
    calls: list[int] = []

    def render() -> str:
        calls.append(1)
        return f"scrapes_total {len(calls)}\n"

    with MetricsServer(render) as counting:
        bodies = [get(counting.metrics_url)[2] for _ in range(3)]
    assert bodies == ["scrapes_total 1\n", "scrapes_total 2\n", "scrapes_total 3\n"]


def test_stop_leaves_no_thread_and_closes_the_port() -> None:
    before = set(threading.enumerate())
    metrics = MetricsServer(lambda: "up 1\n")
    metrics.start()
    url = metrics.metrics_url
    assert get(url)[0] == 200
    assert metrics.running
    assert server_threads()
    metrics.stop()
    assert not metrics.running
    assert server_threads() == []
    assert set(threading.enumerate()) <= before
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    metrics.stop()  # stopping twice is harmless


def test_misuse_is_reported() -> None:
    metrics = MetricsServer(lambda: "")
    with pytest.raises(RuntimeError, match="not started"):
        _ = metrics.port
    with metrics, pytest.raises(RuntimeError, match="already started"):
        metrics.start()
    assert server_threads() == []


def test_binds_loopback_by_default() -> None:
    with MetricsServer(lambda: "") as metrics:
        assert metrics.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("", False),
        ("text/plain;version=0.0.4", False),
        ("application/openmetrics-text", True),
        (PROMETHEUS_ACCEPT, True),
        ("Application/OpenMetrics-Text; version=1.0.0", True),
        ("application/openmetrics-text;q=0,text/plain", False),
        ("application/openmetrics-text;q=bad", False),
    ],
)
def test_wants_openmetrics(accept: str | None, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected
