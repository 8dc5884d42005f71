"""The NCCL-hang runbook on a 512-node (4,096-GPU) pretraining run that hangs with no crash.

The fleet: one cell with a 520-node training pool (512 for the gang, 8 spares). Checkpoints every
10 minutes, a restart costs the whole gang 10 minutes, a step takes 10 s. The run hangs at 900 s
(step 90, last checkpoint at step 60), and nothing crashes and no XID fires.
"""

from __future__ import annotations

import pytest

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.ports import TrainingReader
from firedrill.remediate.training import (
    HANG_REASON,
    QUARANTINE_KEY,
    REASON_LABEL,
    OpsFleet,
    StallDetector,
    StallPage,
    find_hung_ranks,
    plan_hang_remediation,
    run_hang_runbook,
)
from firedrill.twin.engine import Twin
from firedrill.twin.training import RankRecord
from tests.twin.test_training import jobset, training_spec

JS = "pretrain-405b"
NODES = 512
HUNG_RANK = 2345  # node 293, GPU 1
HANG_AT_S = 900.0
RESTART_S = 600.0
USD = 2.0
SCRAPE_S = 15.0


def big_twin() -> Twin:
    spec = training_spec(
        NODES + 8,
        [jobset(JS, NODES, checkpoint_interval_s=600.0, restart_cost_s=RESTART_S)],
    )
    return Twin(spec, seed=5, record=True, hours_hint=1.0)


def watch_until_page(twin: Twin, detector: StallDetector, *, limit_s: float) -> StallPage:
    end = twin.now_s() + limit_s
    while twin.now_s() < end:
        twin.advance(SCRAPE_S)
        pages = detector.evaluate()
        if pages:
            (page,) = pages
            return page
    raise AssertionError(f"no page within {limit_s} s")


@pytest.fixture(scope="module")
def hung() -> tuple[Twin, StallDetector, StallPage]:
    """The run, hung at 900 s and watched until the stall pages."""
    twin = big_twin()
    detector = StallDetector(twin, gpu_hour_usd=USD)
    while twin.now_s() < HANG_AT_S:
        twin.advance(SCRAPE_S)
        assert detector.evaluate() == []
    twin.apply(ops.InjectHang(JS, HUNG_RANK))
    page = watch_until_page(twin, detector, limit_s=1800.0)
    return twin, detector, page


def test_the_hang_pages_after_ten_minutes_of_zero_progress_with_the_burn_in_the_page(
    hung: tuple[Twin, StallDetector, StallPage],
) -> None:
    twin, _, page = hung
    assert (page.jobset, page.cell, page.region, page.gpus) == (JS, "c1", "r1", 4096)
    assert page.stalled_since_s == HANG_AT_S  # the last scrape that saw progress
    assert page.at_s - HANG_AT_S == 600.0
    assert page.gpu_hours_burned == pytest.approx(4096 * 600.0 / 3600)  # 682.7 GPU-h
    assert page.usd_burned == pytest.approx(4096 * 600.0 / 3600 * USD)
    assert page.usd_per_hour == 4096 * USD
    assert "4096 GPUs" in page.summary
    assert twin.fault_log == []  # no XID: only the stall could have paged


def test_the_runbook_names_the_rank_suspends_quarantines_and_resumes_elsewhere(
    hung: tuple[Twin, StallDetector, StallPage],
) -> None:
    twin, detector, page = hung
    js = twin.training.jobset(JS)
    assert (js.state, js.checkpoint_step) == ("running", 60)
    assert js.step == pytest.approx(90.0)
    bad_node = js.nodes[HUNG_RANK // 8]
    records = twin.training.flight_recorder(JS)
    assert len(records) == 4096
    journal_before = len(twin.journal)

    report = run_hang_runbook(twin, twin.training, JS, records, gpu_hour_usd=USD)

    assert (report.rank, report.node, report.hung[0].gpu) == (HUNG_RANK, bad_node, 1)
    assert len(report.hung) == 1
    assert report.excluded == (bad_node,)
    assert [type(s.op) for s in report.steps] == [
        ops.SuspendJobSet,
        ops.Taint,
        ops.Label,
        ops.ResumeJobSet,
    ]
    assert report.steps[-1].op == ops.ResumeJobSet(JS, exclude_nodes=(bad_node,))
    assert report.suspended_at_s == report.resumed_at_s == page.at_s
    # every step is journalled with its inverse
    assert [a.op for a in twin.journal[journal_before:]] == [s.op for s in report.steps]
    assert [a.inverse for a in twin.journal[journal_before:]] == [s.inverse for s in report.steps]
    node = twin.node(bad_node)
    assert (QUARANTINE_KEY, HANG_REASON, "NoSchedule") in node.taints
    assert (REASON_LABEL, HANG_REASON) in node.labels
    # resumed from the last committed checkpoint, on 512 nodes without the bad one
    assert report.step_at_suspend == pytest.approx(90.0)
    assert report.resumed_from_step == 60
    assert report.steps_lost == pytest.approx(30.0)
    assert len(report.placement) == NODES
    assert bad_node not in report.placement
    js = twin.training.jobset(JS)
    assert (js.state, js.nodes, js.excluded) == ("restarting", report.placement, (bad_node,))
    # the bill: the hang's GPU-hours held without progress, plus the 30 steps to redo
    stalled = 4096 * (page.at_s - HANG_AT_S) / 3600
    redone = 30 * 10.0 * 4096 / 3600
    assert report.gpu_hours_stalled == pytest.approx(stalled)
    assert report.gpu_hours_redone == pytest.approx(redone)
    assert report.gpu_hours_lost == pytest.approx(stalled + redone)
    assert report.usd_lost == pytest.approx((stalled + redone) * USD)
    assert report.restart_gpu_hours == pytest.approx(4096 * RESTART_S / 3600)

    # after the restart cost the gang trains again, and the stall does not page again
    twin.advance(RESTART_S + 300.0)
    js = twin.training.jobset(JS)
    assert (js.state, js.resumed_from_step) == ("running", 60)
    assert js.step == pytest.approx(60.0 + 30.0, abs=0.6)
    assert find_hung_ranks(twin.training.flight_recorder(JS)) == ()
    assert detector.evaluate() == []
    assert len(detector.pages) == 1


def test_a_dry_run_plans_the_same_steps_and_changes_nothing() -> None:
    twin = big_twin()
    twin.advance(HANG_AT_S)
    twin.apply(ops.InjectHang(JS, HUNG_RANK))
    twin.advance(60.0)
    journal = list(twin.journal)
    report = run_hang_runbook(
        twin, twin.training, JS, twin.training.flight_recorder(JS), gpu_hour_usd=USD, dry_run=True
    )
    assert report.dry_run
    assert report.rank == HUNG_RANK
    assert report.steps[0].op == ops.SuspendJobSet(JS)
    assert all(s.inverse is None for s in report.steps)
    assert twin.journal == journal
    assert twin.training.jobset(JS).state == "running"


def test_a_restart_or_a_suspension_is_not_paged_as_a_stall() -> None:
    twin = Twin(
        training_spec(6, [jobset("pretrain", 4, restart_cost_s=900.0)]), seed=1, record=True
    )
    detector = StallDetector(twin, gpu_hour_usd=USD, stall_s=300.0)
    twin.advance(60.0)
    detector.evaluate()
    twin.apply(ops.RebootNode("gpu-c1-train-0001"))  # the gang restarts for 15 minutes
    for _ in range(int(900 / SCRAPE_S) + 10):
        twin.advance(SCRAPE_S)
        assert detector.evaluate() == []
    twin.apply(ops.SuspendJobSet("pretrain"))
    for _ in range(40):
        twin.advance(SCRAPE_S)
        assert detector.evaluate() == []


# -- the pure plan ------------------------------------------------------------------------------


def records(seqs: dict[int, int], ranks: int = 16) -> list[RankRecord]:
    """Eight ranks a node; every rank entered seq 10 unless ``seqs`` says otherwise."""
    out = []
    for r in range(ranks):
        seq = seqs.get(r, 10)
        if seq == 10:
            out.append(RankRecord(r, f"n{r // 8}", r % 8, "all_reduce", seq, "started"))
        else:
            out.append(RankRecord(r, f"n{r // 8}", r % 8, "reduce_scatter", seq, "completed"))
    return out


def test_the_plan_excludes_each_hung_node_once_in_rank_order() -> None:
    plan = plan_hang_remediation("js", records({12: 9, 9: 9, 3: 8}))
    assert [h.rank for h in plan.hung] == [3, 9, 12]
    assert plan.nodes == ("n0", "n1")
    assert plan.operations == (
        ops.SuspendJobSet("js"),
        ops.Taint("n0", QUARANTINE_KEY, HANG_REASON, "NoSchedule"),
        ops.Label("n0", REASON_LABEL, HANG_REASON),
        ops.Taint("n1", QUARANTINE_KEY, HANG_REASON, "NoSchedule"),
        ops.Label("n1", REASON_LABEL, HANG_REASON),
        ops.ResumeJobSet("js", exclude_nodes=("n0", "n1")),
    )
    assert (plan.waiting_in, plan.waiting_seq) == ("all_reduce", 10)


def test_the_plan_refuses_when_no_rank_lags() -> None:
    with pytest.raises(OperationError, match="no rank"):
        plan_hang_remediation("js", records({}))
    with pytest.raises(OperationError):
        plan_hang_remediation("js", [])


def test_the_plan_refuses_a_hang_wider_than_its_budget() -> None:
    with pytest.raises(OperationError, match="escalate"):
        plan_hang_remediation("js", records({0: 9, 8: 9, 16: 9}, ranks=24))
    wide = plan_hang_remediation("js", records({0: 9, 8: 9, 16: 9}, 24), max_nodes=3)
    assert wide.nodes == ("n0", "n1", "n2")


def test_the_runbook_refuses_records_from_another_placement_or_jobset() -> None:
    twin = Twin(training_spec(6, [jobset("pretrain", 4)]), seed=1, record=False)
    fleet: OpsFleet = twin
    training: TrainingReader = twin.training
    with pytest.raises(OperationError, match="not in its placement"):
        run_hang_runbook(fleet, training, "pretrain", records({3: 9}), gpu_hour_usd=USD)
    with pytest.raises(UnknownTargetError):
        run_hang_runbook(fleet, training, "nope", records({3: 9}), gpu_hour_usd=USD)
    assert twin.journal == []
