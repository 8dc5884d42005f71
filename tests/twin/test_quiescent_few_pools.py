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


def _run(spec: FleetSpec, seed: int, hours: float, *, record: bool) -> tuple[int, dict[str, bytes]]:
    twin = Twin(spec, seed=seed, record=record, hours_hint=hours)
    twin.run_for(hours * 3600.0)
    twin.flush_ttft()
    return twin.macro_steps, _arrays(twin)


def _bent() -> FleetSpec:
    """One pool with the default (bending) latency curve, interference and a cold penalty."""
    m = model(latency=LatencySpec(), max_num_seqs=16, queue_timeout_s=60.0)
    return fleet(regions={"r": (1, 8, 8, 20.0)}, m=m, tokens=TokensSpec())


@pytest.mark.parametrize(
    ("name", "spec", "record"),
    [
        (
            "one pool",
            quiet(
                erlang_spec(2.0, 2, 8, 1).model_copy(
                    update={"regions": erlang_spec(2.0, 2, 8, 1).regions[1:2]}
                )
            ),
            False,
        ),
        ("three pools, recorded", quiet(erlang_spec(2.0, 2, 8, 1)), True),
        ("bent curve", quiet(_bent(), max_step_s=120.0), False),
    ],
)
def test_few_pools_on_python_numbers_equal_the_array_path(
    name: str, spec: FleetSpec, record: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps, few = _run(spec, 5, 2.0, record=record)
    assert steps > 0, name  # the interval was quiet: the path under test ran
    monkeypatch.setattr(quiescent, "SCALAR_POOLS", 0)
    steps_arrays, arrays = _run(spec, 5, 2.0, record=record)
    assert steps_arrays == steps
    assert few.keys() == arrays.keys()
    differ = [k for k in few if few[k] != arrays[k]]
    assert differ == [], name
