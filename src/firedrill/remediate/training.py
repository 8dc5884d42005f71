"""The training-storm runbook as code: page on a stalled gang, name the hung rank, exclude it.

A hang is the expensive training incident because nothing fires: no crash, no XID, every GPU busy
waiting in a collective. So detection is on the symptom, zero progress while GPUs are held
(``StallDetector``), and the page carries what it costs (GPUs × hours × $/GPU-hour), because
GPU-hours are the severity axis when no user is affected.

The response follows the reference runbook "NCCL hang: name the rank, exclude it, restart":

1. read the flight-recorder records and name the rank(s) whose last collective lags the gang's
   (every other rank entered collective N and waits for them) — ``find_hung_ranks``;
2. suspend the JobSet (stops the bleed, keeps the object and its history);
3. taint the rank's node ``gpu.corp/quarantine=nccl-hang:NoSchedule`` and label the reason;
4. resume with the node excluded, from the last *committed* checkpoint; a restart costs the whole
   gang R minutes, so it must not land on the same bad node.

``plan_hang_remediation`` is pure: records in, operations out. ``run_hang_runbook`` validates the
plan against the fleet, applies it in order (or only records it, in dry-run) and reports what the
hang cost. It refuses, rather than guesses, when the records name no laggard or more nodes than
an automation budget allows: a hang spread over many nodes is a fabric or a code problem, and
excluding nodes would only shrink the pool.

This module depends on ports only: the twin's ``TrainingSim`` satisfies ``TrainingReader`` and the
twin ``OpsFleet``; a Kubernetes adapter can satisfy both the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.series import Labels
from firedrill.ports import Signals
from firedrill.ports.training import RankRecordLike, TrainingReader

QUARANTINE_KEY = "gpu.corp/quarantine"
REASON_LABEL = "gpu.corp/quarantine-reason"
HANG_REASON = "nccl-hang"
DEFAULT_STALL_S = 600.0  # zero progress this long pages (10 minutes)
DEFAULT_MAX_NODES = 2  # at most this many nodes excluded per hang without a human

PROGRESS_SERIES = "firedrill_jobset_progress_steps_total"
GPUS_SERIES = "firedrill_jobset_gpus"
STATE_SERIES = "firedrill_jobset_state"


# ---------------------------------------------------------------------------------------------
# what the runbook reads (``RankRecordLike``, ``JobSetLike``, ``TrainingReader``: the Training port)


class OpsFleet(Protocol):
    """The slice of the ``Fleet`` port and the ``Clock`` the runbook acts through."""

    def apply(self, op: ops.Operation) -> ops.Operation: ...

    def now_s(self) -> float: ...


# ---------------------------------------------------------------------------------------------
# diagnosis and plan (pure)


@dataclass(frozen=True)
class HungRank:
    rank: int
    node: str
    gpu: int
    last_collective: str
    seq: int


@dataclass(frozen=True)
class HangPlan:
    """Who is hung, where the gang waits, and the ordered operations that fix it."""

    jobset: str
    hung: tuple[HungRank, ...]
    waiting_in: str  # the collective every other rank entered
    waiting_seq: int
    nodes: tuple[str, ...]  # the hung ranks' nodes, each once, in rank order
    operations: tuple[ops.Operation, ...]


def find_hung_ranks(records: Sequence[RankRecordLike]) -> tuple[HungRank, ...]:
    """The ranks whose last collective lags the newest any rank entered, in rank order."""
    if not records:
        return ()
    newest = max(r.seq for r in records)
    return tuple(
        HungRank(r.rank, r.node, r.gpu, r.last_collective, r.seq)
        for r in sorted(records, key=lambda r: r.rank)
        if r.seq < newest
    )


def plan_hang_remediation(
    jobset: str, records: Sequence[RankRecordLike], *, max_nodes: int = DEFAULT_MAX_NODES
) -> HangPlan:
    """Suspend → taint and label each hung node → resume excluding them.

    Raises ``OperationError`` when no rank lags (not a single-rank hang: nothing to exclude) or
    when the laggards span more than ``max_nodes`` nodes (escalate to a human).
    """
    hung = find_hung_ranks(records)
    if not hung:
        raise OperationError(
            f"jobset '{jobset}': every rank's last collective is the same; no rank to exclude"
        )
    nodes = tuple(dict.fromkeys(h.node for h in hung))
    if len(nodes) > max_nodes:
        raise OperationError(
            f"jobset '{jobset}': {len(hung)} ranks on {len(nodes)} nodes lag the gang (budget "
            f"{max_nodes}); a hang this wide is not one bad node, escalate"
        )
    newest = max(records, key=lambda r: (r.seq, -r.rank))
    steps: list[ops.Operation] = [ops.SuspendJobSet(jobset)]
    for node in nodes:
        steps.append(ops.Taint(node, QUARANTINE_KEY, HANG_REASON, "NoSchedule"))
        steps.append(ops.Label(node, REASON_LABEL, HANG_REASON))
    steps.append(ops.ResumeJobSet(jobset, exclude_nodes=nodes))
    return HangPlan(
        jobset=jobset,
        hung=hung,
        waiting_in=newest.last_collective,
        waiting_seq=newest.seq,
        nodes=nodes,
        operations=tuple(steps),
    )


# ---------------------------------------------------------------------------------------------
# execution


@dataclass(frozen=True)
class StepRecord:
    """One runbook step: what was applied, its inverse, when (dry-run: what would have been)."""

    at_s: float
    op: ops.Operation
    inverse: ops.Operation | None  # None in dry-run


@dataclass(frozen=True)
class HangReport:
    """What the runbook did and what the hang cost."""

    jobset: str
    hung: tuple[HungRank, ...]
    waiting_in: str
    waiting_seq: int
    excluded: tuple[str, ...]
    suspended_at_s: float
    resumed_at_s: float
    step_at_suspend: float
    resumed_from_step: int  # the last committed checkpoint
    steps_lost: float
    gpus: int
    gpu_hours_stalled: float  # the JobSet's GPU-hours held without progress, so far
    gpu_hours_redone: float  # ... thrown away and redone, so far (this suspension included)
    gpu_hours_slowed: float
    restart_gpu_hours: float  # the restart ahead: R of the whole gang
    gpu_hour_usd: float
    placement: tuple[str, ...]  # where the gang resumes (empty in dry-run)
    steps: tuple[StepRecord, ...]
    dry_run: bool

    @property
    def rank(self) -> int:
        return self.hung[0].rank

    @property
    def node(self) -> str:
        return self.hung[0].node

    @property
    def gpu_hours_lost(self) -> float:
        return self.gpu_hours_stalled + self.gpu_hours_redone + self.gpu_hours_slowed

    @property
    def usd_lost(self) -> float:
        return self.gpu_hours_lost * self.gpu_hour_usd


def run_hang_runbook(
    fleet: OpsFleet,
    training: TrainingReader,
    jobset: str,
    records: Sequence[RankRecordLike],
    *,
    gpu_hour_usd: float,
    max_nodes: int = DEFAULT_MAX_NODES,
    dry_run: bool = False,
) -> HangReport:
    """Name the hung rank from ``records``, then suspend, quarantine its node and resume without it.

    Validates first: the JobSet must exist, the plan must be within budget and every hung node
    must be in the JobSet's placement (records from another run are refused). In dry-run the
    plan is recorded and nothing is applied.
    """
    before = training.jobset(jobset)
    plan = plan_hang_remediation(jobset, records, max_nodes=max_nodes)
    strangers = [n for n in plan.nodes if n not in before.nodes]
    if strangers:
        raise OperationError(
            f"jobset '{jobset}': flight-recorder nodes {strangers} are not in its placement"
        )
    gpus = before.ranks
    restart_gpu_hours = gpus * before.restart_cost_s / 3600.0
    steps: list[StepRecord] = []
    now = fleet.now_s()
    if dry_run:
        steps = [StepRecord(now, op, None) for op in plan.operations]
        return HangReport(
            jobset=jobset,
            hung=plan.hung,
            waiting_in=plan.waiting_in,
            waiting_seq=plan.waiting_seq,
            excluded=plan.nodes,
            suspended_at_s=now,
            resumed_at_s=now,
            step_at_suspend=before.step,
            resumed_from_step=before.checkpoint_step,
            steps_lost=before.step - before.checkpoint_step,
            gpus=gpus,
            gpu_hours_stalled=before.gpu_hours_stalled,
            gpu_hours_redone=before.gpu_hours_redone,
            gpu_hours_slowed=before.gpu_hours_slowed,
            restart_gpu_hours=restart_gpu_hours,
            gpu_hour_usd=gpu_hour_usd,
            placement=(),
            steps=tuple(steps),
            dry_run=True,
        )
    suspended_at = now
    for op in plan.operations:
        at = fleet.now_s()
        if isinstance(op, ops.SuspendJobSet):
            suspended_at = at
        steps.append(StepRecord(at, op, fleet.apply(op)))
    after = training.jobset(jobset)
    return HangReport(
        jobset=jobset,
        hung=plan.hung,
        waiting_in=plan.waiting_in,
        waiting_seq=plan.waiting_seq,
        excluded=plan.nodes,
        suspended_at_s=suspended_at,
        resumed_at_s=steps[-1].at_s,
        step_at_suspend=before.step,
        resumed_from_step=after.checkpoint_step,
        steps_lost=before.step - after.checkpoint_step,
        gpus=gpus,
        gpu_hours_stalled=after.gpu_hours_stalled,
        gpu_hours_redone=after.gpu_hours_redone,
        gpu_hours_slowed=after.gpu_hours_slowed,
        restart_gpu_hours=restart_gpu_hours,
        gpu_hour_usd=gpu_hour_usd,
        placement=after.nodes,
        steps=tuple(steps),
        dry_run=False,
    )


# ---------------------------------------------------------------------------------------------
# detection


@dataclass(frozen=True)
class StallPage:
    """A page: a JobSet has held GPUs with zero progress for ``stalled_s``."""

    at_s: float
    jobset: str
    cell: str
    region: str
    stalled_since_s: float
    gpus: int
    gpu_hour_usd: float
    alertname: str = "TrainingJobStalled"
    severity: str = "page"

    @property
    def stalled_s(self) -> float:
        return self.at_s - self.stalled_since_s

    @property
    def gpu_hours_burned(self) -> float:
        return self.gpus * self.stalled_s / 3600.0

    @property
    def usd_burned(self) -> float:
        return self.gpu_hours_burned * self.gpu_hour_usd

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.gpu_hour_usd

    @property
    def summary(self) -> str:
        return (
            f"{self.jobset} ({self.cell}): zero progress for {self.stalled_s / 60:.0f} min on "
            f"{self.gpus} GPUs; {self.gpu_hours_burned:,.0f} GPU-h burned "
            f"(${self.usd_burned:,.0f}), burning ${self.usd_per_hour:,.0f}/h"
        )


@dataclass
class _Watch:
    last_step: float
    since_s: float
    paged: bool = False


class StallDetector:
    """Pages once per stall: zero progress for ``stall_s`` while the JobSet holds GPUs.

    Reads the JobSet series through the ``Signals`` port at each evaluation. A JobSet holding no
    GPUs (pending, suspended) is not burning; one restarting is expected to make no progress for
    its restart cost and is paged by its restart count instead, so both reset the stall clock.
    The clock also resets on any progress, which re-arms the page.
    """

    def __init__(
        self, signals: Signals, *, gpu_hour_usd: float, stall_s: float = DEFAULT_STALL_S
    ) -> None:
        if stall_s <= 0:
            raise OperationError(f"stall_s must be > 0, not {stall_s}")
        self.signals = signals
        self.gpu_hour_usd = gpu_hour_usd
        self.stall_s = stall_s
        self.watches: dict[str, _Watch] = {}
        self.pages: list[StallPage] = []

    def evaluate(self) -> list[StallPage]:
        """Read the latest samples; return the pages that fire now."""
        t, labels, steps = self.signals.instant(PROGRESS_SERIES)
        _, glabels, gpus = self.signals.instant(GPUS_SERIES)
        _, rlabels, restarting = self.signals.instant(STATE_SERIES, {"state": "restarting"})
        held = {_label(lab, "jobset"): float(v) for lab, v in zip(glabels, gpus, strict=True)}
        restart = {
            _label(lab, "jobset"): float(v) > 0 for lab, v in zip(rlabels, restarting, strict=True)
        }
        fired: list[StallPage] = []
        for lab, value in zip(labels, steps, strict=True):
            name = _label(lab, "jobset")
            step = float(value)
            w = self.watches.get(name)
            if w is None:
                self.watches[name] = _Watch(step, t)
                continue
            if step > w.last_step or held.get(name, 0.0) <= 0 or restart.get(name, False):
                w.last_step, w.since_s, w.paged = step, t, False
                continue
            if not w.paged and t - w.since_s >= self.stall_s - 1e-9:
                w.paged = True
                page = StallPage(
                    at_s=t,
                    jobset=name,
                    cell=_label(lab, "cell"),
                    region=_label(lab, "region"),
                    stalled_since_s=w.since_s,
                    gpus=int(held.get(name, 0.0)),
                    gpu_hour_usd=self.gpu_hour_usd,
                )
                fired.append(page)
        self.pages.extend(fired)
        return fired


def _label(labels: Labels, key: str) -> str:
    for k, v in labels:
        if k == key:
            return v
    return ""
