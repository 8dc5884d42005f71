"""The quiescent steps of a fleet of a few pools, on Python numbers, are the array path's.

A fleet of up to ``SCALAR_POOLS`` pools serves a quiet interval on Python floats and ints (the
same operations, the same draws in the same order); with the threshold at 0 the same fleet takes
the array path. Both must leave every counter, histogram, gauge and the generator bit for bit
the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from firedrill.model.spec import FleetSpec, LatencySpec, TokensSpec
from firedrill.twin import quiescent
from firedrill.twin.engine import Twin
from tests.twin.fleets import erlang_spec, fleet, model, quiet


def _arrays(twin: Twin) -> dict[str, bytes]:
    out = {k: v.tobytes() for k, v in vars(twin).items() if isinstance(v, np.ndarray)}
    out["rng"] = repr(twin.rng.bit_generator.state).encode()
    out["clock"] = repr((twin.t, twin.step_no, twin.samples, twin.macro_steps)).encode()
    return out


def _run(spec: FleetSpec, hours: float, *, record: bool) -> tuple[int, int, dict[str, bytes]]:
    twin = Twin(spec, seed=5, record=record, hours_hint=hours)
    twin.run_for(hours * 3600.0)
    twin.flush_ttft()
    return twin.macro_steps, int(twin.errors.sum()), _arrays(twin)


def _bent() -> FleetSpec:
    """One pool with the default (bending) latency curve, interference and a cold penalty."""
    m = model(latency=LatencySpec(), max_num_seqs=16, queue_timeout_s=60.0)
    return fleet(regions={"r": (1, 8, 8, 20.0)}, m=m, tokens=TokensSpec())


def _one_pool() -> FleetSpec:
    """The Erlang C fleet's cell at 70%: one pool."""
    spec = erlang_spec(2.0, 2, 8, 1)
    return spec.model_copy(update={"regions": spec.regions[1:2]})


def _idle_and_timeouts() -> FleetSpec:
    """A pool at 70% with a 3 s queue timeout (a waiter times out now and then within a macro
    step) and a pool without load."""
    flat = erlang_spec(2.0, 2, 8, 1).models[0].latency
    m = model(latency=flat, max_num_seqs=2, queue_timeout_s=3.0)
    return fleet(
        regions={"a": (1, 8, 8, 5.6), "b": (1, 8, 8, 0.0)},
        m=m,
        tokens=TokensSpec(output_mean=250.0),
    )


@pytest.mark.parametrize(
    ("name", "spec", "hours", "record"),
    [
        ("one pool", quiet(_one_pool()), 2.0, False),
        ("three pools, recorded", quiet(erlang_spec(2.0, 2, 8, 1)), 2.0, True),
        ("bent curve", quiet(_bent(), max_step_s=120.0), 2.0, False),
        ("idle pool, timeouts", quiet(_idle_and_timeouts()), 24.0, False),
    ],
)
def test_few_pools_on_python_numbers_equal_the_array_path(
    name: str, spec: FleetSpec, hours: float, record: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps, errors, few = _run(spec, hours, record=record)
    assert steps > 0, name  # the interval was quiet: the path under test ran
    if "timeouts" in name:
        assert errors > 0  # timeouts drawn within macro steps: that branch ran too
    monkeypatch.setattr(quiescent, "SCALAR_POOLS", 0)
    steps_arrays, _, arrays = _run(spec, hours, record=record)
    assert steps_arrays == steps
    assert few.keys() == arrays.keys()
    differ = [k for k in few if few[k] != arrays[k]]
    assert differ == [], name
