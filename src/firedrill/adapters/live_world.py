"""``LiveWorld``: a drill's world on a live fleet, composed of the adapters that reach it.

A game day against a live fleet acts through one endpoint and watches through another: the
operations, the fleet's views, its change feed, capacity and digests go to the fleet's control
endpoint (the served twin's API, ``RemoteTwin``, today); every series the drill judges (the
hypothesis, the stop conditions, the RTO terms) comes from the Prometheus that scrapes the fleet
(``PrometheusSignals``); and time is the wall clock's. Nothing here decides anything: the control
plane runs unchanged on this composition, as it does on the embedded twin.

Time. A twin served at ``--speed S`` runs S of its seconds per wall second, and the drill must
speak the twin's seconds (its injections at 5 min, its 10 min RTO budget). A drill's times count
from its own start, while the fleet was already running (Prometheus had to scrape it first): the
run's second 0 is the twin's second ``offset_s``, read from the twin's API (``GET /v1/now``) as
the run starts. From that one reading, a ``TimeMap``:

- the clock's ``now_s`` is the wall time mapped to the run's (twin) seconds, and ``advance(s)``
  sleeps ``s / S`` wall seconds (``ScaledClock``);
- every Prometheus sample's timestamp (wall Unix seconds, the moment it was scraped) is mapped
  back to run seconds, and query windows and steps the other way, so the drill's own rates,
  burn rates and quantiles run over twin time;
- the control endpoint's times (the change feed, faults, replica transitions, burn-in results)
  are twin seconds: ``offset_s`` is subtracted on the way in, added to ``since_s`` on the way out.

The map is read once and checked, not re-read on every call: ``twin serve`` keeps its time at
``(wall - start) * S`` floored to its step, so a linear map is exact to one twin step plus half the
anchor's round trip; re-reading it each time would add a round trip to every ``now_s`` and make
the run's clock jitter. ``open`` checks the twin really runs at S from two readings (a
``--manual-clock`` twin or another speed is refused), and ``drift_s`` measures the twin against
the map again (at ``settle``).

Error bound. Prometheus stamps a sample with the wall time its scrape started, and the twin
serves its state as of its last step, so a sample stands for the twin at its mapped time to
within one twin step; but what the drill can see moves only once per scrape: a reading is up to
one scrape interval old (``scrape_interval_s`` x S twin seconds, 30 s at 0.5 s and 60x), and an
RTO term cut at an evaluation step is known to that resolution.

``settle`` waits until Prometheus has scraped past the twin's current time, so the end of a run
reads the fleet as it was when the run ended, not a scrape before.

A scenario (``firedrill respond --prometheus``) reads more than a drill: JobSets, the sandboxes'
audit records and compensations, the change journal, flags and quarantines. Those are the fleet's
state, not signals, so they come from the control endpoint with their times moved by
``offset_s`` like the change feed's (and the one operation that names a time,
``RunCompensations``, moved the other way on its way to the twin).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from firedrill.adapters.clock import ScaledClock, TimeMap
from firedrill.adapters.prometheus import PrometheusSignals, selector
from firedrill.adapters.remote_twin import RemoteTwin
from firedrill.errors import RemoteWorldError, SignalsMissing
from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Applied, Operation, RunCompensations
from firedrill.model.release import DigestRecord, RolloutView, ServingDigest
from firedrill.model.sandbox import CompensationRecord, EgressRecord, ToolCallRecord
from firedrill.model.series import Labels, Series
from firedrill.model.spec import FleetSpec
from firedrill.model.state import CellView, FaultRecord, NodeView, ReplicaTransition
from firedrill.twin.training import JobSetView, RankRecord

__all__ = ["REQUIRED_SERIES", "LiveSandboxes", "LiveTiming", "LiveWorld"]

# What a drill cannot judge without (its observer's serving series); named when absent
REQUIRED_SERIES = (
    "http_requests_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:kv_cache_usage_perc",
    "firedrill_replicas_ready",
)
PROBE = "firedrill_replicas_ready"  # a series every scrape of the fleet carries
INTERVAL_WINDOW_WALL_S = 300.0  # wall seconds of samples the scrape interval is measured over
FRESH_INTERVALS = 3.0  # the newest sample may be this many scrape intervals old, plus slack
FRESH_SLACK_WALL_S = 5.0
SPEED_TOLERANCE = 0.1  # the twin may run this share off the expected speed, plus two steps
STALE_SCRAPES = 4  # an instant read falls back on a sample up to this many scrapes old
STEP_SLACK_S = 2.0  # twin seconds: the twin's time is floored to its step (1 s) at each reading


@dataclass(frozen=True)
class LiveTiming:
    """How a live run's time was mapped, and how well: what a report about it should say."""

    speed: float
    anchor_unix_s: float  # the wall's Unix second at the run's second 0
    offset_s: float  # the twin's second at the run's second 0
    anchor_uncertainty_s: float  # run seconds: half the anchor reading's round trip, scaled
    scrape_interval_wall_s: float  # median gap between scrapes (over the run, once settled)
    drift_s: float  # run seconds: the twin's time minus the map's at the last check
    max_gap_wall_s: float | None = None  # the longest gap between two scrapes during the run
    max_late_s: float = 0.0  # run seconds: how far behind the fleet a step of the run fell

    @property
    def resolution_s(self) -> float:
        """Run seconds between two scrapes: what a reading can be off by."""
        return self.scrape_interval_wall_s * self.speed


class LiveWorld:
    """Control through ``control``, signals from ``signals``, time from ``clock``."""

    def __init__(
        self,
        control: RemoteTwin,
        signals: PrometheusSignals,
        clock: ScaledClock,
        *,
        offset_s: float = 0.0,
        scrape_interval_wall_s: float,
        anchor_uncertainty_s: float = 0.0,
        settle_timeout_wall_s: float | None = None,
        time_fn: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (math.isfinite(scrape_interval_wall_s) and scrape_interval_wall_s > 0):
            raise ValueError("the scrape interval is a finite number of seconds > 0")
        self.control = control
        self.signals = signals
        self.clock = clock
        self.offset_s = offset_s  # the twin's seconds at the run's second 0
        self.scrape_interval_wall_s = scrape_interval_wall_s
        self.anchor_uncertainty_s = anchor_uncertainty_s
        self.settle_timeout_wall_s = settle_timeout_wall_s or max(10 * scrape_interval_wall_s, 5.0)
        self._time = time_fn
        self._sleep = sleep
        self.drift_s = 0.0
        self.max_gap_wall_s: float | None = None
        self._sandbox = LiveSandboxes(self)

    def __repr__(self) -> str:
        return f"LiveWorld({self.control!r}, {self.signals!r}, {self.clock.time_map.speed:g}x)"

    # -- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        control: RemoteTwin,
        prometheus_url: str,
        *,
        speed: float = 1.0,
        check_wall_s: float | None = None,
        time_fn: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        prometheus: Callable[[TimeMap], PrometheusSignals] | None = None,
    ) -> LiveWorld:
        """Check Prometheus scrapes the fleet and the twin runs at ``speed``, then start the run's
        time at the twin's now; the world, or a ``RemoteWorldError`` / ``SignalsError`` saying
        what is wrong.

        ``check_wall_s`` (default ``max(1, 10 / speed)``, at most 10 s) is how long the twin's
        speed is watched before the run starts.
        """
        first, first_uncertainty = TimeMap.anchored(control.now_s, speed=speed, time_fn=time_fn)
        if prometheus is None:
            signals = PrometheusSignals(prometheus_url, time_map=first, sleep=sleep)
        else:
            signals = prometheus(first)
        interval = scrape_interval(signals, now_unix_s=time_fn())
        watch = check_wall_s if check_wall_s is not None else min(max(1.0, 10.0 / speed), 10.0)
        waited = time_fn() - first.anchor_unix_s
        if waited < watch:
            sleep(watch - waited)
        second, uncertainty = TimeMap.anchored(control.now_s, speed=speed, time_fn=time_fn)
        _check_speed(control.url, first, second, first_uncertainty + uncertainty)
        # the run's second 0 is the twin's now
        start_unix = second.anchor_unix_s
        run_map = TimeMap(anchor_unix_s=start_unix, anchor_run_s=0.0, speed=speed)
        signals.time_map = run_map
        # resampled at the scrape interval, a range query returns every scrape once
        signals.step_s = interval * speed
        clock = ScaledClock(
            run_map, start_s=0.0, max_lag_s=interval * speed, time_fn=time_fn, sleep=sleep
        )
        return cls(
            control, signals, clock, offset_s=second.run_s(start_unix),
            scrape_interval_wall_s=interval, anchor_uncertainty_s=uncertainty,
            time_fn=time_fn, sleep=sleep,
        )  # fmt: skip

    def measure_drift(self) -> float:
        """The twin's time minus the map's now, in run seconds (kept in ``drift_s``)."""
        reading, _ = TimeMap.anchored(
            self.control.now_s, speed=self.clock.time_map.speed, time_fn=self._time
        )
        twin_run_s = reading.anchor_run_s - self.offset_s
        self.drift_s = twin_run_s - self.clock.time_map.run_s(reading.anchor_unix_s)
        return self.drift_s

    def timing(self) -> LiveTiming:
        tm = self.clock.time_map
        return LiveTiming(
            speed=tm.speed, anchor_unix_s=tm.anchor_unix_s, offset_s=self.offset_s,
            anchor_uncertainty_s=self.anchor_uncertainty_s,
            scrape_interval_wall_s=self.scrape_interval_wall_s, drift_s=self.drift_s,
            max_gap_wall_s=self.max_gap_wall_s, max_late_s=self.clock.max_late_s,
        )  # fmt: skip

    # -- Clock ------------------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.clock.now_s()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def settle(self) -> None:
        """Wait until Prometheus holds a scrape taken at or after the twin's time now."""
        target = self.clock.live_s()
        deadline = self._time() + self.settle_timeout_wall_s
        newest = newest_sample_s(self.signals)
        while newest is None or newest < target:
            if self._time() > deadline:
                seen = "no sample" if newest is None else f"its newest at {newest:.1f} s"
                raise SignalsMissing(
                    f"Prometheus at {self.signals.url} has not scraped {PROBE} past the twin's "
                    f"{target:.1f} s within {self.settle_timeout_wall_s:g} s of wall time "
                    f"({seen})",
                    url=self.signals.url,
                )
            self._sleep(self.scrape_interval_wall_s / 4)
            newest = newest_sample_s(self.signals)
        self.measure_drift()
        # what the run's readings really rested on: the scrapes it saw, gaps included
        gaps = _gaps(_probe_wall_times(self.signals, window_s=max(self.clock.live_s(), 1.0)))
        if gaps:
            self.scrape_interval_wall_s = statistics.median(gaps)
            self.max_gap_wall_s = max(gaps)

    # -- Signals: Prometheus ----------------------------------------------------------------------

    def series_names(self) -> Sequence[str]:
        return self.signals.series_names()

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        return self.signals.query(name, matchers, start_s=start_s, end_s=end_s)

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        """The latest samples at the clock's instant (not the wall's now: every read of one
        evaluation step sees the same scrapes).

        The last sample of each series within a few scrapes (``last_over_time``), not the
        instant selector's: a scrape that failed (slow, timed out) marks every series of the
        target stale, and an instant read would then find the fleet empty, which a counter's
        reader takes for a reset to zero; the previous scrape is the honest reading.
        """
        at_s = self.clock.now_s()
        window_ms = max(1000, math.ceil(self.scrape_interval_wall_s * STALE_SCRAPES * 1000))
        query = f"last_over_time({selector(name, matchers)}[{window_ms}ms])"
        samples = self.signals.vector(query, at_s=at_s)
        labels = [tuple((k, v) for k, v in s.labels if k != "__name__") for s in samples]
        return at_s, labels, np.array([s.value for s in samples], dtype=np.float64)

    # -- Fleet and FleetHistory: the control endpoint ---------------------------------------------

    def apply(self, op: Operation) -> Operation:
        return self._to_run(self.control.apply(self._to_twin(op)))

    def inverse_of(self, op: Operation) -> Operation:
        return self._to_run(self.control.inverse_of(self._to_twin(op)))

    def _to_twin(self, op: Operation) -> Operation:
        """An operation that names a time (run seconds), as the twin reads it."""
        if isinstance(op, RunCompensations):
            return replace(op, since_s=op.since_s + self.offset_s)
        return op

    def _to_run(self, op: Operation) -> Operation:
        if isinstance(op, RunCompensations):
            return replace(op, since_s=op.since_s - self.offset_s)
        return op

    def node(self, name: str) -> NodeView:
        return self.control.node(name)

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        return self.control.node_views(cell=cell)

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        return self.control.pods_on(node, gpu)

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        result = self.control.burn_in_result(node)
        if result is None:
            return None
        at_s, passed, detail = result
        return at_s - self.offset_s, passed, detail

    def cells(self) -> Sequence[CellView]:
        return self.control.cells()

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        found = self.control.changes(since_s=since_s + self.offset_s, cell=cell)
        return [replace(e, at_s=e.at_s - self.offset_s) for e in found]

    def fault_events(self, *, since_s: float = 0.0) -> Sequence[FaultRecord]:
        found = self.control.fault_events(since_s=since_s + self.offset_s)
        return [replace(e, at_s=e.at_s - self.offset_s) for e in found]

    def replica_transitions(self, *, since_s: float = 0.0) -> Sequence[ReplicaTransition]:
        found = self.control.replica_transitions(since_s=since_s + self.offset_s)
        return [replace(e, at_s=e.at_s - self.offset_s) for e in found]

    # -- Capacity and Digests: the control endpoint -----------------------------------------------

    def max_rps_per_replica(self, model: str, cell: str) -> float:
        return self.control.max_rps_per_replica(model, cell)

    def cold_cache_penalty(self, model: str, cell: str) -> float:
        return self.control.cold_cache_penalty(model, cell)

    def capacity_errors(self) -> int:
        return self.control.capacity_errors()

    def published(self, model: str) -> Sequence[DigestRecord]:
        return self.control.published(model)

    def digest_record(self, digest: str) -> DigestRecord | None:
        return self.control.digest_record(digest)

    def serving_digests(self, region: str) -> Sequence[ServingDigest]:
        return self.control.serving_digests(region)

    def unsigned_replicas_admitted(self) -> int:
        return self.control.unsigned_replicas_admitted()

    # -- what a scenario reads beyond a drill (ScenarioWorld): the control endpoint, in run time

    def rollout_view(self, model: str) -> RolloutView:
        return self.control.rollout_view(model)

    def jobset(self, name: str) -> JobSetView:
        view = self.control.jobset(name)
        return replace(
            view,
            checkpoint_at_s=view.checkpoint_at_s - self.offset_s,
            started_at_s=view.started_at_s - self.offset_s,
        )

    def flight_recorder(self, jobset: str) -> Sequence[RankRecord]:
        return self.control.flight_recorder(jobset)

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        return self._sandbox.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        return self._sandbox.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def operations(self) -> Sequence[Applied]:
        return [
            replace(
                a,
                op=self._to_run(a.op),
                inverse=self._to_run(a.inverse),
                at_s=a.at_s - self.offset_s,
            )
            for a in self.control.operations()
        ]

    def flags(self) -> Mapping[str, str]:
        return self.control.flags()

    def quarantined_pods(self) -> frozenset[str]:
        return self.control.quarantined_pods()

    def quarantine_actions(self) -> Mapping[str, int]:
        return self.control.quarantine_actions()

    def fleet_spec(self) -> FleetSpec:
        return self.control.fleet_spec()

    @property
    def sandbox(self) -> LiveSandboxes:
        return self._sandbox


class LiveSandboxes:
    """The fleet's sandboxes' audit trail through the control endpoint, in run seconds."""

    def __init__(self, world: LiveWorld) -> None:
        self._world = world

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        offset = self._world.offset_s
        found = self._world.control.egress_records(
            start_s=start_s + offset, end_s=end_s + offset, tenant=tenant
        )
        return [replace(r, at_s=r.at_s - offset) for r in found]

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        offset = self._world.offset_s
        found = self._world.control.tool_records(
            start_s=start_s + offset, end_s=end_s + offset, tenant=tenant
        )
        return [replace(r, at_s=r.at_s - offset) for r in found]

    def compensations(self, *, tenant: str | None = None) -> Sequence[CompensationRecord]:
        offset = self._world.offset_s
        return [
            replace(c, at_s=c.at_s - offset, completed_at_s=c.completed_at_s - offset)
            for c in self._world.control.sandbox.compensations(tenant=tenant)
        ]

    def complete_since_s(self) -> float:
        return self._world.control.sandbox.complete_since_s() - self._world.offset_s

    def warm_pool(self, tenant: str) -> int:
        return self._world.control.sandbox.warm_pool(tenant)

    def has_pod(self, pod: str) -> bool:
        return self._world.control.sandbox.has_pod(pod)


def newest_sample_s(signals: PrometheusSignals) -> float | None:
    """Run seconds of the newest scrape of ``PROBE`` (``None``: no sample within lookback)."""
    unix_s = _newest_unix(signals)
    return None if unix_s is None else signals.time_map.run_s(unix_s)


def _newest_unix(signals: PrometheusSignals) -> float | None:
    found = signals.vector(f"max(timestamp({PROBE}))")
    if not found or not math.isfinite(found[0].value):
        return None
    return found[0].value


def scrape_interval(signals: PrometheusSignals, *, now_unix_s: float) -> float:
    """Wall seconds between two scrapes of the fleet, measured from the samples' timestamps.

    ``SignalsMissing`` (naming the URL and the series) when Prometheus has none of the series a
    drill reads, fewer than two scrapes of them, or none recent: then it does not scrape the
    fleet the run is about to control, and a drill would judge nothing.
    """
    url = signals.url
    names = set(signals.series_names())
    missing = [n for n in REQUIRED_SERIES if n not in names]
    if missing:
        firedrill = sorted(n for n in names if n.startswith("firedrill_"))
        held = f"it holds {len(names)} series names, {len(firedrill)} of them firedrill_*"
        raise SignalsMissing(
            f"Prometheus at {url} has no {', '.join(missing)} ({held}): is it scraping the "
            f"fleet's /metrics (`twin serve`, or the real exporters)?",
            url=url,
        )
    longest = _probe_wall_times(signals, window_s=signals.time_map.speed * INTERVAL_WINDOW_WALL_S)
    if len(longest) < 2:
        raise SignalsMissing(
            f"Prometheus at {url} holds {len(longest)} scrape(s) of {PROBE} in the last "
            f"{INTERVAL_WINDOW_WALL_S:g} s: wait for it to scrape the fleet at least twice",
            url=url,
        )
    interval = statistics.median(_gaps(longest[-21:]))
    age = now_unix_s - longest[-1]
    if interval <= 0 or age > FRESH_INTERVALS * interval + FRESH_SLACK_WALL_S:
        raise SignalsMissing(
            f"Prometheus at {url} last scraped {PROBE} {age:.1f} s ago (every {interval:g} s "
            f"before that): it no longer scrapes the fleet",
            url=url,
        )
    return float(interval)


def _check_speed(url: str, first: TimeMap, second: TimeMap, uncertainty_s: float) -> None:
    """Refuse a twin whose time did not move ``speed`` x the wall's between two readings."""
    wall_s = second.anchor_unix_s - first.anchor_unix_s
    expected = first.run_s(second.anchor_unix_s) - first.anchor_run_s
    moved = second.anchor_run_s - first.anchor_run_s
    tolerance = SPEED_TOLERANCE * expected + STEP_SLACK_S + uncertainty_s
    if abs(moved - expected) > tolerance:
        raise RemoteWorldError(
            f"the twin at {url} moved {moved:.1f} s in {wall_s:.2f} s of wall time; at --speed "
            f"{first.speed:g} it should have moved {expected:.1f} s (is it served with "
            f"--manual-clock, at another --speed, or too loaded to keep up?)"
        )


def _probe_wall_times(signals: PrometheusSignals, *, window_s: float) -> list[float]:
    """Wall Unix seconds of the scrapes of ``PROBE`` in the last ``window_s`` run seconds (of
    the series scraped most often)."""
    wall_times = [
        [signals.time_map.unix_s(t) for t in times.tolist()]
        for _, times, _ in signals.raw(selector(PROBE), window_s=window_s)
    ]
    return max(wall_times, key=len, default=[])


def _gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]
