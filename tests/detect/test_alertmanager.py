"""The generated alertmanager.yml, checked by amtool and run by a real Alertmanager on loopback.

The end-to-end tests start Alertmanager with the generated config (only the timings shortened and
the webhooks pointed at a recorder in this process), post alerts to ``/api/v2/alerts`` and assert
on the notifications that arrive: how alerts are grouped, which are muted, and that an alert
without ``cell`` cannot mute anything fleet-wide.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from firedrill.detect.alertmanager import (
    INHIBITIONS,
    Receivers,
    RoutingSpec,
    alertmanager_config,
    alertmanager_yaml,
    duration,
)

TIMEOUT_S = 20.0  # upper bound on any wait for Alertmanager; a pass takes a few seconds
GROUP_WAIT_S = 1
GROUP_INTERVAL_S = 2
INSTALL_HINT = "install the Debian packages prometheus and prometheus-alertmanager (`make tools`)"


def amtool_binary() -> str:
    found = shutil.which("amtool")
    if not found:
        pytest.fail(f"amtool not found on PATH; {INSTALL_HINT}", pytrace=False)
    return found


def alertmanager_binary() -> str:
    """$FIREDRILL_ALERTMANAGER, else Debian's ``prometheus-alertmanager``, else ``alertmanager``."""
    override = os.environ.get("FIREDRILL_ALERTMANAGER")
    if override:
        if not shutil.which(override):
            pytest.fail(f"FIREDRILL_ALERTMANAGER={override} is not an executable", pytrace=False)
        return override
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not found:
        pytest.fail(
            "Alertmanager not found (neither $FIREDRILL_ALERTMANAGER nor prometheus-alertmanager"
            f" nor alertmanager on PATH); {INSTALL_HINT}",
            pytrace=False,
        )
    return found


def write_config(tmp_path: Path, routing: RoutingSpec) -> Path:
    path = tmp_path / "alertmanager.yml"
    path.write_text(alertmanager_yaml(routing))
    return path


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [amtool_binary(), *args], capture_output=True, text=True, timeout=30, check=False
    )


# --- the config itself --------------------------------------------------------------------------


def walk_keys(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from walk_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_keys(item)


def test_yaml_round_trips_to_the_config_and_uses_only_the_matchers_syntax() -> None:
    routing = RoutingSpec()
    config = alertmanager_config(routing)
    assert yaml.safe_load(alertmanager_yaml(routing)) == config
    assert not {"match", "match_re", "source_match", "target_match"} & set(walk_keys(config))
    route = config["route"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "30s",
        "5m",
        "4h",
    )
    assert route["group_by"] == ["cell", "alertname"]


def test_every_inhibition_requires_its_equal_labels_on_both_sides() -> None:
    for rule in alertmanager_config(RoutingSpec())["inhibit_rules"]:
        for label in rule["equal"]:
            assert f'{label}=~".+"' in rule["source_matchers"]
            assert f'{label}=~".+"' in rule["target_matchers"]


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (1, "1s"), (90, "90s"), (300, "5m"), (5400, "90m")]
)
def test_duration_uses_the_largest_whole_unit(seconds: int, text: str) -> None:
    assert duration(seconds) == text


def test_repeat_interval_below_group_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="repeat_interval_s"):
        RoutingSpec(group_interval_s=600, repeat_interval_s=60)


def test_amtool_accepts_the_config(tmp_path: Path) -> None:
    result = amtool("check-config", str(write_config(tmp_path, RoutingSpec())))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "2 inhibit rules" in result.stdout
    assert "3 receivers" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=CellTTFTBurnFast", "severity=page", "team=inference", "cell=c1"], "page"),
        (["alertname=DCGMXidFatal", "severity=ticket", "team=gpu-fleet", "cell=c1"], "ticket"),
        (
            ["alertname=SandboxMetadataAccess", "severity=security", "team=security", "cell=c1"],
            "security,page",
        ),
        (["alertname=SomethingNew", "cell=c1"], "ticket"),
    ],
    ids=["page", "ticket", "security-also-pages", "no-severity-defaults-to-ticket"],
)
def test_amtool_routes_each_severity(tmp_path: Path, labels: list[str], receivers: str) -> None:
    config = write_config(tmp_path, RoutingSpec())
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        f"--verify.receivers={receivers}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receivers


# --- a real Alertmanager on loopback ------------------------------------------------------------


@dataclass(frozen=True)
class Notification:
    receiver: str  # path the webhook was posted to, without the slash
    payload: dict[str, Any]

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload["alerts"])

    def label_values(self, name: str) -> set[str]:
        return {a["labels"].get(name, "") for a in self.alerts}


class Recorder:
    """Webhook receiver on 127.0.0.1 that keeps every JSON payload posted to it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Notification] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with recorder._lock:
                    recorder._received.append(
                        Notification(self.path.strip("/"), json.loads(body or b"{}"))
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def receivers(self) -> Receivers:
        base = f"http://127.0.0.1:{self._server.server_address[1]}"
        return Receivers(page=f"{base}/page", ticket=f"{base}/ticket", security=f"{base}/security")

    def received(self, receiver: str | None = None) -> list[Notification]:
        with self._lock:
            return [n for n in self._received if receiver is None or n.receiver == receiver]

    def of(self, receiver: str, **labels: str) -> list[Notification]:
        """Notifications to ``receiver`` holding at least one alert with all of ``labels``."""
        return [
            n
            for n in self.received(receiver)
            if any(all(a["labels"].get(k) == v for k, v in labels.items()) for a in n.alerts)
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def settle() -> None:
    """Let a notification that could still come arrive: the group's next flush, plus slack."""
    time.sleep(GROUP_INTERVAL_S + 1.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Alertmanager:
    """One Alertmanager process, clustering off, storage in a temporary directory."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "alertmanager.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [
                alertmanager_binary(),
                f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--cluster.listen-address=",
                "--log.level=debug",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for("Alertmanager to become ready", self._ready)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self._process.poll() is not None:
            raise AssertionError(f"Alertmanager exited early:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                status: int = response.status
                return status == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, *alerts: dict[str, str]) -> None:
        """Fire alerts, each given by its labels."""
        body = json.dumps([{"labels": labels} for labels in alerts]).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as response:
            result: list[dict[str, Any]] = json.load(response)
            return result

    def status_of(self, **labels: str) -> dict[str, Any]:
        matches: list[dict[str, Any]] = [
            a["status"]
            for a in self.alerts()
            if all(a["labels"].get(k) == v for k, v in labels.items())
        ]
        assert len(matches) == 1, f"{len(matches)} alerts match {labels}"
        return matches[0]

    def stop(self) -> None:
        try:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=10)
        finally:
            self._log.close()


StartAlertmanager = Callable[[dict[str, Any]], Alertmanager]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def fast_routing(recorder: Recorder) -> RoutingSpec:
    """The production routing with test-sized timings and webhooks to the recorder."""
    return RoutingSpec(
        group_wait_s=GROUP_WAIT_S,
        group_interval_s=GROUP_INTERVAL_S,
        receivers=recorder.receivers,
    )


@pytest.fixture
def start_alertmanager(tmp_path: Path) -> Iterator[StartAlertmanager]:
    started: list[Alertmanager] = []

    def start(config: dict[str, Any]) -> Alertmanager:
        am = Alertmanager(config, tmp_path / f"am{len(started)}")
        started.append(am)
        return am

    try:
        yield start
    finally:
        for am in started:
            am.stop()


@pytest.fixture
def alertmanager(fast_routing: RoutingSpec, start_alertmanager: StartAlertmanager) -> Alertmanager:
    # Set up after the recorder, so torn down (terminated and waited for) before it closes.
    return start_alertmanager(alertmanager_config(fast_routing))


def xid(cell: str, node: str) -> dict[str, str]:
    return {
        "alertname": "DCGMXidFatal",
        "severity": "ticket",
        "team": "gpu-fleet",
        "cell": cell,
        "region": "us-east",
        "node": node,
        "Hostname": node,
        "gpu": "0",
    }


def test_400_nodes_with_the_same_xid_in_one_cell_are_one_ticket(
    alertmanager: Alertmanager, recorder: Recorder
) -> None:
    alertmanager.post(*(xid("c1", f"n{i:03d}") for i in range(400)))
    wait_for("the ticket", lambda: bool(recorder.received("ticket")))
    settle()
    tickets = recorder.received("ticket")
    assert len(tickets) == 1
    assert len(tickets[0].alerts) == 400
    assert tickets[0].label_values("node") == {f"n{i:03d}" for i in range(400)}
    assert tickets[0].payload["groupLabels"] == {"cell": "c1", "alertname": "DCGMXidFatal"}
    assert tickets[0].payload["truncatedAlerts"] == 0
    assert recorder.received("page") == []


def test_the_same_alert_in_two_cells_is_two_notifications(
    alertmanager: Alertmanager, recorder: Recorder
) -> None:
    alertmanager.post(*(xid(cell, f"{cell}-n{i}") for cell in ("c1", "c2") for i in range(5)))
    wait_for("both tickets", lambda: len(recorder.received("ticket")) >= 2)
    settle()
    tickets = recorder.received("ticket")
    assert len(tickets) == 2
    assert sorted(t.payload["groupLabels"]["cell"] for t in tickets) == ["c1", "c2"]
    for t in tickets:
        assert t.label_values("cell") == {t.payload["groupLabels"]["cell"]}
        assert len(t.alerts) == 5


def ttft_burn_fast(**extra: str) -> dict[str, str]:
    return {
        "alertname": "CellTTFTBurnFast",
        "severity": "page",
        "team": "inference",
        "burn_tier": "fast",
        "region": "us-east",
        **extra,
    }


def kv_cache_high(**extra: str) -> dict[str, str]:
    return {
        "alertname": "KVCacheHigh",
        "severity": "ticket",
        "team": "inference",
        "region": "us-east",
        **extra,
    }


def test_a_fast_ttft_burn_mutes_that_cells_kv_cache_ticket_only(
    alertmanager: Alertmanager, recorder: Recorder
) -> None:
    alertmanager.post(ttft_burn_fast(cell="cA"))
    # Once the page is out, the inhibitor has certainly seen the source.
    wait_for("the TTFT page", lambda: bool(recorder.of("page", alertname="CellTTFTBurnFast")))
    alertmanager.post(kv_cache_high(cell="cA", pod="p1"), kv_cache_high(cell="cB", pod="p2"))
    wait_for("cell B's KV ticket", lambda: bool(recorder.of("ticket", cell="cB")))
    settle()
    assert recorder.of("ticket", alertname="KVCacheHigh", cell="cA") == []
    assert len(recorder.of("ticket", alertname="KVCacheHigh", cell="cB")) == 1
    muted = alertmanager.status_of(alertname="KVCacheHigh", cell="cA")
    assert muted["state"] == "suppressed"
    assert len(muted["inhibitedBy"]) == 1
    assert alertmanager.status_of(alertname="KVCacheHigh", cell="cB")["state"] == "active"


def dcgm_ecc_dbe(node: str) -> dict[str, str]:
    return {**xid("c1", node), "alertname": "DCGMEccDbe"}


def test_a_not_ready_node_mutes_its_own_dcgm_tickets_only(
    alertmanager: Alertmanager, recorder: Recorder
) -> None:
    not_ready = {**xid("c1", "n1"), "alertname": "NodeNotReady"}
    alertmanager.post(not_ready)
    wait_for("the NotReady ticket", lambda: bool(recorder.of("ticket", alertname="NodeNotReady")))
    # Both land in the same (cell, alertname) group: the mute applies per alert, not per group.
    alertmanager.post(dcgm_ecc_dbe("n1"), dcgm_ecc_dbe("n2"))
    wait_for("the ECC ticket", lambda: bool(recorder.of("ticket", alertname="DCGMEccDbe")))
    settle()
    ecc = recorder.of("ticket", alertname="DCGMEccDbe")
    assert len(ecc) == 1
    assert ecc[0].label_values("node") == {"n2"}
    assert alertmanager.status_of(alertname="DCGMEccDbe", node="n1")["state"] == "suppressed"


def test_a_source_without_cell_does_not_mute_targets_without_cell(
    alertmanager: Alertmanager, recorder: Recorder
) -> None:
    alertmanager.post(ttft_burn_fast())
    wait_for("the TTFT page", lambda: bool(recorder.of("page", alertname="CellTTFTBurnFast")))
    alertmanager.post(kv_cache_high(pod="p1"), kv_cache_high(pod="p2"))
    wait_for("the KV ticket", lambda: bool(recorder.of("ticket", alertname="KVCacheHigh")))
    settle()
    kv = recorder.of("ticket", alertname="KVCacheHigh")
    assert len(kv) == 1
    assert kv[0].label_values("pod") == {"p1", "p2"}
    assert alertmanager.status_of(alertname="KVCacheHigh", pod="p1")["state"] == "active"


def test_without_the_non_empty_matchers_the_same_alerts_would_be_muted(
    recorder: Recorder, fast_routing: RoutingSpec, start_alertmanager: StartAlertmanager
) -> None:
    """The guard is load-bearing: Alertmanager treats 'missing on both' as equal."""
    config = alertmanager_config(fast_routing)
    config["inhibit_rules"] = [
        {"source_matchers": [i.source], "target_matchers": [i.target], "equal": list(i.equal)}
        for i in INHIBITIONS
    ]
    am = start_alertmanager(config)
    am.post(ttft_burn_fast())
    wait_for("the TTFT page", lambda: bool(recorder.of("page", alertname="CellTTFTBurnFast")))
    am.post(kv_cache_high(pod="p1"))
    wait_for(
        "the KV alert to be inhibited",
        lambda: am.status_of(alertname="KVCacheHigh")["state"] == "suppressed",
    )
    settle()
    assert recorder.of("ticket", alertname="KVCacheHigh") == []
