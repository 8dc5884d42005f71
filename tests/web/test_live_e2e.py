"""End to end on loopback, every piece a real process: the served twin → Prometheus with the
generated rules → Alertmanager with the generated config → ``firedrill serve`` → PostgreSQL.

The story is the reference's "TTFT after a neighbour drain", in us-west-2 at its evening peak
with no spare GPUs in the region: usw2-a is drained through the twin's control API, usw2-b takes
all of the region's chat traffic and burns its TTFT budget. firedrill serve must open exactly
one incident, for usw2-b, with the drain as top suspect and a ``route_weight`` lever (usw2-a's
warm replicas back at half weight) proposed for the capacity lead; approving it through the API
pulls it on the twin, and verification, reading Prometheus, sees the burn stop. No other cell
gets anything, including right after Prometheus starts.

What the test changes from the generated files, and why: rule groups are evaluated every second
instead of every 15 s, Alertmanager's group_wait/group_interval are 1 s instead of 30 s/5 m (the
test would otherwise wait minutes), and the receivers point at the service with its bearer
token instead of the discard address. The twin runs at 30× and serve's verification window is
20 s of Prometheus time. Everything else (expressions, labels, routes, inhibitions) is as
generated. Background GPU faults are off in the test fleet, so a healthy cell is truly healthy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.adapters.test_twin_serve import (
    firedrill_command,
    free_port,
    prometheus_binary,
    stop_process,
    wait_for,
)
from tests.store.conftest import PostgresServer, _database

ROOT = Path(__file__).resolve().parents[2]
SPEED = 30  # simulated seconds per wall second
# Every SLI of the demo SLOs is generated, goodput included: each is a ratio within one metric
# family (goodput the product of two), so a healthy cell reads near 0 even while Prometheus has
# only a few scrapes of each counter.
SLIS = ("ttft", "availability", "goodput")
TOKENS = {
    "am-secret": ("alertmanager", ["webhook"]),
    "alice-secret": ("Alice", ["capacity_lead"]),
    "bob-secret": ("Bob", ["incident_commander", "ops_lead"]),
}


def sha(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()


class Proc:
    """A process with its output in a file; stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, name: str, cmd: list[str], work: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log_path = work / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ)
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited early:\n{self.log()}")
        return True

    def stop(self) -> None:
        stop_process(self.process)


def up(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def fleet_spec(work: Path) -> Path:
    """The demo fleet at us-west-2's evening peak, chat busy, no background GPU faults."""
    spec = yaml.safe_load((ROOT / "examples" / "fleet.yaml").read_text())
    spec["start_hour_utc"] = 21
    for product in spec["products"]:
        if product["name"] == "chat":
            product["peak_rps"]["us-west-2"] = 900
    spec["faults"]["background"] = []
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def slo_spec(work: Path) -> Path:
    """The demo SLOs as they ship: every objective, every SLI kind."""
    spec = yaml.safe_load((ROOT / "examples" / "slo.yaml").read_text())
    assert {o["sli"] for o in spec["objectives"]} == set(SLIS)
    path = work / "slo.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rules(work: Path, serve_url: str) -> tuple[Path, Path]:
    """``firedrill rules generate`` output, with the test's intervals and receivers."""
    out = work / "rules"
    subprocess.run(
        [
            *firedrill_command(),
            "rules",
            "generate",
            str(slo_spec(work)),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    rule_file = yaml.safe_load((out / "rules.yml").read_text())
    for group in rule_file["groups"]:
        group["interval"] = "1s"
    (out / "rules.yml").write_text(yaml.safe_dump(rule_file, sort_keys=False, width=1000))
    am = yaml.safe_load((out / "alertmanager.yml").read_text())
    am["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1m")
    (work / "am-token").write_text("am-secret")
    for receiver in am["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{serve_url}/api/v1/alerts/webhook"
            hook["http_config"] = {
                "authorization": {"type": "Bearer", "credentials_file": str(work / "am-token")}
            }
    (out / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))
    return out / "rules.yml", out / "alertmanager.yml"


class Live:
    """The whole chain, started in order and stopped in reverse."""

    def __init__(self, work: Path, db_url: str) -> None:
        self.work = work
        self.procs: list[Proc] = []
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
        twin_port, prom_port, am_port, serve_port = (free_port() for _ in range(4))
        self.twin_url = f"http://127.0.0.1:{twin_port}"
        self.prom_url = f"http://127.0.0.1:{prom_port}"
        self.am_url = f"http://127.0.0.1:{am_port}"
        self.serve_url = f"http://127.0.0.1:{serve_port}"
        token_file = work / "twin-token"
        self.start(
            "twin",
            [
                *firedrill_command(),
                "twin",
                "serve",
                str(fleet_spec(work)),
                "--speed",
                str(SPEED),
                "--port",
                str(twin_port),
                "--hours",
                "3",
                "--seed",
                "5",
                "--token-file",
                str(token_file),
            ],
            f"{self.twin_url}/metrics",
            env,
        )
        self.twin_token = token_file.read_text().strip()
        rule_file, am_file = rules(work, self.serve_url)
        tokens = {
            "tokens": [{"sha256": sha(t), "person": p, "roles": r} for t, (p, r) in TOKENS.items()]
        }
        (work / "tokens.yml").write_text(yaml.safe_dump(tokens))
        self.start(
            "serve",
            [
                *firedrill_command(),
                "serve",
                "--tokens",
                str(work / "tokens.yml"),
                "--db",
                db_url,
                "--port",
                str(serve_port),
                "--prometheus",
                self.prom_url,
                "--slo",
                str(ROOT / "examples" / "slo.yaml"),
                "--fleet-url",
                self.twin_url,
                "--fleet-token-file",
                str(token_file),
                "--tick",
                "1",
                "--verify-burn-window",
                "20s",
                "--verify-window",
                "1800",
            ],
            f"{self.serve_url}/readyz",
            env,
        )
        am_bin = os.environ.get("FIREDRILL_ALERTMANAGER") or shutil.which("prometheus-alertmanager")
        assert am_bin, "prometheus-alertmanager not found: make tools"
        self.start(
            "alertmanager",
            [
                am_bin,
                f"--config.file={am_file}",
                f"--storage.path={work / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                f"--cluster.listen-address=127.0.0.1:{free_port()}",
            ],
            f"{self.am_url}/-/ready",
            env,
        )
        prom_config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(rule_file)],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": "firedrill-twin",
                    "static_configs": [{"targets": [f"127.0.0.1:{twin_port}"]}],
                }
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        self.start(
            "prometheus",
            [
                prometheus_binary(),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            f"{self.prom_url}/-/ready",
            env,
        )

    def start(self, name: str, cmd: list[str], ready: str, env: dict[str, str]) -> None:
        proc = Proc(name, cmd, self.work, env)
        self.procs.append(proc)
        check = up(ready)
        wait_for(f"{name} at {ready}", lambda: proc.alive() and check(), timeout_s=60)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def twin(self, method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(
            method,
            f"{self.twin_url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.twin_token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        return r.json()

    def api(self, method: str, path: str, token: str = "bob-secret", **kw: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.serve_url}{path}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kw,
        )

    def incidents(self) -> list[dict[str, Any]]:
        r = self.api("GET", "/api/v1/incidents")
        assert r.status_code == 200, r.text
        out: list[dict[str, Any]] = r.json()
        return out

    def weight(self, cell: str) -> int:
        cells = self.twin("GET", "/v1/cells")["cells"]
        (view,) = [c for c in cells if c["name"] == cell]
        return int(dict((m, w) for m, w in view["route_weights"])["llm-70b"])


@pytest.fixture
def live(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Live]:
    with _database(postgres_server) as url:
        chain = Live(tmp_path, url)
        try:
            yield chain
        except BaseException:
            print(chain.logs())
            raise
        finally:
            chain.stop()


@pytest.mark.slow
def test_a_drained_neighbour_pages_one_cell_and_the_approved_lever_stops_the_burn(
    live: Live,
) -> None:
    started = time.monotonic()
    live.twin("POST", "/v1/apply", {"op": "DenyCapacity", "args": {"region": "us-west-2"}})
    # right after Prometheus starts, and for a while: a healthy fleet opens nothing
    wait_for(
        "Prometheus to evaluate every SLI's burn rules on every cell",
        lambda: all(len(_prom(live, _error_ratio(sli, "5m"))) == 7 for sli in SLIS),
        timeout_s=30,
    )
    early = {sli: _values(live, _error_ratio(sli, "5m")) for sli in SLIS}
    time.sleep(10)
    assert live.incidents() == []
    burning = _prom(live, 'ALERTS{alertname=~"Cell.+Burn.+"}')  # pending or firing
    assert burning == [], burning
    for sli, values in early.items():  # ratios within one family: in [0, 1] from the start
        assert all(0.0 <= v <= 1.0 for v in values), (sli, values)

    before = live.weight("usw2-a")
    live.twin(
        "POST",
        "/v1/apply",
        {"op": "SetRouteWeights", "args": {"model": "llm-70b", "weights": [["usw2-a", 0]]}},
    )
    # the ticket tiers (longer windows, lower thresholds) may open it first, as an automation
    # incident; the fast-burn page then joins it and makes it a cell incident
    wait_for(
        "a paged incident",
        lambda: any(i["kind"] == "cell" for i in live.incidents()),
        timeout_s=120,
    )
    (inc,) = live.incidents()
    assert inc["cell"] == "usw2-b"
    assert inc["kind"] == "cell"
    assert inc["sev"] == 3  # a fast burn in one region, free tier: users axis, SEV3

    def proposed() -> list[dict[str, Any]]:
        return [
            lv
            for lv in live.api("GET", f"/api/v1/incidents/{inc['id']}/levers").json()
            if lv["kind"] == "route_weight" and lv["status"] == "proposed"
        ]

    wait_for("a proposed route_weight lever", lambda: bool(proposed()), timeout_s=30)
    detail = live.api("GET", f"/api/v1/incidents/{inc['id']}").json()
    assert detail["suspects"][0]["stream"] == "demand"
    assert detail["suspects"][0]["cell"] == "usw2-a"
    (lever,) = proposed()
    assert lever["target"] == "llm-70b"
    assert lever["roles_needed"] == ["capacity_lead"]
    assert all(c["ok"] for c in lever["checks"])
    assert live.weight("usw2-a") == 0  # advise mode: nothing pulled on its own

    # the incident commander is not who this lever's guard needs
    assert live.api("POST", f"/api/v1/levers/{lever['id']}/approve").status_code == 403
    approved = live.api("POST", f"/api/v1/levers/{lever['id']}/approve", "alice-secret")
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "applied"
    assert live.weight("usw2-a") == before // 2  # usw2-a's warm replicas back at half weight

    def verified() -> bool:
        return bool(live.api("GET", f"/api/v1/levers/{lever['id']}").json()["status"] == "verified")

    wait_for("verification to see the burn stop", verified, timeout_s=120)
    (after,) = live.incidents()
    assert after["status"] == "mitigated"
    kinds = [e["kind"] for e in live.api("GET", f"/api/v1/incidents/{inc['id']}/timeline").json()]
    assert kinds[0] == "opened"
    assert "approval" in kinds
    assert "verified" in kinds
    # still one incident: no other cell got anything
    assert [i["cell"] for i in live.incidents()] == ["usw2-b"]
    status = live.api("GET", "/api/v1/status").json()
    assert {d["name"]: d["state"] for d in status["dependencies"]} == {
        "fleet": "ok",
        "prometheus": "ok",
        "alertmanager": "not configured",
    }
    assert status["mode"] == "advise"
    print(f"end-to-end run: {time.monotonic() - started:.1f} s after the chain was up")


def _error_ratio(sli: str, window: str) -> str:
    return f'slo:sli_error:ratio_rate{window}{{sloth_id="inference-chat-{sli}"}}'


def _values(live: Live, promql: str) -> list[float]:
    return [float(r["value"][1]) for r in _prom(live, promql)]


def _prom(live: Live, promql: str) -> list[Any]:
    r = httpx.get(f"{live.prom_url}/api/v1/query", params={"query": promql}, timeout=5)
    result: list[Any] = r.json()["data"]["result"]
    return result
