"""Prefill/decode disaggregation on the twin: TTFT from the prefill role, TPOT from decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.spec import DisaggregationSpec, FleetSpec, TokensSpec
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from tests.twin import fleets

SEED = 21
PD_FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet-pd.yaml"


def pd_fleet(share: float, *, rps: float = 70.0, prompt_median: float = 700.0) -> FleetSpec:
    """One cell of 24 TP=8 replicas of a disaggregated 70B at constant demand."""
    m = fleets.model().model_copy(
        update={"disaggregated": DisaggregationSpec(prefill_share=share, kv_transfer_s=0.01)}
    )
    return fleets.fleet(
        regions={"r": (1, 26, 24, rps)},
        m=m,
        tokens=TokensSpec(prompt_median=prompt_median),
    )


def means(twin: Twin) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of pool 0 over the run."""
    ttft = float(twin.ttft_sum[0] / twin.ttft_hist[0].sum())
    tpot = float(twin.tpot_sum[0] / twin.tpot_hist[0].sum())
    return ttft, tpot


def run(spec: FleetSpec, seconds: float = 900.0) -> Twin:
    twin = Twin(spec, SEED, hours_hint=seconds / 3600.0)
    twin.run_for(seconds)
    twin.flush_ttft()
    return twin


def test_the_split_moves_ttft_and_tpot_in_opposite_directions() -> None:
    """More prefill replicas: shorter prefill queue (TTFT down), bigger decode batch (TPOT up)."""
    long_prompts = {"prompt_median": 2000.0}
    few = run(pd_fleet(0.4, **long_prompts))
    many = run(pd_fleet(0.6, **long_prompts))
    ttft_few, tpot_few = means(few)
    ttft_many, tpot_many = means(many)
    assert few.pd is not None
    assert many.pd is not None
    assert (few.pd.r_prefill[0], few.pd.r_decode[0]) == (10, 14)
    assert (many.pd.r_prefill[0], many.pd.r_decode[0]) == (14, 10)
    # 10 prefill replicas take ~60 of 70 requests/s: the prefill queue grows without bound
    assert ttft_few > 10.0 > 1.0 > ttft_many
    assert tpot_many > tpot_few * 1.05


def test_a_saturated_prefill_role_queues_while_decode_idles() -> None:
    twin = run(pd_fleet(0.4, prompt_median=2000.0))
    assert twin.pd is not None
    assert twin.pd.waiting()[0] > 1000  # requests waiting for a prefill replica
    util = {
        dict(s.labels)["role"]: float(s.values[-1])
        for s in twin.store.latest("firedrill_pd_utilization")
    }
    assert util["prefill"] > 0.95
    assert util["decode"] < 0.6
    need = {
        dict(s.labels)["role"]: float(s.values[-1])
        for s in twin.store.latest("firedrill_pd_replicas_needed")
    }
    assert need["prefill"] > 10 > need["decode"] > 5  # the load needs ~57% prefill
    waiting = twin.store.latest("vllm:num_requests_waiting")[0].values[-1]
    assert waiting >= twin.pd.waiting()[0]  # the prefill backlog is part of the pool's queue


def test_at_low_load_ttft_is_prefill_time_and_nothing_queues() -> None:
    twin = run(pd_fleet(0.4, rps=20.0), 600.0)
    ttft, _ = means(twin)
    assert 0.05 < ttft < 0.15  # ~60 ms prefill + 10 ms KV transfer, no interference
    assert twin.pd is not None
    assert twin.pd.waiting()[0] == 0
    assert int(twin.errors[0]) == 0


def test_rebalancing_drains_the_prefill_backlog() -> None:
    twin = Twin(pd_fleet(0.4), SEED, hours_hint=0.5)
    twin.run_for(300)
    twin.apply(ops.SetRequestShape("llm-70b", 2000.0, 250.0))
    twin.run_for(300)
    assert twin.pd is not None
    assert twin.pd.waiting()[0] > 500
    inverse = twin.apply(ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 0.6))
    assert inverse == ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 0.4)
    twin.run_for(600)
    assert twin.pd.waiting()[0] < 20
    assert [c.stream for c in twin.changes(since_s=0.0)] == ["demand", "bundle"]


def test_the_autoscaler_sees_the_smaller_role_capacity() -> None:
    twin = Twin(pd_fleet(0.4), SEED)
    assert twin.pd is not None
    per_replica = twin.max_rps_per_replica[0]
    prefill = 0.4 * twin.pd.prefill_rps_per_replica()[0]
    decode = 0.6 * twin.pd.decode_rps_per_replica()[0]
    assert per_replica == pytest.approx(min(prefill, decode))
    twin.apply(ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 0.5))
    assert twin.max_rps_per_replica[0] == pytest.approx(
        min(0.5 * twin.pd.prefill_rps_per_replica()[0], 0.5 * twin.pd.decode_rps_per_replica()[0])
    )


def test_split_and_shape_validate_before_they_act() -> None:
    twin = Twin(pd_fleet(0.4), SEED)
    plain = Twin(fleets.fleet(regions={"r": (1, 4, 2, 1.0)}, m=fleets.model()), SEED)
    for bad in (
        ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 0.0),
        ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 1.0),
        ops.SetRequestShape("llm-70b", 0.0, 250.0),
        ops.SetRequestShape("llm-70b", 700.0, -1.0),
    ):
        with pytest.raises(OperationError):
            twin.apply(bad)
    with pytest.raises(OperationError, match="not served disaggregated"):
        plain.apply(ops.SetPrefillDecodeSplit("llm-70b", "c0-0", 0.5))
    with pytest.raises(UnknownTargetError):
        twin.apply(ops.SetPrefillDecodeSplit("llm-70b", "mars", 0.5))
    with pytest.raises(UnknownTargetError):
        twin.apply(ops.SetRequestShape("llm-1t", 700.0, 250.0))
    assert twin.journal == []
    assert twin.changes_log == []


def observable(twin: Twin) -> dict[str, object]:
    assert twin.pd is not None
    return {
        "share": twin.pd.share.tolist(),
        "max_rps": twin.max_rps_per_replica.tolist(),
        "shape": (twin.shape.prompt_mu.tolist(), twin.shape.output_mean.tolist()),
        "prefill_mean": twin.prefill_mean.tolist(),
        "seats": twin.kv_seats_per_replica.tolist(),
    }


_SPEC = load_fleet(PD_FLEET)
_CELL = st.sampled_from(["use1-pd-a", "use1-pd-b"])
PD_OPS = st.one_of(
    st.builds(
        ops.SetPrefillDecodeSplit, st.just("llm-70b"), _CELL, st.sampled_from([0.2, 0.45, 0.7])
    ),
    st.builds(
        ops.SetRequestShape,
        st.just("llm-70b"),
        st.sampled_from([300.0, 700.0, 2000.0, 4096.0]),
        st.sampled_from([100.0, 250.0, 800.0]),
    ),
)


@settings(max_examples=30, deadline=None)
@given(sequence=st.lists(PD_OPS, max_size=6))
def test_inverses_in_reverse_order_restore_the_split_and_shape(
    sequence: list[ops.Operation],
) -> None:
    twin = Twin(_SPEC, SEED, record=False)
    before = observable(twin)
    inverses = [twin.apply(op) for op in sequence]
    for inverse in reversed(inverses):
        twin.apply(inverse)
    assert observable(twin) == before


def test_the_example_fleet_exports_per_role_series() -> None:
    twin = Twin(_SPEC, SEED, hours_hint=0.1)
    twin.run_for(60)
    roles = {
        (dict(s.labels)["cell"], dict(s.labels)["role"]): float(s.values[-1])
        for s in twin.store.latest("firedrill_pd_replicas")
    }
    assert roles == {
        ("use1-pd-a", "prefill"): 10.0,
        ("use1-pd-a", "decode"): 14.0,
        ("use1-pd-b", "prefill"): 10.0,
        ("use1-pd-b", "decode"): 14.0,
    }
    shares = [float(s.values[-1]) for s in twin.store.latest("firedrill_pd_prefill_share")]
    assert shares == [0.4, 0.4]
    assert np.all(twin.shape.interference == 0.0)  # no decode batch shares a prefill replica
