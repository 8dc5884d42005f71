"""The live world's time mapping, clock and refusals, on injected time (nothing really sleeps).

The wall clock is a counter that ``sleep`` moves; the served twin is a ``RemoteTwin`` whose
transport answers from that counter (its time is ``(wall - start) x speed``, floored to its 1 s
step, as ``twin serve`` keeps it); Prometheus is httpx's ``MockTransport`` stamping a scrape
every 0.5 s of wall time. The real processes are in ``tests/drill/test_live_drill.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from firedrill.adapters.clock import ScaledClock, TimeMap
from firedrill.adapters.live_world import REQUIRED_SERIES, LiveWorld
from firedrill.adapters.prometheus import PrometheusSignals
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.errors import RemoteWorldError, SignalsMissing, SignalsUnavailable

PROM = "http://127.0.0.1:9"
SPEED = 60.0
SCRAPE_S = 0.5
T0_UNIX = 1_800_000_000.0


class Wall:
    """A wall clock that only ``sleep`` moves."""

    def __init__(self, t: float = T0_UNIX) -> None:
        self.t = t
        self.slept: list[float] = []

    def time(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.t += seconds


class FakeTwin(RemoteTwin):
    """A served twin whose answers come from the injected wall clock, not a socket."""

    def __init__(self, wall: Wall, *, speed: float = SPEED, start_unix_s: float) -> None:
        super().__init__("http://127.0.0.1:8", "token-token-token-token")
        self.wall = wall
        self.speed = speed
        self.start_unix_s = start_unix_s
        self.since: list[str] = []

    def twin_s(self) -> float:
        return float(math.floor((self.wall.t - self.start_unix_s) * self.speed))

    def _call(
        self, method: str, path: str, params: Sequence[tuple[str, str]] = (), body: object = None
    ) -> Any:
        if path == "/v1/now":
            return {"now_s": self.twin_s()}
        if path == "/v1/changes":
            self.since.append(dict(params)["since_s"])
            change = {
                "at_s": 1000.0, "stream": "weights", "region": "us-east-1", "cell": "use1-a",
                "subject": "llm-70b", "before": "a", "after": "b", "detail": "",
            }  # fmt: skip
            return {"changes": [change]}
        raise AssertionError(f"unexpected {method} {path}")


class FakePrometheus:
    """Answers the HTTP API from the wall clock: one scrape every ``SCRAPE_S`` since ``since``."""

    def __init__(self, wall: Wall, *, names: Sequence[str] = REQUIRED_SERIES, since: float) -> None:
        self.wall = wall
        self.names = list(names)
        self.since = since
        self.stopped_at: float | None = None  # scrapes stop here (a Prometheus gone stale)
        self.seen: list[tuple[str, dict[str, str]]] = []

    def scrapes(self, until: float) -> list[float]:
        end = min(until, self.stopped_at if self.stopped_at is not None else until)
        n = int((end - self.since) / SCRAPE_S)
        return [self.since + k * SCRAPE_S for k in range(n + 1)] if end >= self.since else []

    def handle(self, request: httpx.Request) -> httpx.Response:
        params = {k: v[0] for k, v in parse_qs(request.url.query.decode()).items()}
        self.seen.append((request.url.path, params))
        now = self.wall.t
        if request.url.path == "/api/v1/label/__name__/values":
            return httpx.Response(200, json={"status": "success", "data": self.names})
        query = params.get("query", "")
        at = float(params.get("time", now))
        metric = {"__name__": "firedrill_replicas_ready", "cell": "use1-a"}
        data: dict[str, Any]
        if request.url.path == "/api/v1/query" and query.startswith("last_over_time("):
            data = {"resultType": "vector", "result": [{"metric": metric, "value": [at, "7"]}]}
        elif request.url.path == "/api/v1/query" and query.endswith("ms]"):
            window = float(query.rsplit("[", 1)[1].removesuffix("ms]")) / 1000
            values = [[t, "1"] for t in self.scrapes(at) if t > at - window]
            data = {"resultType": "matrix", "result": [{"metric": metric, "values": values}]}
        elif query.startswith("max(timestamp("):
            last = self.scrapes(at)
            result = [{"metric": {}, "value": [at, str(last[-1])]}] if last else []
            data = {"resultType": "vector", "result": result}
        elif request.url.path == "/api/v1/query":
            data = {"resultType": "vector", "result": [{"metric": metric, "value": [at, "7"]}]}
        else:
            start, end = float(params["start"]), float(params["end"])
            step = float(params["step"])
            n = int((end - start) / step)
            values = [[start + k * step, str(k)] for k in range(n + 1)]
            data = {"resultType": "matrix", "result": [{"metric": metric, "values": values}]}
        return httpx.Response(200, json={"status": "success", "data": data})


def _open(
    wall: Wall, twin: FakeTwin, prom: FakePrometheus | None, *, speed: float = SPEED
) -> LiveWorld:
    def signals(time_map: TimeMap) -> PrometheusSignals:
        if prom is None:

            def refuse(request: httpx.Request) -> httpx.Response:
                raise httpx.ConnectError("connection refused", request=request)

            transport = httpx.MockTransport(refuse)
        else:
            transport = httpx.MockTransport(prom.handle)
        return PrometheusSignals(
            PROM, time_map=time_map, transport=transport, retries=2, sleep=wall.sleep,
            now_unix_s=wall.time,
        )  # fmt: skip

    return LiveWorld.open(
        twin, PROM, speed=speed, time_fn=wall.time, sleep=wall.sleep, prometheus=signals
    )


# -- the time map and the clock --------------------------------------------------------------------


def test_the_time_map_scales_wall_seconds_to_run_seconds_and_back() -> None:
    tm = TimeMap(anchor_unix_s=T0_UNIX, anchor_run_s=100.0, speed=60.0)
    assert tm.run_s(T0_UNIX + 0.5) == pytest.approx(130.0)
    assert tm.unix_s(130.0) == pytest.approx(T0_UNIX + 0.5)
    assert tm.wall_s(15.0) == pytest.approx(0.25)
    assert tm.epoch_unix_s == pytest.approx(T0_UNIX - 100.0 / 60.0)
    assert tm.run_s(tm.unix_s(1234.5)) == pytest.approx(1234.5)
    # at the wall's speed and anchored at 0 it is WallClock's mapping
    assert TimeMap(anchor_unix_s=50.0).run_s(80.0) == 30.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="speed"):
            TimeMap(anchor_unix_s=T0_UNIX, speed=bad)


def test_the_anchor_is_the_midpoint_of_a_reading_its_uncertainty_half_the_round_trip() -> None:
    wall = Wall()

    def read() -> float:
        wall.t += 0.02  # a 20 ms round trip, answered in its middle
        return 600.0

    tm, uncertainty = TimeMap.anchored(read, speed=SPEED, time_fn=wall.time)
    assert tm.anchor_unix_s == pytest.approx(T0_UNIX + 0.01)
    assert tm.anchor_run_s == 600.0
    assert uncertainty == pytest.approx(0.01 * SPEED)


def test_the_scaled_clock_stands_still_between_advances_and_sleeps_wall_time() -> None:
    wall = Wall()
    clock = ScaledClock(TimeMap(anchor_unix_s=T0_UNIX, speed=SPEED), max_lag_s=30.0,
                        time_fn=wall.time, sleep=wall.sleep)  # fmt: skip
    assert clock.now_s() == 0.0
    wall.t += 0.1  # the control plane works for 100 ms: 6 s of the fleet's time
    assert clock.now_s() == 0.0  # reads within one step are of one instant
    assert clock.live_s() == pytest.approx(6.0)
    clock.advance(15.0)  # to 15 s: 9 s of it are left, 0.15 s of wall
    assert wall.slept == [pytest.approx(0.15)]
    assert clock.now_s() == 15.0
    wall.t += 0.5  # a step that took 30 s of the fleet's time, 15 s more than it had
    clock.advance(15.0)
    assert wall.slept == [pytest.approx(0.15)]  # nothing more slept
    assert clock.now_s() == 30.0  # late within max_lag_s: still on its instant
    assert clock.max_late_s == pytest.approx(15.0)
    wall.t += 1.0  # a step 60 s late, past max_lag_s: the clock catches up with the fleet
    clock.advance(15.0)
    assert clock.now_s() == pytest.approx(clock.live_s()) == pytest.approx(105.0)
    assert clock.caught_up == 1
    assert clock.max_late_s == pytest.approx(60.0)
    clock.advance(-5.0)  # a target computed from a stale reading: sleeps nothing
    assert clock.now_s() == pytest.approx(105.0)
    with pytest.raises(ValueError, match="NaN"):
        clock.advance(math.nan)


def test_the_scaled_clock_starts_where_it_is_told() -> None:
    wall = Wall(T0_UNIX + 0.01)
    clock = ScaledClock(TimeMap(anchor_unix_s=T0_UNIX + 0.05, speed=SPEED), start_s=0.0,
                        time_fn=wall.time, sleep=wall.sleep)  # fmt: skip
    assert clock.now_s() == 0.0
    clock.advance(15.0)  # from the start instant, not from the wall's now
    assert wall.t == pytest.approx(T0_UNIX + 0.05 + 0.25)


def test_the_scaled_clock_keeps_instants_to_the_millisecond() -> None:
    wall = Wall(T0_UNIX + 0.000_123_4)
    clock = ScaledClock(TimeMap(anchor_unix_s=T0_UNIX, speed=SPEED), time_fn=wall.time,
                        sleep=wall.sleep)  # fmt: skip
    assert clock.now_s() == round(0.000_123_4 * SPEED, 3)


# -- Prometheus's times through the map ----------------------------------------------------------


def test_prometheus_queries_go_out_in_wall_time_and_come_back_in_run_time() -> None:
    wall = Wall(T0_UNIX + 120.0)
    prom = FakePrometheus(wall, since=T0_UNIX)
    tm = TimeMap(anchor_unix_s=T0_UNIX, anchor_run_s=0.0, speed=SPEED)
    signals = PrometheusSignals(PROM, time_map=tm, transport=httpx.MockTransport(prom.handle),
                                step_s=30.0, now_unix_s=wall.time)  # fmt: skip
    (series,) = signals.query("firedrill_replicas_ready", start_s=600.0, end_s=1200.0)
    _, params = prom.seen[-1]
    assert float(params["start"]) == pytest.approx(T0_UNIX + 10.0)  # 600 s at 60x
    assert float(params["end"]) == pytest.approx(T0_UNIX + 20.0)
    assert float(params["step"]) == pytest.approx(0.5)  # 30 s of run time per wall half second
    assert series.t_s[0] == pytest.approx(600.0)
    assert series.t_s[-1] == pytest.approx(1200.0)
    assert list(series.t_s[:3]) == pytest.approx([600.0, 630.0, 660.0])
    # raw scrapes over a run window: a range selector of the wall's milliseconds
    (raw,) = signals.raw("firedrill_replicas_ready", window_s=120.0, at_s=1200.0)
    _, params = prom.seen[-1]
    assert params["query"] == "firedrill_replicas_ready[2000ms]"
    assert list(raw[1]) == pytest.approx([1110.0, 1140.0, 1170.0, 1200.0])
    # an instant read is of now, mapped
    at_s, _, values = signals.instant("firedrill_replicas_ready")
    assert at_s == pytest.approx(7200.0)
    assert values.tolist() == [7.0]


# -- opening a live world --------------------------------------------------------------------------


def test_opening_counts_the_run_from_the_twins_now_and_reads_at_the_clocks_instant() -> None:
    wall = Wall(T0_UNIX + 8.0)  # the twin started 8 s ago (480 s of its time)
    twin = FakeTwin(wall, start_unix_s=T0_UNIX)
    prom = FakePrometheus(wall, since=T0_UNIX + 2.0)
    world = _open(wall, twin, prom)
    timing = world.timing()
    assert timing.speed == SPEED
    assert timing.scrape_interval_wall_s == pytest.approx(SCRAPE_S)
    assert timing.resolution_s == pytest.approx(30.0)
    # watched the twin's speed for 1 s, then started at the twin's now
    assert wall.t == pytest.approx(T0_UNIX + 9.0)
    assert timing.anchor_unix_s == pytest.approx(T0_UNIX + 9.0)
    assert timing.offset_s == 540.0
    assert world.now_s() == 0.0
    # an instant read is of the clock's instant even when the wall has moved on
    wall.t = T0_UNIX + 9.2
    at_s, labels, values = world.instant("firedrill_replicas_ready", {"cell": "use1-a"})
    _, params = prom.seen[-1]
    # the last sample within four scrapes: a failed scrape's staleness is not an empty fleet
    assert params["query"] == 'last_over_time(firedrill_replicas_ready{cell="use1-a"}[2000ms])'
    assert float(params["time"]) == pytest.approx(T0_UNIX + 9.0)
    assert at_s == 0.0
    assert labels == [(("cell", "use1-a"),)]
    assert values.tolist() == [7.0]
    # the control endpoint's times are the twin's: shifted by the offset both ways
    (change,) = world.changes(since_s=60.0)
    assert twin.since == [repr(60.0 + timing.offset_s)]
    assert change.at_s == pytest.approx(1000.0 - timing.offset_s)
    # a 15 s step at 60x sleeps a quarter of a wall second, less the time the step took
    world.advance(15.0)
    assert world.now_s() == 15.0
    assert wall.t == pytest.approx(T0_UNIX + 9.25)
    wall.t += 0.5  # a step that took 30 s of the fleet's time, 15 s more than it had
    world.advance(15.0)
    assert world.now_s() == 30.0  # within one scrape interval late: on its instant
    assert world.timing().max_late_s == pytest.approx(15.0)
    # settle waits for a scrape at or after the twin's now, then measures the drift
    world.settle()
    assert world.drift_s == pytest.approx(0.0, abs=1.5)  # the twin's 1 s step


def test_an_unreachable_prometheus_is_named_in_the_error() -> None:
    wall = Wall(T0_UNIX + 8.0)
    with pytest.raises(
        SignalsUnavailable, match=r"cannot reach Prometheus at http://127\.0\.0\.1:9"
    ):
        _open(wall, FakeTwin(wall, start_unix_s=T0_UNIX), None)


def test_a_prometheus_without_the_fleets_series_names_what_is_missing() -> None:
    wall = Wall(T0_UNIX + 8.0)
    prom = FakePrometheus(wall, names=["up", "scrape_duration_seconds"], since=T0_UNIX)
    with pytest.raises(SignalsMissing) as caught:
        _open(wall, FakeTwin(wall, start_unix_s=T0_UNIX), prom)
    message = str(caught.value)
    assert PROM in message
    assert "http_requests_total" in message
    assert "firedrill_replicas_ready" in message
    assert "0 of them firedrill_*" in message
    assert caught.value.url == PROM


def test_a_prometheus_that_stopped_scraping_the_fleet_is_refused() -> None:
    wall = Wall(T0_UNIX + 60.0)
    prom = FakePrometheus(wall, since=T0_UNIX)
    prom.stopped_at = T0_UNIX + 30.0
    with pytest.raises(SignalsMissing, match=r"last scraped firedrill_replicas_ready 30\.0 s ago"):
        _open(wall, FakeTwin(wall, start_unix_s=T0_UNIX), prom)


def test_a_prometheus_with_a_single_scrape_asks_to_wait() -> None:
    wall = Wall(T0_UNIX + 8.0)
    prom = FakePrometheus(wall, since=T0_UNIX + 7.9)
    with pytest.raises(SignalsMissing, match=r"holds 1 scrape\(s\)"):
        _open(wall, FakeTwin(wall, start_unix_s=T0_UNIX), prom)


@pytest.mark.parametrize(("twin_speed", "hint"), [(0.0, "moved 0.0 s"), (30.0, "should have")])
def test_a_twin_on_a_manual_clock_or_at_another_speed_is_refused(
    twin_speed: float, hint: str
) -> None:
    wall = Wall(T0_UNIX + 8.0)
    twin = FakeTwin(wall, speed=twin_speed, start_unix_s=T0_UNIX)
    prom = FakePrometheus(wall, since=T0_UNIX)
    with pytest.raises(RemoteWorldError, match="--manual-clock") as caught:
        _open(wall, twin, prom)
    assert hint in str(caught.value)
    assert twin.url in str(caught.value)


def test_settle_names_a_prometheus_that_never_scrapes_past_the_end() -> None:
    wall = Wall(T0_UNIX + 8.0)
    prom = FakePrometheus(wall, since=T0_UNIX)
    world = _open(wall, FakeTwin(wall, start_unix_s=T0_UNIX), prom)
    prom.stopped_at = wall.t
    world.advance(60.0)
    with pytest.raises(SignalsMissing, match="has not scraped firedrill_replicas_ready past"):
        world.settle()
