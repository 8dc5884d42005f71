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
- the counters the single step adds to in place are added to in place, member by member, so
  every other part of the twin keeps holding the same arrays;
- what only a member can answer (its demand, its routing share, its partitions' losses, its
  mirrored warmth, its OOM crashes) is asked of the member.

A member served disaggregated (prefill and decode pools) serves alone: its serving step is
another shape. ``tests/twin/test_ensemble.py`` compares every member's serving state with a
lone twin's after every step, over seeds and fleets.
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

    def serve(self, twins: Sequence[Twin]) -> None:
        batch = [t for t in twins if id(t) in self.together]
        for t in twins:
            if id(t) not in self.together:
                t._serve()
        if len(batch) == 1:
            batch[0]._serve()
        elif batch:
            self._serve(batch)

    def _seat_arrays(self, twins: Sequence[Twin]) -> dict[str, np.ndarray]:
        """The bundle-dependent per-pool arrays, stacked; restacked only when one was rebound."""
        now = tuple(getattr(t, name) for t in twins for name in _SEATS)
        if len(now) != len(self._seats_of) or any(
            a is not b for a, b in zip(now, self._seats_of, strict=True)
        ):
            self._seats = {name: np.stack([getattr(t, name) for t in twins]) for name in _SEATS}
            self._seats_of = now
        return self._seats

    def _serve(self, twins: Sequence[Twin]) -> None:
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
        lam_warm = np.stack([t.lam_warm if t.step_no != 1 else lam[k] for k, t in enumerate(twins)])
        lam_warm += (lam - lam_warm) * c.warm_gain
        for k, t in enumerate(twins):
            t.lam = lam[k]
            if t.step_no == 1:
                t.lam_warm = lam_warm[k].copy()  # the run starts with warm prefix caches
            else:
                t.lam_warm[...] = lam_warm[k]
            if t.recovery.homing.mirroring:
                t.recovery.homing.warm(d_models[k])
                lam_warm[k] = t.lam_warm
        coldness = np.clip(1.0 - lam_warm / np.maximum(lam, 1e-12), 0.0, 1.0)
        # -- arrivals, what is lost on the way and what fails fast: each member's draws --------
        offered = (lam + lost) * dt
        lost_p = lost / np.maximum(lam + lost, 1e-12)
        error_fraction = np.stack([t.error_fraction for t in twins])
        fail_fast = np.stack([t.error_fail_fast for t in twins])
        fast_p = error_fraction * fail_fast
        arrivals = np.empty((runs, c.n_pools), dtype=np.int64)
        n_lost = np.zeros_like(arrivals)
        failed_fast = np.zeros_like(arrivals)
        errors_in = [bool(np.count_nonzero(t.error_fraction)) for t in twins]
        for k, t in enumerate(twins):
            a = poisson(t.rng, offered[k])
            if np.count_nonzero(lost[k]):
                n_lost[k] = binomial(t.rng, a, lost_p[k])
                a = a - n_lost[k]
            if errors_in[k] and np.count_nonzero(t.error_fail_fast):
                failed_fast[k] = binomial(t.rng, a, fast_p[k])
                a = a - failed_fast[k]
            arrivals[k] = a
        # -- capacity ---------------------------------------------------------------------------
        seat = self._seat_arrays(twins)
        serving = np.stack([t.ready for t in twins])
        ready = serving.astype(np.float64)
        seats = serving * seat["seats_int"]
        no_capacity = serving == 0
        queue = np.stack([t.queue for t in twins])  # [R, pools, ages]
        busy = np.stack([t.busy for t in twins])
        dropped = None
        if np.count_nonzero(no_capacity):
            dropped = np.where(no_capacity, arrivals + queue.sum(axis=2), 0)
            arrivals = np.where(no_capacity, 0, arrivals)
            queue[no_capacity] = 0
            busy[no_capacity] = 0
        inv_ready = 1.0 / np.maximum(ready, 1.0)
        batch = busy * inv_ready
        slow_mix = 1.0 + np.stack([t.slow_sum for t in twins]) * inv_ready
        tpot = decode_step_s(shape, batch) * slow_mix
        service = c.prefill_mean + shape.output_mean * tpot
        overflow = np.maximum(busy - ready * seat["kv_seats_per_replica"], 0.0)
        keep = 1.0 - overflow / np.maximum(busy, 1)  # exactly 1.0 where nothing overflows
        for k, t in enumerate(twins):
            if np.count_nonzero(overflow[k]):
                t.preemptions += poisson(t.rng, overflow[k] * 0.05 * dt)
        # -- the queue: age cohorts, timeouts, then completions and admissions in sub-steps ----
        queue[:, :, 1:] = queue[:, :, :-1]
        queue[:, :, 0] = 0
        expired = queue * c.timeout_mask
        timed_out = expired.sum(axis=2)
        queue -= expired
        waiting = queue[:, :, 1:].sum(axis=2)
        done, admitted, wait_corr, new_busy, new_fast = self._queue(
            twins, service, keep, seats, arrivals, waiting, busy
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
            if errors_in[k] and not t.error_fail_fast.all():
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
        pools = c.pool_range
        for k, t in enumerate(twins):
            t.queue[...] = queue[k]
            t.busy = new_busy[k]
            t.busy_fast = new_fast[k]
            t._busy_seen = new_busy[k].copy()
            t._pending_admit += taken[k]
            t._wait_corr_acc += wait_corr[k]
            t._extra_acc += wait_corr[k]
            t._factor_acc += factor_in[k]
            t._extra_acc += extra_in[k]
            t.tpot_hist[pools, tpot_bin[k]] += done[k] + hanging[k]
            t.tpot_sum += tpot_in[k]
            t.errors += hanging[k]
            t.ok += done[k]
            t.errors += fails[k]
            t.requests += requests_in[k]
            t.kv_usage = kv_usage[k]
            t.kv_usage_sum += kv_usage[k]
            t.util_sum += util_in[k]
            t.ready_sum += ready[k]
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
    ) -> tuple[I64, I64, F64, I64, I64]:
        """``Traffic._queue_arithmetic`` for every member: (done, admitted, wait correction,
        busy, busy in the fast phase), each [R, pools]."""
        c = self.first
        dt = c.dt
        runs = len(twins)
        fast = np.stack([t.busy_fast for t in twins])
        seen = np.stack([t._busy_seen for t in twins])
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
