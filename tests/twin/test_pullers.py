"""Competing pullers slow a hydrate storm and raise origin errors unless frozen; a recycled pool
re-hydrates in waves of at most ``max_surge``.

Small fleets from ``tests/twin/fleets.py``: one region, one cell of 80 empty nodes, a 50 GB/s
origin without P2P, so every byte is an origin byte and the numbers are easy to check by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from firedrill.drill.recovery import hydrate_stats
from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.spec import RegistrySpec
from firedrill.twin.engine import PULLING, READY, Twin
from tests.shapes import num
from tests.twin.fleets import fleet, model

ORIGIN_GBPS = 50.0


def _storm(*, competing: bool, frozen: bool, seconds: float = 900.0) -> Twin:
    """40 llm-70b replicas asked for at once on 80 empty nodes; optionally 40 eval pullers."""
    reg = RegistrySpec(origin_gbytes_per_s=ORIGIN_GBPS, p2p=False)
    twin = Twin(fleet(regions={"r": (1, 80, 0, 0.0)}, m=model(), registry=reg), seed=3)
    if frozen:
        twin.apply(ops.FreezePullers("r", True))
    if competing:
        twin.apply(ops.StartPullers("eval-sweep", "r", 40, 140.0, "eval"))
    twin.apply(ops.SetReplicas("llm-70b", "c0-0", 40))
    twin.run_for(seconds)
    return twin


@pytest.fixture(scope="module")
def storms() -> dict[str, dict[str, object]]:
    return {
        name: hydrate_stats(
            _storm(competing=c, frozen=f), region="r", model="llm-70b", start_s=0.0, end_s=900.0
        )
        for name, c, f in (
            ("alone", False, False),
            ("competing", True, False),
            ("frozen", True, True),
        )
    }


def test_competing_pullers_slow_the_storm_and_raise_origin_errors(
    storms: dict[str, dict[str, object]],
) -> None:
    alone, competing = storms["alone"], storms["competing"]
    # 40 x 140 GB = 5.6 TB from a 50 GB/s origin: 112 s of transfer, then 28 s load, 20 s warm-up
    assert alone["gbytes_pulled"] == pytest.approx(5600.0)
    assert alone["first_ready_s"] == pytest.approx(112 + 28 + 20, abs=15)
    # the eval sweep's 5.6 TB shares the origin: the serving wave's transfer takes twice as long
    assert competing["competing_gbytes"] == pytest.approx(5600.0)
    assert competing["first_ready_s"] == pytest.approx(224 + 28 + 20, abs=15)
    assert competing["peak_gbps_per_node"] == pytest.approx(num(alone["peak_gbps_per_node"]) / 2)
    assert num(competing["origin_errors"]) > 1.8 * num(alone["origin_errors"])
    assert competing["replicas_became_ready"] == alone["replicas_became_ready"] == 40


def test_freezing_competitors_gives_the_storm_its_origin_back(
    storms: dict[str, dict[str, object]],
) -> None:
    alone, frozen = storms["alone"], storms["frozen"]
    assert frozen["competing_gbytes"] == 0.0
    for key in ("first_ready_s", "origin_errors", "peak_gbps_per_node", "gbytes_pulled"):
        assert frozen[key] == alone[key], key


def test_thaw_resumes_a_frozen_group_where_it_stopped() -> None:
    reg = RegistrySpec(origin_gbytes_per_s=ORIGIN_GBPS, p2p=False)
    twin = Twin(fleet(regions={"r": (1, 10, 0, 0.0)}, m=model(), registry=reg), seed=3)
    twin.apply(ops.StartPullers("eval-sweep", "r", 10, 140.0, "eval"))
    twin.run_for(10)  # 10 nodes x 5 GB/s: 50 GB each of 140
    group = twin.recovery.pullers.groups["eval-sweep"]
    twin.apply(ops.FreezePullers("r", True))
    left = dict(group.remaining_gb)
    assert all(v == pytest.approx(90.0) for v in left.values())
    twin.run_for(60)
    assert group.remaining_gb == left  # nothing moved while frozen
    assert not any(d < 0 for _, d in twin.supply.pulls)
    twin.apply(ops.FreezePullers("r", False))
    twin.run_for(17)  # 90 GB at 5 GB/s: 18 s
    assert group.active
    twin.run_for(2)
    assert not group.active
    assert group.done_s == pytest.approx(10 + 60 + 18, abs=1)
    assert twin.supply.regions[0].competing_origin_gb == pytest.approx(1400.0)
    assert twin.supply.regions[0].origin_gb == 0.0  # serving bytes are counted apart


def test_a_critical_group_is_never_frozen() -> None:
    twin = Twin(fleet(regions={"r": (1, 10, 0, 0.0)}, m=model()), seed=3)
    twin.apply(ops.FreezePullers("r", True))
    twin.apply(ops.StartPullers("scale-out", "r", 4, 16.0, "scale_out", critical=True))
    twin.apply(ops.StartPullers("eval-sweep", "r", 4, 16.0, "eval"))
    twin.run_for(30)
    assert not twin.recovery.pullers.groups["scale-out"].active
    assert twin.recovery.pullers.groups["eval-sweep"].active


def test_a_puller_on_a_hydrating_node_halves_its_nic() -> None:
    """One node, ample origin: the replica's pull and the puller's share the node's NIC."""
    twin = Twin(fleet(regions={"r": (1, 1, 0, 0.0)}, m=model()), seed=3)
    twin.apply(ops.StartPullers("eval-sweep", "r", 1, 1000.0, "eval"))
    twin.apply(ops.SetReplicas("llm-70b", "c0-0", 1))
    twin.run_for(3)  # 140 GB at half of 50 GB/s takes 5.6 s
    nic = twin.nodes[0].nic_gbps
    assert any(r.state == PULLING for r in twin.replicas)
    assert twin.supply.last_rate_gbps[(0, twin.replicas[0].digest)] == pytest.approx(nic / 2)


def test_recycling_30_percent_with_a_10_percent_surge_comes_back_in_waves() -> None:
    reg = RegistrySpec(origin_gbytes_per_s=ORIGIN_GBPS, p2p=False)
    twin = Twin(fleet(regions={"r": (1, 60, 50, 200.0)}, m=model(), registry=reg), seed=3)
    twin.run_for(60)
    inverse = twin.apply(ops.RecyclePool("c0-0", "llm-70b", 30.0, 10.0))
    assert inverse == ops.StopRecycle("c0-0", "llm-70b")
    low = 50
    for _ in range(600):
        twin.step()
        low = min(low, int(twin.ready[0]))
        assert int(twin.ready[0]) >= 45  # never more than 5 (10% of 50) out at once
    assert low == 45
    job = twin.recovery.recycler.finished[0]
    assert job.recycled == 15
    assert int(twin.ready[0]) == 50
    st = hydrate_stats(twin, region="r", model="llm-70b", start_s=60.0, end_s=twin.t)
    assert st["replicas_became_ready"] == 15
    assert st["gbytes_pulled"] == pytest.approx(15 * 140.0)  # the nodes came back cold
    # three waves of five: the became-ready count climbs in three separate jumps
    became = twin.query(
        "firedrill_replicas_became_ready_total", {"cell": "c0-0"}, start_s=60.0, end_s=twin.t
    )[0].values
    jumps = np.diff(became)[np.diff(became) > 0]
    assert jumps.sum() == 15
    assert len(jumps) >= 3
    plateaus = np.flatnonzero(np.diff(became) > 0)
    assert plateaus[-1] - plateaus[0] >= 8  # spread over minutes, not one scrape


def test_stop_recycle_leaves_the_rest_of_the_pool_alone() -> None:
    twin = Twin(fleet(regions={"r": (1, 60, 50, 200.0)}, m=model()), seed=3)
    twin.apply(ops.RecyclePool("c0-0", "llm-70b", 100.0, 10.0))
    twin.run_for(10)
    twin.apply(ops.StopRecycle("c0-0", "llm-70b"))
    twin.run_for(300)
    recycled = twin.recovery.recycler.finished[0].recycled
    assert recycled == 5
    assert int(twin.ready[0]) == 50
    assert sum(1 for r in twin.replicas if r.state == READY) == 50


def test_pullers_need_a_region_with_that_many_nodes() -> None:
    twin = Twin(fleet(regions={"r": (1, 4, 0, 0.0)}, m=model()), seed=3)
    with pytest.raises(OperationError, match="4 serving nodes"):
        twin.apply(ops.StartPullers("eval-sweep", "r", 5, 10.0))
    assert twin.recovery.pullers.groups == {}
