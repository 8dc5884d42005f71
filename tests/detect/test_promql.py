"""The PromQL toolbox: ``for:`` state and ``increase`` as the evaluators rely on them."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from firedrill.detect.promql import AlertState, prom_increase, series_increase

A = (("cell", "a"),)
B = (("cell", "b"),)


def test_an_alert_is_pending_for_its_hold_then_fires_then_resolves() -> None:
    state = AlertState("Hot", for_ms=60_000, static={"severity": "page"})
    assert state.step({A: 1.0}, now_ms=0, t_s=0.0) == []
    assert [e.state for e in state.pending()] == ["pending"]
    assert state.step({A: 2.0}, now_ms=30_000, t_s=30.0) == []
    (fired,) = state.step({A: 3.0}, now_ms=60_000, t_s=60.0)
    assert (fired.state, fired.at_s, fired.value) == ("firing", 60.0, 3.0)
    assert dict(fired.labels) == {"alertname": "Hot", "cell": "a", "severity": "page"}
    assert [e.at_s for e in state.firing()] == [60.0]
    (gone,) = state.step({}, now_ms=90_000, t_s=90.0)
    assert (gone.state, gone.value) == ("resolved", 3.0)
    assert state.firing() == []
    assert state.pending() == []


def test_a_pending_alert_that_drops_out_is_forgotten_and_starts_over() -> None:
    state = AlertState("Hot", for_ms=60_000)
    state.step({A: 1.0, B: 1.0}, now_ms=0, t_s=0.0)
    assert state.step({B: 1.0}, now_ms=30_000, t_s=30.0) == []  # A forgotten, no event
    state.step({A: 1.0, B: 1.0}, now_ms=45_000, t_s=45.0)
    fired = state.step({A: 1.0, B: 1.0}, now_ms=60_000, t_s=60.0)
    assert [dict(e.labels)["cell"] for e in fired] == ["b"]  # A's hold restarted at 45 s


def test_without_for_an_alert_fires_at_its_first_evaluation() -> None:
    state = AlertState("Now", for_ms=0)
    assert [e.state for e in state.step({A: 1.0}, now_ms=5, t_s=0.005)] == ["firing"]


counters = st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=2, max_size=30).map(
    lambda xs: list(np.cumsum(xs))
)


@given(counters, st.floats(0.0, 30.0), st.floats(0.0, 30.0))
def test_one_series_increase_is_the_vector_increase_without_resets(
    values: list[float], lead_s: float, tail_s: float
) -> None:
    times = [15.0 * i for i in range(len(values))]
    start, end = times[0] - lead_s, times[-1] + tail_s
    one = series_increase(times, values, start, end)
    many = prom_increase(
        np.array(values[:1]), np.array(values[-1:]), times[0], times[-1], len(values), start, end
    )
    assert one == float(many[0]) or (math.isnan(one) and math.isnan(float(many[0])))


def test_a_counter_reset_adds_back_the_value_before_it() -> None:
    times = [0.0, 15.0, 30.0, 45.0]
    assert series_increase(times, [0.0, 10.0, 2.0, 5.0], 0.0, 45.0) == 15.0
    assert math.isnan(series_increase([0.0], [1.0], 0.0, 15.0))  # one sample: no value
