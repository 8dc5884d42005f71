"""Training JobSets on the twin: progress, checkpoints, crashes, hangs, stragglers and Kueue.

Fleets are built in code: one cell with one tiny serving pool (the twin needs a model) and a
training pool sized for the case. Time steps are 5 s, steps take 10 s, so a number of steps is a
number of seconds over ten.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.spec import (
    CellSpec,
    FaultsSpec,
    FleetSpec,
    JobSetSpec,
    NodePoolSpec,
    ProductSpec,
    RegionSpec,
    XidRateSpec,
)
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.faults import FaultEvent
from firedrill.twin.training import JobSetView, RankRecord
from tests.twin.fleets import model

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
CKPT_S = 300.0
RESTART_S = 600.0


def jobset(
    name: str = "pretrain",
    nodes: int = 4,
    *,
    queue: str = "research-h100",
    checkpoint_interval_s: float = CKPT_S,
    restart_cost_s: float = RESTART_S,
) -> JobSetSpec:
    return JobSetSpec(
        name=name,
        region="r1",
        cell="c1",
        nodes=nodes,
        queue=queue,
        checkpoint_interval_s=checkpoint_interval_s,
        restart_cost_s=restart_cost_s,
    )


def training_spec(
    train_nodes: int,
    jobsets: list[JobSetSpec],
    *,
    faults: FaultsSpec | None = None,
    dt_s: float = 5.0,
) -> FleetSpec:
    """One region, one cell: a one-node serving pool and ``train_nodes`` training nodes."""
    m = model(name="llm-8b", weights_gb=16.0, tp=1)
    return FleetSpec(
        name="training",
        dt_s=dt_s,
        models=[m],
        regions=[
            RegionSpec(
                name="r1",
                cells=[
                    CellSpec(
                        name="c1",
                        node_pools=[
                            NodePoolSpec(name="serve", nodes=1),
                            NodePoolSpec(name="train", nodes=train_nodes, role="training"),
                        ],
                        replicas={m.name: 1},
                    )
                ],
            )
        ],
        products=[
            ProductSpec(
                name="code", model=m.name, peak_rps={"r1": 1.0}, diurnal_amplitude=0.0, noise=0.0
            )
        ],
        training=jobsets,
        faults=faults or FaultsSpec(background=[]),
    )


def make_twin(
    train_nodes: int = 6, jobsets: list[JobSetSpec] | None = None, *, record: bool = False
) -> Twin:
    return Twin(training_spec(train_nodes, jobsets or [jobset()]), seed=3, record=record)


def view(twin: Twin, name: str = "pretrain") -> JobSetView:
    return twin.training.jobset(name)


def node_name(k: int) -> str:
    return f"gpu-c1-train-{k:04d}"


def laggards(records: list[RankRecord]) -> list[RankRecord]:
    newest = max(r.seq for r in records)
    return [r for r in records if r.seq < newest]


# -- progress and checkpoints ------------------------------------------------------------------


def test_a_jobset_starts_running_on_its_cells_training_nodes() -> None:
    js = view(make_twin())
    assert js.state == "running"
    assert js.nodes == tuple(node_name(k) for k in range(4))
    assert (js.ranks, js.gpus) == (32, 32)
    assert (js.step, js.checkpoint_step) == (0.0, 0)


def test_progress_advances_and_checkpoints_commit_on_their_interval() -> None:
    twin = make_twin(record=True)
    twin.run_for(290.0)
    js = view(twin)
    assert js.step == pytest.approx(29.0)
    assert js.checkpoint_step == 0  # the first checkpoint is due at 300 s
    twin.run_for(360.0)
    js = view(twin)
    assert js.step == pytest.approx(65.0)
    assert (js.checkpoint_step, js.checkpoint_at_s) == (60, 600.0)
    assert js.gpu_hours_lost == 0.0
    _, labels, values = twin.instant("firedrill_jobset_progress_steps_total")
    assert [dict(lab)["jobset"] for lab in labels] == ["pretrain"]
    assert values[0] == pytest.approx(64.5, abs=1.0)  # last scrape at 645 s
    _, _, gpus = twin.instant("firedrill_jobset_gpus")
    assert gpus.tolist() == [32.0]
    _, labels, state = twin.instant("firedrill_jobset_state", {"state": "running"})
    assert state.tolist() == [1.0]


# -- crashes ------------------------------------------------------------------------------------


def crash_at_650(twin: Twin, node: int = 2, gpu: int = 3) -> None:
    twin.run_for(650.0)  # step 65; checkpoint 60 committed at 600 s
    ni = twin.node_index[node_name(node)]
    twin._fault(FaultEvent(twin.now_s(), ni, gpu, "xid", 79))


def test_a_fatal_xid_fails_the_gang_and_it_restarts_from_the_last_checkpoint() -> None:
    twin = make_twin()
    before = view(twin).nodes
    crash_at_650(twin)
    js = view(twin)
    assert (js.state, js.restarts) == ("restarting", 1)
    assert js.step == 60.0
    assert js.steps_lost == pytest.approx(5.0)
    assert js.gpu_hours_redone == pytest.approx(5 * 10.0 * 32 / 3600)
    assert js.nodes == before  # the JobSet controller restarts on the same node set
    assert js.gpus == 32  # held through the restart, with no progress
    twin.apply(ops.ResetGpu(node_name(2), 3))  # the GPU is healthy again before the restart ends
    twin.run_for(RESTART_S - 5.0)
    assert view(twin).state == "restarting"
    twin.run_for(5.0)
    js = view(twin)
    assert (js.state, js.resumed_from_step, js.started_at_s) == ("running", 60, 1250.0)
    assert js.nodes == before
    assert js.gpu_hours_stalled == pytest.approx(32 * RESTART_S / 3600)
    twin.run_for(100.0)
    assert view(twin).step == pytest.approx(70.0)


def test_restarting_into_the_same_bad_node_fails_again() -> None:
    twin = make_twin()
    before = view(twin).nodes
    crash_at_650(twin)  # no reset: GPU 3 of node 2 stays broken
    twin.run_for(RESTART_S)
    js = view(twin)
    assert (js.state, js.restarts, js.nodes) == ("restarting", 2, before)
    assert js.step == 60.0
    twin.run_for(RESTART_S)
    assert view(twin).restarts == 3
    assert view(twin).gpu_hours_stalled == pytest.approx(2 * 32 * RESTART_S / 3600)  # 20 min held


def test_a_tainted_node_is_replaced_by_a_spare_on_restart() -> None:
    twin = make_twin()
    twin.apply(ops.Taint(node_name(2), "gpu.corp/quarantine", "xid79", "NoSchedule"))
    assert view(twin).nodes[2] == node_name(2)  # a taint does not evict a running gang
    crash_at_650(twin)
    js = view(twin)
    assert js.nodes == (node_name(0), node_name(1), node_name(4), node_name(3))  # ranks 16-23 move
    twin.run_for(RESTART_S)
    assert view(twin).state == "running"


def test_a_rebooted_node_fails_the_gang_and_is_not_used_while_down() -> None:
    twin = make_twin()
    twin.run_for(100.0)
    twin.apply(ops.RebootNode(node_name(1)))
    js = view(twin)
    assert (js.state, js.restarts) == ("restarting", 1)
    assert node_name(1) not in js.nodes


def test_without_enough_usable_nodes_the_jobset_stays_pending() -> None:
    twin = make_twin(train_nodes=4)
    twin.apply(ops.Cordon(node_name(0)))
    crash_at_650(twin)
    js = view(twin)
    assert (js.state, js.gpus) == ("pending", 0)
    twin.run_for(100.0)
    assert view(twin).state == "pending"
    twin.apply(ops.Uncordon(node_name(0)))
    twin.run_for(5.0)  # the next scheduling pass
    assert view(twin).state == "restarting"


# -- hangs and stragglers ----------------------------------------------------------------------


def test_a_hang_stops_progress_without_a_crash_and_the_flight_recorder_names_the_rank() -> None:
    twin = make_twin()
    twin.run_for(650.0)
    twin.apply(ops.InjectHang("pretrain", 13))  # node 1, GPU 5
    twin.run_for(600.0)
    js = view(twin)
    assert (js.state, js.restarts) == ("running", 0)
    assert js.step == pytest.approx(65.0)
    assert js.checkpoint_step == 60  # the checkpoint due at 900 s could not be written
    assert js.gpu_hours_stalled == pytest.approx(32 * 600.0 / 3600)
    assert twin.fault_log == []  # and nothing an XID alert could see
    records = twin.training.flight_recorder("pretrain")
    assert [r.rank for r in records] == list(range(32))
    (hung,) = laggards(records)
    assert (hung.rank, hung.node, hung.gpu) == (13, node_name(1), 5)
    others = [r for r in records if r.rank != 13]
    assert {(r.last_collective, r.seq, r.state) for r in others} == {
        (others[0].last_collective, hung.seq + 1, "started")
    }
    assert hung.state == "completed"


def test_a_healthy_gangs_ranks_are_all_at_the_same_collective() -> None:
    twin = make_twin()
    twin.run_for(100.0)
    records = twin.training.flight_recorder("pretrain")
    assert laggards(records) == []
    assert records[0].seq == 1 + 3 * 10  # the checkpoint broadcast, then 3 collectives a step


def test_the_hang_belongs_to_the_node_restarting_onto_it_hangs_again() -> None:
    twin = make_twin()
    twin.run_for(650.0)
    twin.apply(ops.InjectHang("pretrain", 13))
    twin.apply(ops.SuspendJobSet("pretrain"))
    twin.apply(ops.ResumeJobSet("pretrain"))
    twin.run_for(RESTART_S + 100.0)
    js = view(twin)
    assert (js.state, js.step) == ("running", 60.0)  # back on node 1, hung again
    assert laggards(twin.training.flight_recorder("pretrain"))[0].node == node_name(1)
    twin.apply(ops.SuspendJobSet("pretrain"))
    twin.apply(ops.ResumeJobSet("pretrain", exclude_nodes=(node_name(1),)))
    twin.run_for(RESTART_S + 100.0)
    js = view(twin)
    assert node_name(1) not in js.nodes
    assert js.step == pytest.approx(70.0)
    assert laggards(twin.training.flight_recorder("pretrain")) == []


def test_a_straggler_slows_the_whole_gang() -> None:
    twin = make_twin()
    twin.run_for(100.0)
    twin.apply(ops.InjectStraggler("pretrain", 30, slowdown=2.0))
    twin.run_for(200.0)
    js = view(twin)
    assert js.step == pytest.approx(20.0)  # 10 steps at full speed, 10 at half
    assert js.gpu_hours_slowed == pytest.approx(32 * 200.0 * 0.5 / 3600)
    twin.apply(ops.ClearTrainingFault("pretrain"))
    twin.run_for(100.0)
    assert view(twin).step == pytest.approx(30.0)


# -- Kueue --------------------------------------------------------------------------------------


def three_jobsets() -> Twin:
    return make_twin(12, [jobset("a", 6), jobset("b", 6), jobset("c", 6)], record=True)


def test_hold_blocks_admission_while_running_workloads_continue() -> None:
    twin = three_jobsets()
    assert [j.state for j in twin.training.jobsets()] == ["running", "running", "pending"]
    twin.apply(ops.SetQueueStopPolicy("research-h100", "Hold"))
    twin.apply(ops.SuspendJobSet("b"))  # six nodes free: c would fit
    twin.run_for(300.0)
    a, b, c = twin.training.jobsets()
    assert (a.state, b.state, c.state) == ("running", "suspended", "pending")
    assert a.step == pytest.approx(30.0)
    _, _, status = twin.instant("kueue_cluster_queue_status", {"status": "active"})
    assert status.tolist() == [0.0]
    _, _, pending = twin.instant("kueue_pending_workloads")
    assert pending.tolist() == [1.0]
    twin.apply(ops.SetQueueStopPolicy("research-h100", None))
    c = view(twin, "c")
    assert c.state == "restarting"
    assert set(c.nodes) == set(view(twin, "b").nodes)


def test_hold_and_drain_evicts_admitted_workloads_until_released() -> None:
    twin = three_jobsets()
    twin.run_for(350.0)  # a and b at step 35, checkpoint 30
    twin.apply(ops.SetQueueStopPolicy("research-h100", "HoldAndDrain"))
    a, b, c = twin.training.jobsets()
    assert (a.state, b.state, c.state) == ("suspended", "suspended", "pending")
    assert (a.evicted, a.suspended, a.gpus) == (True, False, 0)
    assert a.steps_lost == pytest.approx(5.0)
    twin.run_for(100.0)
    assert view(twin, "a").step == 30.0
    twin.apply(ops.SetQueueStopPolicy("research-h100", None))
    assert [j.state for j in twin.training.jobsets()] == ["restarting", "restarting", "pending"]
    twin.run_for(RESTART_S + 100.0)
    assert view(twin, "a").step == pytest.approx(40.0)


# -- operations: inverses and validation ---------------------------------------------------------


def spec_state(twin: Twin) -> list[tuple[object, ...]]:
    """What an operation sets (not what time does): suspend, exclusions, placement, queues."""
    return [
        (j.name, j.suspended, j.evicted, j.excluded, frozenset(j.nodes))
        for j in twin.training.jobsets()
    ] + [tuple(sorted(twin.training.queues().items(), key=str))]


@pytest.mark.parametrize(
    ("setup", "op"),
    [
        ((), ops.SuspendJobSet("pretrain")),
        ((ops.SuspendJobSet("pretrain"),), ops.ResumeJobSet("pretrain")),
        ((), ops.ResumeJobSet("pretrain", (node_name(5),))),
        ((), ops.SetQueueStopPolicy("research-h100", "Hold")),
        ((), ops.SetQueueStopPolicy("research-h100", "HoldAndDrain")),
        (
            (ops.SetQueueStopPolicy("research-h100", "Hold"),),
            ops.SetQueueStopPolicy("research-h100", None),
        ),
    ],
)
def test_lifecycle_operations_are_undone_by_their_inverse(
    setup: tuple[ops.Operation, ...], op: ops.Operation
) -> None:
    twin = make_twin()
    twin.run_for(100.0)
    for s in setup:
        twin.apply(s)
    before = spec_state(twin)
    assert twin.inverse_of(op) == twin.inverse_of(op)
    assert spec_state(twin) == before  # computing the inverse changes nothing
    inverse = twin.apply(op)
    assert spec_state(twin) != before or isinstance(inverse, ops.Noop)
    twin.run_for(10.0)
    twin.apply(inverse)
    assert spec_state(twin) == before


def test_suspend_then_its_inverse_resumes_from_the_checkpoint_on_the_same_nodes() -> None:
    twin = make_twin()
    twin.run_for(350.0)
    nodes = view(twin).nodes
    inverse = twin.apply(ops.SuspendJobSet("pretrain"))
    js = view(twin)
    assert (js.state, js.gpus) == ("suspended", 0)
    assert js.steps_lost == pytest.approx(5.0)
    assert inverse == ops.ResumeJobSet("pretrain", ())
    assert isinstance(twin.apply(ops.SuspendJobSet("pretrain")), ops.Noop)
    twin.apply(inverse)
    twin.run_for(RESTART_S)
    js = view(twin)
    assert (js.state, js.nodes, js.resumed_from_step) == ("running", nodes, 30)


def test_fault_injections_invert_to_the_fault_they_replaced() -> None:
    twin = make_twin()
    twin.run_for(100.0)
    assert twin.apply(ops.InjectStraggler("pretrain", 7, 3.0)) == ops.ClearTrainingFault("pretrain")
    assert twin.apply(ops.InjectHang("pretrain", 9)) == ops.InjectStraggler("pretrain", 7, 3.0)
    inverse = twin.apply(ops.ClearTrainingFault("pretrain"))
    assert inverse == ops.InjectHang("pretrain", 9)
    twin.apply(inverse)
    twin.run_for(100.0)
    assert view(twin).step == pytest.approx(10.0)
    twin.apply(ops.ClearTrainingFault("pretrain"))
    assert isinstance(twin.apply(ops.ClearTrainingFault("pretrain")), ops.Noop)


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        (ops.SuspendJobSet("nope"), "jobset"),
        (ops.ResumeJobSet("nope"), "jobset"),
        (ops.ResumeJobSet("pretrain", ("gpu-c1-train-9999",)), "node"),
        (ops.InjectHang("nope", 0), "jobset"),
        (ops.InjectHang("pretrain", 32), "rank"),
        (ops.InjectStraggler("pretrain", -1), "rank"),
        (ops.ClearTrainingFault("nope"), "jobset"),
        (ops.SetQueueStopPolicy("nope", "Hold"), "cluster queue"),
    ],
)
def test_unknown_targets_raise_and_change_nothing(op: ops.Operation, kind: str) -> None:
    twin = make_twin()
    before = twin.training.jobsets()
    with pytest.raises(UnknownTargetError) as err:
        twin.apply(op)
    assert err.value.kind == kind
    assert twin.training.jobsets() == before
    assert twin.journal == []


def test_a_straggler_faster_than_the_gang_is_refused() -> None:
    twin = make_twin()
    with pytest.raises(OperationError):
        twin.apply(ops.InjectStraggler("pretrain", 0, 0.5))


def test_a_jobset_never_placed_has_no_ranks_to_fault() -> None:
    twin = make_twin(4, [jobset("a", 4), jobset("b", 4)])
    assert view(twin, "b").state == "pending"
    assert twin.training.flight_recorder("b") == []
    with pytest.raises(OperationError):
        twin.apply(ops.InjectHang("b", 0))


# -- the demo fleet and determinism ------------------------------------------------------------


def test_the_demo_fleets_pretraining_run_fills_its_training_pool() -> None:
    twin = Twin(load_fleet(FLEET_YAML), seed=7, record=False)
    (js,) = twin.training.jobsets()
    assert (js.name, js.state, js.gpus, js.ranks) == ("pretrain-405b", "running", 512, 512)
    assert all("-h100-train-" in n for n in js.nodes)


def test_background_faults_give_the_same_training_history_for_the_same_seed() -> None:
    faults = FaultsSpec(background=[XidRateSpec(kind="xid", xid=79, per_1000_node_days=4000.0)])
    spec = training_spec(10, [jobset(nodes=8)], faults=faults, dt_s=10.0)
    runs = []
    for _ in range(2):
        twin = Twin(spec, seed=11, record=False)
        twin.run_for(4 * 3600.0)
        runs.append((twin.training.jobsets(), [e for e in twin.fault_log]))
    assert runs[0] == runs[1]
    assert runs[0][0][0].restarts > 0
