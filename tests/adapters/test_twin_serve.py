"""``firedrill twin serve``: the twin's series live on /metrics, scraped by a real Prometheus.

The command runs as its own process, exactly as an operator starts it, and is read only over
HTTP. At ``--speed 60`` one wall second is a simulated minute, and ``--hours 0.5`` bounds a run
to about 30 wall seconds, so a twin this file fails to stop still goes away by itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
DEMO_CELLS = 7  # examples/fleet.yaml: 3 regions, 7 cells
TIMEOUT_S = 15.0  # upper bound on any single wait; a pass takes a few seconds
JOB = "firedrill-twin"
INSTALL_HINT = "install the Debian package prometheus (`make tools`)"
# What Prometheus 2.x sends: OpenMetrics preferred, the classic text format accepted
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
SERVING = re.compile(r"serving .+ on http://127\.0\.0\.1:(\d+)/metrics")


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    """Status, Content-Type and body of a GET."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def parse_openmetrics(text: str) -> list[Metric]:
    return list(openmetrics_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def firedrill_command() -> list[str]:
    """The installed ``firedrill`` script next to this interpreter, else its entry point."""
    script = Path(sys.executable).parent / "firedrill"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from firedrill.cli import main; main()"]


def stop_process(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if it has not exited within 10 s; the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"pid {process.pid} ignored SIGTERM and was killed") from None
    return process.returncode


class ServedTwin:
    """One ``firedrill twin serve`` process on a free loopback port; its output in a file."""

    def __init__(self, workdir: Path) -> None:
        self.log_path = workdir / "twin-serve.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")  # one unwrapped line
        for forcing_colour in ("FORCE_COLOR", "TTY_COMPATIBLE"):
            env.pop(forcing_colour, None)
        args = ["twin", "serve", str(FLEET_YAML), "--speed", "60", "--port", "0"]
        args += ["--hours", "0.5", "--seed", "3"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*firedrill_command(), *args], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.port = 0
        try:
            wait_for("the 'serving ... on http://...' line", self._serving)
        except BaseException:
            self.stop()
            raise

    def _serving(self) -> bool:
        found = SERVING.search(self.output())
        if found:
            self.port = int(found.group(1))
            return True
        if self.process.poll() is not None:
            raise AssertionError(f"twin serve exited early:\n{self.output()}")
        return False

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return stop_process(self.process)


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[ServedTwin]:
    served = ServedTwin(tmp_path)
    try:
        yield served
    finally:
        served.stop()


def samples(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a text-format body, keyed by name and label set."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def requests_ok(twin: ServedTwin) -> float:
    """``http_requests_total`` of one cell's llm-70b, 2xx."""
    status, _, body = get(twin.metrics_url)
    assert status == 200
    labels = {"cell": "use1-a", "model_name": "llm-70b", "status": "2xx"}
    values = [
        value
        for (name, label_set), value in samples(body).items()
        if name == "http_requests_total" and set(labels.items()) <= label_set
    ]
    assert len(values) == 1, f"{len(values)} http_requests_total series match {labels}"
    return values[0]


def test_metrics_are_served_live_and_counters_advance(twin: ServedTwin) -> None:
    status, content_type, body = get(twin.metrics_url)

    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'vllm:num_requests_running{cell="' in body
    buckets = [
        line
        for line in body.splitlines()
        if line.startswith("vllm:time_to_first_token_seconds_bucket{") and 'le="2.5"' in line
    ]
    assert buckets, 'no vllm:time_to_first_token_seconds_bucket with le="2.5"'
    assert all('cell="' in line and 'region="' in line for line in buckets)
    # Real vLLM has no 2.0 s TTFT boundary, so neither has the twin.
    assert 'le="2.0"' not in body
    assert "# HELP vllm:time_to_first_token_seconds " in body
    families = {family.name for family in text_string_to_metric_families(body)}
    assert {"vllm:num_requests_running", "vllm:time_to_first_token_seconds"} <= families

    status, content_type, body = get(twin.metrics_url, accept=PROMETHEUS_ACCEPT)
    assert status == 200, body
    assert content_type.startswith("application/openmetrics-text")
    families = {family.name for family in parse_openmetrics(body)}
    assert {"vllm:num_requests_running", "http_requests"} <= families

    before = requests_ok(twin)
    # 60x: a simulated minute per wall second; a couple of seconds is plenty of traffic
    wait_for("http_requests_total to increase", lambda: requests_ok(twin) > before)

    assert twin.stop() == 0, twin.output()
    assert "stopped at simulated" in twin.output()


# --- a real Prometheus scraping it --------------------------------------------------------------


def prometheus_binary() -> str:
    """$FIREDRILL_PROMETHEUS, else ``prometheus`` on PATH."""
    override = os.environ.get("FIREDRILL_PROMETHEUS")
    if override:
        if not shutil.which(override):
            pytest.fail(f"FIREDRILL_PROMETHEUS={override} is not an executable", pytrace=False)
        return override
    found = shutil.which("prometheus")
    if not found:
        pytest.fail(
            f"Prometheus not found (neither $FIREDRILL_PROMETHEUS nor prometheus on PATH); "
            f"{INSTALL_HINT}",
            pytrace=False,
        )
    return found


class PrometheusServer:
    """One Prometheus process on a free loopback port, run with ``config`` (written into
    ``workdir``) on the storage in ``data``, with any further ``flags``."""

    def __init__(self, config: dict[str, Any], workdir: Path, data: Path, *flags: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={data}",
                    *flags,
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for("Prometheus to become ready", self._ready)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self._process.poll() is not None:
            raise AssertionError(f"Prometheus exited early:\n{self.log()}")
        try:
            return get(f"{self.url}/-/ready")[0] == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        status, _, body = get(url)
        assert status == 200, body
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        assert answer["data"]["resultType"] == "vector", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def stop(self) -> int:
        return stop_process(self._process)


class Prometheus(PrometheusServer):
    """One Prometheus server scraping ``target`` every second, storage in a temporary directory."""

    def __init__(self, target: str, workdir: Path) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
        }
        super().__init__(config, workdir, workdir / "data")


@pytest.fixture
def prometheus(twin: ServedTwin, tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(f"127.0.0.1:{twin.port}", tmp_path / "prometheus")
    try:
        yield server
    finally:
        server.stop()


def test_a_real_prometheus_scrapes_every_cell(twin: ServedTwin, prometheus: Prometheus) -> None:
    per_cell = 'sum by (cell) (vllm:num_requests_running{model_name="llm-70b"})'
    result: list[dict[str, Any]] = []

    def every_cell_scraped() -> bool:
        nonlocal result
        result = prometheus.query(per_cell)
        return len(result) == DEMO_CELLS

    try:
        wait_for(f"{DEMO_CELLS} cells in Prometheus", every_cell_scraped, timeout_s=30)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; last result {result}\n--- prometheus ---\n{prometheus.log()[-3000:]}"
            f"\n--- twin ---\n{twin.output()}"
        ) from None

    cells = {series["metric"]["cell"] for series in result}
    served = {
        dict(label_set)["cell"]
        for (name, label_set), _ in samples(get(twin.metrics_url)[2]).items()
        if name == "vllm:num_requests_running" and ("model_name", "llm-70b") in label_set
    }
    assert cells == served
    up = prometheus.query(f'up{{job="{JOB}"}}')
    assert [series["value"][1] for series in up] == ["1"]


@pytest.mark.parametrize("dangling", [False, True])
def test_twin_serve_never_writes_its_token_through_a_planted_link(
    tmp_path: Path, dangling: bool
) -> None:
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_text("precious\n")
    link = tmp_path / "state" / "twin-token"
    link.parent.mkdir()
    link.symlink_to(victim)
    env = dict(os.environ, COLUMNS="200")
    args = ["twin", "serve", str(FLEET_YAML), "--port", "0", "--speed", "60", "--hours", "0.01"]
    done = subprocess.run(
        [*firedrill_command(), *args, "--token-file", str(link)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "symbolic link" in output
    assert link.is_symlink()
    if dangling:
        assert not victim.exists()  # O_CREAT through a dangling link would have made it
    else:
        assert victim.read_text() == "precious\n"
