"""Model quality on the twin: golden-set probes per weights digest, and the canary's share.

Latency and errors say nothing about whether answers are right. Weights that are fast and wrong
(a bad fine-tune, a broken quantisation, a mislabelled digest) serve every request within the
TTFT SLO and fail users all the same, so the online quality SLI is a golden set: prompts with
known answers, sent to the fleet at a fixed rate per cell and graded pass or fail.

* **Truth.** Each weights digest has a true golden-set pass rate: ``WeightsSpec.quality`` for a
  model's spec digest and, by default, for every later digest of the model; ``SetWeightsQuality``
  overrides it (a digest injected fast and wrong). The rate is a property of the weights, the same
  in every cell.
* **Probes.** At every scrape, each digest with ready replicas in a pool (model × cell) receives
  Poisson(``golden_probes_per_s`` × scrape interval) probes, addressed to that version as a
  canary analysis addresses its probes (so a canary at 10% of traffic is judged on as many
  answers as the stable digest), and each passes with the digest's true rate. A pool with no
  ready replica gets no probes (its requests fail, which the availability SLI sees).
* **Series.** ``firedrill_golden_set_requests_total{model_name, digest, cell, region,
  result="pass"|"fail"}`` counts graded probes; a digest's counters exist, at 0, from the run's
  start (as an exporter publishes its counters from start-up), whenever the digest was published.
  ``firedrill_rollout_canary_share{model_name, cell, region}`` is the share of the pool's ready
  replicas (so of its traffic) not on the region's stable digest: the canary's share while a
  rollout runs, and after an abort until the canary's replicas are replaced, so 0 means the
  stable digest serves 100%. ``firedrill_rollout_canary_percent`` is the rollout's step (0 while
  no canary runs).

Probes draw from their own random stream (seeded from the run's seed and ``GOLDEN_STREAM``), so
turning quality on or off, or changing the probe rate, leaves demand, faults and serving exactly
as they were. Nothing here runs per request: a scrape costs a few array operations per pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.release import RolloutView
from firedrill.model.series import labels_of
from firedrill.model.spec import DIGEST_RE, FleetSpec, ModelSpec
from firedrill.twin.replica import DigestInfo

if TYPE_CHECKING:
    from firedrill.twin.recorder import SeriesStore

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class QualityTwin(Protocol):
    """What the golden-set probes read and write of the twin.

    They read the pools, the digests and the rollouts; publishing a new digest (an operation)
    registers it, makes it available in the root regions and replicates it onward.
    """

    @property
    def spec(self) -> FleetSpec: ...
    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def model_index(self) -> Mapping[str, int]: ...
    @property
    def cell_names(self) -> Sequence[str]: ...
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
    def pool_range(self) -> I64: ...
    @property
    def digests(self) -> Sequence[DigestInfo]: ...
    @property
    def digest_index(self) -> Mapping[str, int]: ...
    @property
    def region_digest(self) -> I64: ...
    @property
    def rollout(self) -> Sequence[tuple[int, int] | None]: ...
    @property
    def available(self) -> set[tuple[int, int]]: ...
    def lookup_model(self, name: str) -> int: ...
    def register_digest(self, model: int, digest: str, signed: bool, attested: bool) -> int: ...
    def replicate_onward(self, source: int, digest: int) -> None: ...


QUALITY_OPS = (ops.SetWeightsQuality,)
GOLDEN_STREAM = 0x601D  # spawn key of the probes' random stream (independent of the others)
GOLDEN_SERIES = "firedrill_golden_set_requests_total"
CANARY_SHARE = "firedrill_rollout_canary_share"
CANARY_PERCENT = "firedrill_rollout_canary_percent"
RESULTS = ("pass", "fail")


class GoldenSet:
    """Golden-set probes of every pool, split over the digests its ready replicas serve."""

    def __init__(self, twin: QualityTwin, seed: int) -> None:
        self.twin = twin
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(GOLDEN_STREAM,)))
        n = twin.n_pools
        self.rate = np.array(
            [twin.models[int(m)].golden_probes_per_s for m in twin.pool_model], dtype=np.float64
        )
        self.default_quality = [m.weights.quality for m in twin.models]
        self.overrides: dict[str, float] = {}  # digest -> true pass rate
        cols = max(4, len(twin.digests))
        self.ready_by_digest = np.zeros((n, cols), dtype=np.int64)
        self.passed = np.zeros((n, cols), dtype=np.int64)
        self.failed = np.zeros((n, cols), dtype=np.int64)
        self._registered = 0  # digests whose counter families exist in the store
        self._pools_of_model = [
            np.flatnonzero(twin.pool_model == mi) for mi in range(len(twin.models))
        ]

    # -- state ---------------------------------------------------------------------------------
    def on_ready(self, pool: int, digest: int, delta: int) -> None:
        """A replica of ``digest`` in ``pool`` became ready (+1) or stopped being ready (-1)."""
        if digest >= self.ready_by_digest.shape[1]:
            self._grow(digest + 1)
        self.ready_by_digest[pool, digest] += delta

    def _grow(self, cols: int) -> None:
        cols = max(cols, 2 * self.ready_by_digest.shape[1])
        for name in ("ready_by_digest", "passed", "failed"):
            old: I64 = getattr(self, name)
            new = np.zeros((old.shape[0], cols), dtype=np.int64)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)

    def quality_of(self, digest: int) -> float:
        """The true golden-set pass rate of a registered digest."""
        info = self.twin.digests[digest]
        return self.overrides.get(info.digest, self.default_quality[info.model])

    def qualities(self) -> F64:
        """True pass rate per registered digest, by digest index."""
        return np.array([self.quality_of(d) for d in range(len(self.twin.digests))])

    def canary_share(self) -> F64:
        """Share of each pool's ready replicas (its traffic) off the region's stable digest."""
        tw = self.twin
        stable = tw.region_digest[tw.pool_model, tw.pool_region]
        total = self.ready_by_digest.sum(axis=1)
        on_stable = self.ready_by_digest[tw.pool_range, stable]
        out: F64 = np.where(total > 0, 1.0 - on_stable / np.maximum(total, 1), 0.0)
        return out

    def canary_percent(self) -> F64:
        per_model = np.array(
            [0.0 if ro is None else float(ro[1]) for ro in self.twin.rollout], dtype=np.float64
        )
        out: F64 = per_model[self.twin.pool_model]
        return out

    def rollout_view(self, model: int) -> RolloutView:
        tw = self.twin
        ro = tw.rollout[model]
        stable = tuple(
            (r, tw.digests[int(tw.region_digest[model, ri])].digest)
            for ri, r in enumerate(tw.region_names)
        )
        return RolloutView(
            model=tw.models[model].name,
            stable=stable,
            canary_digest=None if ro is None else tw.digests[ro[0]].digest,
            canary_percent=0 if ro is None else ro[1],
        )

    # -- probes --------------------------------------------------------------------------------
    def probe(self, interval_s: float) -> None:
        """Send and grade one scrape interval's probes to every digest serving in every pool.

        Poisson(λ) probes each passing with probability q are Poisson(λq) passes and, independent
        of them, Poisson(λ(1 - q)) failures: one draw instead of a count and a binomial split.
        """
        d = len(self.twin.digests)
        lam = np.where(self.ready_by_digest[:, :d] > 0, self.rate[:, None] * interval_s, 0.0)
        q = self.qualities()[None, :]
        rates = np.empty((2, *lam.shape))  # passes, failures
        np.multiply(lam, q, out=rates[0])
        np.multiply(lam, 1.0 - q, out=rates[1])
        graded = self.rng.poisson(rates)
        self.passed[:, :d] += graded[0]
        self.failed[:, :d] += graded[1]

    # -- operations ----------------------------------------------------------------------------
    def inverse(self, op: ops.Operation) -> ops.Operation:
        if not isinstance(op, ops.SetWeightsQuality):
            raise OperationError(f"unsupported operation {op!r}")
        mi = self.twin.lookup_model(op.model)
        if not DIGEST_RE.match(op.digest):
            raise OperationError(f"{op.digest!r} is not a sha256 digest")
        if op.quality is not None and not 0.0 <= op.quality <= 1.0:
            raise OperationError("a golden-set pass rate is within 0..1")
        known = self.twin.digest_index.get(op.digest)
        if known is not None and self.twin.digests[known].model != mi:
            raise OperationError(f"digest {op.digest} is not a digest of '{op.model}'")
        return ops.SetWeightsQuality(op.model, op.digest, self.overrides.get(op.digest))

    def apply(self, op: ops.Operation) -> None:
        if not isinstance(op, ops.SetWeightsQuality):
            raise OperationError(f"unsupported operation {op!r}")
        tw = self.twin
        mi = tw.model_index[op.model]
        if op.digest not in tw.digest_index:
            # published: in the registry of every root region, replicated onward with lag
            d = tw.register_digest(mi, op.digest, True, True)
            for ri, region in enumerate(tw.spec.regions):
                if region.replicate_from is None:
                    tw.available.add((ri, d))
                    tw.replicate_onward(ri, d)
        if op.quality is None:
            self.overrides.pop(op.digest, None)
        else:
            self.overrides[op.digest] = op.quality

    # -- series --------------------------------------------------------------------------------
    def register_series(self, store: SeriesStore) -> None:
        base = [self._pool_labels(p) for p in range(self.twin.n_pools)]
        for name in (CANARY_SHARE, CANARY_PERCENT):
            store.family(name, [labels_of(**b) for b in base])
        self._register_digests(store, k=0)

    def _pool_labels(self, p: int) -> dict[str, str]:
        tw = self.twin
        return {
            "model_name": tw.models[int(tw.pool_model[p])].name,
            "cell": tw.cell_names[int(tw.pool_cell[p])],
            "region": tw.region_names[int(tw.pool_region[p])],
        }

    def _register_digests(self, store: SeriesStore, *, k: int) -> None:
        """Counter families of digests published since the last scrape, at 0 before it."""
        tw = self.twin
        for d in range(self._registered, len(tw.digests)):
            info = tw.digests[d]
            pools = self._pools_of_model[info.model]
            for result in RESULTS:
                key = f"{GOLDEN_SERIES}|{info.digest}|{result}"
                store.family(
                    key,
                    [
                        labels_of(**self._pool_labels(int(p)), digest=info.digest, result=result)
                        for p in pools
                    ],
                )
                store.fill(key, 0.0, until_k=k)
        self._registered = len(tw.digests)

    def scrape(self, store: SeriesStore, k: int, interval_s: float) -> None:
        """Probe the interval just ended and write every quality and canary series."""
        if interval_s > 0:
            self.probe(interval_s)
        if self._registered < len(self.twin.digests):
            self._register_digests(store, k=k)
        for d in range(self._registered):
            info = self.twin.digests[d]
            pools = self._pools_of_model[info.model]
            store.write(f"{GOLDEN_SERIES}|{info.digest}|pass", k, self.passed[pools, d] * 1.0)
            store.write(f"{GOLDEN_SERIES}|{info.digest}|fail", k, self.failed[pools, d] * 1.0)
        store.write(CANARY_SHARE, k, self.canary_share())
        store.write(CANARY_PERCENT, k, self.canary_percent())
