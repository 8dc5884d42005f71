"""What the step computes once and reuses, or draws another way, is what it computed before.

The step draws over small pool arrays element by element (``twin/draws.py``), runs the queue's
sub-steps on Python ints for a fleet of a few pools, and keeps the routing share and the
partition cut plan between steps; each must give exactly what the plain computation gives,
every time its inputs change.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.model import operations as ops
from firedrill.model.spec import LatencySpec, TokensSpec
from firedrill.specfile import load_fleet
from firedrill.twin import draws, traffic
from firedrill.twin.engine import Twin
from tests.twin.fleets import fleet, model

FLEET = "examples/fleet.yaml"

counts = st.lists(
    st.one_of(st.just(0), st.integers(0, 10), st.integers(0, 5000)), min_size=0, max_size=20
)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=counts,
    probs=st.lists(st.sampled_from([0.0, 1.0, 0.5, 1e-9, 0.3, 0.999]), min_size=20, max_size=20),
    rates=st.lists(st.sampled_from([0.0, 1e-7, 0.5, 3.0, 40.0, 900.0]), min_size=20, max_size=20),
    scalar_p=st.floats(0.0, 1.0),
)
def test_draws_match_numpys_array_calls_and_leave_the_same_state(
    seed: int, n: list[int], probs: list[float], rates: list[float], scalar_p: float
) -> None:
    ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
    k = len(n)
    na = np.array(n, dtype=np.int64)
    p = np.array(probs[:k])
    lam = np.array(rates[:k])
    for got, want in (
        (draws.binomial(ours, na, p), numpys.binomial(na, p)),
        (draws.binomial(ours, na, scalar_p), numpys.binomial(na, scalar_p)),
        (draws.poisson(ours, lam), numpys.poisson(lam)),
    ):
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        assert got.tolist() == want.tolist()
    assert ours.bit_generator.state == numpys.bit_generator.state


def _fresh_share(tw: Twin) -> npt.NDArray[np.float64]:
    """The routing share computed from scratch, as the step computed it every step before."""
    w = tw.weights * ~tw.cell_quarantined
    local = w[:, None, :] * tw.region_mask[None, :, :]
    local_sum = local.sum(axis=2, keepdims=True)
    glob = w[:, None, :] / np.maximum(w.sum(axis=1), 1e-300)[:, None, None]
    share = np.where(local_sum > 0, local / np.maximum(local_sum, 1e-300), glob)
    if tw.recovery.homing.rerouting:
        share = tw.recovery.homing.reroute(share, w)
    out: npt.NDArray[np.float64] = share
    return out


def test_routing_share_follows_every_change_of_its_inputs() -> None:
    tw = Twin(load_fleet(FLEET), 3, record=False)
    tw.run_for(5)
    first, _ = tw.routing_matrix()
    again, _ = tw.routing_matrix()
    assert again is first  # nothing changed: kept
    assert not first.flags.writeable  # shared between steps: nobody may write into it
    changes: list[ops.Operation] = [
        ops.SetRouteWeights("llm-70b", (("use1-a", 0), ("usw2-a", 7))),
        ops.QuarantineCell("use1-b"),
        ops.SetRegionWeight("llm-70b", "us-east-1", 40),
        ops.SetRegionWeight("llm-70b", "us-east-1", 0),
        ops.UnquarantineCell("use1-b"),
        ops.SetRegionWeight("llm-70b", "us-east-1", 100),
    ]
    seen = [first.tobytes()]
    for op in changes:
        tw.apply(op)
        tw.run_for(1)
        share, _ = tw.routing_matrix()
        assert np.array_equal(share, _fresh_share(tw))
        seen.append(share.tobytes())
    assert len(set(seen[:-1])) == len(seen) - 1  # each change changed the share


def test_partition_losses_follow_cuts_and_heals() -> None:
    tw = Twin(load_fleet(FLEET), 3, record=False)
    tw.run_for(5)
    served_before = tw.lam.copy()
    tw.apply(ops.Partition("region-edge", "us-east-1", "edge"))
    tw.run_for(1)
    east = [p for p in range(tw.n_pools) if tw.cell_region[int(tw.pool_cell[p])] == 0]
    assert not tw.lam[east].any()  # users cannot reach the cut-off region's cells
    tw.apply(ops.Heal("region-edge", "us-east-1", "edge"))
    tw.apply(ops.Partition("region-region", "us-east-1", "us-west-2"))
    tw.run_for(1)
    assert tw.lam[east].any()  # the edge is back; only the backbone between two is cut
    tw.apply(ops.Heal("region-region", "us-east-1", "us-west-2"))
    tw.run_for(1)
    assert np.allclose(tw.lam, served_before, rtol=0.2)


def _small_cells(rho: float) -> Twin:
    """Two cells of 2 s services (sub-stepped) at high load, with KV overflow and timeouts."""
    lat = LatencySpec(
        prefill_a_s=0.0,
        prefill_b_s_per_token=1e-9,
        prefill_c_s_per_token2=0.0,
        decode_a_s=2.0 / 250.0,
        decode_b_s_per_token=0.0,
        decode_c_s_per_seq=0.0,
        prefill_interference=0.0,
        cold_cache_penalty=0.0,
    )
    m = model(latency=lat, max_num_seqs=4, queue_timeout_s=5.0)
    spec = fleet(
        regions={"r": (2, 3, 3, rho * 2 * 12 / 2.0)}, m=m, tokens=TokensSpec(output_mean=250.0)
    )
    return Twin(spec, seed=5, record=False)


@pytest.mark.parametrize("rho", [0.6, 1.3])
def test_sub_steps_on_python_ints_are_the_array_loop_bit_for_bit(
    rho: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(scalar_pools: int) -> Twin:
        monkeypatch.setattr(traffic, "SCALAR_POOLS", scalar_pools)
        tw = _small_cells(rho)
        assert tw.n_pools == 2
        tw.run_for(900)
        tw.apply(ops.Drain(tw.nodes[0].name))  # seats taken mid-run: the "moved" branch
        tw.run_for(300)
        tw.flush_ttft()
        return tw

    ints, arrays = run(4), run(0)
    assert int(arrays.admitted_total.sum()) > 1000
    if rho > 1:
        assert int(arrays.errors.sum()) > 0  # timeouts: the queue was long
    for name in ("busy", "busy_fast", "ok", "errors", "requests", "admitted_total", "ttft_hist"):
        assert np.array_equal(getattr(ints, name), getattr(arrays, name)), name
    assert np.array_equal(ints.queue_wait_sum, arrays.queue_wait_sum)
    assert np.array_equal(ints.queue, arrays.queue)
    assert ints.rng.bit_generator.state == arrays.rng.bit_generator.state
