"""The fits themselves: pure functions from sampled series to parameters with their fit quality.

Each function takes plain arrays (times in Unix seconds, values as Prometheus answered them) and
returns a frozen value that carries the estimate, an error measure and the number of samples it
used, so the report can say how far to trust each number. Nothing here knows Prometheus or the
twin's classes: the same functions fit series from a real fleet and from a twin's backfill.

The models fitted are the twin's own (``firedrill.twin.demand``, ``firedrill.twin.serving``):

- demand: ``rps(h) = peak · (1 − amp · (1 − cos(2π (h − peak_h) / 24)) / 2)``, which is linear in
  ``(1, cos ωh, sin ωh)``: ordinary least squares, then ``peak``, ``amp`` and ``peak_h`` from the
  coefficients, their standard errors by the delta method;
- a straight line ``y = a + k·x`` (decode step time against batch, KV usage against batch);
- the prefill curve from the TTFT histogram: a bucket edge ``e`` holding a share ``F`` of the
  observations is the prefill time of the prompt length at quantile ``F`` of the (lognormal)
  prompt distribution, so each edge gives one point of the curve;
- fault rates: events per 1,000 node-days with the exact (Garwood) Poisson 95% interval.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri
from scipy.stats import chi2

F64 = npt.NDArray[np.float64]
OMEGA = 2.0 * math.pi / 24.0  # radians per hour of the day
MIN_DIURNAL_SAMPLES = 12


@dataclass(frozen=True)
class DiurnalFit:
    """Peak requests/s, diurnal amplitude (0–1) and peak hour (UTC) of one demand series."""

    peak_rps: float
    amplitude: float
    peak_hour_utc: float
    peak_rel_stderr: float  # standard error of the peak over the peak
    amplitude_stderr: float
    peak_hour_stderr_h: float
    rel_rmse: float  # residual RMS over the mean rate: noise, events and what the shape misses
    samples: int


@dataclass(frozen=True)
class LineFit:
    """``y = intercept + slope · x`` with standard errors."""

    intercept: float
    slope: float
    intercept_stderr: float
    slope_stderr: float
    rel_rmse: float  # residual RMS over the mean of y
    samples: int


@dataclass(frozen=True)
class PrefillFit:
    """A scale on the base prefill curve and the curve points it was fitted to."""

    scale: float
    rel_spread: float  # standard deviation of the log ratio over the edges
    edges_used: int
    observations: int
    lengths: tuple[float, ...]  # prompt tokens at each used edge
    seconds: tuple[float, ...]  # the prefill time each edge says


@dataclass(frozen=True)
class RateFit:
    """Events per 1,000 node-days with its exact Poisson 95% interval."""

    per_1000_node_days: float
    low: float
    high: float
    events: int
    node_days: float


def _finite(*arrays: F64) -> tuple[F64, ...]:
    keep = np.ones(arrays[0].shape, dtype=bool)
    for a in arrays:
        keep &= np.isfinite(a)
    return tuple(a[keep] for a in arrays)


def fit_diurnal(t_unix_s: F64, rps: F64) -> DiurnalFit | None:
    """The twin's diurnal demand shape fitted to a request-rate series; None if too few points."""
    t, y = _finite(np.asarray(t_unix_s, dtype=np.float64), np.asarray(rps, dtype=np.float64))
    n = int(y.size)
    if n < MIN_DIURNAL_SAMPLES or float(np.max(y, initial=0.0)) <= 0.0:
        return None
    hours = (t / 3600.0) % 24.0
    x = np.column_stack([np.ones(n), np.cos(OMEGA * hours), np.sin(OMEGA * hours)])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = max(n - 3, 1)
    sigma2 = float(resid @ resid) / dof
    try:
        cov = sigma2 * np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:  # every sample at one hour of the day: no shape to see
        return None

    def derived(p: F64) -> F64:
        m, c, s = (float(v) for v in p)
        a = math.hypot(c, s)
        peak = m + a
        amp = 2.0 * a / peak if peak > 0 else 0.0
        hour = (math.atan2(s, c) / OMEGA) % 24.0
        return np.array([peak, amp, hour])

    value = derived(coef)
    jac = np.zeros((3, 3))
    for i in range(3):
        h = 1e-6 * max(abs(float(coef[i])), 1e-9)
        step = np.zeros(3)
        step[i] = h
        d = derived(coef + step) - derived(coef - step)
        d[2] = (d[2] + 12.0) % 24.0 - 12.0  # the hour wraps at midnight
        jac[:, i] = d / (2.0 * h)
    var = np.diag(jac @ cov @ jac.T)
    peak, amp, hour = (float(v) for v in value)
    mean = float(np.mean(y))
    return DiurnalFit(
        peak_rps=peak,
        amplitude=min(max(amp, 0.0), 1.0),
        peak_hour_utc=hour,
        peak_rel_stderr=math.sqrt(max(float(var[0]), 0.0)) / peak if peak > 0 else math.inf,
        amplitude_stderr=math.sqrt(max(float(var[1]), 0.0)),
        peak_hour_stderr_h=math.sqrt(max(float(var[2]), 0.0)),
        rel_rmse=math.sqrt(float(resid @ resid) / n) / mean if mean > 0 else math.inf,
        samples=n,
    )


def fit_line(x: F64, y: F64, *, through_origin: bool = False) -> LineFit | None:
    """Least-squares line; None with fewer than three points or no spread in ``x``."""
    xs, ys = _finite(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    n = int(xs.size)
    if n < 3 or float(np.ptp(xs)) <= 0.0:
        return None
    design = xs[:, None] if through_origin else np.column_stack([np.ones(n), xs])
    coef, *_ = np.linalg.lstsq(design, ys, rcond=None)
    resid = ys - design @ coef
    k = design.shape[1]
    sigma2 = float(resid @ resid) / max(n - k, 1)
    cov = sigma2 * np.linalg.inv(design.T @ design)
    mean = float(np.mean(ys))
    rel = math.sqrt(float(resid @ resid) / n) / abs(mean) if mean else math.inf
    if through_origin:
        return LineFit(0.0, float(coef[0]), 0.0, math.sqrt(float(cov[0, 0])), rel, n)
    return LineFit(
        float(coef[0]),
        float(coef[1]),
        math.sqrt(float(cov[0, 0])),
        math.sqrt(float(cov[1, 1])),
        rel,
        n,
    )


def quadratic_s(a: float, b: float, c: float, length: F64) -> F64:
    """The DistServe prefill curve ``a + b·L + c·L²`` (seconds)."""
    out: F64 = a + b * length + c * length**2
    return out


def fit_prefill_scale(
    edges_s: F64,
    cumulative: F64,
    *,
    base: tuple[float, float, float],
    prompt_median: float,
    prompt_sigma: float,
    factor: float = 1.0,
    tail: float = 0.02,
) -> PrefillFit | None:
    """Scale ``k`` so that ``k · base(L)`` matches the prefill times the TTFT buckets say.

    ``cumulative`` holds the observations at or under each finite edge, then the total. An edge
    whose share lies in (tail, 1 − tail) says: the prompt of quantile F takes ``edge / factor``
    to prefill (``factor`` is the batch-interference slowdown the observations carried). One
    prompt-length distribution pins the curve's level, not its three coefficients apart: the
    base curve's shape is kept and scaled.
    """
    edges = np.asarray(edges_s, dtype=np.float64)
    counts = np.asarray(cumulative, dtype=np.float64)
    total = float(counts[-1]) if counts.size else 0.0
    if total <= 0 or edges.size + 1 != counts.size or factor <= 0:
        return None
    share = counts[:-1] / total
    used = (share > tail) & (share < 1.0 - tail) & (edges > 0)
    if not used.any():
        return None
    lengths = prompt_median * np.exp(prompt_sigma * ndtri(share[used]))
    seconds = edges[used] / factor
    predicted = quadratic_s(*base, lengths)
    ok = predicted > 0
    if not ok.any():
        return None
    log_ratio = np.log(seconds[ok] / predicted[ok])
    return PrefillFit(
        scale=float(np.exp(np.mean(log_ratio))),
        rel_spread=float(np.std(log_ratio)),
        edges_used=int(ok.sum()),
        observations=int(total),
        lengths=tuple(float(v) for v in lengths[ok]),
        seconds=tuple(float(v) for v in seconds[ok]),
    )


def poisson_rate(events: int, node_days: float) -> RateFit:
    """Events per 1,000 node-days, with the exact two-sided 95% Poisson interval."""
    if node_days <= 0:
        raise ValueError("node_days must be positive")
    scale = 1000.0 / node_days
    low = 0.0 if events == 0 else float(chi2.ppf(0.025, 2 * events)) / 2.0
    high = float(chi2.ppf(0.975, 2 * events + 2)) / 2.0
    return RateFit(events * scale, low * scale, high * scale, events, node_days)


def count_events(t_s: F64, values: F64, *, window_start_s: float, step_s: float) -> list[float]:
    """Values a gauge series newly took inside the window (the XID code of each new XID).

    A series that already exists at the window's start carries an event from before it; one
    that appears later was created by its first event. Each later change to a new non-zero value
    is one more event. (dcgm-exporter's XID gauge shows a repeat of the same code as nothing.)
    """
    t, v = _finite(np.asarray(t_s, dtype=np.float64), np.asarray(values, dtype=np.float64))
    out: list[float] = []
    if v.size == 0:
        return out
    if t[0] > window_start_s + 1.5 * step_s and v[0] != 0:
        out.append(float(v[0]))
    for prev, cur in itertools.pairwise(v):
        if cur != prev and cur != 0:
            out.append(float(cur))
    return out


def counter_increase(t_s: F64, values: F64, *, window_start_s: float, step_s: float) -> float:
    """How much a counter rose in the window; a series born inside it counts from zero."""
    t, v = _finite(np.asarray(t_s, dtype=np.float64), np.asarray(values, dtype=np.float64))
    if v.size == 0:
        return 0.0
    rise = float(np.sum(np.maximum(np.diff(v), 0.0)))
    resets = np.diff(v) < 0
    rise += float(np.sum(v[1:][resets]))  # a reset: the counter restarted from zero
    if t[0] > window_start_s + 1.5 * step_s:
        rise += float(v[0])
    return rise
