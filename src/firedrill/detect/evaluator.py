"""In-process evaluation of the SLO burn-rate alerts, on the twin's simulated clock.

It computes exactly what the generated rules ask Prometheus to compute, so an alert that fires
here fires there at the same evaluation (``tests/detect/test_promtool_equivalence.py`` proves it
with the real rule engine): ``rate()`` with Prometheus 2.x's extrapolation (left-closed range,
extrapolation to the range edges below 1.1 average intervals, the zero-crossing limit for
counters), ratios of sums by (cell, region) clamped to [0, 1], the goodput product of two such
ratios, ``and`` on equal label sets.

Incremental: each evaluation reads one instant sample per counter through the ``Signals`` port and
appends it to a per-objective history, so a step costs O(windows × cells), independent of how
long the run has been going.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.detect.promql import AlertEvent as AlertEvent
from firedrill.detect.promql import prom_increase as prom_increase
from firedrill.detect.rules import alert_name
from firedrill.detect.slo import BurnTier, Objective, SloSpec, duration_s
from firedrill.model.series import Labels, labels_of
from firedrill.ports import Signals

F64 = npt.NDArray[np.float64]
ROWS = 4  # counters kept per objective: two ratios of numerator and denominator
_SLI_CODE = {"ttft": 0, "availability": 1, "goodput": 2}
BACKFILL_COARSE_ROWS = 2048  # samples beyond the last two hours of a backfill


@dataclass
class _History:
    """Evaluation times and every objective's counters per cell, growing by doubling.

    ``rows[k, 4·o]`` / ``rows[k, 4·o + 1]`` are objective o's first ratio (numerator,
    denominator) at evaluation k, ``rows[k, 4·o + 2]`` / ``rows[k, 4·o + 3]`` its second (goodput
    only); columns of the last axis are cells.
    """

    width: int  # 4 x objectives
    n: int = 0
    t: F64 = field(default_factory=lambda: np.zeros(256))
    rows: F64 = field(default_factory=lambda: np.zeros((256, 0, 0)))

    def __post_init__(self) -> None:
        self.rows = np.zeros((self.t.size, self.width, 0))

    def append(self, t: float, row: F64) -> None:
        if self.n and self.t[self.n - 1] == t:
            self.n -= 1  # re-evaluated at the same instant: the newer sample replaces it
        cells = max(row.shape[1], self.rows.shape[2])
        if self.n == self.t.size or cells > self.rows.shape[2]:
            cap = self.t.size * 2 if self.n == self.t.size else self.t.size
            t_new = np.zeros(cap)
            t_new[: self.n] = self.t[: self.n]
            r_new = np.zeros((cap, self.width, cells))
            r_new[: self.n, :, : self.rows.shape[2]] = self.rows[: self.n]
            self.t, self.rows = t_new, r_new
        self.t[self.n] = t
        self.rows[self.n, :, : row.shape[1]] = row
        self.n += 1


@dataclass
class _Selection:
    name: str
    matchers: dict[str, str]
    group: npt.NDArray[np.int64] | None = None  # series index -> cell index


class BurnRateEvaluator:
    """Evaluates every objective's burn tiers per cell at each call of ``evaluate``."""

    def __init__(self, spec: SloSpec, signals: Signals) -> None:
        self.spec = spec
        self.signals = signals
        self.cells: list[tuple[str, str]] = []  # (cell, region), discovered from the series
        self._cell_index: dict[tuple[str, str], int] = {}
        self.history = _History(width=ROWS * len(spec.objectives))
        self.firing: dict[tuple[str, str, str], bool] = {}  # (objective, tier, cell)
        self.events: list[AlertEvent] = []
        self._sel: dict[str, tuple[_Selection, ...]] = {}
        for o in spec.objectives:
            le = repr(float(o.ttft_threshold_s))
            bucket = _Selection(
                "vllm:time_to_first_token_seconds_bucket", {"model_name": o.model, "le": le}
            )
            count = _Selection("vllm:time_to_first_token_seconds_count", {"model_name": o.model})
            ok = _Selection("http_requests_total", {"model_name": o.model, "status": "2xx"})
            bad = _Selection("http_requests_total", {"model_name": o.model, "status": "5xx"})
            if o.sli == "ttft":
                self._sel[o.name] = (bucket, count)
            elif o.sli == "availability":
                self._sel[o.name] = (bad, ok)
            else:
                self._sel[o.name] = (bad, ok, bucket, count)
        self._windows = {w: duration_s(w) for w in spec.windows()}
        self._window_s = np.array(list(self._windows.values()))
        names = list(self._windows)
        if "1h" not in names:
            raise ValueError("the SLO windows must include 1h (the min-events guard)")
        self._w_1h = names.index("1h")
        self._long_i = np.array([names.index(t.long) for t in spec.tiers])
        self._short_i = np.array([names.index(t.short) for t in spec.tiers])
        factors = np.array([t.factor for t in spec.tiers])
        self._thresholds = np.array([factors * o.budget for o in spec.objectives])
        self._min_events = np.array([float(o.min_events_per_hour) for o in spec.objectives])
        self._sli = np.array([_SLI_CODE[o.sli] for o in spec.objectives])
        self._obj_index = {o.name: i for i, o in enumerate(spec.objectives)}
        self._state: npt.NDArray[np.bool_] = np.zeros(
            (len(spec.objectives), len(spec.tiers), 0), bool
        )

    def _read(
        self, sel: _Selection, cache: dict[tuple[str, str], tuple[float, F64]]
    ) -> tuple[float, F64]:
        key = (sel.name, repr(sorted(sel.matchers.items())))
        hit = cache.get(key)
        if hit is not None and hit[1].size == len(self.cells):
            return hit
        t, labels, values = self.signals.instant(sel.name, sel.matchers)
        if sel.group is None or sel.group.size != len(labels):
            idx = []
            for lab in labels:
                d = dict(lab)
                ckey = (d.get("cell", ""), d.get("region", ""))
                if ckey not in self._cell_index:
                    self._cell_index[ckey] = len(self.cells)
                    self.cells.append(ckey)
                idx.append(self._cell_index[ckey])
            sel.group = np.array(idx, dtype=np.int64)
        out = np.bincount(sel.group, weights=values, minlength=len(self.cells)).astype(np.float64)
        out[~np.isfinite(out)] = 0.0
        cache[key] = (t, out)
        return t, out

    @property
    def started(self) -> bool:
        return self.history.n > 0

    @property
    def history_s(self) -> float:
        """Seconds of counter history the windows can see (backfilled part included)."""
        h = self.history
        return float(h.t[h.n - 1] - h.t[0]) if h.n else 0.0

    @property
    def longest_window_s(self) -> float:
        return float(self._window_s.max())

    def backfill(self) -> float:
        """Extend the history back past the longest window at the rate seen so far.

        A real Prometheus holds days of history when a fault starts; an evaluator that started
        with the run sees only minutes, and then a 1 h window holding 5 minutes of history reads
        a total outage 12 times too fast (the 14.4x page fires after 15 s instead of 52 s) and
        every tier fires at once. Called once the run has sampled its steady state (before the
        first fault), this prepends synthetic samples that continue every counter backwards at
        its observed steady rate: at the evaluation spacing for the last two hours, coarser
        beyond (a window's error *ratio* does not depend on the spacing, as both counters share
        the samples). Returns the history length afterwards; with fewer than two evaluations
        there is no rate to continue and nothing changes.
        """
        h = self.history
        if h.n < 2:
            return self.history_s
        span = float(h.t[h.n - 1] - h.t[0])
        need = self.longest_window_s - span
        if span <= 0 or need <= 0:
            return self.history_s
        spacing = span / (h.n - 1)
        fine = min(need, 2 * 3600.0)
        n_fine = math.ceil(fine / spacing)
        back = spacing * np.arange(1, n_fine + 1)
        if need > back[-1]:
            coarse = max(spacing, (need - back[-1]) / BACKFILL_COARSE_ROWS)
            n_coarse = math.ceil((need - back[-1]) / coarse)
            back = np.concatenate([back, back[-1] + coarse * np.arange(1, n_coarse + 1)])
        t0 = float(h.t[0])
        rate = (h.rows[h.n - 1] - h.rows[0]) / span  # [width, cells]
        times = (t0 - back)[::-1]
        rows = h.rows[0][None, :, :] + rate[None, :, :] * (times - t0)[:, None, None]
        n = h.n + times.size
        t_new = np.zeros(max(n * 2, 256))
        r_new = np.zeros((t_new.size, h.rows.shape[1], h.rows.shape[2]))
        t_new[: times.size] = times
        t_new[times.size : n] = h.t[: h.n]
        r_new[: times.size] = rows
        r_new[times.size : n] = h.rows[: h.n]
        h.t, h.rows, h.n = t_new, r_new, n
        return self.history_s

    @property
    def evaluations(self) -> int:
        return self.history.n

    def evaluate(self) -> list[AlertEvent]:
        """Read the latest samples and evaluate every alert; return the state changes."""
        cache: dict[tuple[str, str], tuple[float, F64]] = {}
        parts: list[F64] = []
        t = 0.0
        for o in self.spec.objectives:
            sels = self._sel[o.name]
            t, va = self._read(sels[0], cache)
            _, vb = self._read(sels[1], cache)
            if o.sli == "ttft":
                parts += [va, vb, vb, vb]  # fast / all first tokens; the second ratio unused
            else:
                parts += [va, va + vb]  # 5xx / all requests
                if o.sli == "availability":
                    parts += [vb, vb]
                else:
                    _, vc = self._read(sels[2], cache)
                    _, vd = self._read(sels[3], cache)
                    parts += [vc, vd]  # fast / all first tokens
        width = len(self.cells)
        row = np.zeros((len(parts), width))
        for i, v in enumerate(parts):
            row[i, : v.size] = v
        self.history.append(t, row)
        changes = self._evaluate_all()
        self.events.extend(changes)
        return changes

    def _increases(self, windows_s: F64) -> F64:
        """Increase of every counter row per window and cell: [4 x objectives, W, C]."""
        h = self.history
        last = h.n - 1
        t = float(h.t[last])
        start = t - windows_s
        i = np.searchsorted(h.t[: h.n], start - 1e-9, side="left")
        first = np.transpose(h.rows[i], (1, 0, 2))  # [rows, W, C]
        latest = h.rows[last][:, None, :]
        return prom_increase(
            first, latest, h.t[i][None, :, None], t, (last - i + 1)[None, :, None],
            start[None, :, None], t,
        )  # fmt: skip

    def _ratios_of(self, inc: F64) -> F64:
        """Error ratios [objectives, W, C] from increases [4 x objectives, W, C], as the rules
        write them: ``1 - clamp(fast/all)``, ``clamp(5xx/all)``, and for goodput
        ``1 - ((1 - clamp(5xx/all)) * clamp(fast/all) or (1 - clamp(5xx/all)))``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            # Without events a ratio is absent (NaN never fires); goodput then counts the
            # answered share alone.
            den_a, den_b = inc[1::ROWS], inc[3::ROWS]
            first = np.where(den_a > 0, np.clip(inc[0::ROWS] / den_a, 0.0, 1.0), np.nan)
            second = np.where(den_b > 0, np.clip(inc[2::ROWS] / den_b, 0.0, 1.0), 1.0)
        sli = self._sli[:, None, None]
        out: F64 = np.where(
            sli == _SLI_CODE["ttft"],
            1.0 - first,
            np.where(sli == _SLI_CODE["availability"], first, 1.0 - ((1.0 - first) * second)),
        )
        return out

    def _index(self, o: Objective) -> int:
        return self._obj_index[o.name]

    def error_ratio(self, o: Objective, window_s: float) -> F64:
        """The SLI error ratio per cell over ``window_s`` at the latest evaluation."""
        out: F64 = self._ratios_of(self._increases(np.array([window_s])))[self._index(o), 0]
        return out

    def events_per_hour(self, o: Objective) -> F64:
        """Events of the SLI's denominator over the last hour (the min-events guard)."""
        out: F64 = self._increases(np.array([3600.0]))[ROWS * self._index(o) + 1, 0]
        return out

    def _evaluate_all(self) -> list[AlertEvent]:
        inc = self._increases(self._window_s)
        ratios = self._ratios_of(inc)  # [objectives, windows, cells]
        events = inc[1::ROWS, self._w_1h]  # [objectives, cells]
        thr = self._thresholds[:, :, None]  # [objectives, tiers, 1]
        cond = (
            (ratios[:, self._long_i] > thr)
            & (ratios[:, self._short_i] > thr)
            & (events >= self._min_events[:, None])[:, None, :]
        )  # [objectives, tiers, cells]
        prev = self._state
        if prev.shape != cond.shape:
            grown = np.zeros(cond.shape, dtype=bool)
            grown[:, :, : prev.shape[2]] = prev
            prev = grown
        self._state = cond
        out: list[AlertEvent] = []
        t = float(self.history.t[self.history.n - 1])
        for oi, ti, ci in zip(*np.nonzero(cond != prev), strict=True):
            o = self.spec.objectives[int(oi)]
            tier = self.spec.tiers[int(ti)]
            cell, region = self.cells[int(ci)]
            now = bool(cond[oi, ti, ci])
            self.firing[(o.name, tier.tier, cell)] = now
            out.append(
                AlertEvent(
                    at_s=t,
                    alertname=alert_name(o, tier),
                    state="firing" if now else "resolved",
                    labels=self._labels(o, tier, cell, region),
                    value=float(ratios[oi, self._long_i[ti], ci]),
                )
            )
        return out

    def _labels(self, o: Objective, tier: BurnTier, cell: str, region: str) -> Labels:
        return labels_of(
            alertname=alert_name(o, tier),
            severity=tier.severity,
            team="inference",
            burn_tier=tier.tier,
            slo=o.name,
            model_name=o.model,
            product=o.product,
            cell=cell,
            region=region,
        )

    def active(self) -> Sequence[tuple[str, str, str]]:
        """(objective, tier, cell) of every alert firing now."""
        return sorted(k for k, v in self.firing.items() if v)
