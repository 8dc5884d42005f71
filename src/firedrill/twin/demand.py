"""Demand per product × region: a diurnal shape, multiplicative noise and events.

Noise is piecewise constant per minute (a lognormal factor drawn from the run's generator), so the
offered load is smooth within a minute and Poisson arrivals supply the per-second jitter.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from firedrill.model.spec import FleetSpec

F64 = npt.NDArray[np.float64]
NOISE_PERIOD_S = 60.0


class Demand:
    def __init__(self, spec: FleetSpec, rng: np.random.Generator) -> None:
        self.products = [p.name for p in spec.products]
        self.regions = [r.name for r in spec.regions]
        np_, nr = len(self.products), len(self.regions)
        self.peak = np.zeros((np_, nr))
        self.amp = np.zeros((np_, nr))
        self.peak_h = np.zeros((np_, nr))
        self.noise_sigma = np.zeros((np_, nr))
        for i, p in enumerate(spec.products):
            for j, r in enumerate(self.regions):
                self.peak[i, j] = p.peak_rps.get(r, 0.0)
                self.amp[i, j] = p.diurnal_amplitude
                self.peak_h[i, j] = p.peak_hour_utc.get(r, 18.0)
                self.noise_sigma[i, j] = p.noise
        self.start_h = spec.start_hour_utc
        self.rng = rng
        self._noise = np.ones((np_, nr))
        self._noise_until = -1.0
        # events: (product, region, start, end, multiplier)
        self.events: list[tuple[int, int, float, float, float]] = []
        for i, p in enumerate(spec.products):
            for ev in p.events:
                j = self.regions.index(ev.region)
                self.events.append((i, j, ev.at_s, ev.at_s + ev.duration_s, ev.multiplier))
        self.extra: list[tuple[int, int, float, float, float]] = []

    def add_event(self, product: int, region: int, start: float, end: float, mult: float) -> None:
        self.extra.append((product, region, start, end, mult))

    def shape(self, t_s: float) -> F64:
        """Diurnal factor in (0, 1] per product × region at time ``t_s``."""
        hour = (self.start_h + t_s / 3600.0) % 24.0
        phase = 2.0 * math.pi * (hour - self.peak_h) / 24.0
        out: F64 = 1.0 - self.amp * (1.0 - np.cos(phase)) / 2.0
        return out

    def rps(self, t_s: float) -> F64:
        """Offered requests/s per product × region."""
        if t_s >= self._noise_until:
            z = self.rng.standard_normal(self._noise.shape)
            self._noise = np.exp(self.noise_sigma * z - self.noise_sigma**2 / 2.0)
            self._noise_until = (math.floor(t_s / NOISE_PERIOD_S) + 1) * NOISE_PERIOD_S
        out: F64 = self.peak * self.shape(t_s) * self._noise
        for i, j, start, end, mult in self.events + self.extra:
            if start <= t_s < end:
                out[i, j] *= mult
        return out
