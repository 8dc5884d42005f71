"""``twin calibrate`` refuses clearly, exit 4, and writes nothing, when there is nothing to fit.

A real Prometheus (backfilled with one hour of vLLM's request counter only) answers: no
kube-state-metrics, an empty window; a closed port stands for Prometheus being down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from firedrill.cli.main import app
from tests.adapters.test_twin_serve import free_port
from tests.calibrate.test_roundtrip import EXAMPLES, BackfilledPrometheus

START_UNIX_S = 1_700_000_000


@pytest.fixture(scope="module")
def requests_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackfilledPrometheus]:
    work = tmp_path_factory.mktemp("requests-only")
    lines = ["# TYPE http_requests_total counter"]
    for i in range(61):
        t = START_UNIX_S + 60 * i
        lines.append(
            f'http_requests_total{{model_name="llm-70b",region="us-east-1",status="2xx"}} '
            f"{100 * i} {t}"
        )
    path = work / "requests.om"
    path.write_text("\n".join([*lines, "# EOF", ""]))
    server = BackfilledPrometheus(path, work / "prometheus")
    try:
        yield server
    finally:
        server.stop()


def _calibrate(url: str, out: Path, *extra: str) -> tuple[int, str]:
    args = ["twin", "calibrate", "--prometheus", url, "--base", str(EXAMPLES / "fleet.yaml")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), *extra])
    return result.exit_code, result.output


def test_no_kube_state_metrics_is_a_clear_error(
    requests_only: BackfilledPrometheus, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.yaml"
    code, output = _calibrate(
        requests_only.url, out, "--window", "1h", "--end", str(START_UNIX_S + 3600)
    )
    assert code == 4, output
    assert "kube-state-metrics" in output
    assert not out.exists()


def test_an_empty_window_is_a_clear_error(
    requests_only: BackfilledPrometheus, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.yaml"
    code, output = _calibrate(
        requests_only.url, out, "--window", "1h", "--end", str(START_UNIX_S - 86_400)
    )
    assert code == 4, output
    assert "window is empty" in output
    assert not out.exists()


def test_prometheus_down_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    code, output = _calibrate(f"http://127.0.0.1:{free_port()}", out, "--window", "1h")
    assert code == 4, output
    assert "cannot reach Prometheus" in output
    assert not out.exists()


def test_a_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    code, output = _calibrate("http://127.0.0.1:9", tmp_path / "f.yaml", "--window", "seven")
    assert code == 2, output
