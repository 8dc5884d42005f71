"""Quiescent steps: off is the 1-second path bit for bit; on stays within bounds of the oracles.

The option draws other random numbers than the 1-second path, so it is held to the fidelity
oracles (Erlang C mean waits, TTFT at 1 QPS, the 14.4x page time) with stated bounds, seeded;
the errors across seeds are recorded in BENCHMARKS.md (``benchmarks/quiescent_fidelity.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from firedrill.model import operations as ops
from firedrill.model.spec import FaultsSpec, QuiescentSpec, TokensSpec
from firedrill.twin.engine import Twin
from firedrill.twin.quiescent import erlang_c, stationary_state
from firedrill.twin.serving import erlang_c_wait_s, quantile_from_hist
from tests.twin.fleets import erlang_spec, fleet, model, quiet


def _state(twin: Twin) -> list[bytes]:
    arrays = [
        twin.queue,
        twin.busy,
        twin.ok,
        twin.errors,
        twin.requests,
        twin.ttft_hist,
        twin.tpot_hist,
        twin.queue_wait_sum,
        twin.util_sum,
        twin.kv_usage_sum,
    ]
    return [a.tobytes() for a in arrays] + [repr(twin.rng.bit_generator.state).encode()]


def test_the_option_is_strict_and_off_by_default() -> None:
    spec = fleet(regions={"r": (1, 8, 8, 1.0)}, m=model())
    assert spec.quiescent.enabled is False
    with pytest.raises(ValidationError):
        QuiescentSpec.model_validate({"enabled": True, "max_stpe_s": 30})
    with pytest.raises(ValidationError):
        QuiescentSpec(max_step_s=0.0)


def test_off_is_the_one_second_path_bit_for_bit() -> None:
    """Disabled, whatever its other settings, the twin steps as it did without the option."""
    base = erlang_spec(2.0, 2, 8, 1)
    runs = []
    for spec in (base, quiet(base, enabled=False, max_step_s=5.0)):
        twin = Twin(spec, seed=7, record=True)
        twin.run_for(900)
        twin.flush_ttft()
        assert twin.macro_steps == 0
        assert twin.step_no == 900
        runs.append((_state(twin), twin.query("vllm:num_requests_running", start_s=0, end_s=900)))
    (a, series_a), (b, series_b) = runs
    assert a == b
    assert [s.values.tobytes() for s in series_a] == [s.values.tobytes() for s in series_b]


def test_on_is_deterministic_and_takes_macro_steps() -> None:
    spec = quiet(erlang_spec(2.0, 2, 8, 1))
    states = []
    for _ in range(2):
        twin = Twin(spec, seed=3, record=False)
        twin.run_for(3600)
        twin.flush_ttft()
        states.append(_state(twin))
        assert twin.step_no == 3600
        assert twin.t == 3600.0
        assert 0 < twin.macro_steps <= 3600 / 2
    assert states[0] == states[1]


def test_macro_steps_stop_at_the_callers_boundary_and_at_every_scrape() -> None:
    spec = quiet(erlang_spec(2.0, 2, 8, 1))
    twin = Twin(spec, seed=5, record=True)
    for chunk in (7.0, 23.0, 60.0, 1.0, 49.0):
        end = twin.t + chunk
        twin.run_for(chunk)
        assert twin.t == pytest.approx(end, abs=1e-9)
    assert twin.macro_steps > 0
    series = twin.query("vllm:num_requests_running", start_s=0, end_s=twin.t)
    ts = series[0].t_s
    assert np.allclose(ts, np.arange(ts.size) * spec.scrape_interval_s)  # at each scrape time
    assert ts[-1] == pytest.approx(135.0)


@pytest.mark.parametrize(
    ("service_s", "seats", "replicas", "cells", "hours", "bounds"),
    [
        (20.0, 2, 4, 20, 8.0, {0.5: 0.10, 0.7: 0.10, 0.9: 0.10}),
        (2.0, 2, 8, 20, 2.0, {0.5: 0.10, 0.7: 0.05, 0.9: 0.05}),
    ],
)
def test_mean_queue_wait_matches_erlang_c_with_quiescent_steps(
    service_s: float,
    seats: int,
    replicas: int,
    cells: int,
    hours: float,
    bounds: dict[float, float],
) -> None:
    """The bounds of the 1-second path's fidelity tests hold with macro steps."""
    twin = Twin(quiet(erlang_spec(service_s, seats, replicas, cells)), seed=11, record=False)
    twin.run_for(hours * 3600)
    twin.flush_ttft()
    assert twin.macro_steps > 0
    c = seats * replicas
    for rho, rel in bounds.items():
        pools = np.nonzero(twin.pool_region == twin.region_index[f"r{int(rho * 100)}"])[0]
        measured = twin.queue_wait_sum[pools].sum() / twin.admitted_total[pools].sum()
        expected = erlang_c_wait_s(c, rho * c / service_s, service_s)
        assert measured == pytest.approx(expected, rel=rel), rho
        assert twin.util_sum[pools].mean() / twin.samples == pytest.approx(rho, rel=0.02)
        # every request offered is answered or still in the system: nothing lost to the steps
        inside = int(twin.queue[pools].sum() + twin.busy[pools].sum())
        answered = int(twin.ok[pools].sum() + twin.errors[pools].sum())
        assert int(twin.requests[pools].sum()) == answered + inside


def test_low_load_ttft_matches_vllm_ci_numbers_with_quiescent_steps() -> None:
    spec = quiet(fleet(regions={"r": (1, 8, 8, 1.0)}, m=model()))
    twin = Twin(spec, seed=2, record=False)
    twin.run_for(4 * 3600)
    twin.flush_ttft()
    assert twin.macro_steps > 0
    p50 = quantile_from_hist(twin.ttft_hist[0], twin.edges, 0.5)
    p99 = quantile_from_hist(twin.ttft_hist[0], twin.edges, 0.99)
    assert p50 == pytest.approx(0.057, rel=0.20)
    assert p99 == pytest.approx(0.111, rel=0.20)


def test_fast_burn_page_fires_at_the_workbook_time_with_quiescent_steps() -> None:
    """A total outage 5 minutes in: 14.4x page within one evaluation after 51.8 s, 6x after 129.6 s.

    Before the outage the cell is quiet (macro steps, cut at each 15 s scrape); during it the
    injected errors make the fleet not quiet, so the page is timed on 1-second steps.
    """
    from firedrill.detect.evaluator import BurnRateEvaluator
    from firedrill.detect.slo import Objective, SloSpec

    slo = SloSpec(
        objectives=[
            Objective(name="a", product="p", model="llm-70b", sli="availability", target=0.999)
        ]
    )
    twin = Twin(quiet(fleet(regions={"r": (1, 8, 8, 20.0)}, m=model())), seed=4, record=True)
    burn = BurnRateEvaluator(slo, twin)
    burn.evaluate()
    while twin.t < 300.0 - 1e-9:
        twin.run_for(15.0)
        burn.evaluate()
    assert twin.macro_steps > 0
    assert burn.backfill() >= burn.longest_window_s
    twin.apply(ops.InjectServingErrors("llm-70b", "c0-0", 1.0))
    quiet_before = twin.macro_steps
    fired: dict[str, float] = {}
    while twin.t < 900.0 - 1e-9:
        twin.run_for(15.0)
        for ev in burn.evaluate():
            if ev.state == "firing":
                fired.setdefault(ev.label("burn_tier"), twin.t - 300.0)
    assert twin.macro_steps == quiet_before  # an injected error is not quiet
    page, slow_page = sorted(fired.values())[:2]
    assert 51.84 <= page < 51.84 + 15.0
    assert 129.6 <= slow_page < 129.6 + 15.0


@pytest.mark.parametrize(
    ("servers", "lam", "service_s"),
    [(2, 1.0, 1.0), (16, 5.6, 2.0), (8, 0.36, 20.0), (1, 0.9, 1.0), (300, 140.0, 2.0)],
)
def test_erlang_c_probability_of_waiting_agrees_with_the_mean_wait(
    servers: int, lam: float, service_s: float
) -> None:
    """P(wait) = mean wait × (cμ − λ): the closed form the steps draw from, against serving's."""
    expected = erlang_c_wait_s(servers, lam, service_s) * (servers / service_s - lam)
    assert erlang_c(servers, lam * service_s) == pytest.approx(expected, rel=1e-9)


def test_erlang_c_and_the_stationary_draw_hold_for_a_large_pool() -> None:
    """15,000 seats: the textbook sum overflows; the log form and the draw stay finite."""
    p = erlang_c(15_000, 14_000.0)
    assert 0.0 <= p < 1e-6
    rng = np.random.default_rng(1)
    draws = [stationary_state(rng, 15_000, 14_000.0, p) for _ in range(200)]
    busy = np.array([b for b, _ in draws], dtype=np.float64)
    assert all(q == 0 for _, q in draws)
    assert busy.mean() == pytest.approx(14_000.0, rel=0.01)


def test_faults_drawn_over_a_macro_step_keep_their_rate() -> None:
    """Phantom XIDs (only the exporter's gauge) leave the fleet quiet: 8 nodes × 60 per node-hour
    for 2 hours is 960 events, drawn over each interval as the 1-second path draws them per step."""
    faults = FaultsSpec(phantom_xid_exporter_versions=["3.3.8-3.6.0"], phantom_xid_per_node_hour=60)
    base = fleet(regions={"r": (1, 8, 8, 1.0)}, m=model()).model_copy(update={"faults": faults})
    counts = []
    for on in (False, True):
        twin = Twin(quiet(base, enabled=on), seed=9, record=False)
        twin.run_for(2 * 3600)
        assert (twin.macro_steps > 0) == on
        assert all(ev.phantom for ev in twin.fault_log)
        counts.append(len(twin.fault_log))
    for n in counts:
        assert n == pytest.approx(960, rel=0.10)


def test_a_pool_whose_load_stops_drains_on_one_second_steps() -> None:
    """Route weight 0 leaves a cell's requests in service: not a stationary state, so the
    fleet is not quiet until they are done (20 s services: not all done 10 s later)."""
    m = erlang_spec(20.0, 2, 4, 1).models[0]
    spec = fleet(
        regions={"r": (2, 4, 4, 0.3 * 8 / 20.0 * 2)}, m=m, tokens=TokensSpec(output_mean=250.0)
    )
    twin = Twin(quiet(spec), seed=2, record=False)
    twin.run_for(600)
    assert twin.macro_steps > 0
    idle = twin.lookup_cell("c0-1")  # one model: pool index = cell index
    twin.run_for(1)
    while twin.busy[idle] == 0:  # a moment with requests in service there
        twin.run_for(1)
    twin.apply(ops.SetRouteWeights("llm-70b", (("c0-1", 0),)))
    while np.count_nonzero(twin.pool_dirty):  # the change reconciled: only the drain is left
        twin.step()
    before = twin.macro_steps
    left = int(twin.busy[idle])
    assert left > 0
    twin.run_for(4)
    assert twin.macro_steps == before
    assert int(twin.busy[idle]) <= left
