"""Serving R twins of one fleet in one step: the arithmetic once, on a leading run axis.

``Traffic._serve`` is about a hundred numpy operations on arrays of a few dozen pools, each
costing about a microsecond whatever its size: on the demo fleet the serving step is a third of
a drill's time, nearly all of it that fixed cost. ``ServeTogether.serve`` does the same step for
R members at once: their arrays are stacked on a leading run axis ([R, pools]), the arithmetic
runs once, and what each member would have drawn it draws from its own generator, in the single
step's order, on its own row. So each member ends the step exactly as ``_serve`` would have left
it, bit for bit:

- every elementwise operation is the single step's, in the same order and association (an IEEE
  operation on a row of a stacked array is the operation on that array); reductions run over the
  same axis of the same values (a sum over cells, regions or cohorts reduces one row at a time);
- where the single step branches (a pool with lost traffic, overflowing KV, an injected 5xx, a
  queue with older cohorts, the number of queue sub-steps), the member's draws are taken or not
  as its branch says; the arithmetic of a branch not taken is done anyway where it changes
  nothing (a keep factor of exactly 1.0, a count of 0, a correction forced to 0.0);
- the members' serving state lives in ``[R, ...]`` arrays whose rows are the members' own
  arrays (``_Pack``): what the single step changes in place is changed in place in the stack,
  for every member at once, and every other part of a twin keeps holding its arrays;
- what only a member can answer (its demand, its routing share, its partitions' losses, its
  mirrored warmth, its OOM crashes) is asked of the member.

A member served disaggregated (prefill and decode pools) serves alone: its serving step is
another shape; so does a member whose request shape was changed (its per-pool constants are no
longer the first member's). ``tests/twin/test_ensemble.py`` compares every member's serving
state with a lone twin's after every step, over seeds and fleets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from firedrill.twin.draws import binomial, poisson
from firedrill.twin.engine import Twin
from firedrill.twin.serving import decode_step_s, lattice_service, queue_substeps
from firedrill.twin.state import F64, I64, TPOT_EXPORT
from firedrill.twin.traffic import CROSS_REGION_RTT_S

__all__ = ["ServeTogether", "can_serve_together"]

_CONSTANTS = (
    "prefill_mean",
    "kv_tokens_per_seq",
    "warm_gain",
    "timeout_mask",
    "cross_mask",
    "product_to_model",
)
_SHAPE: tuple[str, ...] = ("decode_a", "decode_b", "decode_c", "prompt_mean", "output_mean")
_SHAPE += ("interference", "cold_penalty")
_SEATS = (  # rebound together when a bundle changes (``TwinState.update_seats``)
    "seats_int",
    "seats_per_replica",
    "kv_seats_per_replica",
    "kv_tokens_per_replica",
    "max_rps_per_replica",
)


# The serving state, held by the ensemble as [R, ...] arrays whose rows are the members' own
# arrays (each member's attribute is a view of its row): what the twin changes in place between
# steps is in the stacked array already, and the step adds to every member's counters at once.
_OWNED = (
    "queue", "_pending_admit", "tpot_hist", "errors", "ok", "requests", "preemptions", "ready",
    "busy", "busy_fast", "_busy_seen", "lam", "lam_warm", "slow_sum", "error_fraction",
    "error_fail_fast", "kv_usage", "_factor_acc", "_extra_acc", "_wait_corr_acc", "tpot_sum",
    "kv_usage_sum", "util_sum", "ready_sum",
)  # fmt: skip


class _Pack:
    """The members served together and their stacked serving state (see ``_OWNED``)."""

    def __init__(self, twins: Sequence[Twin]) -> None:
        self.members = list(twins)
        self.arrays: dict[str, np.ndarray] = {}
        self.views: dict[str, list[np.ndarray]] = {}
        for name in _OWNED:
            stacked = np.stack([getattr(t, name) for t in twins])
            rows = list(stacked)
            for t, row in zip(twins, rows, strict=True):
                setattr(t, name, row)
            self.arrays[name] = stacked
            self.views[name] = rows

    def holds(self, twins: Sequence[Twin]) -> bool:
        """Whether ``twins`` are its members in its order, each holding its rows: an attribute
        the twin rebound since (a new array) is copied into its row and the row given back."""
        if len(twins) != len(self.members) or any(
            a is not b for a, b in zip(twins, self.members, strict=True)
        ):
            return False
        for name, rows in self.views.items():
            for t, row in zip(twins, rows, strict=True):
                now = getattr(t, name)
                if now is not row:
                    if now.shape != row.shape:
                        return False
                    row[...] = now
                    setattr(t, name, row)
        return True


def can_serve_together(a: Twin, b: Twin) -> bool:
    """Whether two twins' serving steps have the same shape and constants (one fleet's)."""
    if a.pd is not None or b.pd is not None:
        return False
    if a.n_pools != b.n_pools or a.queue_k != b.queue_k or a.dt != b.dt:
        return False
    if len(a.cell_names) != len(b.cell_names):
        return False
    for name in _CONSTANTS:
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape or not np.array_equal(x, y):
            return False
    return all(np.array_equal(getattr(a.shape, n), getattr(b.shape, n)) for n in _SHAPE)


class ServeTogether:
    """The serving step of an ensemble's members (see the module doc)."""

    def __init__(self, twins: Sequence[Twin]) -> None:
        first = twins[0]
        # members that share the first one's constants are served together; any other alone
        self.together = {id(t) for t in twins if can_serve_together(first, t)}
        self.first = first
        self._seats_of: tuple[object, ...] = ()
        self._seats: dict[str, np.ndarray] = {}
        self._pack: _Pack | None = None
        self.packs = 0  # stacked states built (one, and one more each time members drop out)

    def serve(self, twins: Sequence[Twin]) -> None:
        # a member whose request shape changed (written into its shape in place) has other
        # constants than the first member's: it serves alone from then on
        batch = [t for t in twins if id(t) in self.together and not t.shape_changes]
        for t in twins:
            if id(t) not in self.together or t.shape_changes:
                t._serve()
        if len(batch) == 1:
            batch[0]._serve()
        elif batch:
            if self._pack is None or not self._pack.holds(batch):
                self._pack = _Pack(batch)  # the first step, or members dropped out
                self.packs += 1
            self._serve(batch, self._pack.arrays)

    def _rows(self, runs: int) -> I64:
        rows: I64 = np.arange(runs)[:, None]
        return rows

    def _seat_arrays(self, twins: Sequence[Twin]) -> dict[str, np.ndarray]:
        """The bundle-dependent per-pool arrays, stacked; restacked only when one was rebound."""
        now = tuple(getattr(t, name) for t in twins for name in _SEATS)
        if len(now) != len(self._seats_of) or any(
            a is not b for a, b in zip(now, self._seats_of, strict=True)
        ):
            self._seats = {name: np.stack([getattr(t, name) for t in twins]) for name in _SEATS}
            self._seats_of = now
        return self._seats

    def _serve(self, twins: Sequence[Twin], st: dict[str, np.ndarray]) -> None:
        c = self.first
        shape = c.shape
        nc = len(c.cell_names)
        dt = c.dt
        runs = len(twins)
        # -- routing: each member's demand and share, then the flows of all at once ------------
        d_models = []
        shares = []
        for t in twins:
            rps = t.demand.rps(t.t)
            d_models.append(t.product_to_model @ rps)  # [models, regions]
            shares.append(t.routing_matrix()[0])
        d_model = np.stack(d_models)  # [R, models, regions]
        share = np.stack(shares)  # [R, models, regions, cells]
        cross = c.cross_mask
        flow = d_model[:, :, :, None] * share
        routed = flow.sum(axis=2)  # [R, models, cells]
        unrouted = d_model.sum(axis=2) - routed.sum(axis=2)
        lam = routed.reshape(runs, -1)
        lost = np.repeat(np.maximum(unrouted, 0.0) / nc, nc, axis=1)
        for k, t in enumerate(twins):
            if t.partitions:
                lam[k], lost[k] = t._partition_losses(flow[k], lam[k], lost[k])
        rtt = (flow * cross[None, None, :, :]).sum(axis=2).reshape(runs, -1) * CROSS_REGION_RTT_S
        extra = rtt / np.maximum(lam, 1e-12)
        st["lam"][...] = lam
        lam_warm = st["lam_warm"]
        for k, t in enumerate(twins):
            if t.step_no == 1:
                lam_warm[k] = lam[k]  # the run starts with warm prefix caches
        lam_warm += (lam - lam_warm) * c.warm_gain
        for k, t in enumerate(twins):
            if t.recovery.homing.mirroring:  # writes the member's row in place
                t.recovery.homing.warm(d_models[k])
        coldness = np.clip(1.0 - lam_warm / np.maximum(lam, 1e-12), 0.0, 1.0)
        # -- arrivals, what is lost on the way and what fails fast: each member's draws --------
        offered = (lam + lost) * dt
        lost_p = lost / np.maximum(lam + lost, 1e-12)
        error_fraction = st["error_fraction"]
        fail_fast = st["error_fail_fast"]
        fast_p = error_fraction * fail_fast
        arrivals = np.empty((runs, c.n_pools), dtype=np.int64)
        n_lost = np.zeros_like(arrivals)
        failed_fast = np.zeros_like(arrivals)
        errors_in = [bool(np.count_nonzero(row)) for row in error_fraction]
        for k, t in enumerate(twins):
            a = poisson(t.rng, offered[k])
            if np.count_nonzero(lost[k]):
                n_lost[k] = binomial(t.rng, a, lost_p[k])
                a = a - n_lost[k]
            if errors_in[k] and np.count_nonzero(fail_fast[k]):
                failed_fast[k] = binomial(t.rng, a, fast_p[k])
                a = a - failed_fast[k]
            arrivals[k] = a
        # -- capacity ---------------------------------------------------------------------------
        seat = self._seat_arrays(twins)
        serving = st["ready"]
        ready = serving.astype(np.float64)
        seats = serving * seat["seats_int"]
        no_capacity = serving == 0
        queue = st["queue"]  # [R, pools, ages]
        busy = st["busy"]
        dropped = None
        if np.count_nonzero(no_capacity):
            dropped = np.where(no_capacity, arrivals + queue.sum(axis=2), 0)
            arrivals = np.where(no_capacity, 0, arrivals)
            queue[no_capacity] = 0
            busy[no_capacity] = 0
        inv_ready = 1.0 / np.maximum(ready, 1.0)
        batch = busy * inv_ready
        slow_mix = 1.0 + st["slow_sum"] * inv_ready
        tpot = decode_step_s(shape, batch) * slow_mix
        service = c.prefill_mean + shape.output_mean * tpot
        overflow = np.maximum(busy - ready * seat["kv_seats_per_replica"], 0.0)
        keep = 1.0 - overflow / np.maximum(busy, 1)  # exactly 1.0 where nothing overflows
        preemptions = st["preemptions"]
        for k, t in enumerate(twins):
            if np.count_nonzero(overflow[k]):
                preemptions[k] += poisson(t.rng, overflow[k] * 0.05 * dt)
        # -- the queue: age cohorts, timeouts, then completions and admissions in sub-steps ----
        queue[:, :, 1:] = queue[:, :, :-1]
        queue[:, :, 0] = 0
        expired = queue * c.timeout_mask
        timed_out = expired.sum(axis=2)
        queue -= expired
        waiting = queue[:, :, 1:].sum(axis=2)
        done, admitted, wait_corr, new_busy, new_fast = self._queue(
            twins, service, keep, seats, arrivals, waiting, busy, st
        )
        queue[:, :, 0] = arrivals
        oldest_first = queue[:, :, ::-1]
        cum = np.cumsum(oldest_first, axis=2)
        take = np.clip(admitted[:, :, None] - (cum - oldest_first), 0, oldest_first)
        queue -= take[:, :, ::-1]
        taken = take[:, :, ::-1]
        factor = (1.0 + shape.interference * np.minimum(batch / seat["seats_per_replica"], 1.0)) * (
            1.0 + shape.cold_penalty * coldness
        )
        factor_in = admitted * factor
        extra_in = admitted * extra
        tpot_bin = np.searchsorted(TPOT_EXPORT, tpot / slow_mix)
        tpot_in = done * tpot
        # -- a hanging 5xx fails at the end of its service: each member's draw -----------------
        hang_p = error_fraction * ~fail_fast
        hanging = np.zeros_like(done)
        for k, t in enumerate(twins):
            if errors_in[k] and not fail_fast[k].all():
                hanging[k] = binomial(t.rng, done[k], hang_p[k])
        done = done - hanging
        fails = timed_out + failed_fast + n_lost
        if dropped is not None:
            fails = fails + dropped
        requests_in = arrivals + (fails - timed_out)
        kv_usage = np.minimum(
            new_busy * c.kv_tokens_per_seq / np.maximum(ready * seat["kv_tokens_per_replica"], 1.0),
            1.0,
        )
        util_in = np.minimum(lam / np.maximum(ready * seat["max_rps_per_replica"], 1e-12), 1.0)
        busy[...] = new_busy
        st["busy_fast"][...] = new_fast
        st["_busy_seen"][...] = new_busy
        st["_pending_admit"] += taken
        st["_wait_corr_acc"] += wait_corr
        st["_extra_acc"] += wait_corr
        st["_factor_acc"] += factor_in
        st["_extra_acc"] += extra_in
        st["tpot_hist"][self._rows(runs), c.pool_range[None, :], tpot_bin] += done + hanging
        st["tpot_sum"] += tpot_in
        st["errors"] += hanging
        st["ok"] += done
        st["errors"] += fails
        st["requests"] += requests_in
        st["kv_usage"][...] = kv_usage
        st["kv_usage_sum"] += kv_usage
        st["util_sum"] += util_in
        st["ready_sum"] += ready
        for k, t in enumerate(twins):
            t.samples += 1
            t.tpot_now = tpot[k]
            t.service_now = service[k]
        for t in twins:
            if t._oom_models:
                t._oom_crashes()

    def _queue(
        self,
        twins: Sequence[Twin],
        service: F64,
        keep: F64,
        seats: I64,
        arrivals: I64,
        waiting: I64,
        busy: I64,
        st: dict[str, np.ndarray],
    ) -> tuple[I64, I64, F64, I64, I64]:
        """``Traffic._queue_arithmetic`` for every member: (done, admitted, wait correction,
        busy, busy in the fast phase), each [R, pools]."""
        c = self.first
        dt = c.dt
        runs = len(twins)
        fast = st["busy_fast"]
        seen = st["_busy_seen"]
        moved = busy != seen
        if np.count_nonzero(moved):
            fast = np.where(moved, fast * busy // np.maximum(seen, 1), fast)
        fast = np.minimum(fast, busy)
        slow = busy - fast
        contended = (waiting > 0) | (arrivals > seats - busy)
        subs = [1] * runs
        for k in range(runs):
            if np.count_nonzero(contended[k]):
                subs[k] = queue_substeps(dt, float(service[k][contended[k]].min()))
        n = np.array(subs)
        h = dt / n
        pi, p1, p2 = lattice_service(service / h[:, None])
        p1 = p1 * keep
        p2 = p2 * keep
        done = np.zeros_like(busy)
        admitted = np.zeros_like(busy)
        area = np.zeros_like(busy)
        left = arrivals
        zero = np.zeros(c.n_pools, dtype=np.int64)
        for j in range(max(subs)):
            active = n > j
            d_slow = np.zeros_like(busy)
            d_fast = np.zeros_like(busy)
            arrive = np.zeros_like(busy)
            for k, t in enumerate(twins):
                if not active[k]:
                    continue
                d_slow[k] = binomial(t.rng, slow[k], p1[k])
                d_fast[k] = binomial(t.rng, fast[k], p2[k])
                if subs[k] == 1:
                    arrive[k] = arrivals[k]
                else:
                    arrive[k] = binomial(t.rng, left[k], 1.0 / (subs[k] - j))
            left = left - arrive
            slow = slow - d_slow
            fast = fast - d_fast
            done = done + d_slow + d_fast
            waiting = waiting + arrive
            x = np.minimum(np.maximum(seats - slow - fast, 0), waiting)
            x[~active] = 0
            waiting = waiting - x
            x_slow = np.zeros_like(busy)
            for k, t in enumerate(twins):
                x_slow[k] = binomial(t.rng, x[k], pi[k]) if active[k] else zero
            slow = slow + x_slow
            fast = fast + np.asarray(x - x_slow, dtype=np.int64)
            admitted = admitted + x
            area = area + np.where((active & (n > 1))[:, None], waiting, 0)
        new_busy = slow + fast
        corr = np.where((n > 1)[:, None], area * h[:, None] - waiting * dt, 0.0)
        return done, admitted, corr, new_busy, fast
