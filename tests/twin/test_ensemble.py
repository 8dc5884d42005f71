"""The twin's ensemble: member k is the lone twin with the same fleet and seed, bit for bit.

Step by step, every array the serving step reads or writes and every random generator's state
are compared between each member of an ensemble and a lone twin driven through the same
operations at the same times (partitions, fail-fast and hanging 5xx, a drained cell, a bundle
change, mirrored traffic), over seeds drawn by hypothesis; then whole drill reports, run as an
ensemble and alone; then the lockstep's own rules (drop-out, errors, quiescent members).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firedrill.drill.ensemble import run_batch
from firedrill.drill.many import DrillJob, run_one, run_seeds
from firedrill.drill.run import run_drill
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec, LatencySpec, TokensSpec
from firedrill.ports import DrillWorld
from firedrill.specfile import load_drill, load_fleet
from firedrill.twin import together
from firedrill.twin.engine import Twin
from firedrill.twin.ensemble import EnsembleStopped, TwinEnsemble, embedded_ensemble
from firedrill.twin.serving import queue_substeps
from firedrill.twin.together import can_serve_together
from firedrill.twin.world import embedded_world
from tests.twin.fleets import erlang_spec, fleet, model, quiet

ROOT = Path(__file__).resolve().parents[2]
DEMO = load_fleet(ROOT / "examples" / "fleet.yaml")
PD = load_fleet(ROOT / "examples" / "fleet-pd.yaml")
L5 = ROOT / "examples" / "drills" / "l5-region-blackhole.yaml"

# every array the serving step reads or writes (traffic._serve, _queue_arithmetic, flush_ttft)
SERVING_STATE = (
    "queue", "busy", "busy_fast", "_busy_seen", "lam", "lam_warm", "_pending_admit",
    "_factor_acc", "_extra_acc", "_wait_corr_acc", "tpot_hist", "tpot_sum", "ttft_hist",
    "ttft_sum", "requests", "ok", "errors", "preemptions", "kv_usage", "kv_usage_sum",
    "util_sum", "ready_sum", "tpot_now", "service_now", "ready", "state_counts",
)  # fmt: skip

# (step, operation): the serving step's branches, each taken by some member at some time
DEMO_OPS: tuple[tuple[int, ops.Operation], ...] = (
    (20, ops.Partition("region-edge", "us-west-2", "edge")),
    (40, ops.InjectServingErrors("llm-70b", "use1-a", 0.3)),
    (60, ops.InjectServingErrors("llm-8b", "use1-b", 0.2, fail_fast=False)),
    (80, ops.SetRouteWeights("llm-70b", (("euw1-a", 0),))),
    (120, ops.Heal("region-edge", "us-west-2", "edge")),
    (140, ops.SetServingConfig("llm-8b", "sha256:" + "ef" * 32, 64, 0.97)),
)


def _state(t: Twin) -> dict[str, Any]:
    out: dict[str, Any] = {name: np.array(getattr(t, name), copy=True) for name in SERVING_STATE}
    out["t"] = t.t
    out["samples"] = t.samples
    out["rng"] = t.rng.bit_generator.state
    out["demand_rng"] = t.demand.rng.bit_generator.state
    return out


def _assert_same(a: Twin, b: Twin, where: str) -> None:
    sa, sb = _state(a), _state(b)
    for name, va in sa.items():
        vb = sb[name]
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype, f"{where}: {name} dtype"
            assert np.array_equal(va, vb), f"{where}: {name} differs"
            assert va.tobytes() == vb.tobytes(), f"{where}: {name} differs in its bits"
        else:
            assert va == vb, f"{where}: {name} differs"


def _lockstep(
    fleet: FleetSpec,
    seeds: Sequence[int],
    steps: int,
    operations: Sequence[tuple[int, ops.Operation]] = (),
    per_member: Callable[[int, int], ops.Operation | None] = lambda _k, _i: None,
) -> None:
    """Step an ensemble and lone twins side by side; ``per_member(k, step)`` is an operation
    for member ``k`` only (and its lone twin), so that members' branches differ."""
    ens = TwinEnsemble([(fleet, s) for s in seeds], 1.0)
    alone = [Twin(fleet, s, hours_hint=1.0) for s in seeds]
    todo = dict(operations)
    for i in range(1, steps + 1):
        if (op := todo.get(i)) is not None:
            for t in (*ens.twins, *alone):
                t.apply(op)
        for k in range(len(seeds)):
            if (mine := per_member(k, i)) is not None:
                ens.twins[k].apply(mine)
                alone[k].apply(mine)
        ens._step(ens.twins)
        for t in alone:
            t.step()
        for k, (a, b) in enumerate(zip(ens.twins, alone, strict=True)):
            _assert_same(a, b, f"member {k} (seed {seeds[k]}) after step {i}")


SEEDS = st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=4, unique=True)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds=SEEDS)
def test_members_of_the_demo_fleet_are_lone_twins_step_by_step(seeds: list[int]) -> None:
    _lockstep(DEMO, seeds, 160, DEMO_OPS)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds=SEEDS)
def test_members_of_an_overloaded_small_fleet_are_lone_twins(seeds: list[int]) -> None:
    """Two-second services (queue sub-steps), a 90% region, a cell without replicas: the lone
    twin takes its few-pools path (Python ints), the ensemble its arrays."""
    spec = erlang_spec(service_s=2.0, seats=4, replicas=2, cells=1)
    _lockstep(spec, seeds, 200, ((50, ops.SetReplicas("llm-70b", "c2-0", 0)),))


def test_members_with_different_queue_sub_steps_are_lone_twins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Services from 2 s (batch 1) to 8 s (a full batch), and members cut to different replica
    counts: in one step members take different numbers of queue sub-steps, one among them."""
    lat = LatencySpec(
        prefill_a_s=0.0, prefill_b_s_per_token=1e-9, prefill_c_s_per_token2=0.0,
        decode_a_s=0.001, decode_b_s_per_token=0.0, decode_c_s_per_seq=0.008,
        prefill_interference=0.0, cold_cache_penalty=0.0,
    )  # fmt: skip
    spec = fleet(
        regions={"r": (1, 4, 4, 3.0)}, m=model(latency=lat, max_num_seqs=4, queue_timeout_s=30.0),
        tokens=TokensSpec(output_mean=250.0),
    )  # fmt: skip
    counts: list[int] = []

    def substeps(dt_s: float, shortest_service_s: float) -> int:
        n = queue_substeps(dt_s, shortest_service_s)
        counts.append(n)
        return n

    monkeypatch.setattr(together, "queue_substeps", substeps)

    def cut(k: int, i: int) -> ops.Operation | None:
        return ops.SetReplicas("llm-70b", "c0-0", 1 + k) if i == 30 else None

    _lockstep(spec, [3, 4, 5], 240, per_member=cut)
    # what the test is for: one sub-step (a full batch's 8 s services) up to several
    assert 1 in counts, sorted(set(counts))
    assert len(set(counts)) >= 2, sorted(set(counts))


def test_members_with_mirrored_traffic_are_lone_twins() -> None:
    """A region's users sent elsewhere, its cells kept warm by a mirror, its users back: the
    mirror's warmth (written into the member's arrays during the step) sets the coldness."""
    lat = LatencySpec(cold_cache_decay_s=5.0, cold_cache_penalty=0.5)
    spec = fleet(regions={"a": (1, 4, 4, 10.0), "b": (1, 4, 4, 10.0)}, m=model(latency=lat))
    steps = (
        (1, ops.SetRegionWeight("llm-70b", "a", 30)),
        (2, ops.MirrorTraffic("llm-70b", "a", 100)),
        (40, ops.SetRegionWeight("llm-70b", "a", 100)),
    )
    _lockstep(spec, [1, 2], 80, steps)


def test_a_member_whose_request_shape_changed_serves_alone_and_stays_equal() -> None:
    """A request-shape change is written into the member's shape in place: from then on its
    constants are not the first member's, and it serves alone (the others still together)."""
    change = ops.SetRequestShape("llm-8b", 4000.0, 600.0)

    def member_1_at_20(k: int, i: int) -> ops.Operation | None:
        return change if (k, i) == (1, 20) else None

    _lockstep(DEMO, [1, 2, 3], 60, per_member=member_1_at_20)
    ens = TwinEnsemble([(DEMO, 1), (DEMO, 2)], 1.0)
    ens.twins[0].apply(change)
    alone = [Twin(DEMO, 1), Twin(DEMO, 2)]
    alone[0].apply(change)
    for _ in range(30):
        ens._step(ens.twins)
        for t in alone:
            t.step()
    for a, b in zip(ens.twins, alone, strict=True):
        _assert_same(a, b, "the first member's shape changed")


def test_members_that_differ_are_served_alone_and_still_equal() -> None:
    """A disaggregated fleet's members serve alone (another step's shape); mixed fleets too."""
    a, b = Twin(PD, 1), Twin(PD, 2)
    assert not can_serve_together(a, b)
    _lockstep(PD, [1, 2], 60)
    assert can_serve_together(Twin(DEMO, 1), Twin(DEMO, 2))


def test_a_member_whose_bundle_changed_is_restacked() -> None:
    """The per-pool seat arrays are rebound by a bundle change of one member only."""
    ens = TwinEnsemble([(DEMO, 5), (DEMO, 6)], 1.0)
    alone = [Twin(DEMO, 5), Twin(DEMO, 6)]
    op = ops.SetServingConfig("llm-70b", "sha256:" + "ef" * 32, 32, 0.9)
    for i in range(40):
        if i == 10:
            ens.twins[1].apply(op)
            alone[1].apply(op)
        ens._step(ens.twins)
        for t in alone:
            t.step()
    for a, b in zip(ens.twins, alone, strict=True):
        _assert_same(a, b, "after 40 steps")


# -- whole runs --------------------------------------------------------------------------------


def _report(result_report: dict[str, Any]) -> str:
    return json.dumps(result_report, sort_keys=True, default=str)


def test_drill_reports_of_an_ensemble_are_the_lone_runs_reports() -> None:
    """The L5 drill with jitter: every member's whole report is the lone run's, byte for byte."""
    loaded = load_drill(L5)
    job = DrillJob(loaded.spec, loaded.fleet, loaded.slo, loaded.policy, loaded.spec_sha256)
    seeds = run_seeds(11, 3)
    from firedrill.drill.run import world_args

    args = [world_args(job.spec, job.fleet, seed=s, jitter=job.jitter(s)) for s in seeds]
    ens = TwinEnsemble([(f, ts) for f, ts, _ in args], args[0][2])

    def body(seed: int) -> Callable[[DrillWorld], str]:
        def run(world: DrillWorld) -> str:
            r = run_drill(
                job.spec, job.fleet, job.slo, job.policy, seed=seed, jitter=job.jitter(seed),
                world=world,
            )  # fmt: skip
            return _report(r.report)

        return run

    together = ens.run([body(s) for s in seeds])
    alone = [
        _report(
            run_drill(
                job.spec, job.fleet, job.slo, job.policy, seed=s, jitter=job.jitter(s),
                make_world=embedded_world,
            ).report
        )
        for s in seeds
    ]  # fmt: skip
    assert together == alone
    assert ens.steps == 3600  # one step of the members per second of the drill
    assert ens.member_steps == 3 * 3600


def test_run_batch_outcomes_equal_run_one() -> None:
    loaded = load_drill(L5)
    job = DrillJob(
        loaded.spec, loaded.fleet, loaded.slo, loaded.policy, loaded.spec_sha256,
        make_world=embedded_world, make_ensemble=embedded_ensemble,
    )  # fmt: skip
    tasks = list(enumerate(run_seeds(4, 2)))
    assert run_batch(job, tasks) == [run_one(job, i, s) for i, s in tasks]


# -- the lockstep's rules ----------------------------------------------------------------------


def test_bodies_drop_out_and_the_rest_keep_stepping() -> None:
    ens = TwinEnsemble([(DEMO, s) for s in (1, 2, 3)], 1.0)
    seen: list[tuple[int, float]] = []

    def body(k: int) -> Callable[[DrillWorld], float]:
        def run(world: DrillWorld) -> float:
            for _ in range(k + 1):
                world.advance(7.5)  # not a whole number of steps: as ``Twin.run_for`` rounds
                seen.append((k, world.now_s()))
            return world.now_s()

        return run

    assert ens.run([body(k) for k in range(3)]) == [8.0, 16.0, 24.0]
    lone = Twin(DEMO, 3)
    for _ in range(3):
        lone.run_for(7.5)
    assert lone.t == 24.0
    _assert_same(ens.twins[2], lone, "after three advances")
    assert ens.steps == 24
    assert ens.member_steps == 8 + 16 + 24
    assert seen == [(0, 8.0), (1, 8.0), (2, 8.0), (1, 16.0), (2, 16.0), (2, 24.0)]


def test_an_error_in_one_body_stops_the_others_and_is_raised() -> None:
    ens = TwinEnsemble([(DEMO, s) for s in (1, 2, 3)], 1.0)
    stopped: list[int] = []

    def body(k: int) -> Callable[[DrillWorld], int]:
        def run(world: DrillWorld) -> int:
            try:
                world.advance(5.0)
                if k == 1:
                    raise RuntimeError("member 1 failed")
                world.advance(5.0)
            except EnsembleStopped:
                stopped.append(k)
                raise
            return k

        return run

    with pytest.raises(RuntimeError, match="member 1 failed"):
        ens.run([body(k) for k in range(3)])
    assert stopped == [0, 2]
    assert ens.twins[0].t == 5.0  # nothing stepped after the failure


def test_quiescent_members_advance_alone_with_the_same_results() -> None:
    spec = quiet(erlang_spec(service_s=2.0, seats=4, replicas=2, cells=1))
    ens = TwinEnsemble([(spec, 1), (spec, 2)], 1.0)

    def run(world: DrillWorld) -> float:
        world.advance(600.0)
        return world.now_s()

    assert ens.run([run, run]) == [600.0, 600.0]
    assert ens.steps == 0
    for k, seed in enumerate((1, 2)):
        lone = Twin(spec, seed)
        lone.run_for(600.0)
        _assert_same(ens.twins[k], lone, f"quiescent member {k}")


def test_a_failing_drill_stops_the_others_and_each_reverts_its_injections() -> None:
    """Member 1's world fails 10 minutes in (after the blackhole): member 0's ``advance`` raises
    ``EnsembleStopped``, its drill reverts what it injected, and member 1's error is raised."""
    loaded = load_drill(L5)
    job = DrillJob(loaded.spec, loaded.fleet, loaded.slo, loaded.policy, loaded.spec_sha256)
    ens = TwinEnsemble([(loaded.fleet, 1), (loaded.fleet, 2)], 1.05)
    broken = ens.worlds[1]
    advance = broken.advance
    cut_when_failing: list[bool] = []

    def fail_late(seconds: float) -> None:
        if broken.now_s() >= 600.0:
            cut_when_failing.append(bool(ens.twins[0].partitions and ens.twins[1].partitions))
            raise RuntimeError("the world went away")
        advance(seconds)

    broken.advance = fail_late  # type: ignore[method-assign]

    def run(world: DrillWorld) -> str:
        r = run_drill(job.spec, job.fleet, job.slo, job.policy, seed=1, world=world)
        return str(r.verdict)

    with pytest.raises(RuntimeError, match="the world went away"):
        ens.run([run, run])
    assert cut_when_failing == [True]  # both regions were blackholed when it failed
    for twin in ens.twins:
        assert twin.t >= 600.0
        assert not twin.partitions  # the blackhole was reverted in both runs
