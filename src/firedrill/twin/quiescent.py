"""Quiescent steps: a quiet fleet's serving advanced over an interval in closed form.

A time-stepped twin pays a fixed cost per step however little happens in it; a small fleet that
only serves a steady load pays it every second for nothing. When the fleet spec opts in
(``FleetSpec.quiescent``) and nothing but serving happens over an interval, the interval is one
step: its arrivals one Poisson draw at the interval's mean rate, and each pool's queue the
stationary M/M/c (Erlang C) at that rate: the number in the system at the interval's end drawn
from the stationary distribution (busy seats and the queue), the waits of the requests admitted
in the interval drawn from Erlang C's wait distribution (no wait with probability 1 − P(wait),
else exponential at rate cμ − λ), binned into the age cohorts the TTFT histogram reads with the
within-cohort mean credited as the wait correction, exactly as the sub-stepped path credits its
own. Counters and run means advance by the interval's totals, gauges take the drawn state.

What "nothing but serving happens" means is checked cheaply by the engine and here: see
:meth:`Quiescent.quiet_steps`. Every other path is untouched, so with the option off every
output is the 1-second path's, bit for bit.

A fleet of a few pools (the small cell the option exists for) runs the same closed form on
Python numbers rather than NumPy calls on one-element arrays, which cost a microsecond each
whatever their size: the same operations and draws, so the same numbers as the array path.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
from scipy.special import gammaln, pdtr

from firedrill.model.spec import FleetSpec
from firedrill.twin.replica import ReplicaState
from firedrill.twin.serving import LATTICE_H2_MIN_SLOTS, decode_step_s, lattice_service
from firedrill.twin.state import F64, TPOT_EXPORT
from firedrill.twin.traffic import CROSS_REGION_RTT_S, SCALAR_POOLS, Traffic

TRANSITIONAL = [
    int(s)
    for s in (
        ReplicaState.PENDING,
        ReplicaState.PULLING,
        ReplicaState.LOADING,
        ReplicaState.WARMING,
        ReplicaState.DRAINING,
    )
]
TIMEOUT_TAIL_MAX = 1e-3  # P(a request waits past the queue timeout) above it: not quiet


class Quiescent(Traffic):
    """The closed-form serving of a quiet interval."""

    def __init__(self, spec: FleetSpec, seed: int, *, record: bool, hours_hint: float) -> None:
        super().__init__(spec, seed, record=record, hours_hint=hours_hint)
        # per pool, the last (decay, cohort probabilities) of the waits' draw: a steady load
        # has the same decay interval after interval, and the probabilities cost a dozen calls
        self._cohort_pv: dict[int, tuple[float, F64]] = {}
        self._warm_gain_k: dict[int, tuple[bytes, list[float]]] = {}  # 1 - (1 - gain)^k, per k

    def quiet_steps(self, limit_s: float) -> int:
        """How many ``dt`` steps from now may be one macro step (0 or 1: none).

        Bounded by ``limit_s`` (the caller's ``advance`` and the next scrape), the option's
        ``max_step_s``, the next event on the heap, the next minute of demand noise and the
        next start or end of a demand event. The fleet is quiet when no pull is in flight, no
        pool waits for reconcile, no replica is pending, pulling, loading, warming or draining,
        and no partition, injected error, OOM-prone model, mirroring or disaggregated pool is
        in play; the engine checks training, sandboxes and recycling.
        """
        q = self.spec.quiescent
        dt = self.dt
        span = min(limit_s, q.max_step_s)
        k = math.floor(span / dt + 1e-9)
        if k < 2 or self.step_no < 1:
            return 0
        if (
            self.supply.pulls
            or self.partitions
            or self._oom_models
            or self.pd is not None
            or self.recovery.homing.mirroring
            or np.count_nonzero(self.pool_dirty)
            or np.count_nonzero(self.error_fraction)
            or np.count_nonzero(self.state_counts[:, TRANSITIONAL])
        ):
            return 0
        if self._heap:
            k = min(k, self._steps_before(self._heap[0][0]))
        d = self.demand
        if np.count_nonzero(d.noise_sigma):
            k = min(k, self._steps_before(d._noise_until))
        for _, _, start, end, _ in d.events + d.extra:
            for b in (start, end):
                if b > self.t:
                    k = min(k, self._steps_before(b))
        return k if k >= 2 else 0

    def _steps_before(self, at_s: float) -> int:
        """Steps from now whose time is strictly before ``at_s``."""
        return math.ceil((at_s - self.t) / self.dt - 1e-9) - 1

    def _offered(self, t_s: float) -> tuple[F64, F64] | None:
        """(arrival rate, cross-region RTT per request) per pool at ``t_s``; None if any is lost."""
        got = self._routed(t_s)
        if got is None:
            return None
        lam, flow = got
        _, cross = self.routing_matrix()
        rtt = (flow * cross[None, :, :]).sum(axis=1).reshape(-1) * CROSS_REGION_RTT_S
        extra: F64 = rtt / np.maximum(lam, 1e-12)
        return lam, extra

    def _routed(self, t_s: float) -> tuple[F64, F64] | None:
        """(arrival rate per pool, flow [models, regions, cells]) at ``t_s``; None if any is lost.

        The interval's end needs only the rate: the RTT is the start's (``_offered``).
        """
        rps = self.demand.rps(t_s)
        d_model = self.product_to_model @ rps
        share, _ = self.routing_matrix()
        flow: F64 = d_model[:, :, None] * share
        routed = flow.sum(axis=1)
        if (d_model.sum(axis=1) - routed.sum(axis=1) > 1e-9 * max(1.0, routed.sum())).any():
            return None  # a model with no route anywhere: its requests fail, not quiet
        lam: F64 = routed.reshape(-1)
        return lam, flow

    def serve_interval(self, k: int) -> int:
        """Serve the next ``k`` steps in closed form if the load allows; the steps taken (0: none).

        Halves the interval while the offered load changes by more than the tolerance over it.
        On success ``t`` and ``step_no`` have advanced by the interval.
        """
        if self.n_pools <= SCALAR_POOLS:
            return self._serve_interval_few(k)
        q = self.spec.quiescent
        dt = self.dt
        t0 = self.t
        first = self._offered(round(t0 + dt, 9))
        if first is None:
            return 0
        lam0, extra = first
        while k >= 2:
            last = self._routed(round(t0 + k * dt, 9))
            if last is None:
                return 0
            lam1 = last[0]
            top = np.maximum(lam0, lam1)
            if np.all(np.abs(lam1 - lam0) <= q.demand_tolerance * top):
                break
            k //= 2
        if k < 2:
            return 0
        lam = (lam0 + lam1) / 2.0
        ready = self.ready.astype(np.float64)
        seats = self.ready * self.seats_int
        if np.any((lam > 0) & (self.ready == 0)):
            return 0
        idle = lam <= 0
        if np.count_nonzero(self.busy[idle]) or np.count_nonzero(self.queue[idle]):
            return 0  # a pool losing its load drains on 1-second steps, not stationary
        if np.any(seats > self.ready * self.kv_seats_per_replica):
            return 0  # the KV cache may overflow: preemptions, not the M/M/c
        inv_ready = 1.0 / np.maximum(ready, 1.0)
        slow_mix = 1.0 + self.slow_sum * inv_ready
        batch = self.busy * inv_ready
        for _ in range(2):  # the service at the stationary batch (exact for a flat curve)
            tpot = decode_step_s(self.shape, batch) * slow_mix
            service = self.prefill_mean + self.shape.output_mean * tpot
            batch = np.minimum(lam * service, seats) * inv_ready
        tpot = decode_step_s(self.shape, batch) * slow_mix
        service = self.prefill_mean + self.shape.output_mean * tpot
        offered = lam * service
        live = lam > 0
        if np.any(offered[live] >= q.max_utilization * seats[live]):
            return 0
        n_pools = self.n_pools
        p_wait = np.zeros(n_pools)
        theta = np.ones(n_pools)
        for p in np.nonzero(live)[0].tolist():
            c = int(seats[p])
            p_wait[p] = erlang_c(c, float(offered[p]))
            theta[p] = c / float(service[p]) - float(lam[p])
            if (
                p_wait[p]
                * math.exp(-theta[p] * self.models[int(self.pool_model[p])].queue_timeout_s)
                > TIMEOUT_TAIL_MAX
            ):
                return 0
        # the interval is quiet: draw it
        rng = self.rng
        span = k * dt
        arrivals = rng.poisson(lam * span)
        waiting0 = self.queue.sum(axis=1)
        busy_end = np.zeros(n_pools, dtype=np.int64)
        q_end = np.zeros(n_pools, dtype=np.int64)
        for p in np.nonzero(live)[0].tolist():
            busy_end[p], q_end[p] = stationary_state(
                rng, int(seats[p]), float(offered[p]), float(p_wait[p])
            )
        admitted = waiting0 + arrivals - q_end
        short = admitted < 0
        q_end = np.where(short, waiting0 + arrivals, q_end)
        admitted = np.maximum(admitted, 0)
        # waits of the admitted: Erlang C, binned into age cohorts of dt; those drawn past the
        # queue timeout gave up (rare: a quiet pool's tail beyond it is below TIMEOUT_TAIL_MAX)
        n_wait = rng.binomial(admitted, p_wait)
        timed_out = np.zeros(n_pools, dtype=np.int64)
        for p in np.nonzero(n_wait)[0].tolist():
            timed_out[p] = self._wait_cohorts(p, int(n_wait[p]), float(theta[p]))
        n_wait = n_wait - timed_out
        admitted = admitted - timed_out
        done = self.busy + admitted - busy_end
        busy_end = np.where(done < 0, self.busy + admitted, busy_end)
        done = np.maximum(done, 0)
        self._pending_admit[:, 0] += admitted - n_wait
        self._extra_acc += admitted * extra
        gain = 1.0 - (1.0 - self.warm_gain) ** k
        self.lam_warm += (lam - self.lam_warm) * gain
        coldness = np.clip(1.0 - self.lam_warm / np.maximum(lam, 1e-12), 0.0, 1.0)
        factor = (
            1.0 + self.shape.interference * np.minimum(batch / self.seats_per_replica, 1.0)
        ) * (1.0 + self.shape.cold_penalty * coldness)
        self._factor_acc += admitted * factor
        # completions and counters
        tpot_bin = np.searchsorted(TPOT_EXPORT, tpot / slow_mix)
        self.tpot_hist[self.pool_range, tpot_bin] += done
        self.tpot_sum += done * tpot
        self.ok += done
        self.errors += timed_out
        self.requests += arrivals
        # the drawn state: busy seats (in the lattice's phases) and the queue, all just arrived
        _, p_slow, p_fast = lattice_service(service / dt)
        fast_share = np.where(live, (1.0 / p_fast) / (1.0 / p_fast + 1.0 / p_slow), 0.5)
        self.busy = np.asarray(busy_end, dtype=np.int64)
        self.busy_fast = np.asarray(rng.binomial(self.busy, fast_share), dtype=np.int64)
        self._busy_seen = self.busy.copy()
        self.queue[:] = 0
        self.queue[:, 0] = q_end
        # gauges and run means over the interval
        kv_of = self.kv_tokens_per_seq / np.maximum(ready * self.kv_tokens_per_replica, 1.0)
        self.kv_usage = np.minimum(self.busy * kv_of, 1.0)
        self.kv_usage_sum += np.minimum(offered * kv_of, 1.0) * k
        self.util_sum += (
            np.minimum(lam / np.maximum(ready * self.max_rps_per_replica, 1e-12), 1.0) * k
        )
        self.ready_sum += ready * k
        self.samples += k
        self.lam = lam
        self.tpot_now = tpot
        self.service_now = service
        self.t = round(t0 + span, 9)
        self.step_no += k
        return k

    def _wait_cohorts(self, p: int, n_wait: int, theta: float) -> int:
        """Draw the age cohorts of pool ``p``'s ``n_wait`` waits; the number that timed out.

        Credits the admitted to the TTFT binning (``_pending_admit``) with their
        within-cohort mean wait as the correction.
        """
        dt = self.dt
        decay = math.exp(-theta * dt)
        cached = self._cohort_pv.get(p)
        if cached is not None and cached[0] == decay:
            pv = cached[1]
        else:
            ages = np.arange(self.queue_k, dtype=np.float64)
            raw = (1.0 - decay) * decay**ages
            raw[-1] = 1.0 - float(raw[:-1].sum())
            pv = np.clip(raw, 0.0, 1.0)
            pv.flags.writeable = False
            self._cohort_pv[p] = (decay, pv)
        cohorts = self.rng.multinomial(n_wait, pv)
        late = self.timeout_mask[p].astype(bool)
        timed_out = int(cohorts[late].sum())
        cohorts[late] = 0
        waited = n_wait - timed_out
        self._pending_admit[p] += cohorts
        within = 1.0 / theta - dt * decay / (1.0 - decay)  # mean wait inside a cohort
        corr = waited * within
        self._wait_corr_acc[p] += corr
        self._extra_acc[p] += corr
        return timed_out

    def _warm_gain_over(self, k: int) -> list[float]:
        """Per pool, the prefix-cache warmth's gain over ``k`` steps: 1 - (1 - gain)^k."""
        key = self.warm_gain.tobytes()
        cached = self._warm_gain_k.get(k)
        if cached is not None and cached[0] == key:
            return cached[1]
        gain: list[float] = (1.0 - (1.0 - self.warm_gain) ** k).tolist()
        self._warm_gain_k[k] = (key, gain)
        return gain

    def _serve_interval_few(self, k: int) -> int:
        """``serve_interval`` for a fleet of a few pools, on Python numbers.

        Each NumPy call costs about a microsecond whatever the array's size, and the closed
        form is a few dozen of them: on one pool they were most of a macro step. Here every
        elementwise operation is the same IEEE operation on a Python float (or an exact one on
        a Python int), the transcendental ones (the warmth's power, the cohorts' powers) stay
        NumPy calls on the same arrays, and every draw is the scalar call on the same
        generator in the same order, skipping what the array call skips (``draws``): the
        numbers are the array path's, bit for bit.
        """
        q = self.spec.quiescent
        dt = self.dt
        t0 = self.t
        first = self._offered(round(t0 + dt, 9))
        if first is None:
            return 0
        lam0 = first[0].tolist()
        tol = q.demand_tolerance
        lam1 = lam0
        while k >= 2:
            last = self._routed(round(t0 + k * dt, 9))
            if last is None:
                return 0
            lam1 = last[0].tolist()
            if all(
                abs(b - a) <= tol * (a if a >= b else b) for a, b in zip(lam0, lam1, strict=True)
            ):
                break
            k //= 2
        if k < 2:
            return 0
        pools = range(self.n_pools)
        lam = [(a + b) / 2.0 for a, b in zip(lam0, lam1, strict=True)]
        ready_n = self.ready.tolist()
        seats = [r * s for r, s in zip(ready_n, self.seats_int.tolist(), strict=True)]
        busy = self.busy.tolist()
        live = [x > 0 for x in lam]
        for p in pools:
            if live[p] and ready_n[p] == 0:
                return 0
        if not all(live):
            idle = ~np.array(live)
            if np.count_nonzero(self.busy[idle]) or np.count_nonzero(self.queue[idle]):
                return 0  # a pool losing its load drains on 1-second steps, not stationary
        kv_seats = self.kv_seats_per_replica.tolist()
        for p in pools:
            if seats[p] > ready_n[p] * kv_seats[p]:
                return 0  # the KV cache may overflow: preemptions, not the M/M/c
        sh = self.shape
        ready = [float(r) for r in ready_n]
        inv_ready = [1.0 / (r if r >= 1.0 else 1.0) for r in ready]
        slow_mix = [1.0 + s * i for s, i in zip(self.slow_sum.tolist(), inv_ready, strict=True)]
        per_seq = (sh.prompt_mean + sh.output_mean / 2.0).tolist()  # decode_step_s's tokens
        dec_a = sh.decode_a.tolist()
        dec_b = sh.decode_b.tolist()
        dec_c = sh.decode_c.tolist()
        out_mean = sh.output_mean.tolist()
        prefill = self.prefill_mean.tolist()
        batch = [b * i for b, i in zip(busy, inv_ready, strict=True)]
        tpot = [0.0] * len(lam)
        service = [0.0] * len(lam)
        for it in range(3):  # twice the service at the stationary batch, then the final one
            for p in pools:
                b = batch[p]
                tp = (dec_a[p] + dec_b[p] * (b * per_seq[p]) + dec_c[p] * b) * slow_mix[p]
                tpot[p] = tp
                service[p] = prefill[p] + out_mean[p] * tp
                if it < 2:
                    x = lam[p] * service[p]
                    c = float(seats[p])
                    batch[p] = (x if x <= c else c) * inv_ready[p]
        offered = [a * s for a, s in zip(lam, service, strict=True)]
        max_util = q.max_utilization
        for p in pools:
            if live[p] and offered[p] >= max_util * seats[p]:
                return 0
        p_wait = [0.0] * len(lam)
        theta = [1.0] * len(lam)
        for p in pools:
            if live[p]:
                c = seats[p]
                p_wait[p] = erlang_c(c, offered[p])
                theta[p] = c / service[p] - lam[p]
                timeout_s = self.models[int(self.pool_model[p])].queue_timeout_s
                if p_wait[p] * math.exp(-theta[p] * timeout_s) > TIMEOUT_TAIL_MAX:
                    return 0
        # the interval is quiet: draw it
        rng = self.rng
        span = k * dt
        arrivals = [int(rng.poisson(x * span)) if x * span != 0.0 else 0 for x in lam]
        waiting0 = self.queue.sum(axis=1).tolist()
        busy_end = [0] * len(lam)
        q_end = [0] * len(lam)
        for p in pools:
            if live[p]:
                busy_end[p], q_end[p] = stationary_state(rng, seats[p], offered[p], p_wait[p])
        admitted = [0] * len(lam)
        for p in pools:
            a = waiting0[p] + arrivals[p] - q_end[p]
            if a < 0:
                q_end[p] = waiting0[p] + arrivals[p]
            admitted[p] = a if a > 0 else 0
        n_wait = [
            int(rng.binomial(a, pw)) if a != 0 and pw != 0.0 else 0
            for a, pw in zip(admitted, p_wait, strict=True)
        ]
        # waits of the admitted: Erlang C, binned into age cohorts of dt; those drawn past the
        # queue timeout gave up (rare: a quiet pool's tail beyond it is below TIMEOUT_TAIL_MAX)
        timed_out = [0] * len(lam)
        for p in pools:
            if n_wait[p]:
                timed_out[p] = self._wait_cohorts(p, n_wait[p], theta[p])
        # counters, accumulators and the drawn state, pool by pool: an element's update costs
        # a tenth of an array operation's call
        extra = first[1].tolist()
        gain = self._warm_gain_over(k)
        warm = self.lam_warm.tolist()
        interference = sh.interference.tolist()
        cold_penalty = sh.cold_penalty.tolist()
        per_replica = self.seats_per_replica.tolist()
        per_tok = self.kv_tokens_per_seq.tolist()
        kv_tokens = self.kv_tokens_per_replica.tolist()
        max_rps = self.max_rps_per_replica.tolist()
        kv_usage = [0.0] * len(lam)
        busy_fast = [0] * len(lam)
        pending = self._pending_admit
        extra_acc = self._extra_acc
        factor_acc = self._factor_acc
        tpot_hist = self.tpot_hist
        tpot_sum = self.tpot_sum
        ok = self.ok
        errors = self.errors
        requests = self.requests
        kv_usage_sum = self.kv_usage_sum
        util_sum = self.util_sum
        ready_sum = self.ready_sum
        for p in pools:
            admitted[p] -= timed_out[p]
            d = busy[p] + admitted[p] - busy_end[p]
            if d < 0:
                busy_end[p] = busy[p] + admitted[p]
            done = d if d > 0 else 0
            pending[p, 0] += admitted[p] - (n_wait[p] - timed_out[p])  # admitted, no wait
            extra_acc[p] += admitted[p] * extra[p]
            # prefix-cache warmth over the interval, and the TTFT factor of the admitted
            w = warm[p] + (lam[p] - warm[p]) * gain[p]
            warm[p] = w
            x = lam[p]
            cold = 1.0 - w / (x if x >= 1e-12 else 1e-12)
            cold = 0.0 if cold < 0.0 else (1.0 if cold > 1.0 else cold)
            share = batch[p] / per_replica[p]
            f = (1.0 + interference[p] * (share if share <= 1.0 else 1.0)) * (
                1.0 + cold_penalty[p] * cold
            )
            factor_acc[p] += admitted[p] * f
            # completions and counters
            tpot_hist[p, bisect.bisect_left(TPOT_EDGES, tpot[p] / slow_mix[p])] += done
            tpot_sum[p] += done * tpot[p]
            ok[p] += done
            errors[p] += timed_out[p]
            requests[p] += arrivals[p]
            # the drawn busy seats' lattice phases
            if busy_end[p]:
                share = 0.5
                if live[p]:
                    p_slow, p_fast = _lattice_rates(service[p] / dt)
                    share = (1.0 / p_fast) / (1.0 / p_fast + 1.0 / p_slow)
                busy_fast[p] = int(rng.binomial(busy_end[p], share))
            # gauges and run means over the interval
            room = ready[p] * kv_tokens[p]
            kv_of = per_tok[p] / (room if room >= 1.0 else 1.0)
            u = busy_end[p] * kv_of
            kv_usage[p] = u if u <= 1.0 else 1.0
            u = offered[p] * kv_of
            kv_usage_sum[p] += (u if u <= 1.0 else 1.0) * k
            cap = ready[p] * max_rps[p]
            u = lam[p] / (cap if cap >= 1e-12 else 1e-12)
            util_sum[p] += (u if u <= 1.0 else 1.0) * k
            ready_sum[p] += ready[p] * k
        self.lam_warm[:] = warm
        # the drawn state: busy seats and the queue, all just arrived
        self.busy = np.array(busy_end, dtype=np.int64)
        self.busy_fast = np.array(busy_fast, dtype=np.int64)
        self._busy_seen = self.busy.copy()
        self.queue[:] = 0
        self.queue[:, 0] = q_end
        self.kv_usage = np.array(kv_usage)
        self.samples += k
        self.lam = np.array(lam)
        self.tpot_now = np.array(tpot)
        self.service_now = np.array(service)
        self.t = round(t0 + span, 9)
        self.step_no += k
        return k


TPOT_EDGES: list[float] = TPOT_EXPORT.tolist()


def _lattice_rates(mean_slots: float) -> tuple[float, float]:
    """(p_slow, p_fast) of :func:`firedrill.twin.serving.lattice_service` for one service."""
    m = mean_slots if mean_slots >= 1.0 else 1.0
    if m >= LATTICE_H2_MIN_SLOTS:
        spread = math.sqrt(m / 2.0)
        fast = m - spread
        return 1.0 / (m + spread), 1.0 / (fast if fast >= 1.0 else 1.0)
    geo = 1.0 / m
    return geo, geo


def erlang_c(servers: int, offered: float) -> float:
    """P(wait) of M/M/c with ``servers`` servers and offered load ``offered`` (< servers).

    Through Erlang B = Poisson pmf(c; a) / Poisson cdf(c; a), in logs: stable for the tens of
    thousands of seats of a large pool, where the textbook sum overflows.
    """
    if offered <= 0.0:
        return 0.0
    c = float(servers)
    b = math.exp(c * math.log(offered) - offered - float(gammaln(c + 1.0))) / float(
        pdtr(c, offered)
    )
    return c * b / (c - offered * (1.0 - b))


def stationary_state(
    rng: np.random.Generator, servers: int, offered: float, p_wait: float
) -> tuple[int, int]:
    """(busy servers, queue) drawn from the stationary M/M/c distribution.

    With probability P(wait) every server is busy and the queue is geometric; otherwise the
    number busy is Poisson(a) conditioned below c (drawn by rejection: a quiet pool has
    a < c, so a draw is accepted with probability above 0.38).
    """
    if rng.random() < p_wait:
        rho = offered / servers
        return servers, int(rng.geometric(1.0 - rho)) - 1
    for _ in range(REJECTION_TRIES):
        n = int(rng.poisson(offered))
        if n < servers:
            return n, 0
    return servers - 1, 0


REJECTION_TRIES = 200


__all__ = ["Quiescent", "erlang_c", "stationary_state"]
