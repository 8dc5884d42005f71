"""Serving physics of a pool of identical vLLM replicas: seats, latency curve, queue, TTFT.

A pool is one model in one cell. Its replicas are modelled together (vectorised over pools) rather
than request by request, which is what makes 10,000 nodes for 24 hours affordable:

* **Seats** are concurrent sequences: ``max_num_seqs`` per replica, while the KV cache holds them.
  When ``max_num_seqs`` asks for more sequences than ``gpu_memory_utilization`` leaves KV room for,
  vLLM admits them and then preempts: the twin counts preemptions and loses throughput.
* **Queue**: a discrete-time birth–death process on seats (Poisson arrivals, FIFO admission) whose
  service time, counted in slots, has the exponential's mean *and* variance. A single completion
  probability per slot (the Geo/Geo/c queue) has a service variance short by the factor 1 − dt·μ,
  which biases waits low by about dt·μ/2 under load (−25% at 2 s services and 1 s steps). So each
  admitted request draws one of two completion probabilities (a two-phase mixture,
  :func:`lattice_service`), and a step in which a pool's services are shorter than
  ``MIN_SLOTS_PER_SERVICE`` slots *and* requests may have to wait (a queue, or more arrivals than
  free seats) runs its queue arithmetic (completions and admissions only) in sub-steps; a pool
  with room for every arrival admits them at once however the step is cut, so idle pools cost
  nothing more. The mean wait
  stays within 5% of Erlang C from 1 s to 30 s services (``tests/twin/test_fidelity.py``). The
  service rate μ depends on the batch, through the decode step of the DistServe curve, so under
  load the queue behaves like the state-dependent M/M/c that continuous batching is.
* **Latency curve** (DistServe): prefill = a + b·Σlen + c·Σlen²; decode step = a + b·Σtokens +
  c·batch. Prompt lengths are lognormal, so TTFT at low load is the prefill-time distribution.
* **TTFT** = queue wait + prefill × (batch interference) × (cold prefix-cache penalty) + RTT.
  Requests are binned into a fine histogram by sampling a multinomial over the bins, so bucket
  counters are integers like a real exporter's.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from firedrill.model.spec import GPU_MEMORY_GB, VLLM_TPOT_BUCKETS_S, VLLM_TTFT_BUCKETS_S, ModelSpec

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

ACTIVATION_OVERHEAD = 0.08  # share of usable HBM vLLM keeps for activations and CUDA graphs


def fine_edges() -> F64:
    """Internal histogram edges: log-spaced from 1 ms to 2,560 s, plus vLLM's exact buckets."""
    grid = np.geomspace(1e-3, 2560.0, 241)
    return np.unique(np.concatenate([grid, np.array(VLLM_TTFT_BUCKETS_S), VLLM_TPOT_BUCKETS_S]))


@dataclass(frozen=True)
class PoolShape:
    """Per-pool constants derived from the model spec (arrays over pools)."""

    prefill_a: F64
    prefill_b: F64
    prefill_c: F64
    decode_a: F64
    decode_b: F64
    decode_c: F64
    interference: F64
    cold_penalty: F64
    prompt_mu: F64  # ln(median prompt tokens)
    prompt_sigma: F64
    prompt_mean: F64  # E[L]
    prompt_sq_mean: F64  # E[L^2]
    output_mean: F64


def kv_capacity_tokens(model: ModelSpec, gpu: str, gpu_memory_utilization: float) -> float:
    """KV-cache tokens one replica holds: usable HBM minus weights and activations."""
    hbm_gb = GPU_MEMORY_GB[gpu] * model.tp
    usable_gb = hbm_gb * gpu_memory_utilization * (1 - ACTIVATION_OVERHEAD) - model.weights_gb
    return max(0.0, usable_gb * 1e9 / model.kv_bytes_per_token)


def mean_prefill_s(shape: PoolShape) -> F64:
    """E[prefill] over the lognormal prompt distribution (exact for the quadratic curve)."""
    return (
        shape.prefill_a
        + shape.prefill_b * shape.prompt_mean
        + shape.prefill_c * (shape.prompt_sq_mean)
    )


def decode_step_s(shape: PoolShape, batch: F64) -> F64:
    """Seconds per decode step of a replica with ``batch`` running sequences."""
    tokens = batch * (shape.prompt_mean + shape.output_mean / 2.0)
    return shape.decode_a + shape.decode_b * tokens + shape.decode_c * batch


def prefill_cdf(shape_idx: I64, shape: PoolShape, budget_s: F64, factor: F64) -> F64:
    """P(prefill × factor ≤ budget) per row; ``budget_s`` is [rows, edges], factor [rows]."""
    a = shape.prefill_a[shape_idx][:, None]
    b = shape.prefill_b[shape_idx][:, None]
    c = shape.prefill_c[shape_idx][:, None]
    x = budget_s / factor[:, None] - a  # seconds left for the length-dependent part
    with np.errstate(invalid="ignore", divide="ignore"):
        quad = (-b + np.sqrt(np.maximum(b * b + 4.0 * c * x, 0.0))) / (2.0 * np.maximum(c, 1e-30))
        lin = x / np.maximum(b, 1e-30)
        length = np.where(c > 0, quad, lin)
        z = (np.log(np.maximum(length, 1e-12)) - shape.prompt_mu[shape_idx][:, None]) / np.maximum(
            shape.prompt_sigma[shape_idx][:, None], 1e-9
        )
    out: F64 = np.where(x > 0, ndtr(z), 0.0)
    return out


MIN_SLOTS_PER_SERVICE = 8.0  # fewer slots per mean service than this: sub-step the queue
MAX_SUBSTEPS = 16
LATTICE_H2_MIN_SLOTS = 2.0  # below it no two-phase lattice on slots >= 1 has variance m²


def queue_substeps(dt_s: float, shortest_service_s: float) -> int:
    """Sub-steps of the queue arithmetic so that a service lasts at least 8 slots (at most 16).

    With fewer slots per service the lattice's shape, not only its two moments, shows in the
    wait: at 4 slots the mean wait is 5-8% short at 50-70% utilisation, at 8 slots 2-6%.
    """
    if not shortest_service_s > 0:
        return MAX_SUBSTEPS
    need = math.ceil(MIN_SLOTS_PER_SERVICE * dt_s / shortest_service_s - 1e-9)
    return max(1, min(MAX_SUBSTEPS, need))


def lattice_service(mean_slots: F64) -> tuple[F64, F64, F64]:
    """A service time on slots with the exponential's mean ``m`` and variance ``m²``.

    A request is in one of two phases with equal probability, completing each slot with
    probability 1/a or 1/b (geometric on 1, 2, …), a = m − √(m/2), b = m + √(m/2): the mean is
    (a + b)/2 = m and the second moment ½Σ(2x² − x) = 2m², the exponential's. The phase is
    drawn with probability ½ whatever the slot length, so a request admitted in a step cut into
    sub-steps and served in whole steps (or the reverse) keeps the mean. It needs m ≥ 2 (a ≥ 1);
    below it the plain geometric is the closest. Returns (P(slow phase), p_slow, p_fast).
    """
    m = np.maximum(mean_slots, 1.0)
    spread = np.sqrt(m / 2.0)
    ok = m >= LATTICE_H2_MIN_SLOTS
    geo = 1.0 / m
    p_slow: F64 = np.where(ok, 1.0 / (m + spread), geo)
    p_fast: F64 = np.where(ok, 1.0 / np.maximum(m - spread, 1.0), geo)
    half: F64 = np.full_like(m, 0.5)
    return half, p_slow, p_fast


def admit_fifo(queue: I64, free: I64) -> tuple[I64, I64]:
    """Admit up to ``free`` requests per pool, oldest cohort first.

    ``queue`` is [pools, ages] with age 0 the newest cohort. Returns (admitted per cohort, rest).
    """
    oldest_first = queue[:, ::-1]
    cum = np.cumsum(oldest_first, axis=1)
    before = cum - oldest_first
    take = np.clip(free[:, None] - before, 0, oldest_first)
    admitted = take[:, ::-1]
    return admitted, queue - admitted


class TtftBinner:
    """Turns admitted cohorts into TTFT histogram counts on the fine edges."""

    def __init__(self, shape: PoolShape, dt_s: float) -> None:
        self.shape = shape
        self.dt_s = dt_s
        self.edges = fine_edges()
        self._edges_list: list[float] = self.edges.tolist()
        self._prefill_key: tuple[bytes, ...] = ()
        self._long_prefill: F64 = np.zeros(0)
        self._mean_prefill: F64 = np.zeros(0)

    def _prefills(self) -> tuple[F64, F64]:
        """Per pool: the prefill of a prompt 4.5 sigma long, and the mean prefill.

        Computed again only when the shape's arrays change (a request-shape change writes
        them in place).
        """
        sh = self.shape
        key = tuple(
            a.tobytes()
            for a in (
                sh.prefill_a,
                sh.prefill_b,
                sh.prefill_c,
                sh.prompt_mu,
                sh.prompt_sigma,
                sh.prompt_mean,
                sh.prompt_sq_mean,
            )
        )
        if key != self._prefill_key:
            long_len = np.exp(sh.prompt_mu + 4.5 * sh.prompt_sigma)
            self._long_prefill = sh.prefill_a + sh.prefill_b * long_len + sh.prefill_c * long_len**2
            self._mean_prefill = mean_prefill_s(sh)
            self._prefill_key = key
        return self._long_prefill, self._mean_prefill

    def bin(
        self,
        rng: np.random.Generator,
        admitted: I64,
        factor: F64,
        extra_s: F64,
    ) -> tuple[I64, F64]:
        """Histogram counts [pools, bins+1] (last = overflow) and the TTFT sum per pool.

        Only the edges that can be reached are evaluated: from the shortest wait plus the
        shortest prefill to the longest wait plus the prefill of a prompt 4.5 sigma long (the
        mass beyond it, < 4e-6, lands in the last bin evaluated).
        """
        pools, _ = admitted.shape
        nbins = self.edges.size + 1
        counts = np.zeros((pools, nbins), dtype=np.int64)
        sums = np.zeros(pools)
        rows_p, rows_k = np.nonzero(admitted)
        if rows_p.size == 0:
            return counts, sums
        n = admitted[rows_p, rows_k]
        sh = self.shape
        long_prefill, mean_prefill = self._prefills()
        one = int(rows_p[0]) if rows_p[0] == rows_p[-1] else -1  # rows in one pool only
        if one >= 0:  # its constants broadcast as Python floats: the same values, fewer calls
            f1 = float(factor[one])
            wait = np.maximum(rows_k * self.dt_s + float(extra_s[one]), 0.0)
            shortest = float(wait.min()) + float(sh.prefill_a[one]) * f1
            longest = float(wait.max()) + f1 * float(long_prefill[one])
        else:
            f = factor[rows_p]
            wait = np.maximum(rows_k * self.dt_s + extra_s[rows_p], 0.0)
            shortest = float((wait + sh.prefill_a[rows_p] * f).min())
            longest = float((wait + f * long_prefill[rows_p]).max())
        lo = max(bisect.bisect_left(self._edges_list, shortest) - 1, 0)
        hi = min(bisect.bisect_right(self._edges_list, longest) + 1, self.edges.size)
        budget = self.edges[lo:hi][None, :] - wait[:, None]
        if one >= 0:
            cdf = _prefill_cdf_one(sh, one, budget, f1)
        else:
            cdf = prefill_cdf(rows_p, sh, budget, f)
        cdf[:, -1] = 1.0
        # the cdf's steps (from 0), clipped to [0, 1] and normalised per row
        pvals = np.empty_like(cdf)
        pvals[:, 0] = cdf[:, 0]
        np.subtract(cdf[:, 1:], cdf[:, :-1], out=pvals[:, 1:])
        np.clip(pvals, 0.0, 1.0, out=pvals)
        pvals /= pvals.sum(axis=1, keepdims=True)
        sampled = rng.multinomial(n, pvals)
        if one >= 0:
            counts[one, lo:hi] = sampled.sum(axis=0)
            total = 0.0  # in row order, as np.add.at adds
            for x in (n * (wait + float(mean_prefill[one]) * f1)).tolist():
                total += x
            sums[one] = total
            return counts, sums
        np.add.at(counts, (rows_p[:, None], np.arange(lo, hi)[None, :]), sampled)
        mean_ttft = wait + mean_prefill[rows_p] * f
        np.add.at(sums, rows_p, n * mean_ttft)
        return counts, sums


def _prefill_cdf_one(shape: PoolShape, pool: int, budget_s: F64, factor: float) -> F64:
    """:func:`prefill_cdf` for rows of one pool: its constants as Python floats.

    The same operations in the same order, element by element, so the same values.
    """
    a = float(shape.prefill_a[pool])
    b = float(shape.prefill_b[pool])
    c = float(shape.prefill_c[pool])
    x = budget_s / factor - a  # seconds left for the length-dependent part
    with np.errstate(invalid="ignore", divide="ignore"):
        if c > 0:
            length = (-b + np.sqrt(np.maximum(b * b + 4.0 * c * x, 0.0))) / (2.0 * max(c, 1e-30))
        else:
            length = x / max(b, 1e-30)
        z = (np.log(np.maximum(length, 1e-12)) - float(shape.prompt_mu[pool])) / max(
            float(shape.prompt_sigma[pool]), 1e-9
        )
    out: F64 = np.where(x > 0, ndtr(z), 0.0)
    return out


def erlang_c_wait_s(servers: int, arrival_rps: float, service_s: float) -> float:
    """Mean queue wait of M/M/c (Erlang C), for checks and the fidelity test."""
    a = arrival_rps * service_s
    if a >= servers:
        return float("inf")
    term = 1.0
    total = 1.0
    for k in range(1, servers):
        term *= a / k
        total += term
    top = term * a / servers * servers / (servers - a)
    p_wait = top / (total + top)
    return p_wait / (servers / service_s - arrival_rps)


def quantile_from_hist(counts: npt.NDArray[np.int64], edges: F64, q: float) -> float:
    """Quantile of a histogram on ``edges`` (last bin: overflow), log-linear within a bin."""
    total = int(counts.sum())
    if total == 0:
        return float("nan")
    target = q * total
    cum = np.cumsum(counts)
    i = int(np.searchsorted(cum, target, side="left"))
    if i >= edges.size:
        return float(edges[-1])
    lo = edges[i - 1] if i > 0 else edges[0] / 2
    hi = edges[i]
    prev = cum[i - 1] if i > 0 else 0
    inbin = counts[i]
    frac = 0.5 if inbin == 0 else (target - prev) / inbin
    return float(np.exp(np.log(lo) + frac * (np.log(hi) - np.log(lo))))
