"""The pure fits: each recovers what generated its input, and says how sure it is."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from firedrill.calibrate.fit import (
    count_events,
    counter_increase,
    fit_diurnal,
    fit_line,
    fit_prefill_scale,
    poisson_rate,
    quadratic_s,
)
from firedrill.model.spec import VLLM_TTFT_BUCKETS_S

DAY_S = 86_400.0


def _demand(t: np.ndarray, peak: float, amp: float, peak_h: float) -> np.ndarray:
    # the twin's own formula (firedrill.twin.demand.Demand.shape)
    hour = (t / 3600.0) % 24.0
    out: np.ndarray = peak * (1.0 - amp * (1.0 - np.cos(2 * math.pi * (hour - peak_h) / 24)) / 2)
    return out


def test_the_diurnal_fit_recovers_the_twins_shape_exactly_without_noise() -> None:
    t = np.arange(0.0, 2 * DAY_S, 60.0)
    fit = fit_diurnal(t, _demand(t, 1000.0, 0.4, 23.5))
    assert fit is not None
    assert fit.peak_rps == pytest.approx(1000.0)
    assert fit.amplitude == pytest.approx(0.4)
    assert fit.peak_hour_utc == pytest.approx(23.5)
    assert fit.rel_rmse == pytest.approx(0.0, abs=1e-9)


def test_the_diurnal_fit_under_poisson_noise_is_within_its_standard_errors() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(0.0, 3 * DAY_S, 300.0)
    rate = _demand(t, 200.0, 0.5, 6.0)
    observed = rng.poisson(rate * 300.0) / 300.0
    fit = fit_diurnal(t, observed.astype(np.float64))
    assert fit is not None
    assert abs(fit.peak_rps - 200.0) <= 4 * fit.peak_rel_stderr * 200.0
    assert abs(fit.amplitude - 0.5) <= 4 * fit.amplitude_stderr
    assert abs(fit.peak_hour_utc - 6.0) <= 4 * fit.peak_hour_stderr_h
    assert fit.samples == t.size


def test_too_few_or_empty_samples_fit_nothing() -> None:
    assert fit_diurnal(np.arange(5.0), np.ones(5)) is None
    assert fit_diurnal(np.arange(100.0), np.zeros(100)) is None
    assert fit_line(np.ones(10), np.arange(10.0)) is None  # no spread in x


def test_nan_samples_are_dropped_not_fitted() -> None:
    t = np.arange(0.0, DAY_S, 60.0)
    y = _demand(t, 50.0, 0.3, 12.0)
    y[::7] = np.nan
    fit = fit_diurnal(t, y)
    assert fit is not None
    assert fit.peak_rps == pytest.approx(50.0)
    assert fit.samples == int(np.isfinite(y).sum())


def test_a_line_recovers_its_slope_and_intercept() -> None:
    x = np.linspace(1.0, 40.0, 50)
    fit = fit_line(x, 0.018 + 2.2e-4 * x)
    assert fit is not None
    assert fit.intercept == pytest.approx(0.018)
    assert fit.slope == pytest.approx(2.2e-4)
    origin = fit_line(x, 0.01 * x, through_origin=True)
    assert origin is not None
    assert origin.slope == pytest.approx(0.01)


def test_the_prefill_scale_comes_back_from_the_ttft_buckets() -> None:
    base = (0.012, 6.0e-5, 6.0e-9)
    true_scale, median, sigma, factor = 1.17, 700.0, 0.31, 1.05
    edges = np.array(VLLM_TTFT_BUCKETS_S)
    # P(prefill x factor <= e) = P(L <= L_e), with true_scale x base(L_e) = e / factor
    lengths = np.linspace(1.0, 20_000.0, 200_001)
    curve = true_scale * quadratic_s(*base, lengths) * factor
    l_at = np.interp(edges, curve, lengths, left=0.0, right=np.inf)
    with np.errstate(divide="ignore"):
        share = ndtr((np.log(l_at) - math.log(median)) / sigma)
    cumulative = np.append(share * 1e6, 1e6)
    fit = fit_prefill_scale(
        edges, cumulative, base=base, prompt_median=median, prompt_sigma=sigma, factor=factor
    )
    assert fit is not None
    assert fit.scale == pytest.approx(true_scale, rel=1e-3)
    assert fit.edges_used >= 3
    assert fit.observations == 1_000_000


def test_a_histogram_with_nothing_inside_its_buckets_fits_nothing() -> None:
    edges = np.array(VLLM_TTFT_BUCKETS_S)
    everything_in_first = np.full(edges.size + 1, 100.0)
    assert (
        fit_prefill_scale(
            edges, everything_in_first, base=(0.01, 1e-5, 0.0), prompt_median=700, prompt_sigma=0.3
        )
        is None
    )
    assert (
        fit_prefill_scale(
            edges, np.zeros(edges.size + 1), base=(0.01, 1e-5, 0), prompt_median=7, prompt_sigma=1
        )
        is None
    )


def test_the_poisson_interval_is_garwoods() -> None:
    zero = poisson_rate(0, 1000.0)
    assert zero.per_1000_node_days == 0.0
    assert zero.low == 0.0
    assert zero.high == pytest.approx(3.689, abs=1e-3)  # the rule of three, exactly
    seven = poisson_rate(7, 500.0)
    assert seven.per_1000_node_days == pytest.approx(14.0)
    assert seven.low == pytest.approx(2.0 * 2.8143, rel=1e-3)
    assert seven.high == pytest.approx(2.0 * 14.4226, rel=1e-3)
    with pytest.raises(ValueError, match="node_days"):
        poisson_rate(1, 0.0)


def test_xid_events_are_new_codes_not_samples() -> None:
    t = np.arange(0.0, 600.0, 60.0)
    # born inside the window with XID 79, reset to 0, XID 79 again, then 48: three events
    born = np.array([np.nan, np.nan, 79, 79, 0, 0, 79, 79, 48, 48])
    assert count_events(t, born, window_start_s=0.0, step_s=60.0) == [79.0, 79.0, 48.0]
    # present from the window's start: its first code is from before the window
    before = np.array([79.0] * 5 + [13.0] * 5)
    assert count_events(t, before, window_start_s=0.0, step_s=60.0) == [13.0]


def test_a_counter_increase_counts_resets_and_births() -> None:
    t = np.arange(0.0, 300.0, 60.0)
    assert counter_increase(t, np.array([2.0, 3, 3, 1, 2]), window_start_s=0, step_s=60) == 3.0
    born = np.array([np.nan, np.nan, 1.0, 2, 2])
    assert counter_increase(t, born, window_start_s=0, step_s=60) == 2.0
