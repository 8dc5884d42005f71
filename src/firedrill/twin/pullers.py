"""Competing pullers and pool recycling: the load a recovery puts on the weights supply chain.

Recovery is the dangerous half of a drill: the survivor scales out, a recycled pool re-hydrates,
and every new replica pulls 140 GB at once. Two things make that storm worse or better:

* **competing pullers** — batch and eval jobs that also pull weights, and non-critical scale-outs.
  A group is ``nodes`` nodes of a region, each pulling ``gbytes`` GB from the region's registry
  (a digest of its own, so its bytes never satisfy a serving replica). Its pulls go through the
  same fluid model as serving hydrate (``twin/supply.py``): they share the origin's bandwidth and
  GET rate (so more 503 SlowDown and 429) and the NIC of the node they run on (so a hydrating
  node on the same NIC pulls slower). The group runs on the region's serving nodes, those with
  free GPUs first (where new replicas land), and holds no GPU: the jobs' GPUs are elsewhere.
  Freezing a region pauses its non-critical groups where they are; thawing resumes them.
* **recycling** — ``kubectl rollout restart`` of X % of a pool whose nodes come back with an
  empty weights cache: each recycled replica drains, its node forgets the digest, and the
  replacement re-hydrates. At most ``max_surge`` % of the pool is in flight at a time (recycled
  and not ready again), so the ready curve climbs back in waves.

Neither draws random numbers; both are driven by operations and by the engine's reconcile clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.twin.replica import Node, Replica, ReplicaState
from firedrill.twin.supply import Pull, Supply


class PullersTwin(Protocol):
    """What competing pullers and pool recycling read and write of the twin.

    They read the clock, the nodes, the replicas and the pools; they start and stop pulls in the
    supply chain, empty a recycled node's weights cache and remove the recycled replica.
    """

    @property
    def t(self) -> float: ...
    @property
    def supply(self) -> Supply: ...
    @property
    def nodes(self) -> Sequence[Node]: ...
    @property
    def replicas(self) -> Sequence[Replica]: ...
    @property
    def model_index(self) -> Mapping[str, int]: ...
    @property
    def cell_names(self) -> Sequence[str]: ...
    @property
    def cell_index(self) -> Mapping[str, int]: ...
    @property
    def region_index(self) -> Mapping[str, int]: ...
    @property
    def cell_nodes(self) -> Sequence[Sequence[int]]: ...
    @property
    def pool_replicas(self) -> Sequence[set[int]]: ...
    @property
    def desired(self) -> npt.NDArray[np.int64]: ...
    @property
    def ready(self) -> npt.NDArray[np.int64]: ...
    def pool_of(self, replica: int) -> int: ...
    def remove_replica(self, r: Replica, *, graceful: bool) -> None: ...


PULLER_OPS = (ops.StartPullers, ops.StopPullers, ops.FreezePullers)
RECYCLE_OPS = (ops.RecyclePool, ops.StopRecycle)
RECYCLE_EVERY_S = 5.0  # the Deployment controller's pace


@dataclass
class PullerGroup:
    spec: ops.StartPullers
    region: int
    digest: int  # negative: a puller digest, never a serving one
    nodes: tuple[int, ...]
    remaining_gb: dict[int, float]  # node -> GB still to pull; a node that finished is absent
    started_s: float
    done_s: float | None = None

    @property
    def active(self) -> bool:
        return self.done_s is None


class Pullers:
    """Competing puller groups by name, and which regions are frozen."""

    def __init__(self, twin: PullersTwin) -> None:
        self.twin = twin
        self.groups: dict[str, PullerGroup] = {}
        self.frozen: set[int] = set()
        self._digests: dict[str, int] = {}  # name -> digest, stable across restarts of a name

    # -- operations -------------------------------------------------------------------------------
    def inverse(self, op: ops.Operation) -> ops.Operation:
        match op:
            case ops.StartPullers(name=name, region=region, nodes=n, gbytes=gb, kind=kind):
                self._region(region)
                if not name:
                    raise OperationError("a puller group needs a name")
                if n < 1 or not gb > 0:
                    raise OperationError("pullers need nodes >= 1 and gbytes > 0")
                if kind not in ("batch", "eval", "scale_out"):
                    raise OperationError(f"puller kind must be batch, eval or scale_out: {kind!r}")
                have = len(self._candidates(self._region(region)))
                if n > have:
                    raise OperationError(f"region '{region}' has {have} serving nodes, not {n}")
                old = self.groups.get(name)
                return ops.StopPullers(name) if old is None else old.spec
            case ops.StopPullers(name=name):
                old = self.groups.get(name)
                return ops.Noop("no such pullers") if old is None else old.spec
            case ops.FreezePullers(region=region):
                ri = self._region(region)
                return ops.FreezePullers(region, ri in self.frozen)
        raise OperationError(f"not a puller operation: {op!r}")

    def apply(self, op: ops.Operation) -> None:
        match op:
            case ops.StartPullers():
                if op.name in self.groups:
                    self._stop(op.name)
                ri = self._region(op.region)
                nodes = tuple(self._candidates(ri)[: op.nodes])
                digest = self._digests.setdefault(op.name, -1 - len(self._digests))
                group = PullerGroup(
                    spec=op,
                    region=ri,
                    digest=digest,
                    nodes=nodes,
                    remaining_gb=dict.fromkeys(nodes, float(op.gbytes)),
                    started_s=self.twin.t,
                )
                self.groups[op.name] = group
                if not self._paused(group):
                    self._resume(group)
            case ops.StopPullers(name=name):
                if name in self.groups:
                    self._stop(name)
            case ops.FreezePullers(region=region, frozen=frozen):
                ri = self._region(region)
                if frozen and ri not in self.frozen:
                    self.frozen.add(ri)
                    for g in self._in(ri):
                        if self._paused(g):
                            self._suspend(g)
                elif not frozen and ri in self.frozen:
                    self.frozen.discard(ri)
                    for g in self._in(ri):
                        self._resume(g)
            case _:
                raise OperationError(f"not a puller operation: {op!r}")

    def state(self) -> tuple[object, ...]:
        """What the operations set, for comparisons: groups and frozen regions."""
        return (
            tuple(g.spec for _, g in sorted(self.groups.items())),
            tuple(sorted(self.frozen)),
        )

    # -- engine hooks -----------------------------------------------------------------------------
    def pulled(self, pull: Pull) -> None:
        """A puller's node finished its pull (called by the engine's hydrate step)."""
        for g in self.groups.values():
            if g.digest == pull.digest:
                g.remaining_gb.pop(pull.node, None)
                self.twin.supply.add_holder(g.region, g.digest)  # its peers can fetch from it
                if not g.remaining_gb:
                    g.done_s = self.twin.t
                return

    def pulling_nodes(self, region: int) -> int:
        """Puller nodes of a region with a pull in flight now."""
        pulls = self.twin.supply.pulls
        return sum(1 for g in self._in(region) for n in g.remaining_gb if (n, g.digest) in pulls)

    # -- internals --------------------------------------------------------------------------------
    def _region(self, name: str) -> int:
        if name not in self.twin.region_index:
            raise UnknownTargetError("region", name)
        return self.twin.region_index[name]

    def _candidates(self, ri: int) -> list[int]:
        """The region's serving nodes, those with free GPUs first (where new replicas land)."""
        nodes = self.twin.nodes
        serving = [i for i, n in enumerate(nodes) if n.region == ri and n.role == "serving"]
        return sorted(serving, key=lambda i: (not nodes[i].free, i))

    def _in(self, ri: int) -> list[PullerGroup]:
        return [g for g in self.groups.values() if g.region == ri and g.active]

    def _paused(self, g: PullerGroup) -> bool:
        return g.region in self.frozen and not g.spec.critical

    def _resume(self, g: PullerGroup) -> None:
        supply = self.twin.supply
        for node, left in g.remaining_gb.items():
            supply.start(node, g.region, g.digest, float(g.spec.gbytes), self.twin.t)
            supply.pulls[(node, g.digest)].remaining_gb = left

    def _suspend(self, g: PullerGroup) -> None:
        for node in g.remaining_gb:
            pull = self.twin.supply.pulls.pop((node, g.digest), None)
            if pull is not None:
                g.remaining_gb[node] = pull.remaining_gb

    def _stop(self, name: str) -> None:
        g = self.groups.pop(name)
        self._suspend(g)


@dataclass
class RecycleJob:
    spec: ops.RecyclePool
    cell: int
    pools: tuple[int, ...]  # model x cell pool indices
    queue: list[int] = field(default_factory=list)  # replica ids still to recycle
    target_ready: dict[int, int] = field(default_factory=dict)  # pool -> ready before the storm
    surge: dict[int, int] = field(default_factory=dict)  # pool -> replicas in flight at most
    recycled: int = 0
    started_s: float | None = None
    done_s: float | None = None


class Recycler:
    """Rolling restarts whose nodes come back cold, ``max_surge`` at a time."""

    def __init__(self, twin: PullersTwin) -> None:
        self.twin = twin
        self.jobs: dict[tuple[str, str], RecycleJob] = {}
        self.finished: list[RecycleJob] = []
        self._next_s = 0.0

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    def inverse(self, op: ops.Operation) -> ops.Operation:
        match op:
            case ops.RecyclePool(cell=cell, pool=pool, percent=pct, max_surge=surge):
                self._pools(cell, pool)
                if not (0 < pct <= 100 and 0 < surge <= 100):
                    raise OperationError("recycle percent and max_surge must be within (0, 100]")
                old = self.jobs.get((cell, pool))
                return ops.StopRecycle(cell, pool) if old is None else old.spec
            case ops.StopRecycle(cell=cell, pool=pool):
                self._pools(cell, pool)
                old = self.jobs.get((cell, pool))
                # A stop cannot give recycled nodes their caches back; undoing it restarts the
                # recycle over the pool as it is then.
                return ops.Noop("not recycling") if old is None else old.spec
        raise OperationError(f"not a recycle operation: {op!r}")

    def apply(self, op: ops.Operation) -> None:
        match op:
            case ops.RecyclePool(cell=cell, pool=pool):
                ci, pools = self._pools(cell, pool)
                self.jobs[(cell, pool)] = RecycleJob(spec=op, cell=ci, pools=pools)
                self._next_s = self.twin.t  # start on the next step
            case ops.StopRecycle(cell=cell, pool=pool):
                job = self.jobs.pop((cell, pool), None)
                if job is not None:
                    job.done_s = self.twin.t
                    self.finished.append(job)
            case _:
                raise OperationError(f"not a recycle operation: {op!r}")

    def state(self) -> tuple[ops.RecyclePool, ...]:
        return tuple(self.jobs[k].spec for k in sorted(self.jobs))

    def step(self) -> None:
        if self.twin.t < self._next_s:
            return
        self._next_s = self.twin.t + RECYCLE_EVERY_S
        for key in sorted(self.jobs):
            job = self.jobs[key]
            if job.started_s is None:
                self._start(job)
            if self._advance(job):
                del self.jobs[key]
                job.done_s = self.twin.t
                self.finished.append(job)

    def _pools(self, cell: str, pool: str) -> tuple[int, tuple[int, ...]]:
        """Pools (model x cell) a recycle of ``pool`` acts on: the model, or the models a node
        pool of the cell hosts."""
        tw = self.twin
        if cell not in tw.cell_index:
            raise UnknownTargetError("cell", cell)
        ci = tw.cell_index[cell]
        nc = len(tw.cell_names)
        if pool in tw.model_index:
            return ci, (tw.model_index[pool] * nc + ci,)
        node_pools = {tw.nodes[n].pool for n in tw.cell_nodes[ci]}
        if pool not in node_pools:
            raise UnknownTargetError("pool", f"{cell}/{pool}")
        hosted = {
            tw.replicas[r].model
            for n in tw.cell_nodes[ci]
            if tw.nodes[n].pool == pool
            for r in tw.nodes[n].replicas
        }
        return ci, tuple(sorted(m * nc + ci for m in hosted))

    def _start(self, job: RecycleJob) -> None:
        tw = self.twin
        job.started_s = tw.t
        for p in job.pools:
            ready = sorted(
                r for r in tw.pool_replicas[p] if tw.replicas[r].state is ReplicaState.READY
            )
            n = math.ceil(job.spec.percent / 100.0 * len(ready) - 1e-9)
            job.queue.extend(ready[:n])
            job.target_ready[p] = len(ready)
            want = max(int(tw.desired[p]), len(ready), 1)
            job.surge[p] = max(1, math.floor(job.spec.max_surge / 100.0 * want + 1e-9))

    def _advance(self, job: RecycleJob) -> bool:
        """Recycle what the surge allows; True when the job is finished."""
        tw = self.twin
        for p in job.pools:
            in_flight = max(0, job.target_ready[p] - int(tw.ready[p]))
            room = job.surge[p] - in_flight
            while room > 0:
                rid = self._next_in(job, p)
                if rid is None:
                    break
                self._recycle(rid)
                job.recycled += 1
                room -= 1
        return not job.queue and all(int(tw.ready[p]) >= job.target_ready[p] for p in job.pools)

    def _next_in(self, job: RecycleJob, pool: int) -> int | None:
        tw = self.twin
        for i, rid in enumerate(job.queue):
            r = tw.replicas[rid]
            if tw.pool_of(rid) != pool:
                continue
            del job.queue[i]
            if r.state is ReplicaState.READY:
                return rid
            return self._next_in(job, pool)  # gone or broken since: skip it
        return None

    def _recycle(self, rid: int) -> None:
        tw = self.twin
        r = tw.replicas[rid]
        if r.node >= 0:
            node = tw.nodes[r.node]
            if r.digest in node.cache:  # the node comes back with an empty weights cache
                node.cache.discard(r.digest)
                tw.supply.remove_holder(node.region, r.digest)
        tw.remove_replica(r, graceful=True)  # the replacement is scheduled by the pool's reconcile
