"""Prefill/decode disaggregation on the twin: two roles in one pool, and how they fall out of step.

A disaggregated model (``ModelSpec.disaggregated``) runs each pool's replicas in two roles, as
llm-d and Dynamo deploy them: ``prefill_share`` of the ready replicas only prefill prompts, the
rest only decode, and each request's KV cache moves from one to the other (``kv_transfer_s``).
The split is what an operator balances: prefill work grows with prompt length (quadratically),
decode work with output length and batch, so a shift in the request shape leaves one role
saturated while the other idles.

Per pool, vectorised like the rest of the engine:

* **Prefill stage.** Requests wait in a FIFO of age cohorts for a prefill replica. Each step the
  prefill replicas complete ``prefill replicas × dt / (mean prefill × cold-cache factor)``
  requests (a fractional remainder carries over while a backlog remains); requests older than the
  model's ``queue_timeout_s`` fail. TTFT = the wait for a prefill replica + the KV transfer + the
  prefill time (the engine's prefill distribution, without chunked-prefill interference: no
  decode batch shares a prefill replica) + any wait for a decode seat (back-pressure).
* **Decode stage.** Prefilled requests go to the engine's seat queue, whose seats are the decode
  replicas' only; TPOT comes from the decode replicas' batch, and a decode seat is held for the
  decode alone.
* **Split.** ``SetPrefillDecodeSplit`` changes a pool's share at once (replicas switch roles, as
  llm-d's role-switching does, without a restart in the twin); the pool keeps at least one
  replica in each role once it has two. The autoscaler sees the pool's saturation throughput as
  the smaller of its two roles' capacities, so a prefill-bound pool scales out whole.
* **Request shape.** ``SetRequestShape`` changes a model's prompt and output lengths in every
  pool (a demand-stream change): prefill time, KV per sequence and decode steps follow.

Series, for disaggregated pools only, each with ``role="prefill"|"decode"`` (names are the
twin's own; a real fleet reads the same from its per-role deployments): ``firedrill_pd_replicas``
(ready replicas in the role), ``firedrill_pd_requests_waiting`` (prefill backlog, decode seat
queue), ``firedrill_pd_utilization`` (prefill: busy share of the prefill replicas' time; decode:
running sequences over decode seats), ``firedrill_pd_replicas_needed`` (replicas the role needs
for the offered load at saturation, what a capacity planner computes from the latency curve) and,
per pool, ``firedrill_pd_prefill_share``. The twin's ``vllm:num_requests_waiting`` of a
disaggregated pool counts both queues.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeStream
from firedrill.model.series import labels_of
from firedrill.model.spec import ModelSpec
from firedrill.twin.serving import PoolShape, decode_step_s, mean_prefill_s

if TYPE_CHECKING:
    from firedrill.twin.recorder import SeriesStore

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class DisaggTwin(Protocol):
    """What prefill/decode disaggregation reads and writes of the twin.

    It reads the pools' serving state (ready replicas, seat queue, batch, offered load) every
    step. It writes the request shape and what follows from it (``shape`` in place, the mean
    prefill, KV per sequence, then the seats through ``update_seats``), the saturation
    throughput the autoscaler uses (``max_rps_per_replica`` in place), and notes its changes.
    """

    @property
    def dt(self) -> float: ...
    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def model_index(self) -> Mapping[str, int]: ...
    @property
    def cell_names(self) -> Sequence[str]: ...
    @property
    def cell_index(self) -> Mapping[str, int]: ...
    @property
    def region_names(self) -> Sequence[str]: ...
    @property
    def n_pools(self) -> int: ...
    @property
    def pool_model(self) -> I64: ...
    @property
    def pool_cell(self) -> I64: ...
    @property
    def pool_region(self) -> I64: ...
    @property
    def queue_k(self) -> int: ...
    @property
    def timeout_mask(self) -> I64: ...
    @property
    def age_wait_s(self) -> F64: ...
    @property
    def shape(self) -> PoolShape: ...
    @property
    def seats_per_replica(self) -> F64: ...
    @property
    def seats_int(self) -> I64: ...
    @property
    def kv_seats_per_replica(self) -> F64: ...
    @property
    def max_rps_per_replica(self) -> F64: ...
    @property
    def ready(self) -> I64: ...
    @property
    def busy(self) -> I64: ...
    @property
    def queue(self) -> I64: ...
    @property
    def lam(self) -> F64: ...

    prefill_mean: F64
    kv_tokens_per_seq: F64
    shape_changes: int  # request-shape changes written in place (an ensemble reads it)

    def update_seats(self) -> None: ...
    def lookup_model(self, name: str) -> int: ...
    def lookup_cell(self, name: str) -> int: ...
    def note_change(
        self,
        stream: ChangeStream,
        cell: int,
        subject: str,
        before: str,
        after: str,
        detail: str = "",
    ) -> None: ...
    def note_model_change(self, stream: ChangeStream, mi: int, before: str, after: str) -> None: ...


PD_OPS = (ops.SetPrefillDecodeSplit, ops.SetRequestShape)
ROLES = ("prefill", "decode")
PD_SERIES = (
    "firedrill_pd_replicas",
    "firedrill_pd_requests_waiting",
    "firedrill_pd_utilization",
    "firedrill_pd_replicas_needed",
)
SHARE_SERIES = "firedrill_pd_prefill_share"
MAX_TOKENS = 1_000_000.0  # a request shape beyond this is a typo, not a workload


def set_request_shape(
    twin: DisaggTwin, model: int, prompt_median: float, output_mean: float
) -> None:
    """Give every pool of ``model`` a new prompt median and output mean, and re-derive its seats."""
    sh = twin.shape
    pools = twin.pool_model == model
    sig = sh.prompt_sigma[pools]
    sh.prompt_mu[pools] = np.log(prompt_median)
    sh.prompt_mean[pools] = prompt_median * np.exp(sig**2 / 2.0)
    sh.prompt_sq_mean[pools] = prompt_median**2 * np.exp(2.0 * sig**2)
    sh.output_mean[pools] = output_mean
    twin.prefill_mean = mean_prefill_s(sh)
    twin.kv_tokens_per_seq = sh.prompt_mean + sh.output_mean / 2.0
    twin.shape_changes += 1
    twin.update_seats()


def request_shape(twin: DisaggTwin, model: int) -> tuple[float, float]:
    """(prompt median, output mean) of a model's requests."""
    p = int(np.flatnonzero(twin.pool_model == model)[0])
    median = float(f"{np.exp(twin.shape.prompt_mu[p]):.9g}")  # exp(log(x)) may be off by an ulp
    return median, float(twin.shape.output_mean[p])


def inverse(twin: DisaggTwin, pd: Disaggregation | None, op: ops.Operation) -> ops.Operation:
    """The inverse of a split or request-shape change (validates it first).

    ``pd`` is the twin's disaggregation, None when it serves no model disaggregated.
    """
    match op:
        case ops.SetPrefillDecodeSplit(model=model, cell=cell, prefill_share=share):
            p = twin.lookup_model(model) * len(twin.cell_names) + twin.lookup_cell(cell)
            if pd is None or not pd.is_pd[p]:
                raise OperationError(f"model '{model}' is not served disaggregated")
            if not 0.0 < share < 1.0:
                raise OperationError("prefill_share is a share of replicas: strictly within 0..1")
            return ops.SetPrefillDecodeSplit(model, cell, float(pd.share[p]))
        case ops.SetRequestShape(model=model, prompt_median=median, output_mean=out):
            mi = twin.lookup_model(model)
            if not (0.0 < median <= MAX_TOKENS and 0.0 < out <= MAX_TOKENS):
                raise OperationError(f"token counts are within 0..{MAX_TOKENS:g}")
            old_median, old_out = request_shape(twin, mi)
            return ops.SetRequestShape(model, old_median, old_out)
    raise OperationError(f"unsupported operation {op!r}")


def apply(twin: DisaggTwin, pd: Disaggregation | None, op: ops.Operation) -> None:
    match op:
        case ops.SetPrefillDecodeSplit(model=model, cell=cell, prefill_share=share):
            assert pd is not None  # inverse() refused a split of a pool not served disaggregated
            p = twin.model_index[model] * len(twin.cell_names) + twin.cell_index[cell]
            before = float(pd.share[p])
            pd.share[p] = share
            pd.update_capacity()
            twin.note_change(
                "bundle",
                int(twin.pool_cell[p]),
                model,
                f"prefill {before:.0%}",
                f"prefill {share:.0%}",
                "prefill/decode split",
            )
        case ops.SetRequestShape(model=model, prompt_median=median, output_mean=out):
            mi = twin.model_index[model]
            old_median, old_out = request_shape(twin, mi)
            set_request_shape(twin, mi, median, out)
            twin.note_model_change(
                "demand",
                mi,
                f"prompt {old_median:g} / output {old_out:g} tokens",
                f"prompt {median:g} / output {out:g} tokens",
            )
        case _:
            raise OperationError(f"unsupported operation {op!r}")


class Disaggregation:
    """The prefill stage and role split of every disaggregated pool (arrays over all pools)."""

    @classmethod
    def of(cls, twin: DisaggTwin) -> Disaggregation | None:
        """The twin's disaggregation, or None when no model is served disaggregated."""
        if not any(m.disaggregated is not None for m in twin.models):
            return None
        return cls(twin)

    def __init__(self, twin: DisaggTwin) -> None:
        self.twin = twin
        n = twin.n_pools
        specs = [twin.models[int(m)].disaggregated for m in twin.pool_model]
        self.is_pd = np.array([s is not None for s in specs], dtype=bool)
        self.idx = np.flatnonzero(self.is_pd)
        self.share = np.array([0.0 if s is None else s.prefill_share for s in specs])
        self.transfer_s = np.array([0.0 if s is None else s.kv_transfer_s for s in specs])
        self.backlog = np.zeros((n, twin.queue_k), dtype=np.int64)
        self.carry = np.zeros(n)
        self.r_prefill = np.zeros(n, dtype=np.int64)
        self.r_decode = twin.ready.copy()
        # run means over the steps since the last scrape
        self._util_acc = np.zeros(n)
        self._steps = 0
        self.prefill_util = np.zeros(n)
        # no decode batch shares a prefill replica: no chunked-prefill interference
        twin.shape.interference[self.idx] = 0.0
        self.service_prefill = twin.prefill_mean.copy()
        self.update_capacity()

    # -- capacity ------------------------------------------------------------------------------
    def split(self, ready: I64) -> tuple[I64, I64]:
        """Prefill and decode replicas of each pool (non-disaggregated pools: all decode)."""
        r_p = np.where(
            self.is_pd & (ready >= 2),
            np.clip(np.rint(ready * self.share), 1, np.maximum(ready - 1, 1)),
            0,
        ).astype(np.int64)
        return r_p, ready - r_p

    def prefill_rps_per_replica(self) -> F64:
        out: F64 = 1.0 / np.maximum(self.twin.prefill_mean, 1e-9)
        return out

    def decode_rps_per_replica(self) -> F64:
        tw = self.twin
        full = np.minimum(tw.seats_per_replica, np.maximum(tw.kv_seats_per_replica, 1.0))
        service = self.transfer_s + tw.shape.output_mean * decode_step_s(tw.shape, full)
        out: F64 = full / service
        return out

    def update_capacity(self) -> None:
        """Re-derive what the split changes: a decode seat's service, the autoscaler's capacity."""
        tw = self.twin
        self.service_prefill = np.where(self.is_pd, self.transfer_s, tw.prefill_mean)
        i = self.idx
        both = np.minimum(
            self.share[i] * self.prefill_rps_per_replica()[i],
            (1.0 - self.share[i]) * self.decode_rps_per_replica()[i],
        )
        tw.max_rps_per_replica[i] = both

    def needed(self) -> tuple[F64, F64]:
        """Replicas each role needs for the offered load, at saturation throughput."""
        lam = self.twin.lam
        return lam / self.prefill_rps_per_replica(), lam / self.decode_rps_per_replica()

    # -- the step ------------------------------------------------------------------------------
    def prefill(
        self, arrivals: I64, extra: F64, lost: I64 | None, coldness: F64
    ) -> tuple[I64, F64, I64 | None, I64]:
        """Run the prefill stage of this step.

        Returns the engine's arrivals (prefilled requests, for the disaggregated pools), the
        extra TTFT seconds (prefill wait and KV transfer added), the requests lost (prefill
        timeouts added) and the replicas that serve seats (decode replicas for those pools).
        """
        tw = self.twin
        i = self.idx
        r_p, r_d = self.split(tw.ready)
        self.r_prefill, self.r_decode = r_p, r_d
        q = self.backlog[i]
        q[:, 1:] = q[:, :-1]
        q[:, 0] = arrivals[i]
        expired = q * tw.timeout_mask[i]
        timed_out = expired.sum(axis=1)
        q -= expired
        prefill_s = tw.prefill_mean[i] * (1.0 + tw.shape.cold_penalty[i] * coldness[i])
        cap_f = r_p[i] * tw.dt / prefill_s + self.carry[i]
        cap = np.floor(cap_f).astype(np.int64)
        oldest_first = q[:, ::-1]
        cum = np.cumsum(oldest_first, axis=1)
        take = np.clip(cap[:, None] - (cum - oldest_first), 0, oldest_first)[:, ::-1]
        q -= take
        done = take.sum(axis=1)
        self.backlog[i] = q
        self.carry[i] = np.where(q.sum(axis=1) > 0, cap_f - cap, 0.0)
        busy_s = done * prefill_s
        self._util_acc[i] += np.where(
            r_p[i] > 0, np.minimum(busy_s / np.maximum(r_p[i] * tw.dt, 1e-12), 1.0), 0.0
        )
        self._steps += 1
        wait_s = (take @ tw.age_wait_s) / np.maximum(done, 1)
        out_arrivals = arrivals.copy()
        out_arrivals[i] = done
        out_extra = extra.copy()
        out_extra[i] += wait_s + self.transfer_s[i]
        if timed_out.any():
            lost = np.zeros_like(arrivals) if lost is None else lost.copy()
            lost[i] += timed_out
        serving = tw.ready.copy()
        serving[i] = r_d[i]
        return out_arrivals, out_extra, lost, serving

    def waiting(self) -> I64:
        """Requests waiting for a prefill replica, per pool."""
        out: I64 = self.backlog.sum(axis=1)
        return out

    # -- series --------------------------------------------------------------------------------
    def register_series(self, store: SeriesStore) -> None:
        tw = self.twin
        base = [
            {
                "model_name": tw.models[int(tw.pool_model[p])].name,
                "cell": tw.cell_names[int(tw.pool_cell[p])],
                "region": tw.region_names[int(tw.pool_region[p])],
            }
            for p in self.idx.tolist()
        ]
        for name in PD_SERIES:
            for role in ROLES:
                store.family(f"{name}|{role}", [labels_of(**b, role=role) for b in base])
        store.family(SHARE_SERIES, [labels_of(**b) for b in base])

    def scrape(self, store: SeriesStore, k: int) -> None:
        tw = self.twin
        i = self.idx
        if self._steps:
            self.prefill_util = self._util_acc / self._steps
            self._util_acc[:] = 0.0
            self._steps = 0
        need_p, need_d = self.needed()
        decode_seats = self.r_decode * tw.seats_int
        decode_util = np.where(decode_seats > 0, tw.busy / np.maximum(decode_seats, 1), 0.0)
        rows = {
            "firedrill_pd_replicas": (self.r_prefill * 1.0, self.r_decode * 1.0),
            "firedrill_pd_requests_waiting": (
                self.waiting() * 1.0,
                tw.queue.sum(axis=1) * 1.0,
            ),
            "firedrill_pd_utilization": (self.prefill_util, decode_util),
            "firedrill_pd_replicas_needed": (need_p, need_d),
        }
        for name, (pre, dec) in rows.items():
            store.write(f"{name}|prefill", k, np.asarray(pre[i], dtype=np.float64))
            store.write(f"{name}|decode", k, np.asarray(dec[i], dtype=np.float64))
        store.write(SHARE_SERIES, k, self.share[i])
