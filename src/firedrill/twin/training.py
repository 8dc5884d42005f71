"""Training JobSets on the twin: gangs of GPUs that checkpoint, crash, hang and straggle.

A JobSet is a gang: every rank (one per GPU, ``nodes × gpus per node`` of them) must enter each
collective before any rank leaves it, so the slowest rank sets the pace of all and one rank that
stops entering collectives stops everyone. That gang property is what makes training incidents
expensive, and it is all this module models:

* **progress**: a step every ``step_time_s`` (10 s by default), ``slowdown`` times slower while a
  straggler rank is in the gang; a checkpoint commits every ``checkpoint_interval_s`` of running
  time (a hung gang cannot write one);
* **crash**: an XID, an ECC error, a link flap or a reboot on any of its nodes fails the whole gang.
  It restarts after ``restart_cost_s`` from the last committed checkpoint; the steps since then are
  redone. The JobSet controller restarts on the *same node set* unless a node is tainted
  NoSchedule/NoExecute, cordoned, NotReady or excluded, so a GPU that is still broken fails the
  gang again at the end of every restart (the reference's "don't restart into the same bad node");
* **hang**: no crash and no XID; every rank but one entered the same collective and waits in it
  forever, so progress is zero while every GPU stays allocated. The fault belongs to the node: a
  restart onto the same node hangs again, a placement without it runs;
* **Kueue**: each JobSet is a workload in a ClusterQueue. ``Hold`` stops new admissions (running
  workloads continue); ``HoldAndDrain`` also evicts the admitted ones, which wait suspended until
  the queue is released.

Flight-recorder records (what PyTorch's NCCL flight recorder dumps: the last collective each rank
entered and its sequence number) are produced for the current incarnation of a running gang, and
the dump of the previous incarnation is kept when it stops, as ``TORCH_NCCL_DUMP_ON_TIMEOUT`` keeps
it on the checkpoint volume.

GPU-hours are a severity axis, so they are counted per JobSet: held without progress (hang and
restart), thrown away (steps redone after a crash or a suspension) and slowed (the share of a
straggling gang's time the straggler costs). Nothing here draws random numbers: faults come from
the engine's fault process or from operations, and the response to each is deterministic.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.series import Labels, labels_of
from firedrill.model.spec import FleetSpec, JobSetSpec
from firedrill.twin.replica import Node

if TYPE_CHECKING:
    from firedrill.twin.recorder import SeriesStore


class TrainingTwin(Protocol):
    """What the training simulation reads of the twin: the clock, the spec and the nodes.

    It writes nothing of the twin's; the engine tells it of GPU faults and lost nodes.
    """

    @property
    def spec(self) -> FleetSpec: ...
    @property
    def t(self) -> float: ...
    @property
    def dt(self) -> float: ...
    @property
    def nodes(self) -> Sequence[Node]: ...
    @property
    def node_index(self) -> Mapping[str, int]: ...
    @property
    def cell_index(self) -> Mapping[str, int]: ...
    @property
    def region_index(self) -> Mapping[str, int]: ...
    @property
    def region_names(self) -> Sequence[str]: ...
    @property
    def cell_nodes(self) -> Sequence[Sequence[int]]: ...


TRAINING_OPS = (
    ops.SuspendJobSet,
    ops.ResumeJobSet,
    ops.SetQueueStopPolicy,
    ops.InjectHang,
    ops.InjectStraggler,
    ops.ClearTrainingFault,
)

JobSetState = Literal["running", "restarting", "pending", "suspended"]
JOBSET_STATES: tuple[JobSetState, ...] = ("running", "restarting", "pending", "suspended")
RankState = Literal["started", "completed"]  # entered and waiting in it / left it
StopPolicy = Literal["Hold", "HoldAndDrain"]
# kueue_cluster_queue_status's values: a stopped ClusterQueue is inactive ("pending").
QUEUE_STATUSES = ("pending", "active", "terminating")

DEFAULT_STEP_TIME_S = 10.0  # seconds per training step of a healthy gang
# One training step as collectives (FSDP: gather the weights, reduce-scatter the gradients, then
# an all-reduce of the loss and grad norm). Sequence number 1 of every incarnation is the
# broadcast of the restored checkpoint state, done during the restart.
STEP_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
FIRST_COLLECTIVE = "broadcast"
_EPS = 1e-9


@dataclass(frozen=True)
class RankRecord:
    """One rank's flight-recorder entry: the last collective it entered."""

    rank: int
    node: str
    gpu: int
    last_collective: str
    seq: int  # collective sequence number in the process group (1-based, per incarnation)
    state: RankState


@dataclass(frozen=True)
class JobSetView:
    """A JobSet as ``kubectl get jobset`` and its Kueue workload show it, plus its GPU-hour bill."""

    name: str
    region: str
    cell: str
    queue: str
    state: JobSetState
    suspended: bool  # spec.suspend, as an operator set it
    evicted: bool  # suspended by Kueue (HoldAndDrain), re-admitted when the queue is released
    nodes: tuple[str, ...]  # the placement: current, or the last one while not admitted
    excluded: tuple[str, ...]  # nodes the JobSet must never be placed on
    ranks: int  # gang size: one rank per GPU
    gpus: int  # GPUs held now (0 while pending or suspended)
    step: float  # training step reached (back to the checkpoint after a crash)
    checkpoint_step: int  # last committed checkpoint
    checkpoint_at_s: float
    resumed_from_step: int  # checkpoint the current (or last) incarnation started from
    started_at_s: float  # when the current (or last) incarnation started running
    restarts: int  # gang failures (suspensions not counted)
    steps_lost: float  # steps thrown away and redone, all incarnations
    step_time_s: float
    checkpoint_interval_s: float
    restart_cost_s: float
    gpu_hours_stalled: float  # GPUs held with no progress: hangs and restarts
    gpu_hours_redone: float  # the GPU time of the steps thrown away
    gpu_hours_slowed: float  # the straggler's share of a slowed gang's GPU time
    gpu_hour_usd: float

    @property
    def gpu_hours_lost(self) -> float:
        return self.gpu_hours_stalled + self.gpu_hours_redone + self.gpu_hours_slowed

    @property
    def usd_lost(self) -> float:
        return self.gpu_hours_lost * self.gpu_hour_usd


@dataclass
class _Fault:
    kind: Literal["hang", "straggler"]
    node: int
    gpu: int
    slowdown: float = 1.0


@dataclass
class _JobSet:
    spec: JobSetSpec
    cell: int
    region: int
    gpus_per_node: int
    state: JobSetState = "pending"
    suspend: bool = False
    evicted: bool = False
    nodes: list[int] = field(default_factory=list)
    excluded: set[int] = field(default_factory=set)
    gpus: int = 0  # GPUs held
    step: float = 0.0
    inc_steps: float = 0.0  # steps since this incarnation started (drives collective seq)
    steps_total: float = 0.0  # every step computed, redone ones included (a counter)
    checkpoint_step: int = 0
    checkpoint_at_s: float = 0.0
    next_checkpoint_s: float = math.inf
    resumed_from: int = 0
    started_at_s: float = 0.0
    ready_at_s: float = math.inf
    restarts: int = 0
    steps_lost: float = 0.0
    gpu_s_stalled: float = 0.0
    gpu_s_redone: float = 0.0
    gpu_s_slowed: float = 0.0
    fault: _Fault | None = None
    dump: tuple[RankRecord, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ranks(self) -> int:
        return self.spec.nodes * self.gpus_per_node


class TrainingSim:
    """Owns the fleet's JobSets and Kueue ClusterQueues; the engine steps it and forwards ops."""

    def __init__(self, twin: TrainingTwin, *, step_time_s: float = DEFAULT_STEP_TIME_S) -> None:
        if step_time_s <= 0:
            raise OperationError(f"step_time_s must be > 0, not {step_time_s}")
        self.twin = twin
        self.step_time_s = step_time_s
        # training nodes of each cell, in node order: where a cell's JobSets may be placed
        self.cell_training: list[list[int]] = [
            [ni for ni in members if twin.nodes[ni].role == "training"]
            for members in twin.cell_nodes
        ]
        self.owner: dict[int, int] = {}  # node -> JobSet holding it
        self.jobs: list[_JobSet] = []
        self.index: dict[str, int] = {}
        self.stop_policy: dict[str, StopPolicy | None] = {}
        for spec in twin.spec.training:
            ci = twin.cell_index[spec.cell]
            cands = self.cell_training[ci]
            gpn = twin.nodes[cands[0]].gpus if cands else 8
            js = _JobSet(
                spec=spec, cell=ci, region=twin.region_index[spec.region], gpus_per_node=gpn
            )
            self.index[spec.name] = len(self.jobs)
            self.jobs.append(js)
            self.stop_policy.setdefault(spec.queue, None)
        for js in self.jobs:  # the run starts with every JobSet that fits already running
            self._launch(js, restart_cost_s=0.0)

    # ------------------------------------------------------------------------------------------
    # reads
    def jobsets(self) -> list[JobSetView]:
        return [self._view(js) for js in self.jobs]

    def jobset(self, name: str) -> JobSetView:
        return self._view(self._js(name))

    def queues(self) -> dict[str, StopPolicy | None]:
        """Each ClusterQueue's stopPolicy."""
        return dict(self.stop_policy)

    def flight_recorder(self, jobset: str) -> list[RankRecord]:
        """The flight-recorder records of every rank, in rank order.

        A running gang's are live; otherwise the dump its last incarnation left (empty if it
        never ran).
        """
        js = self._js(jobset)
        if js.state != "running":
            return list(js.dump)
        return self._records(js)

    def _view(self, js: _JobSet) -> JobSetView:
        names = self.twin.nodes
        return JobSetView(
            name=js.name,
            region=js.spec.region,
            cell=js.spec.cell,
            queue=js.spec.queue,
            state=js.state,
            suspended=js.suspend,
            evicted=js.evicted,
            nodes=tuple(names[ni].name for ni in js.nodes),
            excluded=tuple(sorted(names[ni].name for ni in js.excluded)),
            ranks=js.ranks,
            gpus=js.gpus,
            step=js.step,
            checkpoint_step=js.checkpoint_step,
            checkpoint_at_s=js.checkpoint_at_s,
            resumed_from_step=js.resumed_from,
            started_at_s=js.started_at_s,
            restarts=js.restarts,
            steps_lost=js.steps_lost,
            step_time_s=self.step_time_s,
            checkpoint_interval_s=js.spec.checkpoint_interval_s,
            restart_cost_s=js.spec.restart_cost_s,
            gpu_hours_stalled=js.gpu_s_stalled / 3600.0,
            gpu_hours_redone=js.gpu_s_redone / 3600.0,
            gpu_hours_slowed=js.gpu_s_slowed / 3600.0,
            gpu_hour_usd=self.twin.spec.gpu_hour_usd,
        )

    def _records(self, js: _JobSet) -> list[RankRecord]:
        done = 1 + math.floor(js.inc_steps * len(STEP_COLLECTIVES) + _EPS)
        hung = js.fault if js.fault is not None and js.fault.kind == "hang" else None
        out: list[RankRecord] = []
        rank = 0
        for ni in js.nodes:
            n = self.twin.nodes[ni]
            for g in range(n.gpus):
                if hung is None or (hung.node == ni and hung.gpu == g):
                    # all in step, or the hung rank: it never entered the next collective
                    rec = RankRecord(rank, n.name, g, _collective(done), done, "completed")
                else:  # entered the next collective and waits in it for the hung rank
                    rec = RankRecord(rank, n.name, g, _collective(done + 1), done + 1, "started")
                out.append(rec)
                rank += 1
        return out

    # ------------------------------------------------------------------------------------------
    # time
    def step(self) -> None:
        """Advance every JobSet by one twin step (``twin.dt`` seconds, ending at ``twin.t``)."""
        t, dt = self.twin.t, self.twin.dt
        for js in self.jobs:
            if js.state == "restarting":
                js.gpu_s_stalled += js.gpus * dt
                if t >= js.ready_at_s - _EPS:
                    self._restart_done(js)
            elif js.state == "running":
                self._progress(js, t, dt)
        self._admit_waiting()

    def _progress(self, js: _JobSet, t: float, dt: float) -> None:
        f = js.fault
        if f is not None and f.kind == "hang":
            js.gpu_s_stalled += js.gpus * dt  # every GPU held, every rank waiting
            return
        slowdown = f.slowdown if f is not None else 1.0
        d = dt / (self.step_time_s * slowdown)
        js.step += d
        js.inc_steps += d
        js.steps_total += d
        js.gpu_s_slowed += js.gpus * dt * (1.0 - 1.0 / slowdown)
        if t >= js.next_checkpoint_s - _EPS:
            js.checkpoint_step = math.floor(js.step + _EPS)
            js.checkpoint_at_s = t
            js.next_checkpoint_s += js.spec.checkpoint_interval_s

    def _restart_done(self, js: _JobSet) -> None:
        nodes = self.twin.nodes
        broken = [
            ni
            for ni in js.nodes
            if not nodes[ni].ready or nodes[ni].failed_gpus or nodes[ni].link_down
        ]
        if broken:  # CUDA or NCCL init fails on a node that is still bad: the gang fails again
            self._crash(js)
            return
        js.state = "running"
        js.inc_steps = 0.0
        js.started_at_s = self.twin.t
        js.next_checkpoint_s = self.twin.t + js.spec.checkpoint_interval_s

    # ------------------------------------------------------------------------------------------
    # placement and lifecycle
    def _usable(self, ni: int) -> bool:
        n = self.twin.nodes[ni]
        return (
            n.ready
            and not n.cordoned
            and not any(eff in ("NoSchedule", "NoExecute") for _, eff in n.taints.values())
        )

    def _place(self, js: _JobSet) -> list[int] | None:
        """The JobSet controller's choice: the previous node set where usable, spares for the rest.

        Ranks keep their positions; a replaced node's ranks move to its replacement. None when the
        cell has too few usable nodes (the gang is all-or-nothing).
        """
        me = self.index[js.name]
        slots: list[int] = [
            ni
            if ni not in js.excluded and self._usable(ni) and self.owner.get(ni, me) == me
            else -1
            for ni in js.nodes[: js.spec.nodes]
        ]
        slots += [-1] * (js.spec.nodes - len(slots))
        taken = set(slots)
        spares = (
            ni
            for ni in self.cell_training[js.cell]
            if ni not in taken
            and ni not in js.excluded
            and ni not in self.owner
            and self.twin.nodes[ni].gpus == js.gpus_per_node
            and self._usable(ni)
        )
        for k, ni in enumerate(slots):
            if ni < 0:
                spare = next(spares, None)
                if spare is None:
                    return None
                slots[k] = spare
        return slots

    def _launch(self, js: _JobSet, *, restart_cost_s: float | None = None) -> None:
        """Admit and place the gang: restarting for the restart cost, or pending if it won't fit."""
        placement = self._place(js)
        if placement is None:
            js.state = "pending"
            return
        me = self.index[js.name]
        js.nodes = placement
        for ni in placement:
            self.owner[ni] = me
        js.gpus = sum(self.twin.nodes[ni].gpus for ni in placement)
        js.evicted = False
        if js.fault is not None and js.fault.node not in placement:
            js.fault = None  # the bad node is out of the gang
        js.resumed_from = js.checkpoint_step
        js.step = float(js.checkpoint_step)
        cost = js.spec.restart_cost_s if restart_cost_s is None else restart_cost_s
        js.state = "restarting"
        js.ready_at_s = self.twin.t + cost
        if cost <= 0:
            self._restart_done(js)

    def _stop(self, js: _JobSet) -> None:
        """The gang stops (crash, suspension, eviction): dump, lose the uncommitted steps, free."""
        if js.state == "running":
            js.dump = tuple(self._records(js))
        lost = max(js.step - js.checkpoint_step, 0.0)
        js.steps_lost += lost
        js.gpu_s_redone += lost * self.step_time_s * js.gpus
        js.step = float(js.checkpoint_step)
        for ni in js.nodes:
            if self.owner.get(ni) == self.index[js.name]:
                del self.owner[ni]
        js.gpus = 0
        js.ready_at_s = math.inf
        js.next_checkpoint_s = math.inf

    def _crash(self, js: _JobSet) -> None:
        if js.state not in ("running", "restarting"):
            return
        self._stop(js)
        js.restarts += 1
        self._launch(js)

    def _admit_waiting(self) -> None:
        for js in self.jobs:
            if js.suspend or js.state not in ("pending", "suspended"):
                continue
            if self.stop_policy[js.spec.queue] is None:
                self._launch(js)

    # ------------------------------------------------------------------------------------------
    # faults from the engine
    def on_gpu_fault(self, node: int, gpu: int, *, fatal: bool) -> None:
        """A GPU of ``node`` failed (fatal: unusable until reset/reboot).

        Either way the rank on it dies and takes the gang with it; a fatal fault also leaves the
        GPU broken, so a restart onto the same node fails again until the GPU is reset.
        """
        jid = self.owner.get(node)
        if jid is not None:
            self._crash(self.jobs[jid])

    def on_node_unavailable(self, node: int) -> None:
        """``node`` was drained, rebooted or went NotReady."""
        jid = self.owner.get(node)
        if jid is not None:
            self._crash(self.jobs[jid])

    # ------------------------------------------------------------------------------------------
    # operations
    def _js(self, name: str) -> _JobSet:
        if name not in self.index:
            raise UnknownTargetError("jobset", name)
        return self.jobs[self.index[name]]

    def _rank_at(self, js: _JobSet, rank: int) -> tuple[int, int]:
        """(node, gpu) of a rank in the JobSet's placement."""
        if not 0 <= rank < js.ranks:
            raise UnknownTargetError("rank", f"{js.name}/{rank}")
        if len(js.nodes) != js.spec.nodes:
            raise OperationError(f"jobset '{js.name}' has never been placed: no rank {rank}")
        starts = np.cumsum([0] + [self.twin.nodes[ni].gpus for ni in js.nodes])
        k = bisect.bisect_right(starts.tolist(), rank) - 1
        return js.nodes[k], rank - int(starts[k])

    def _rank_of(self, js: _JobSet, node: int, gpu: int) -> int:
        k = js.nodes.index(node)
        return sum(self.twin.nodes[ni].gpus for ni in js.nodes[:k]) + gpu

    def _fault_op(self, js: _JobSet) -> ops.Operation | None:
        f = js.fault
        if f is None:
            return None
        rank = self._rank_of(js, f.node, f.gpu)
        if f.kind == "hang":
            return ops.InjectHang(js.name, rank)
        return ops.InjectStraggler(js.name, rank, f.slowdown)

    def _excluded_names(self, js: _JobSet) -> tuple[str, ...]:
        return tuple(sorted(self.twin.nodes[ni].name for ni in js.excluded))

    def inverse(self, op: ops.Operation) -> ops.Operation:
        """Validate ``op`` and return the operation that would undo it now; changes nothing."""
        match op:
            case ops.SuspendJobSet(jobset=name):
                js = self._js(name)
                if js.suspend:
                    return ops.Noop("already suspended")
                return ops.ResumeJobSet(name, self._excluded_names(js))
            case ops.ResumeJobSet(jobset=name, exclude_nodes=exclude):
                js = self._js(name)
                for node in exclude:
                    if node not in self.twin.node_index:
                        raise UnknownTargetError("node", node)
                if js.suspend:
                    # The exclusions stay: they record which node was bad.
                    return ops.SuspendJobSet(name)
                old = self._excluded_names(js)
                if set(old) == set(exclude):
                    return ops.Noop("not suspended")
                return ops.ResumeJobSet(name, old)
            case ops.SetQueueStopPolicy(queue=queue, policy=policy):
                if queue not in self.stop_policy:
                    raise UnknownTargetError("cluster queue", queue)
                if policy not in (None, "Hold", "HoldAndDrain"):
                    raise OperationError(f"unknown stopPolicy {policy!r}")
                return ops.SetQueueStopPolicy(queue, self.stop_policy[queue])
            case (
                ops.InjectHang(jobset=name, rank=rank) | ops.InjectStraggler(jobset=name, rank=rank)
            ):
                js = self._js(name)
                self._rank_at(js, rank)
                if isinstance(op, ops.InjectStraggler) and not op.slowdown >= 1.0:
                    raise OperationError(f"straggler slowdown must be >= 1, not {op.slowdown}")
                return self._fault_op(js) or ops.ClearTrainingFault(name)
            case ops.ClearTrainingFault(jobset=name):
                js = self._js(name)
                return self._fault_op(js) or ops.Noop("no training fault")
        raise OperationError(f"not a training operation: {op!r}")

    def apply(self, op: ops.Operation) -> None:
        """Apply a validated training operation (the engine has called ``inverse`` first)."""
        match op:
            case ops.SuspendJobSet(jobset=name):
                js = self._js(name)
                if not js.suspend:
                    js.suspend = True
                    if js.state in ("running", "restarting"):
                        self._stop(js)
                    js.state = "suspended"
                    js.evicted = False  # suspended by its owner now, not by Kueue
            case ops.ResumeJobSet(jobset=name, exclude_nodes=exclude):
                js = self._js(name)
                js.excluded = {self.twin.node_index[n] for n in exclude}
                if js.suspend:
                    js.suspend = False
                    js.state = "pending"  # a workload again: admitted below unless held
            case ops.SetQueueStopPolicy(queue=queue, policy=policy):
                self.stop_policy[queue] = policy
                if policy == "HoldAndDrain":
                    for js in self.jobs:
                        if js.spec.queue == queue and js.state in ("running", "restarting"):
                            self._stop(js)
                            js.evicted = True
                            js.state = "suspended"
            case ops.InjectHang(jobset=name, rank=rank):
                js = self._js(name)
                node, gpu = self._rank_at(js, rank)
                js.fault = _Fault("hang", node, gpu)
            case ops.InjectStraggler(jobset=name, rank=rank, slowdown=slowdown):
                js = self._js(name)
                node, gpu = self._rank_at(js, rank)
                js.fault = _Fault("straggler", node, gpu, slowdown)
            case ops.ClearTrainingFault(jobset=name):
                self._js(name).fault = None
            case _:
                raise OperationError(f"not a training operation: {op!r}")
        self._admit_waiting()

    # ------------------------------------------------------------------------------------------
    # series
    def register_series(self, store: SeriesStore) -> None:
        twin = self.twin
        base = [
            dict(jobset=js.name, cell=js.spec.cell, region=twin.region_names[js.region])
            for js in self.jobs
        ]
        plain = [labels_of(**b) for b in base]
        for name in (
            "firedrill_jobset_progress_steps_total",
            "firedrill_jobset_step",
            "firedrill_jobset_checkpoint_step",
            "firedrill_jobset_gpus",
            "firedrill_jobset_restarts_total",
            "firedrill_jobset_steps_lost_total",
            # GPU time in Prometheus's base unit (GPU-seconds), the unit last: promtool's lint
            # refuses hours in a name, and the views keep their GPU-hours
            "firedrill_jobset_stalled_gpu_seconds_total",
            "firedrill_jobset_redone_gpu_seconds_total",
            "firedrill_jobset_slowed_gpu_seconds_total",
        ):
            store.family(name, plain)
        store.family(
            "firedrill_jobset_state",
            [labels_of(**b, state=s) for b in base for s in JOBSET_STATES],
        )
        self._queues = sorted(self.stop_policy)
        queue_status: list[Labels] = [
            labels_of(cluster_queue=q, status=s) for q in self._queues for s in QUEUE_STATUSES
        ]
        store.family("kueue_cluster_queue_status", queue_status)
        store.family(
            "kueue_pending_workloads",
            [labels_of(cluster_queue=q, status="active") for q in self._queues],
        )
        store.family(
            "kueue_admitted_active_workloads", [labels_of(cluster_queue=q) for q in self._queues]
        )

    def scrape(self, store: SeriesStore, k: int) -> None:
        jobs = self.jobs

        def col(values: Sequence[float]) -> npt.NDArray[np.float64]:
            return np.asarray(values, dtype=np.float64)

        store.write("firedrill_jobset_progress_steps_total", k, col([j.steps_total for j in jobs]))
        store.write("firedrill_jobset_step", k, col([j.step for j in jobs]))
        store.write("firedrill_jobset_checkpoint_step", k, col([j.checkpoint_step for j in jobs]))
        store.write("firedrill_jobset_gpus", k, col([j.gpus for j in jobs]))
        store.write("firedrill_jobset_restarts_total", k, col([j.restarts for j in jobs]))
        store.write("firedrill_jobset_steps_lost_total", k, col([j.steps_lost for j in jobs]))
        gpu_s = [[j.gpu_s_stalled, j.gpu_s_redone, j.gpu_s_slowed] for j in jobs]
        seconds = np.array(gpu_s, dtype=np.float64).reshape(len(jobs), 3)
        for i, key in enumerate(("stalled", "redone", "slowed")):
            store.write(f"firedrill_jobset_{key}_gpu_seconds_total", k, seconds[:, i])
        store.write(
            "firedrill_jobset_state",
            k,
            col([1.0 if j.state == s else 0.0 for j in jobs for s in JOBSET_STATES]),
        )
        status = []
        pending = []
        admitted = []
        for q in self._queues:
            active = self.stop_policy[q] is None
            status += [1.0 if (s == "active") == active else 0.0 for s in QUEUE_STATUSES[:2]]
            status.append(0.0)  # terminating: ClusterQueues are never deleted here
            mine = [j for j in jobs if j.spec.queue == q]
            pending.append(sum(1.0 for j in mine if j.state == "pending" or j.evicted))
            admitted.append(sum(1.0 for j in mine if j.state in ("running", "restarting")))
        store.write("kueue_cluster_queue_status", k, col(status))
        store.write("kueue_pending_workloads", k, col(pending))
        store.write("kueue_admitted_active_workloads", k, col(admitted))


def _collective(seq: int) -> str:
    """The collective with sequence number ``seq`` in an incarnation."""
    if seq <= 1:
        return FIRST_COLLECTIVE
    return STEP_COLLECTIVES[(seq - 2) % len(STEP_COLLECTIVES)]
