"""Golden-set probes on the twin: the online quality SLI per digest, and the canary share."""

from __future__ import annotations

import numpy as np
import pytest

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec, WeightsSpec
from firedrill.twin.engine import Twin
from firedrill.twin.quality import CANARY_PERCENT, CANARY_SHARE, GOLDEN_SERIES
from tests.twin import fleets

SEED = 13
NEW = "sha256:" + "5e" * 32
OTHER = "sha256:" + "07" * 32


def small(*, quality: float = 0.97, probes_per_s: float = 1.0, rps: float = 5.0) -> FleetSpec:
    """One region, two cells of 4 single-GPU nodes, 8 llm-8b-sized replicas per cell."""
    m = fleets.model(name="m", weights_gb=16.0, tp=1)
    m = m.model_copy(
        update={
            "weights": WeightsSpec(digest=fleets.D, quality=quality),
            "golden_probes_per_s": probes_per_s,
        }
    )
    return fleets.fleet(regions={"r": (2, 4, 8, rps)}, m=m)


def counters(twin: Twin, digest: str, cell: str) -> tuple[float, float]:
    """(passed, failed) probes of a digest in a cell at the last scrape."""
    got = {
        dict(s.labels)["result"]: float(s.values[-1])
        for s in twin.store.latest(GOLDEN_SERIES, {"digest": digest, "cell": cell})
    }
    return got["pass"], got["fail"]


def test_the_measured_pass_rate_matches_the_true_rate() -> None:
    """Over an hour at 1 probe/s per cell (~3,600 probes each), within 3 points (> 7 sigma)."""
    twin = Twin(small(quality=0.8), SEED, hours_hint=1.0)
    twin.run_for(3600)
    for cell in ("c0-0", "c0-1"):
        passed, failed = counters(twin, fleets.D, cell)
        n = passed + failed
        assert 3000 < n < 4200  # Poisson(3,600)
        assert abs(passed / n - 0.8) < 0.03


def test_probes_are_deterministic_and_leave_serving_alone() -> None:
    a = Twin(small(), SEED, hours_hint=0.2)
    b = Twin(small(), SEED, hours_hint=0.2)
    quiet = Twin(small(probes_per_s=0.0), SEED, hours_hint=0.2)
    for t in (a, b, quiet):
        t.run_for(600)
    series_a = [s.values.tolist() for s in a.query(GOLDEN_SERIES, start_s=0, end_s=600)]
    series_b = [s.values.tolist() for s in b.query(GOLDEN_SERIES, start_s=0, end_s=600)]
    assert series_a == series_b
    assert counters(quiet, fleets.D, "c0-0") == (0.0, 0.0)
    # the probes' own random stream: demand and serving draw exactly what they drew without them
    for name in ("http_requests_total", "vllm:time_to_first_token_seconds_count"):
        got = [s.values.tolist() for s in a.query(name, start_s=0, end_s=600)]
        assert got == [s.values.tolist() for s in quiet.query(name, start_s=0, end_s=600)]


def test_a_fast_and_wrong_digest_fails_the_golden_set_where_it_serves() -> None:
    twin = Twin(small(), SEED, hours_hint=0.5)
    inverse = twin.apply(ops.SetWeightsQuality("m", NEW, 0.5))
    assert inverse == ops.SetWeightsQuality("m", NEW, None)
    twin.apply(ops.PromoteDigest("m", "r", NEW))
    twin.run_for(1500)
    old_pass, old_fail = counters(twin, fleets.D, "c0-0")
    new_pass, new_fail = counters(twin, NEW, "c0-0")
    # the old digest served until the roll and passed; the new one fails about half its probes
    assert old_pass + old_fail > 0
    assert old_fail / (old_pass + old_fail) < 0.1
    assert new_pass + new_fail > 500
    assert 0.4 < new_fail / (new_pass + new_fail) < 0.6
    # the new digest's counters exist from the start of the run, at 0 before it was published
    first = twin.query(GOLDEN_SERIES, {"digest": NEW, "cell": "c0-0"}, start_s=0, end_s=15)
    assert [s.values.tolist() for s in first] == [[0.0, 0.0], [0.0, 0.0]]


def test_a_canary_is_probed_on_its_own_and_its_share_is_a_series() -> None:
    twin = Twin(small(), SEED, hours_hint=0.5)
    twin.apply(ops.SetWeightsQuality("m", NEW, 0.6))
    twin.run_for(60)
    twin.apply(ops.StartRollout("m", NEW, 25))
    twin.run_for(900)
    share = {dict(s.labels)["cell"]: float(s.values[-1]) for s in twin.store.latest(CANARY_SHARE)}
    assert share == {"c0-0": 0.25, "c0-1": 0.25}  # 2 of 8 replicas
    pct = {dict(s.labels)["cell"]: float(s.values[-1]) for s in twin.store.latest(CANARY_PERCENT)}
    assert pct == {"c0-0": 25.0, "c0-1": 25.0}
    canary = sum(counters(twin, NEW, "c0-0"))
    stable = sum(counters(twin, fleets.D, "c0-0"))
    # a quarter of the traffic, yet as many probes as the stable digest since it became ready
    assert canary > 0.6 * (stable - 60)
    view = twin.rollout_view("m")
    assert (view.canary_digest, view.canary_percent, view.running) == (NEW, 25, True)
    assert view.stable_in("r") == fleets.D

    twin.apply(ops.AbortRollout("m"))
    twin.run_for(120)
    share = {dict(s.labels)["cell"]: float(s.values[-1]) for s in twin.store.latest(CANARY_SHARE)}
    assert share == {"c0-0": 0.0, "c0-1": 0.0}
    assert not twin.rollout_view("m").running
    before = counters(twin, NEW, "c0-0")
    twin.run_for(300)
    assert counters(twin, NEW, "c0-0") == before  # no replica of it left to probe


def test_weights_quality_round_trips_and_validates() -> None:
    twin = Twin(small(), SEED, hours_hint=0.1)
    assert twin.golden.quality_of(0) == 0.97
    inverse = twin.apply(ops.SetWeightsQuality("m", fleets.D, 0.4))
    assert twin.golden.quality_of(0) == 0.4
    assert twin.apply(inverse) == ops.SetWeightsQuality("m", fleets.D, 0.4)
    assert twin.golden.quality_of(0) == 0.97
    assert twin.golden.overrides == {}
    for bad in (
        ops.SetWeightsQuality("m", NEW, 1.5),
        ops.SetWeightsQuality("m", NEW, -0.1),
        ops.SetWeightsQuality("m", "sha256:xyz", 0.5),
    ):
        with pytest.raises(OperationError):
            twin.apply(bad)
    with pytest.raises(UnknownTargetError):
        twin.apply(ops.SetWeightsQuality("nope", NEW, 0.5))
    assert twin.golden.overrides == {}
    assert NEW not in twin.digest_index  # a refused op publishes nothing


def test_a_published_digest_is_signed_attested_and_replicated_from_the_root() -> None:
    spec = small()
    twin = Twin(spec, SEED, hours_hint=0.1)
    twin.apply(ops.SetWeightsQuality("m", OTHER, None))
    info = twin.digests[twin.digest_index[OTHER]]
    assert (info.signed, info.attested) == (True, True)
    assert (0, twin.digest_index[OTHER]) in twin.available
    assert twin.golden.quality_of(twin.digest_index[OTHER]) == 0.97  # the model's default
    with pytest.raises(OperationError, match="not a digest of"):
        Twin(_two_models(spec), SEED).apply(ops.SetWeightsQuality("n", fleets.D, 0.5))


def _two_models(spec: FleetSpec) -> FleetSpec:
    m = spec.models[0]
    n = m.model_copy(update={"name": "n", "weights": WeightsSpec(digest=OTHER)})
    return spec.model_copy(update={"models": [m, n]})


def test_ready_by_digest_follows_the_lifecycle() -> None:
    twin = Twin(small(), SEED, hours_hint=0.2)
    total = twin.golden.ready_by_digest.sum(axis=1)
    assert np.array_equal(total, twin.ready)
    twin.apply(ops.SetWeightsQuality("m", NEW, 0.9))
    twin.apply(ops.PromoteDigest("m", "r", NEW))
    twin.run_for(900)
    rbd = twin.golden.ready_by_digest
    assert np.array_equal(rbd.sum(axis=1), twin.ready)
    assert rbd[:, twin.digest_index[NEW]].sum() == twin.ready.sum() == 16
