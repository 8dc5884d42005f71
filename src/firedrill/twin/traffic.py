"""Traffic: routing the offered load to cells and serving it, one vectorised step at a time.

Demand per product and region is routed to cells by the route weights (locality first), loses
what crosses a network cut, and arrives at each pool's FIFO of age cohorts. Ready replicas serve
it with batch-dependent decode speed and KV-cache overflow (preemptions); the oldest waiting
requests are admitted to free seats and time out past the model's queue timeout. TTFT is binned
at each flush (every scrape), with the cold-cache and chunked-prefill penalties of the moment
each request was admitted.
"""

from __future__ import annotations

import numpy as np

from firedrill.twin.draws import binomial, poisson
from firedrill.twin.replica import ReplicaState
from firedrill.twin.scheduling import Scheduling
from firedrill.twin.serving import decode_step_s, lattice_service, queue_substeps
from firedrill.twin.state import F64, I64, TPOT_EXPORT

READY = ReplicaState.READY
CROSS_REGION_RTT_S = 0.07
OOM_CRASH_PER_S = 1.0 / 900.0  # crash rate of a replica whose gpu_memory_utilization is too high


class Traffic(Scheduling):
    """Routing, serving and the TTFT/TPOT histograms."""

    def routing_matrix(self) -> tuple[F64, F64]:
        """Per model: share of each region's demand sent to each cell, and the cross-region mask.

        Locality first: a region's demand goes to its own cells in proportion to their route
        weights; a region whose cells all have weight 0 (drained, quarantined) spills to every
        other cell in proportion to theirs.
        """
        homing = self.recovery.homing
        # it changes only with the weights, quarantines and region weights: computed once for
        # each of their values (the result is read-only, shared by every step until then)
        key = (
            self.weights.tobytes(),
            self.cell_quarantined.tobytes(),
            homing.home.tobytes() if homing.rerouting else b"",
        )
        if key == self._routing_key:
            return self._routing_share, self.cross_mask
        w = self.weights * ~self.cell_quarantined  # [models, cells]
        local = w[:, None, :] * self.region_mask[None, :, :]  # [models, regions, cells]
        local_sum = local.sum(axis=2, keepdims=True)
        glob = w[:, None, :] / np.maximum(w.sum(axis=1), 1e-300)[:, None, None]
        share = np.where(local_sum > 0, local / np.maximum(local_sum, 1e-300), glob)
        if homing.rerouting:
            share = homing.reroute(share, w)
        share.flags.writeable = False
        self._routing_key = key
        self._routing_share = share
        return share, self.cross_mask

    def _serve(self) -> None:
        nc = len(self.cell_names)
        rps = self.demand.rps(self.t)  # [products, regions]
        d_model = self.product_to_model @ rps  # [models, regions]
        share, cross = self.routing_matrix()
        flow = d_model[:, :, None] * share  # [models, regions, cells]
        routed = flow.sum(axis=1)
        unrouted = d_model.sum(axis=1) - routed.sum(axis=1)  # models with no weight anywhere
        lam = routed.reshape(-1)
        lost = np.repeat(np.maximum(unrouted, 0.0) / nc, nc)
        if self.partitions:
            lam, lost = self._partition_losses(flow, lam, lost)
        rtt = (flow * cross[None, :, :]).sum(axis=1).reshape(-1) * CROSS_REGION_RTT_S
        extra = rtt / np.maximum(lam, 1e-12)
        self.lam = lam
        if self.step_no == 1:
            self.lam_warm = lam.copy()  # the run starts with warm prefix caches
        # prefix-cache warmth: traffic above its recent level arrives cold
        self.lam_warm += (lam - self.lam_warm) * self.warm_gain
        if self.recovery.homing.mirroring:
            self.recovery.homing.warm(d_model)
        coldness = np.clip(1.0 - self.lam_warm / np.maximum(lam, 1e-12), 0.0, 1.0)
        arrivals = poisson(self.rng, (lam + lost) * self.dt)
        n_lost = None
        if np.count_nonzero(lost):
            n_lost = binomial(self.rng, arrivals, lost / np.maximum(lam + lost, 1e-12))
            arrivals = arrivals - n_lost
        failed_fast = None
        if np.count_nonzero(self.error_fraction) and np.count_nonzero(self.error_fail_fast):
            # a fail-fast 5xx is answered at once: it never waits for, nor holds, a seat
            failed_fast = binomial(self.rng, arrivals, self.error_fraction * self.error_fail_fast)
            arrivals = arrivals - failed_fast
        serving = self.ready  # replicas with seats: a disaggregated pool's decode replicas
        if self.pd is not None:
            arrivals, extra, n_lost, serving = self.pd.prefill(arrivals, extra, n_lost, coldness)
        ready = serving.astype(np.float64)
        seats = serving * self.seats_int
        no_capacity = serving == 0
        dropped = None
        if np.count_nonzero(no_capacity):
            # requests with nowhere to go fail at the gateway, and so does the queue
            dropped = np.where(no_capacity, arrivals + self.queue.sum(axis=1), 0)
            arrivals = np.where(no_capacity, 0, arrivals)
            self.queue[no_capacity] = 0
            self.busy[no_capacity] = 0
        # service: completions, with batch-dependent decode speed and KV overflow
        inv_ready = 1.0 / np.maximum(ready, 1.0)
        batch = self.busy * inv_ready
        slow_mix = 1.0 + self.slow_sum * inv_ready
        tpot = decode_step_s(self.shape, batch) * slow_mix
        prefill_s = self.prefill_mean if self.pd is None else self.pd.service_prefill
        service = prefill_s + self.shape.output_mean * tpot
        overflow = np.maximum(self.busy - ready * self.kv_seats_per_replica, 0.0)
        keep = None
        if np.count_nonzero(overflow):
            keep = 1.0 - overflow / np.maximum(self.busy, 1)
            self.preemptions += poisson(self.rng, overflow * 0.05 * self.dt)
        # queue: age cohorts, time out the oldest; completions and FIFO admissions in sub-steps
        q = self.queue
        q[:, 1:] = q[:, :-1]
        q[:, 0] = 0
        timed_out = self._zeros_i
        if np.count_nonzero(q[:, 1:]):
            expired = q * self.timeout_mask
            timed_out = expired.sum(axis=1)
            q -= expired
        done, admitted, wait_corr = self._queue_arithmetic(
            service, keep, seats, arrivals, q[:, 1:].sum(axis=1)
        )
        q[:, 0] = arrivals
        if np.count_nonzero(q[:, 1:]):
            self._pending_admit += _admit(q, admitted)
        else:
            q[:, 0] -= admitted
            self._pending_admit[:, 0] += admitted
        self._wait_corr_acc += wait_corr
        self._extra_acc += wait_corr
        factor = (
            1.0 + self.shape.interference * np.minimum(batch / self.seats_per_replica, 1.0)
        ) * (1.0 + self.shape.cold_penalty * coldness)
        self._factor_acc += admitted * factor
        self._extra_acc += admitted * extra
        # completions: TPOT histogram (one observation per finished request), success counters
        tpot_bin = np.searchsorted(TPOT_EXPORT, tpot / slow_mix)
        self.tpot_hist[self.pool_range, tpot_bin] += done  # one bin per pool: no repeats
        self.tpot_sum += done * tpot
        if np.count_nonzero(self.error_fraction) and not self.error_fail_fast.all():
            # a hanging 5xx held its seat for the whole service and fails at the end
            failed = binomial(self.rng, done, self.error_fraction * ~self.error_fail_fast)
            self.errors += failed  # counted as requests when they arrived
            done = done - failed
        self.ok += done
        fails = timed_out
        if failed_fast is not None:
            fails = fails + failed_fast
        if dropped is not None:
            fails = fails + dropped
        if n_lost is not None:
            fails = fails + n_lost
        self.errors += fails
        self.requests += arrivals + (fails - timed_out)
        # gauges and run means
        self.kv_usage = np.minimum(
            self.busy
            * self.kv_tokens_per_seq
            / np.maximum(ready * self.kv_tokens_per_replica, 1.0),
            1.0,
        )
        self.kv_usage_sum += self.kv_usage
        # every ready replica, the prefill ones of a disaggregated pool too
        ready_all = ready if serving is self.ready else self.ready.astype(np.float64)
        self.util_sum += np.minimum(
            lam / np.maximum(ready_all * self.max_rps_per_replica, 1e-12), 1.0
        )
        self.ready_sum += ready_all
        self.samples += 1
        self.tpot_now = tpot
        self.service_now = service
        if self._oom_models:
            self._oom_crashes()

    def _queue_arithmetic(
        self, service: F64, keep: F64 | None, seats: I64, arrivals: I64, waiting: I64
    ) -> tuple[I64, I64, F64]:
        """Completions and admissions of one step: (completed, admitted, wait correction).

        Each busy seat is in the slow or the fast phase of the lattice service (see
        :func:`firedrill.twin.serving.lattice_service`); the step runs in sub-steps when its
        services are short, arrivals spread evenly over them. ``waiting`` is the queue left from
        earlier steps. The wait correction is the queue's area within the step at sub-step
        resolution minus the whole step the age cohorts credit to those still waiting; it is
        zero without sub-steps and makes the waits of the admitted add up to the queue's area.
        """
        rng = self.rng
        busy = self.busy
        fast = self.busy_fast
        moved = busy != self._busy_seen  # a crash or a gateway drop took seats since last step
        if np.count_nonzero(moved):
            fast = np.where(moved, fast * busy // np.maximum(self._busy_seen, 1), fast)
        fast = np.minimum(fast, busy)
        slow = busy - fast
        contended = (waiting > 0) | (arrivals > seats - busy)
        n = 1
        if np.count_nonzero(contended):
            n = queue_substeps(self.dt, float(service[contended].min()))
        h = self.dt / n
        pi, p1, p2 = lattice_service(service / h)
        if keep is not None:
            p1 = p1 * keep
            p2 = p2 * keep
        if self.n_pools <= SCALAR_POOLS and _all_int64(slow, fast, seats, waiting, arrivals):
            done, admitted, slow, fast, waiting, area = _substeps_scalar(
                rng, n, slow, fast, seats, waiting, arrivals, (p1, p2, pi)
            )
        else:
            done = self._zeros_i
            admitted = self._zeros_i
            area = self._zeros_i
            left = arrivals
            for j in range(n):
                d_slow = binomial(rng, slow, p1)
                d_fast = binomial(rng, fast, p2)
                slow = slow - d_slow
                fast = fast - d_fast
                done = done + d_slow + d_fast
                if n == 1:
                    arrive = arrivals
                else:
                    arrive = binomial(rng, left, 1.0 / (n - j))
                    left = left - arrive
                waiting = waiting + arrive
                x = np.minimum(np.maximum(seats - slow - fast, 0), waiting)
                waiting = waiting - x
                x_slow = binomial(rng, x, pi)
                slow = slow + x_slow
                fast = fast + np.asarray(x - x_slow, dtype=np.int64)
                admitted = admitted + x
                if n > 1:
                    area = area + waiting
        self.busy = slow + fast
        self.busy_fast = fast
        self._busy_seen = self.busy.copy()
        if n == 1:
            return done, admitted, self._zeros_f
        corr: F64 = area * h - waiting * self.dt
        return done, admitted, corr

    def _partition_losses(self, flow: F64, lam: F64, lost: F64) -> tuple[F64, F64]:
        """Traffic that crosses a cut (region-region) or enters a cut-off region (edge) fails.

        A region's users normally enter through its own edge and cross the backbone to reach
        another region's cells. When that region is cut from the edge (a blackhole), the global
        edge sends its users straight to the other regions, so the backbone cut no longer lies on
        their path.
        """
        lam = lam.copy()
        lost = lost.copy()
        key = frozenset(self.partitions)
        if key != self._cuts_key:
            self._cuts = self._plan_cuts()
            self._cuts_key = key
        crossing, edge_cut = self._cuts
        for mi, ri, ci, p in crossing:
            f = flow[mi, ri, ci]
            if f > 0:
                lam[p] -= f
                lost[p] += f
        for p in edge_cut:
            lost[p] += lam[p]
            lam[p] = 0.0
        return np.maximum(lam, 0.0), lost

    def _plan_cuts(self) -> tuple[list[tuple[int, int, int, int]], list[int]]:
        """For the partitions of the moment: the (model, region, cell, pool) routes that cross a
        cut, and the pools of regions cut off from the edge, in the order the losses apply."""
        nc = len(self.cell_names)
        crossing = []
        for mi in range(len(self.models)):
            for ri in range(len(self.region_names)):
                if ("region-edge", self.region_names[ri], "edge") in self.partitions:
                    continue
                for ci in range(nc):
                    if self.regions_cut(ri, self.cell_region[ci]):
                        crossing.append((mi, ri, ci, mi * nc + ci))
        edge_cut = [
            mi * nc + ci
            for ci in range(nc)
            if ("region-edge", self.region_names[self.cell_region[ci]], "edge") in self.partitions
            for mi in range(len(self.models))
        ]
        return crossing, edge_cut

    def flush_ttft(self) -> None:
        """Bin the requests admitted since the last flush into the TTFT histogram."""
        pend = self._pending_admit
        n = pend.sum(axis=1)
        if not n.any():
            return
        factor = self._factor_acc / np.maximum(n, 1)
        extra = self._extra_acc / np.maximum(n, 1)
        counts, sums = self.binner.bin(self.rng, pend, factor, extra)
        self.ttft_hist += counts
        self.ttft_sum += sums
        self.queue_wait_sum += pend @ self.age_wait_s + self._wait_corr_acc
        self.admitted_total += n
        length = binomial(self.rng, n, 0.1)
        self.success_length += length
        self.success_stop += n - length
        self.generation_tokens += n * self.shape.output_mean
        pend[:] = 0
        self._factor_acc[:] = 0.0
        self._extra_acc[:] = 0.0
        self._wait_corr_acc[:] = 0.0

    def _oom_crashes(self) -> None:
        for p in range(self.n_pools):
            if int(self.pool_model[p]) not in self._oom_models or self.ready[p] == 0:
                continue
            k = int(self.rng.poisson(self.ready[p] * OOM_CRASH_PER_S * self.dt))
            if k == 0:
                continue
            ready = sorted(r for r in self.pool_replicas[p] if self.replicas[r].state is READY)
            for rid in ready[:k]:
                self.preemptions[p] += 1
                self._crash(self.replicas[rid], fatal=False)


SCALAR_POOLS = 4  # up to this many pools, the sub-steps run on Python ints (see below)


def _all_int64(*arrays: I64) -> bool:
    return all(a.dtype == np.int64 for a in arrays)


def _substeps_scalar(
    rng: np.random.Generator,
    n: int,
    slow_a: I64,
    fast_a: I64,
    seats_a: I64,
    waiting_a: I64,
    arrivals_a: I64,
    probs: tuple[F64, F64, F64],
) -> tuple[I64, I64, I64, I64, I64, I64]:
    """The sub-step loop of ``_queue_arithmetic`` on Python ints, for a fleet of a few pools.

    Each numpy operation costs about a microsecond whatever the size, so on one to a few pools
    the loop's dozen array operations per sub-step were most of the step. Here every quantity is
    an integer (exact either way) and every draw is the scalar call on the same generator, in
    the same order (all pools' slow-phase completions, then fast, then arrivals, then phases of
    the admitted, sub-step after sub-step), skipping zeros as numpy does: the numbers are the
    array loop's, bit for bit. Returns (done, admitted, slow, fast, waiting, area) as arrays.
    """
    draw = rng.binomial
    p1, p2, pi = (p.tolist() for p in probs)
    slow = slow_a.tolist()
    fast = fast_a.tolist()
    seats = seats_a.tolist()
    waiting = waiting_a.tolist()
    left = arrivals_a.tolist()
    pools = len(slow)
    done = [0] * pools
    admitted = [0] * pools
    area = [0] * pools
    for j in range(n):
        d_slow = [draw(k, p) if k else 0 for k, p in zip(slow, p1, strict=True)]
        d_fast = [draw(k, p) if k else 0 for k, p in zip(fast, p2, strict=True)]
        for i in range(pools):
            slow[i] -= d_slow[i]
            fast[i] -= d_fast[i]
            done[i] += d_slow[i] + d_fast[i]
        if n == 1:
            arrive = left
        else:
            share = 1.0 / (n - j)
            arrive = [draw(k, share) if k else 0 for k in left]
            left = [a - b for a, b in zip(left, arrive, strict=True)]
        x = [0] * pools
        for i in range(pools):
            w = waiting[i] + arrive[i]
            x[i] = min(max(seats[i] - slow[i] - fast[i], 0), w)
            waiting[i] = w - x[i]
        x_slow = [draw(k, p) if k else 0 for k, p in zip(x, pi, strict=True)]
        for i in range(pools):
            slow[i] += x_slow[i]
            fast[i] += x[i] - x_slow[i]
            admitted[i] += x[i]
            if n > 1:
                area[i] += waiting[i]

    def arr(v: list[int]) -> I64:
        return np.array(v, dtype=np.int64)

    return arr(done), arr(admitted), arr(slow), arr(fast), arr(waiting), arr(area)


def _admit(queue: I64, free: I64) -> I64:
    oldest_first = queue[:, ::-1]
    cum = np.cumsum(oldest_first, axis=1)
    take = np.clip(free[:, None] - (cum - oldest_first), 0, oldest_first)
    queue -= take[:, ::-1]
    out: I64 = take[:, ::-1]
    return out
