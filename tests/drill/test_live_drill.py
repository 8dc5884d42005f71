"""The L5 example drill on a live fleet: the same verdict as embedded, RTO terms compared.

Real processes on loopback, started as an operator would: ``firedrill twin serve`` accelerated
60x on the fleet and seed the embedded run builds its twin from, a Debian ``prometheus`` scraping
it every 0.5 s (30 s of the twin's time: the resolution of every reading), and ``gameday run
--target --prometheus --speed 60``, whose hypothesis, stop conditions and RTO terms are read from
Prometheus while its operations go to the twin's control API. The drill runs its full hour
(60 s of wall time). The embedded run is the reference.

What the comparison can hold to: the terms cut by the drill's own levers (decide, shift) and the
hydrate term within one scrape interval; the terms cut by a reading of Prometheus (detect,
time-to-SLO) never earlier than a scrape interval before the embedded run's, and later by at most
the observation pipeline: a scrape interval of staleness, the scrape's own duration (the twin
renders its exposition; on a loaded machine up to another interval), the twin's 15 s recording
interval, the 15 s evaluation step and the page's notification grouping. The embedded run
observes with none of these; ``docs/live.md`` has the figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import yaml
from typer.testing import CliRunner

from firedrill.adapters.prometheus import PrometheusSignals
from firedrill.cli import app
from firedrill.errors import SignalsError
from firedrill.specfile import load_drill
from tests.adapters.test_twin_serve import (
    firedrill_command,
    free_port,
    prometheus_binary,
    stop_process,
    wait_for,
)
from tests.drill.test_remote_world import L5

if TYPE_CHECKING:
    from firedrill.ports import DrillWorld

SPEED = 60.0
SCRAPE_S = 0.5  # wall seconds; 30 s of the twin's time
RESOLUTION_S = SPEED * SCRAPE_S
# twin seconds a reading of Prometheus may lag the embedded run's (see the module doc): a scrape
# interval of staleness, up to another for the scrape itself, the twin's 15 s recording interval,
# the 15 s evaluation step, and a notification group's wait
PIPELINE_S = 4 * RESOLUTION_S
CONTROL = re.compile(r"control API on http://127\.0\.0\.1:(\d+)/v1/")


@dataclass
class LiveFleet:
    twin_url: str
    token_file: Path
    prometheus_url: str
    twin_log: Path
    prometheus_log: Path

    def logs(self) -> str:
        return (
            f"--- twin ---\n{self.twin_log.read_text(errors='replace')[-3000:]}\n"
            f"--- prometheus ---\n{self.prometheus_log.read_text(errors='replace')[-3000:]}"
        )


def _scraped_twice(url: str) -> bool:
    try:
        with PrometheusSignals(url, retries=1) as p:
            found = p.vector("count_over_time(firedrill_replicas_ready[1m])")
    except SignalsError:
        return False
    return bool(found) and found[0].value >= 2


@contextmanager
def serve_live_fleet(
    fleet_path: Path, *, seed: int, speed: float, hours: float, scrape_s: float, tmp_path: Path
) -> Iterator[LiveFleet]:
    """``twin serve`` of the fleet at ``fleet_path`` at ``speed``x, and a Debian ``prometheus``
    scraping it every ``scrape_s`` wall seconds, both started as an operator would and stopped on
    exit; yields once Prometheus has scraped the twin twice."""
    twin_log, token_file = tmp_path / "twin.log", tmp_path / "twin-token"
    # --hours: a twin a test fails to stop still goes away by itself
    args = ["twin", "serve", str(fleet_path), "--port", "0", "--speed", f"{speed:g}"]
    args += ["--hours", f"{hours:g}", "--seed", str(seed), "--token-file", str(token_file)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("FIREDRILL_TWIN_TOKEN", None)
    with twin_log.open("wb") as log:
        twin = subprocess.Popen(
            [*firedrill_command(), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=tmp_path,
        )  # fmt: skip
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        port = ""

        def serving() -> bool:
            nonlocal port
            if twin.poll() is not None:
                raise AssertionError(f"twin serve exited early:\n{twin_log.read_text()}")
            found = CONTROL.search(twin_log.read_text(errors="replace"))
            port = found.group(1) if found else ""
            return bool(port)

        wait_for("twin serve's control API", serving, timeout_s=30)
        work = tmp_path / "prometheus"
        work.mkdir()
        config = {
            "global": {"scrape_interval": f"{scrape_s * 1000:.0f}ms", "scrape_timeout": "500ms"},
            "scrape_configs": [
                {
                    "job_name": "firedrill-twin",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                }
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        prometheus_url = f"http://127.0.0.1:{free_port()}"
        prometheus_log = work / "prometheus.log"
        with prometheus_log.open("wb") as log:
            prometheus = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address={prometheus_url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        live = LiveFleet(
            f"http://127.0.0.1:{port}", token_file, prometheus_url, twin_log, prometheus_log
        )
        try:
            wait_for("Prometheus to scrape the twin twice", lambda: _scraped_twice(prometheus_url))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{live.logs()}") from None
        yield live
    finally:
        if prometheus is not None:
            stop_process(prometheus)
        stop_process(twin)


@pytest.fixture
def live_l5_fleet(tmp_path: Path) -> Iterator[LiveFleet]:
    """The L5 drill's twin served at 60x, and a Prometheus scraping it every 0.5 s."""
    loaded = load_drill(L5)
    fleet = yaml.safe_load((L5.parent / loaded.spec.fleet).read_text())
    fleet["start_hour_utc"] = loaded.spec.start_hour_utc
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    with serve_live_fleet(
        fleet_path,
        seed=loaded.spec.seed,
        speed=SPEED,
        hours=1.5,
        scrape_s=SCRAPE_S,
        tmp_path=tmp_path,
    ) as live:
        yield live


def _gameday(tmp_path: Path, name: str, *extra: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{name}.json"
    args = ["gameday", "run", str(L5), "--seed", "7", "--json", str(out)]
    args += ["--journal-dir", str(tmp_path / f"journal-{name}"), *extra]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": "", "COLUMNS": "200"})
    assert result.exit_code == 0, f"{name}: exit {result.exit_code}\n{result.output}"
    report: dict[str, Any] = json.loads(out.read_text())
    return report, result.output


def _figures(embedded: dict[str, Any], live: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    rows = [("verdict", embedded["verdict"], live["verdict"])]
    rows += [
        (f"rto.{key}", value, live["rto"]["terms"][key])
        for key, value in embedded["rto"]["terms"].items()
    ]
    rows.append(("rto.measured_s", embedded["rto"]["measured_s"], live["rto"]["measured_s"]))
    rows += [
        (f"rto.marks.{key}", value, live["rto"]["marks"][key])
        for key, value in embedded["rto"]["marks"].items()
    ]
    rows += [
        (f"hypothesis.{e['metric']}[{i}]", e["observed"], h["observed"])
        for i, (e, h) in enumerate(zip(embedded["hypothesis"], live["hypothesis"], strict=True))
    ]
    return rows


@pytest.fixture
def embedded_l5(tmp_path: Path) -> dict[str, Any]:
    """The reference: the drill on its embedded twin (run before the live fleet starts, so the
    live drill starts within seconds of the twin's start, at the same hour of the day)."""
    return _gameday(tmp_path, "embedded", "--quiet")[0]


def test_the_l5_drill_on_real_prometheus_matches_the_embedded_run(
    tmp_path: Path, embedded_l5: dict[str, Any], live_l5_fleet: LiveFleet
) -> None:
    embedded, fleet = embedded_l5, live_l5_fleet
    wall0 = time.monotonic()
    try:
        live, output = _gameday(
            tmp_path, "live", "--target", fleet.twin_url, "--token-file", str(fleet.token_file),
            "--prometheus", fleet.prometheus_url, "--speed", f"{SPEED:g}",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None
    wall_s = time.monotonic() - wall0
    rows = _figures(embedded, live)
    table = "\n".join(f"  {name:40} {e!s:>12} {lv!s:>12}" for name, e, lv in rows)
    said = [line for line in output.splitlines() if "live" in line]
    with PrometheusSignals(fleet.prometheus_url, retries=1) as prometheus:
        scrapes = {
            what: prometheus.vector(promql)[0].value
            for what, promql in (
                ("scrapes", "count_over_time(up[2m])"),
                ("failed", "count_over_time(up[2m]) - sum_over_time(up[2m])"),
                ("longest scrape s", "max_over_time(scrape_duration_seconds[2m])"),
                ("median scrape s", "quantile_over_time(0.5, scrape_duration_seconds[2m])"),
            )
        }
    said.append(f"prometheus: {scrapes}")
    print(f"\nL5 embedded vs live ({SPEED:g}x, scrape {SCRAPE_S} s, {wall_s:.1f} s wall)\n{table}")
    print("\n".join(said))

    # it ran in wall time, its time map on the console before and how well it held after
    assert wall_s >= 3600 / SPEED * 0.9
    assert "live: the fleet's time runs 60x the wall clock" in output
    assert "readings known to" in output
    assert live["verdict"] == embedded["verdict"] == "passed"
    assert [(h["clause"], h["passed"]) for h in live["hypothesis"]] == [
        (h["clause"], h["passed"]) for h in embedded["hypothesis"]
    ]
    terms, reference = live["rto"]["terms"], embedded["rto"]["terms"]
    for key in ("decide_s", "shift_s", "hydrate_s"):
        assert abs(terms[key] - reference[key]) <= RESOLUTION_S, (key, table)
    for key in ("detect_s", "time_to_slo_s"):
        assert -RESOLUTION_S <= terms[key] - reference[key] <= PIPELINE_S, (key, table)
    # the total is cut by those two readings
    total = live["rto"]["measured_s"] - embedded["rto"]["measured_s"]
    assert -2 * RESOLUTION_S <= total <= 2 * PIPELINE_S, table
    # the facts the drill judged through the control endpoint are the twin's, not Prometheus's
    observed = {h["metric"]: h["observed"] for h in live["hypothesis"]}
    assert observed["unsigned_admitted"] == 0
    assert observed["survivor_digest_attested"] == 1
    assert live["reverted"]["all"] is True


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--prometheus", "http://127.0.0.1:9"], "--prometheus needs --target"),
        (["--target", "http://127.0.0.1:9", "--speed", "60"], "it goes with --prometheus"),
        (["--prometheus", "http://127.0.0.1:9", "--runs", "2"], "one live drill (no --runs)"),
    ],
)
def test_live_options_that_do_not_go_together_are_refused_before_anything_runs(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    args = ["gameday", "run", str(L5), "--journal-dir", str(tmp_path / "journal"), *extra]
    token = tmp_path / "token"
    token.write_text("t" * 32)
    args += ["--token-file", str(token)]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": "", "COLUMNS": "200"})
    assert result.exit_code == 4, result.output
    assert said in " ".join(result.output.split())
    assert not list((tmp_path / "journal").glob("*.jsonl"))  # no drill was journalled


def test_a_live_drill_names_the_twin_it_cannot_reach(tmp_path: Path) -> None:
    twin, prometheus = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    token = tmp_path / "token"
    token.write_text("t" * 32)
    args = ["gameday", "run", str(L5), "--journal-dir", str(tmp_path / "journal")]
    args += ["--target", twin, "--token-file", str(token), "--prometheus", prometheus]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": "", "COLUMNS": "200"})
    assert result.exit_code == 4, result.output
    assert f"cannot reach the twin at {twin}" in " ".join(result.output.split())


class _LateFleet:
    """A fleet whose time is already past the drill's first injection (only its clock is read)."""

    def now_s(self) -> float:
        return 900.0


def test_a_fleet_already_past_the_first_injection_is_refused() -> None:
    from firedrill.app.gameday import Refused, _check_start

    spec = load_drill(L5).spec
    with pytest.raises(Refused, match=r"already at 900 s, past the drill's first injection at 300"):
        _check_start(cast("DrillWorld", _LateFleet()), spec, "http://127.0.0.1:9")
