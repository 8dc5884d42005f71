"""The six alerting strategies of the SRE workbook's "Alerting on SLOs", scored side by side.

Why this exists: choosing how to alert on an SLO is a trade between detection time, reset time,
precision and recall, and the workbook walks through six designs to show it. Here the same
incidents are replayed on a fleet (the twin by default) and every strategy is scored on the same
counter history, so the trade is measured rather than asserted.

How it is measured:

* **One run, many incidents.** ``plan_incidents`` draws a seeded plan of total outages, partial
  outages, slow burns and blips on one model in one cell, spaced out on a single run;
  ``record_counters`` applies them (``InjectServingErrors`` and its inverse) and records the
  cell's cumulative request and 5xx counters at every evaluation (15 s).
* **Each incident is scored on its own.** The strategies are evaluated offline, once per incident,
  on the run's requests and background errors plus that incident's errors only (the errors of the
  other incidents' windows are left out). A long-window alert still firing from one incident
  therefore neither hides the next one nor takes credit for it, which is how the workbook reasons
  about each strategy (per event). A last evaluation on the background errors alone counts the
  false alarms the fleet raises by itself.
* **The service is healthy outside the run.** Windows reach back up to 3 days and alerts take up
  to 3 days to reset, longer than is worth simulating: before the run and after it the counters
  are extended at the run's mean request rate with no errors, so every window is full from the
  first evaluation and every alert resolves.
* **Ratios are exact increases.** A window's error ratio is the increase of the 5xx counter over
  the increase of the request counter between two samples one window apart; evaluation times and
  windows are multiples of the evaluation interval, so no extrapolation is needed.

Definitions (what the report's numbers mean):

* **budget** — the period's error budget in requests: ``(1 - target) × mean request rate ×
  period`` (30 days by default), the rate being the run's mean.
* **significant** — an incident whose errors consume at least ``SIGNIFICANT_BUDGET_FRACTION``
  (2 %) of the budget: the workbook's paging line (2 % of the budget in one hour is what a 14.4×
  burn over 1 h consumes). Blips are drawn to stay below it; every other class above it.
* **alert episode** — a maximal stretch of evaluations during which at least one of the
  strategy's alerts fires (page or ticket). An episode belongs to an incident when it starts
  between the incident's start and its end plus the strategy's horizon (its longest window plus
  its longest ``for``): after that no error of the incident is left in any of its windows.
* **detection time** — first firing minus incident start; **reset time** — the end of the last
  episode the incident raised minus the incident's end (every alert of the strategy resolved);
  **budget consumed before firing** — the incident's errors from its start to the first firing,
  as a share of the budget. Each is a mean over the detected incidents of a class (``None`` when
  none was detected).
* **precision** — episodes belonging to significant incidents over all episodes (those of blips
  and of the background count against it); **recall** — significant incidents detected over
  significant incidents.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.detect.slo import Objective, SloSpec, duration_s
from firedrill.errors import UnknownTargetError
from firedrill.model.operations import InjectServingErrors, Operation
from firedrill.model.series import Labels
from firedrill.model.spec import FleetSpec

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

IncidentClass = Literal["total_outage", "partial", "slow_burn", "blip"]
INCIDENT_CLASSES: tuple[IncidentClass, ...] = ("total_outage", "partial", "slow_burn", "blip")
CLASS_TITLES: dict[IncidentClass, str] = {
    "total_outage": "total outage",
    "partial": "partial outage",
    "slow_burn": "slow burn",
    "blip": "blip",
}
SIGNIFICANT_BUDGET_FRACTION = 0.02  # of the period's error budget

_PLAN_STREAM = 0x1C  # keeps the plan's draws apart from any other stream seeded from the seed
_MINUTE_S = 60.0
_HOUR_S = 3600.0


# ----------------------------------------------------------------------------------------------
# incidents


@dataclass(frozen=True)
class Incident:
    """A share of the cell's requests fail with 5xx from ``start_s`` for ``duration_s``."""

    id: str
    kind: IncidentClass
    start_s: float  # seconds after the run's start
    duration_s: float
    fraction: float  # share of completed requests that fail

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class IncidentMix:
    """How many incidents of each class a generated plan holds."""

    total_outage: int = 2
    partial: int = 2
    slow_burn: int = 2
    blip: int = 3

    def count(self, kind: IncidentClass) -> int:
        n: int = getattr(self, kind)
        return n


@dataclass(frozen=True)
class IncidentPlan:
    """Incidents on one model in one cell, in time order, within a run of ``horizon_s``."""

    seed: int
    model: str
    cell: str
    incidents: tuple[Incident, ...]
    horizon_s: float  # simulated seconds the run lasts

    def __post_init__(self) -> None:
        ids = [i.id for i in self.incidents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"incident ids must be unique: {ids}")
        prev_end = 0.0
        for inc in self.incidents:
            if not 0.0 < inc.fraction <= 1.0:
                raise ValueError(f"{inc.id}: fraction must be within (0, 1]")
            if inc.duration_s <= 0.0 or inc.start_s < prev_end:
                raise ValueError(
                    f"{inc.id}: incidents start at or after 0, last some time, come in time order"
                    " and do not overlap"
                )
            prev_end = inc.end_s
        if prev_end > self.horizon_s:
            raise ValueError("the last incident ends after the run")


def plan_incidents(
    seed: int,
    objective: Objective,
    *,
    cell: str,
    period_s: float,
    mix: IncidentMix = IncidentMix(),
    step_s: float = 15.0,
) -> IncidentPlan:
    """A seeded plan: ``mix`` incidents in random order, 15–30 min apart, on one cell.

    Classes (the budget shares assume the run's mean request rate):

    * ``total_outage``: every request fails for 15–60 min (35–140 % of a 99.9 %/30 d budget);
    * ``partial``: 10–30 % fail for 30–60 min (7–42 %);
    * ``slow_burn``: a burn rate of 4–8× the budget (0.4–0.8 % at 99.9 %) for 8–14 h (4–16 %);
    * ``blip``: 1–3 min of errors sized to consume 0.3–1 % of the budget, below the 2 %
      significance line even at the daily peak (at 99.9 %: 8–26 s worth of a full outage).

    Times and durations are multiples of ``step_s`` (the evaluation interval).
    """
    rng = np.random.default_rng([seed, _PLAN_STREAM])
    budget_s = objective.budget * period_s  # seconds of full outage the budget allows

    def steps(lo_s: float, hi_s: float) -> float:
        return float(round(rng.uniform(lo_s, hi_s) / step_s) * step_s)

    kinds = [k for k in INCIDENT_CLASSES for _ in range(mix.count(k))]
    order = rng.permutation(len(kinds))
    t = 15 * _MINUTE_S  # lead-in: the run starts warm, this only spaces the first incident
    incidents: list[Incident] = []
    for n, idx in enumerate(order, start=1):
        kind = kinds[int(idx)]
        if kind == "total_outage":
            dur, frac = steps(15 * _MINUTE_S, 60 * _MINUTE_S), 1.0
        elif kind == "partial":
            dur, frac = steps(30 * _MINUTE_S, 60 * _MINUTE_S), float(rng.uniform(0.10, 0.30))
        elif kind == "slow_burn":
            dur = steps(8 * _HOUR_S, 14 * _HOUR_S)
            frac = float(rng.uniform(4.0, 8.0)) * objective.budget
        else:
            dur = steps(1 * _MINUTE_S, 3 * _MINUTE_S)
            frac = min(float(rng.uniform(0.003, 0.010)) * budget_s / dur, 1.0)
        incidents.append(Incident(f"i{n}", kind, t, dur, round(frac, 6)))
        t += dur + steps(15 * _MINUTE_S, 30 * _MINUTE_S)
    return IncidentPlan(seed, objective.model, cell, tuple(incidents), horizon_s=t)


# ----------------------------------------------------------------------------------------------
# strategies


@dataclass(frozen=True)
class AlertRule:
    """Fire when the error ratio over every window is above ``factor`` × the error budget."""

    name: str
    severity: Literal["page", "ticket"]
    factor: float  # burn rate: the threshold is factor × (1 - target)
    windows: tuple[str, ...]  # all must be above the threshold (long first)
    for_: str = "0s"
    inclusive: bool = False  # ``>=`` as the workbook writes strategies 1–3, else ``>``

    @property
    def for_s(self) -> float:
        return duration_s(self.for_)


@dataclass(frozen=True)
class Strategy:
    number: int
    name: str
    title: str
    rules: tuple[AlertRule, ...]

    @property
    def horizon_s(self) -> float:
        """How long after an incident's end one of its errors can still make this fire."""
        return max(max(duration_s(w) for w in r.windows) + r.for_s for r in self.rules)


def _tiers(*, multiwindow: bool) -> tuple[AlertRule, ...]:
    # Workbook table 5-8: 2 % of the budget in 1 h, 5 % in 6 h (page), 10 % in 3 d (ticket).
    rows = ((14.4, "page", "1h", "5m"), (6.0, "page", "6h", "30m"), (1.0, "ticket", "3d", "6h"))
    return tuple(
        AlertRule(
            f"burn {factor:g}x {long}" + (f" & {short}" if multiwindow else ""),
            "page" if severity == "page" else "ticket",
            factor,
            (long, short) if multiwindow else (long,),
        )
        for factor, severity, long, short in rows
    )


WORKBOOK_STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        1,
        "error-rate-10m",
        "Target error rate ≥ SLO threshold (10 m)",
        (AlertRule("error ratio 10m", "page", 1.0, ("10m",), inclusive=True),),
    ),
    Strategy(
        2,
        "error-rate-36h",
        "Increased alert window (36 h)",
        (AlertRule("error ratio 36h", "page", 1.0, ("36h",), inclusive=True),),
    ),
    Strategy(
        3,
        "error-rate-10m-for-1h",
        "Incrementing alert duration (10 m, for 1 h)",
        (AlertRule("error ratio 10m", "page", 1.0, ("10m",), for_="1h", inclusive=True),),
    ),
    Strategy(
        4,
        "burn-rate-1h",
        "Alert on burn rate (14.4× over 1 h)",
        (AlertRule("burn 14.4x 1h", "page", 14.4, ("1h",)),),
    ),
    Strategy(5, "multi-burn-rate", "Multiple burn rates", _tiers(multiwindow=False)),
    Strategy(
        6,
        "multiwindow-multi-burn-rate",
        "Multiwindow, multi-burn-rate",
        _tiers(multiwindow=True),
    ),
)


# ----------------------------------------------------------------------------------------------
# recording the run


class World(Protocol):
    """What the comparison needs of a fleet: ``apply`` (Fleet), ``instant`` (Signals) and the
    Clock. The twin provides all three."""

    def apply(self, op: Operation) -> Operation: ...

    def advance(self, seconds: float) -> None: ...

    def now_s(self) -> float: ...

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], F64]: ...


@dataclass(frozen=True, eq=False)
class CounterHistory:
    """The cell's cumulative counters at every evaluation, ``step_s`` apart from t = 0."""

    step_s: float
    requests: F64  # 2xx + 5xx
    errors: F64  # 5xx

    @property
    def duration_s(self) -> float:
        return (self.requests.size - 1) * self.step_s

    @property
    def mean_rps(self) -> float:
        return float(self.requests[-1] - self.requests[0]) / max(self.duration_s, self.step_s)


def _read_counters(world: World, model: str, cell: str) -> tuple[float, float]:
    _, labels, values = world.instant("http_requests_total", {"model_name": model, "cell": cell})
    if not labels:
        raise UnknownTargetError("cell serving " + model, cell)
    errors = sum(
        float(v) for lab, v in zip(labels, values, strict=True) if ("status", "5xx") in lab
    )
    return float(np.nansum(values)), errors


def record_counters(
    world: World,
    plan: IncidentPlan,
    *,
    step_s: float = 15.0,
    progress: Callable[[float], None] | None = None,
) -> CounterHistory:
    """Run ``plan`` on ``world`` and sample the cell's counters every ``step_s``.

    Each injection's inverse is kept from the moment it is applied and applied at the
    incident's end. ``progress`` receives the simulated seconds done, about every 10 minutes.
    """
    for inc in plan.incidents:
        for t in (inc.start_s, inc.end_s):
            if abs(t / step_s - round(t / step_s)) > 1e-9:
                raise ValueError(f"{inc.id}: times must be multiples of {step_s:g} s")
    starts = {round(i.start_s / step_s): i for i in plan.incidents}
    ends = {round(i.end_s / step_s): i for i in plan.incidents}
    inverses: dict[str, Operation] = {}
    n = round(plan.horizon_s / step_s)
    requests = np.zeros(n + 1)
    errors = np.zeros(n + 1)
    t0 = world.now_s()
    report_every = max(round(600.0 / step_s), 1)
    for k in range(n + 1):
        if k:
            world.advance(step_s)
        requests[k], errors[k] = _read_counters(world, plan.model, plan.cell)
        if k in ends:
            world.apply(inverses.pop(ends[k].id))
        if k in starts:
            inc = starts[k]
            inverses[inc.id] = world.apply(InjectServingErrors(plan.model, plan.cell, inc.fraction))
        if progress is not None and (k % report_every == 0 or k == n):
            progress(world.now_s() - t0)
    return CounterHistory(step_s, requests, errors)


# ----------------------------------------------------------------------------------------------
# scoring


@dataclass(frozen=True)
class IncidentRecord:
    """An incident as it happened: its errors and the share of the budget they consumed."""

    incident: Incident
    errors: float
    budget_consumed: float
    significant: bool


@dataclass(frozen=True)
class Outcome:
    """How one strategy met one incident."""

    incident: str
    kind: IncidentClass
    significant: bool
    detection_time_s: float | None
    reset_time_s: float | None
    budget_consumed_before_firing: float | None
    first_alert: str | None  # the rule that fired first
    episodes: int


@dataclass(frozen=True)
class StrategyScore:
    strategy: Strategy
    outcomes: tuple[Outcome, ...]
    true_alerts: int  # episodes raised by significant incidents
    false_alerts: int  # episodes raised by blips or by the background

    @property
    def precision(self) -> float | None:
        alerts = self.true_alerts + self.false_alerts
        return self.true_alerts / alerts if alerts else None

    @property
    def recall(self) -> float | None:
        sig = [o for o in self.outcomes if o.significant]
        return sum(o.detection_time_s is not None for o in sig) / len(sig) if sig else None

    def detected(self, kind: IncidentClass) -> tuple[int, int]:
        """(detected, all) incidents of a class."""
        of = [o for o in self.outcomes if o.kind == kind]
        return sum(o.detection_time_s is not None for o in of), len(of)

    def mean_by_class(
        self, pick: Callable[[Outcome], float | None]
    ) -> dict[IncidentClass, float | None]:
        out: dict[IncidentClass, float | None] = {}
        for kind in INCIDENT_CLASSES:
            xs = [x for o in self.outcomes if o.kind == kind and (x := pick(o)) is not None]
            out[kind] = float(np.mean(xs)) if xs else None
        return out

    @property
    def detection_time_s(self) -> dict[IncidentClass, float | None]:
        return self.mean_by_class(lambda o: o.detection_time_s)

    @property
    def reset_time_s(self) -> dict[IncidentClass, float | None]:
        return self.mean_by_class(lambda o: o.reset_time_s)

    @property
    def budget_consumed_before_firing(self) -> dict[IncidentClass, float | None]:
        return self.mean_by_class(lambda o: o.budget_consumed_before_firing)

    @property
    def mean_reset_time_s(self) -> float | None:
        """Mean reset time over the significant incidents it detected."""
        xs = [o.reset_time_s for o in self.outcomes if o.significant and o.reset_time_s is not None]
        return float(np.mean(xs)) if xs else None


@dataclass(frozen=True)
class CompareResult:
    seed: int
    objective: Objective
    period_s: float
    slo_digest: str  # sha256 of the SLO spec
    model: str
    cell: str
    step_s: float
    simulated_s: float
    mean_rps: float
    budget_errors: float  # the period's error budget, in requests
    incidents: tuple[IncidentRecord, ...]
    strategies: tuple[StrategyScore, ...]

    def strategy(self, number: int) -> StrategyScore:
        return next(s for s in self.strategies if s.strategy.number == number)

    def to_json(self) -> dict[str, Any]:
        """The machine-readable report (same seed and specs give the same document)."""
        return {
            "seed": self.seed,
            "slo": {
                "objective": self.objective.name,
                "product": self.objective.product,
                "model": self.model,
                "sli": self.objective.sli,
                "target": self.objective.target,
                "period_s": self.period_s,
                "digest": self.slo_digest,
            },
            "cell": self.cell,
            "evaluation_interval_s": self.step_s,
            "simulated_s": self.simulated_s,
            "mean_requests_per_s": _r(self.mean_rps),
            "budget_errors": _r(self.budget_errors),
            "significant_budget_fraction": SIGNIFICANT_BUDGET_FRACTION,
            "incidents": [
                {
                    "id": rec.incident.id,
                    "class": rec.incident.kind,
                    "start_s": rec.incident.start_s,
                    "duration_s": rec.incident.duration_s,
                    "fraction": rec.incident.fraction,
                    "errors": int(rec.errors),
                    "budget_consumed": _r(rec.budget_consumed),
                    "significant": rec.significant,
                }
                for rec in self.incidents
            ],
            "strategies": [_strategy_json(s) for s in self.strategies],
        }


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def _by_class(d: Mapping[IncidentClass, float | None], digits: int = 6) -> dict[str, float | None]:
    return {k: _r(v, digits) for k, v in d.items()}


def _strategy_json(s: StrategyScore) -> dict[str, Any]:
    return {
        "number": s.strategy.number,
        "name": s.strategy.name,
        "title": s.strategy.title,
        "rules": [
            {
                "name": r.name,
                "severity": r.severity,
                "burn_rate": r.factor,
                "windows": list(r.windows),
                "for": r.for_,
            }
            for r in s.strategy.rules
        ],
        "detection_time_s": _by_class(s.detection_time_s),
        "reset_time_s": _by_class(s.reset_time_s),
        "reset_time_mean_s": _r(s.mean_reset_time_s),
        "budget_consumed_before_firing": _by_class(s.budget_consumed_before_firing),
        "detected": {k: s.detected(k)[0] for k in INCIDENT_CLASSES},
        "precision": _r(s.precision),
        "recall": _r(s.recall),
        "alerts": s.true_alerts + s.false_alerts,
        "false_alerts": s.false_alerts,
        "outcomes": [
            {
                "incident": o.incident,
                "class": o.kind,
                "detection_time_s": o.detection_time_s,
                "reset_time_s": o.reset_time_s,
                "budget_consumed_before_firing": _r(o.budget_consumed_before_firing),
                "first_alert": o.first_alert,
                "episodes": o.episodes,
            }
            for o in s.outcomes
        ],
    }


@dataclass(frozen=True)
class _Episode:
    start: int  # evaluation index (of the extended grid) of the first firing
    end: int  # index of the first evaluation that no longer fires
    first_rule: str


class _Grid:
    """Cumulative counters extended by healthy history on both sides, on the evaluation grid."""

    def __init__(self, history: CounterHistory, errors: F64, pad: int, tail: int) -> None:
        rate_per_step = history.mean_rps * history.step_s
        before = history.requests[0] - rate_per_step * np.arange(pad, 0, -1)
        after = history.requests[-1] + rate_per_step * np.arange(1, tail + 1)
        self.requests = np.concatenate([before, history.requests, after])
        self.errors = np.concatenate([np.full(pad, errors[0]), errors, np.full(tail, errors[-1])])
        self.pad = pad
        self.step_s = history.step_s
        self._ratios: dict[str, F64] = {}
        self._hourly: F64 | None = None

    def time_s(self, k: int) -> float:
        return (k - self.pad) * self.step_s

    def index(self, t_s: float) -> int:
        return self.pad + round(t_s / self.step_s)

    def _increase(self, series: F64, window: str) -> F64:
        n = round(duration_s(window) / self.step_s)
        out: F64 = series[self.pad :] - series[self.pad - n : series.size - n]
        return out

    def ratio(self, window: str) -> F64:
        """Error ratio over ``window`` at every evaluation from t = 0 on."""
        if window not in self._ratios:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = self._increase(self.errors, window) / self._increase(self.requests, window)
            self._ratios[window] = np.nan_to_num(r, nan=0.0)
        return self._ratios[window]

    def hourly_requests(self) -> F64:
        if self._hourly is None:
            self._hourly = self._increase(self.requests, "1h")
        return self._hourly


def _firing(grid: _Grid, rule: AlertRule, objective: Objective) -> B:
    threshold = rule.factor * objective.budget
    cond: B = grid.hourly_requests() >= objective.min_events_per_hour
    for w in rule.windows:
        r = grid.ratio(w)
        cond = cond & ((r >= threshold) if rule.inclusive else (r > threshold))
    need = round(rule.for_s / grid.step_s)
    if need == 0:
        return cond
    # Prometheus: pending at the first true evaluation, firing once it has held for ``for``.
    idx = np.arange(cond.size)
    last_false = np.maximum.accumulate(np.where(cond, -1, idx))
    held = idx - last_false  # consecutive true evaluations ending here
    out: B = cond & (held >= need + 1)
    return out


def _episodes(grid: _Grid, strategy: Strategy, objective: Objective) -> list[_Episode]:
    per_rule = [_firing(grid, r, objective) for r in strategy.rules]
    any_firing = np.logical_or.reduce(per_rule)
    edges = np.diff(np.concatenate([[False], any_firing, [False]]).astype(np.int8))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    out: list[_Episode] = []
    for a, b in zip(starts, ends, strict=True):
        first = next(r.name for r, f in zip(strategy.rules, per_rule, strict=True) if f[a])
        out.append(_Episode(int(a) + grid.pad, int(b) + grid.pad, first))
    return out


def _masks(history: CounterHistory, plan: IncidentPlan) -> dict[str, B]:
    """Per incident: the sampling intervals whose errors are its own (start to one step after)."""
    t_end = np.arange(1, history.requests.size) * history.step_s  # interval (t - step, t]
    return {
        inc.id: (t_end > inc.start_s) & (t_end - history.step_s < inc.end_s + history.step_s)
        for inc in plan.incidents
    }


def score(
    history: CounterHistory,
    plan: IncidentPlan,
    objective: Objective,
    *,
    period_s: float,
    slo_digest: str = "",
    strategies: Sequence[Strategy] = WORKBOOK_STRATEGIES,
) -> CompareResult:
    """Score every strategy on every incident of ``plan`` (see the module docstring)."""
    step = history.step_s
    for s in strategies:
        for rule in s.rules:
            for d in (*rule.windows, rule.for_):
                n = duration_s(d) / step
                if abs(n - round(n)) > 1e-9:
                    raise ValueError(f"{s.name}: {d} is not a multiple of the {step:g} s interval")
    increments = np.diff(history.errors)
    masks = _masks(history, plan)
    own = np.logical_or.reduce(list(masks.values())) if masks else np.zeros(increments.size, bool)
    background = np.where(own, 0.0, increments)
    budget_errors = objective.budget * history.mean_rps * period_s
    longest = max(s.horizon_s for s in strategies)
    pad = round(longest / step)
    tail = pad + 1

    def grid_of(extra: F64) -> _Grid:
        cum = np.concatenate([[history.errors[0]], history.errors[0] + np.cumsum(extra)])
        return _Grid(history, cum, pad, tail)

    base_grid = grid_of(background)
    records: list[IncidentRecord] = []
    grids: list[_Grid] = []
    for inc in plan.incidents:
        inc_errors = float(np.sum(increments * masks[inc.id]))
        consumed = inc_errors / budget_errors if budget_errors > 0 else math.inf
        records.append(
            IncidentRecord(inc, inc_errors, consumed, consumed >= SIGNIFICANT_BUDGET_FRACTION)
        )
        grids.append(grid_of(background + increments * masks[inc.id]))

    scores: list[StrategyScore] = []
    for strategy in strategies:
        base_eps = _episodes(base_grid, strategy, objective)
        base_keys = {(e.start, e.end) for e in base_eps}
        true_alerts, false_alerts = 0, len(base_eps)
        outcomes: list[Outcome] = []
        for rec, grid in zip(records, grids, strict=True):
            inc = rec.incident
            lo = grid.index(inc.start_s)
            hi = grid.index(inc.end_s + strategy.horizon_s)
            mine = [
                e
                for e in _episodes(grid, strategy, objective)
                if lo <= e.start <= hi and (e.start, e.end) not in base_keys
            ]
            if rec.significant:
                true_alerts += len(mine)
            else:
                false_alerts += len(mine)
            if mine:
                fired = mine[0].start
                spent = float(grid.errors[fired] - grid.errors[lo])
                outcome = Outcome(
                    inc.id,
                    inc.kind,
                    rec.significant,
                    grid.time_s(fired) - inc.start_s,
                    grid.time_s(mine[-1].end) - inc.end_s,
                    spent / budget_errors if budget_errors > 0 else None,
                    mine[0].first_rule,
                    len(mine),
                )
            else:
                outcome = Outcome(inc.id, inc.kind, rec.significant, None, None, None, None, 0)
            outcomes.append(outcome)
        scores.append(StrategyScore(strategy, tuple(outcomes), true_alerts, false_alerts))

    return CompareResult(
        seed=plan.seed,
        objective=objective,
        period_s=period_s,
        slo_digest=slo_digest,
        model=plan.model,
        cell=plan.cell,
        step_s=step,
        simulated_s=history.duration_s,
        mean_rps=history.mean_rps,
        budget_errors=budget_errors,
        incidents=tuple(records),
        strategies=tuple(scores),
    )


# ----------------------------------------------------------------------------------------------
# the use case


def availability_objective(slo: SloSpec, name: str | None = None) -> Objective:
    """The named objective, or the spec's first availability objective; it must be one."""
    for o in slo.objectives:
        if (name is None or o.name == name) and o.sli == "availability":
            return o
    raise UnknownTargetError("availability objective", name or "(any)")


def first_cell_serving(fleet: FleetSpec, model: str) -> str:
    """The first cell (in spec order) that runs replicas of ``model``."""
    for region in fleet.regions:
        for cell in region.cells:
            if cell.replicas.get(model, 0) > 0:
                return cell.name
    raise UnknownTargetError("model", model)


def slo_digest(slo: SloSpec) -> str:
    return "sha256:" + hashlib.sha256(slo.model_dump_json().encode()).hexdigest()


def compare(
    world: World,
    plan: IncidentPlan,
    slo: SloSpec,
    objective: Objective,
    *,
    progress: Callable[[float], None] | None = None,
) -> CompareResult:
    """Run ``plan`` on ``world`` and score the workbook's six strategies on it."""
    step = duration_s(slo.evaluation_interval)
    history = record_counters(world, plan, step_s=step, progress=progress)
    return score(history, plan, objective, period_s=slo.period_s, slo_digest=slo_digest(slo))
