"""Scheduling and replica lifecycle: placing replicas on nodes, and converging each pool on its
desired count and digest mix.

Reconcile runs every few seconds over the pools marked dirty. A new replica goes through
admission and the ready-gate, lands on a node of its cell (one that already holds its weights
first), pulls its weights if the node lacks them, loads, warms and becomes ready; a replica that
is removed drains first when it serves. A crash fails the requests it had in flight and restarts
it after a back-off unless its GPU is gone.
"""

from __future__ import annotations

import math

import numpy as np

from firedrill.twin.replica import LIVE, Replica, ReplicaState
from firedrill.twin.state import TwinState

PENDING = ReplicaState.PENDING
PULLING = ReplicaState.PULLING
LOADING = ReplicaState.LOADING
WARMING = ReplicaState.WARMING
READY = ReplicaState.READY
DRAINING = ReplicaState.DRAINING
EJECTED = ReplicaState.EJECTED
GONE = ReplicaState.GONE

RESTART_BACKOFF_S = 10.0
DRAIN_GRACE_S = 30.0


class Scheduling(TwinState):
    """Placement, the replica lifecycle's transitions and the per-pool reconcile."""

    def _place_initial(self) -> None:
        """The run starts warm: desired replicas ready, their digests cached on their nodes."""
        order = sorted(range(self.n_pools), key=lambda p: -self.models[int(self.pool_model[p])].tp)
        for p in order:
            mi, ci = int(self.pool_model[p]), int(self.pool_cell[p])
            d = int(self.region_digest[mi, self.cell_region[ci]])
            for _ in range(int(self.desired[p])):
                r = self._new_replica(mi, ci, d)
                node = self._find_node(r)
                if node < 0:
                    continue
                self._bind(r, node)
                if d not in self.nodes[node].cache:
                    self.nodes[node].cache.add(d)
                    self.supply.add_holder(self.nodes[node].region, d)
                self._set_state(r, READY)
        self._recount_slow()

    def _find_node(self, r: Replica) -> int:
        need = self.models[r.model].tp
        affinity = self.models[r.model].node_pools
        best = -1
        for ni in self.cell_nodes[r.cell]:
            n = self.nodes[ni]
            if len(n.free) < need or not n.schedulable:
                continue
            if affinity and n.pool not in affinity:
                continue
            usable = [g for g in n.free if g not in n.failed_gpus]
            if len(usable) < need:
                continue
            if r.digest in n.cache:
                return ni
            if best < 0:
                best = ni
        return best

    def _bind(self, r: Replica, ni: int) -> None:
        n = self.nodes[ni]
        need = self.models[r.model].tp
        usable = [g for g in n.free if g not in n.failed_gpus][:need]
        for g in usable:
            n.free.remove(g)
        r.node, r.gpus = ni, tuple(usable)
        n.replicas.add(r.id)

    def _unbind(self, r: Replica) -> None:
        if r.node >= 0:
            n = self.nodes[r.node]
            n.free.extend(r.gpus)
            n.free.sort()
            n.replicas.discard(r.id)
        r.node, r.gpus = -1, ()

    def _schedule(self, r: Replica) -> None:
        ni = self._find_node(r)
        if ni < 0:
            return
        self._bind(r, ni)
        n = self.nodes[ni]
        if r.digest in n.cache:
            self._begin_load(r)
        else:
            self._set_state(r, PULLING)
            size = self.models[r.model].weights_gb
            self.supply.start(ni, n.region, r.digest, size, self.t)

    def _begin_load(self, r: Replica) -> None:
        self._set_state(r, LOADING)
        m = self.models[r.model]
        self._push(self.t + m.weights_gb / m.load_gbytes_per_s, "loaded", (r.id, r.token))

    def _crash(self, r: Replica, *, fatal: bool) -> None:
        """A replica's process died: in-flight requests fail; it restarts unless the GPU is bad."""
        if r.state is READY:
            p = self._pool(r)
            lost = round(self.busy[p] / max(int(self.ready[p]), 1))
            lost = min(lost, int(self.busy[p]))
            self.busy[p] -= lost
            self.errors[p] += lost
            self.requests[p] += 0
        if r.state in (GONE, DRAINING):
            return
        if fatal:
            self._set_state(r, EJECTED)
        else:
            self._set_state(r, EJECTED)
            self._push(self.t + RESTART_BACKOFF_S, "restart", (r.id, r.token))

    def remove_replica(self, r: Replica, *, graceful: bool) -> None:
        if r.state in (GONE, DRAINING):
            return
        if graceful and r.state is READY:
            self._set_state(r, DRAINING)
            self._push(self.t + DRAIN_GRACE_S, "drained", (r.id, r.token))
            return
        if r.state is READY:
            self._crash(r, fatal=True)
        self._finish_remove(r)

    def _finish_remove(self, r: Replica) -> None:
        if r.node >= 0 and r.state is PULLING:
            still = any(
                self.replicas[o].digest == r.digest and self.replicas[o].state is PULLING
                for o in self.nodes[r.node].replicas
                if o != r.id
            )
            if not still:
                self.supply.pulls.pop((r.node, r.digest), None)
        self._unbind(r)
        self._set_state(r, GONE)

    def _target_digest(self, p: int) -> int:
        return int(self.region_digest[int(self.pool_model[p]), int(self.pool_region[p])])

    def _reconcile(self) -> None:
        for p in np.nonzero(self.pool_dirty)[0].tolist():
            self._reconcile_pool(p)

    def _reconcile_pool(self, p: int) -> None:
        """Converge one pool on its desired count and digest mix, rolling with a 10% surge.

        New-digest replicas are created (through admission) at most ``surge`` at a time; an old
        ready replica is removed only when the ready count exceeds the target, so capacity never
        dips during a digest change. Replicas that serve nothing (cold, ejected) go first.
        """
        want = int(self.desired[p] if self.scaler_paused[p] < 0 else self.scaler_paused[p])
        live = [self.replicas[i] for i in sorted(self.pool_replicas[p])]
        live = [r for r in live if r.state in LIVE]
        mi = int(self.pool_model[p])
        ro = self.rollout[mi]
        canary_n = round(want * ro[1] / 100.0) if ro is not None else 0
        if ro is not None and canary_n > 0 and not self.recovery.admission.landed(ro[0], p):
            canary_n = 0  # the ready-gate: a canary digest not landed here is not planned here
        plan = {self._target_digest(p): want - canary_n}
        if ro is not None and canary_n > 0:
            plan[ro[0]] = plan.get(ro[0], 0) + canary_n
        surge = max(1, math.ceil(0.1 * max(want, 1)))
        stale = [r for r in live if r.digest not in plan]
        for d, n in plan.items():
            have = [r for r in live if r.digest == d]
            missing = n - len(have)
            if missing <= 0:
                continue
            if stale:
                in_flight = sum(1 for r in have if r.state is not READY)
                missing = min(missing, max(0, surge - in_flight))
            for _ in range(missing):
                if not self._admit(d, int(self.pool_region[p])):
                    break
                live.append(self._new_replica(mi, int(self.pool_cell[p]), d))
        # stale replicas: those serving nothing go now, ready ones as replacements become ready
        ready_total = sum(1 for r in live if r.state is READY)
        for r in sorted(stale, key=_removal_order):
            if r.state is not READY:
                self.remove_replica(r, graceful=True)
            elif ready_total > want:
                self.remove_replica(r, graceful=True)
                ready_total -= 1
        # surplus of a planned digest (scale-in, smaller canary)
        for d, n in plan.items():
            have = [r for r in live if r.digest == d and r.state in LIVE]
            if len(have) <= n:
                continue  # no surplus: nothing to order
            have.sort(key=_removal_order)
            for r in have[: len(have) - n]:
                self.remove_replica(r, graceful=True)
        unscheduled = False
        for rid in sorted(self.pool_replicas[p]):
            r = self.replicas[rid]
            if r.state is PENDING and r.node < 0:
                self._schedule(r)
                unscheduled = unscheduled or r.node < 0
        settled = not unscheduled and not any(r.digest not in plan for r in live if r.state in LIVE)
        live_n = sum(1 for i in self.pool_replicas[p] if self.replicas[i].state in LIVE)
        self.pool_dirty[p] = not (settled and live_n == want)

    def _admit(self, digest: int, region: int = -1) -> bool:
        """The ready-gate and admission in ``region`` (twin/admission.py); counted either way."""
        ok = self.recovery.admission.admit(digest, region)
        self.admission["admitted" if ok else "denied"] += 1
        return ok


# least useful first: pending, ejected, pulling, loading, warming, then ready (newest first)
_REMOVAL_RANK = {PENDING: 0, EJECTED: 1, PULLING: 2, LOADING: 3, WARMING: 4, READY: 5}


def _removal_order(r: Replica) -> tuple[int, int]:
    return (_REMOVAL_RANK.get(r.state, 6), -r.id)
