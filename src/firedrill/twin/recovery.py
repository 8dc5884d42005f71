"""The twin's recovery features in one place, so the engine needs only a few small hooks.

Competing pullers and pool recycling (``pullers.py``), hidden dependencies and synthetic probes
(``deps.py``), per-region admission and the ready-gate (``admission.py``), region weights and
traffic mirroring (``homing.py``). This module routes their operations, steps them, and exports
their series, plus two per-pool series the hydrate measurement needs:
``firedrill_replicas_became_ready_total`` (a replica finished warming: the ready curve of a storm
even when old replicas leave as new ones arrive) and the peak per-node pull rate of each region,
``firedrill_hydrate_node_gbps_max``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.series import labels_of
from firedrill.model.spec import ModelSpec
from firedrill.twin.admission import Admission, AdmissionTwin
from firedrill.twin.deps import Dependencies, DepsTwin
from firedrill.twin.homing import Homing, HomingTwin
from firedrill.twin.pullers import PULLER_OPS, RECYCLE_OPS, Pullers, PullersTwin, Recycler
from firedrill.twin.recorder import SeriesStore
from firedrill.twin.supply import Supply

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class RecoveryTwin(PullersTwin, DepsTwin, AdmissionTwin, HomingTwin, Protocol):
    """What the recovery features read and write of the twin: what each of them does, plus the
    pools, the prefix-cache warmth and the supply chain's counters their series export."""

    @property
    def models(self) -> Sequence[ModelSpec]: ...
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
    def lam_warm(self) -> F64: ...
    @property
    def supply(self) -> Supply: ...


RECOVERY_OPS = (*PULLER_OPS, *RECYCLE_OPS, ops.SetAdmission, ops.SetRegionWeight, ops.MirrorTraffic)


class RecoveryFeatures:
    def __init__(self, twin: RecoveryTwin) -> None:
        self.twin = twin
        self.pullers = Pullers(twin)
        self.recycler = Recycler(twin)
        self.homing = Homing(twin)
        self.deps = Dependencies(twin, self.homing)
        self.admission = Admission(twin, self.deps)
        self.became_ready = np.zeros(twin.n_pools)

    @property
    def busy(self) -> bool:
        """Whether ``step`` has anything to do."""
        return self.recycler.busy

    def step(self) -> None:
        self.recycler.step()

    # -- operations -------------------------------------------------------------------------------
    def _owner(self, op: ops.Operation) -> Pullers | Recycler | Admission | Homing:
        if isinstance(op, PULLER_OPS):
            return self.pullers
        if isinstance(op, RECYCLE_OPS):
            return self.recycler
        if isinstance(op, ops.SetAdmission):
            return self.admission
        if isinstance(op, ops.SetRegionWeight | ops.MirrorTraffic):
            return self.homing
        raise OperationError(f"not a recovery operation: {op!r}")

    def inverse(self, op: ops.Operation) -> ops.Operation:
        return self._owner(op).inverse(op)

    def apply(self, op: ops.Operation) -> None:
        self._owner(op).apply(op)

    def check(self, op: ops.Operation) -> None:
        """Refuse, before anything changes, an operation a cut dependency makes fail."""
        if self.deps.declared:
            self.deps.check(op)

    def state(self) -> dict[str, object]:
        """What the recovery operations set, as plain values (for comparisons in tests)."""
        return {
            "pullers": self.pullers.state(),
            "recycle": self.recycler.state(),
            "admission": self.admission.state(),
            "homing": self.homing.state(),
        }

    # -- series -----------------------------------------------------------------------------------
    def register_series(self, store: SeriesStore) -> None:
        tw = self.twin
        pools = [
            labels_of(
                model_name=tw.models[int(tw.pool_model[p])].name,
                cell=tw.cell_names[int(tw.pool_cell[p])],
                region=tw.region_names[int(tw.pool_region[p])],
            )
            for p in range(tw.n_pools)
        ]
        for name in (
            "firedrill_replicas_became_ready_total",
            "firedrill_mirrored_requests_per_second",
            "firedrill_prefix_cache_warm_requests_per_second",
        ):
            store.family(name, pools)
        regions = [labels_of(region=r) for r in tw.region_names]
        for name in (
            "firedrill_hydrate_node_gbps_max",
            "firedrill_hydrate_pull_seconds_total",
            "firedrill_competing_pullers_active",
            "firedrill_competing_pullers_frozen",
        ):
            store.family(name, regions)
        for source in ("origin", "p2p"):
            store.family(
                f"firedrill_competing_pull_bytes_total|{source}",
                [labels_of(region=r, source=source) for r in tw.region_names],
            )
        self.deps.register_series(store)
        self.admission.register_series(store)

    def scrape(self, store: SeriesStore, k: int) -> None:
        tw = self.twin
        store.write("firedrill_replicas_became_ready_total", k, self.became_ready)
        store.write("firedrill_mirrored_requests_per_second", k, self.homing.mirror_target)
        store.write("firedrill_prefix_cache_warm_requests_per_second", k, tw.lam_warm)
        nr = len(tw.region_names)
        # serving GB/s per pulling node, the highest since the last scrape
        peak = np.array([r.interval_peak_gbps_per_node for r in tw.supply.regions])
        for r in tw.supply.regions:
            r.interval_peak_gbps_per_node = 0.0
        store.write("firedrill_hydrate_node_gbps_max", k, peak)
        store.write(
            "firedrill_hydrate_pull_seconds_total",
            k,
            np.array([r.pull_seconds for r in tw.supply.regions]),
        )
        store.write(
            "firedrill_competing_pullers_active",
            k,
            np.array([float(self.pullers.pulling_nodes(ri)) for ri in range(nr)]),
        )
        store.write(
            "firedrill_competing_pullers_frozen",
            k,
            np.array([1.0 if ri in self.pullers.frozen else 0.0 for ri in range(nr)]),
        )
        rs = tw.supply.regions
        store.write(
            "firedrill_competing_pull_bytes_total|origin",
            k,
            np.array([r.competing_origin_gb * 1e9 for r in rs]),
        )
        store.write(
            "firedrill_competing_pull_bytes_total|p2p",
            k,
            np.array([r.competing_p2p_gb * 1e9 for r in rs]),
        )
        self.deps.scrape(store, k)
        self.admission.scrape(store)
