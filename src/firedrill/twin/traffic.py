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

from firedrill.twin.replica import ReplicaState
from firedrill.twin.scheduling import Scheduling
from firedrill.twin.serving import decode_step_s
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
        w = self.weights * ~self.cell_quarantined  # [models, cells]
        local = w[:, None, :] * self.region_mask[None, :, :]  # [models, regions, cells]
        local_sum = local.sum(axis=2, keepdims=True)
        glob = w[:, None, :] / np.maximum(w.sum(axis=1), 1e-300)[:, None, None]
        share = np.where(local_sum > 0, local / np.maximum(local_sum, 1e-300), glob)
        if self.recovery.homing.rerouting:
            share = self.recovery.homing.reroute(share, w)
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
        arrivals = self.rng.poisson((lam + lost) * self.dt)
        n_lost = None
        if lost.any():
            n_lost = self.rng.binomial(arrivals, lost / np.maximum(lam + lost, 1e-12))
            arrivals = arrivals - n_lost
        serving = self.ready  # replicas with seats: a disaggregated pool's decode replicas
        if self.pd is not None:
            arrivals, extra, n_lost, serving = self.pd.prefill(arrivals, extra, n_lost, coldness)
        ready = serving.astype(np.float64)
        seats = serving * self.seats_int
        no_capacity = serving == 0
        dropped = None
        if no_capacity.any():
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
        p_done = self.dt / service
        if overflow.any():
            p_done = p_done * (1.0 - overflow / np.maximum(self.busy, 1))
            self.preemptions += self.rng.poisson(overflow * 0.05 * self.dt)
        done = self.rng.binomial(self.busy, np.minimum(p_done, 1.0))
        self.busy -= done
        # queue: age cohorts, time out the oldest, admit FIFO
        q = self.queue
        q[:, 1:] = q[:, :-1]
        q[:, 0] = arrivals
        free = np.maximum(seats - self.busy, 0)
        if q[:, 1:].any():
            expired = q * self.timeout_mask
            timed_out = expired.sum(axis=1)
            q -= expired
            admitted_by_age = _admit(q, free)
            admitted = admitted_by_age.sum(axis=1)
            self._pending_admit += admitted_by_age
        else:
            timed_out = self._zeros_i
            admitted = np.minimum(arrivals, free)
            q[:, 0] -= admitted
            self._pending_admit[:, 0] += admitted
        self.busy += admitted
        factor = (
            1.0 + self.shape.interference * np.minimum(batch / self.seats_per_replica, 1.0)
        ) * (1.0 + self.shape.cold_penalty * coldness)
        self._factor_acc += admitted * factor
        self._extra_acc += admitted * extra
        # completions: TPOT histogram (one observation per finished request), success counters
        tpot_bin = np.searchsorted(TPOT_EXPORT, tpot / slow_mix)
        np.add.at(self.tpot_hist, (self.pool_range, tpot_bin), done)
        self.tpot_sum += done * tpot
        if self.error_fraction.any():
            failed = self.rng.binomial(done, self.error_fraction)
            self.errors += failed  # counted as requests when they arrived
            done = done - failed
        self.ok += done
        fails = timed_out
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

    def _partition_losses(self, flow: F64, lam: F64, lost: F64) -> tuple[F64, F64]:
        """Traffic that crosses a cut (region-region) or enters a cut-off region (edge) fails.

        A region's users normally enter through its own edge and cross the backbone to reach
        another region's cells. When that region is cut from the edge (a blackhole), the global
        edge sends its users straight to the other regions, so the backbone cut no longer lies on
        their path.
        """
        lam = lam.copy()
        lost = lost.copy()
        nc = len(self.cell_names)
        for mi in range(len(self.models)):
            for ri in range(len(self.region_names)):
                if ("region-edge", self.region_names[ri], "edge") in self.partitions:
                    continue
                for ci in range(nc):
                    f = flow[mi, ri, ci]
                    if f > 0 and self.regions_cut(ri, self.cell_region[ci]):
                        lam[mi * nc + ci] -= f
                        lost[mi * nc + ci] += f
        for ci in range(nc):
            if ("region-edge", self.region_names[self.cell_region[ci]], "edge") in self.partitions:
                for mi in range(len(self.models)):
                    p = mi * nc + ci
                    lost[p] += lam[p]
                    lam[p] = 0.0
        return np.maximum(lam, 0.0), lost

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
        self.queue_wait_sum += pend @ self.age_wait_s
        self.admitted_total += n
        length = self.rng.binomial(n, 0.1)
        self.success_length += length
        self.success_stop += n - length
        self.generation_tokens += n * self.shape.output_mean
        pend[:] = 0
        self._factor_acc[:] = 0.0
        self._extra_acc[:] = 0.0

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


def _admit(queue: I64, free: I64) -> I64:
    oldest_first = queue[:, ::-1]
    cum = np.cumsum(oldest_first, axis=1)
    take = np.clip(free[:, None] - (cum - oldest_first), 0, oldest_first)
    queue -= take[:, ::-1]
    out: I64 = take[:, ::-1]
    return out
