"""Region weights and traffic mirroring: the two knobs a controlled failback turns.

The twin routes locality first: a region's users go to the region's own cells by their route
weights, and spill to every other cell only when the region's own weights are all 0. That is a
cell-level HTTPRoute. A failback needs the global one: a *share* of a region's users sent home
while the rest stays on the survivor, stepped 0 → 10 → 40 → 70 → 100.

* ``SetRegionWeight(model, region, percent)``: ``percent`` of the region's users go to its own
  cells (by their weights), the rest to the other regions' cells (by theirs). 100 is the default
  and costs nothing per step.
* ``MirrorTraffic(model, region, percent)``: ``percent`` of the region's users' requests are
  mirrored to its own cells (Gateway API ``RequestMirror``): the responses are discarded, and the
  prefix caches warm as if that traffic were served (``cold_cache_decay_s``), so the first real
  users after a step do not pay the cold-cache tax. The mirror's load on the replicas is not
  modelled. Exported per pool: ``firedrill_mirrored_requests_per_second`` and the rate the cache is
  warm for, ``firedrill_prefix_cache_warm_requests_per_second``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeStream
from firedrill.model.spec import ModelSpec

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class HomingTwin(Protocol):
    """What region weights and mirroring read and write of the twin.

    They read the names, the route weights and the desired replicas; mirroring warms the
    prefix caches (it writes ``lam_warm`` in place) and a weight change is noted in the log.
    """

    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def model_index(self) -> Mapping[str, int]: ...
    @property
    def cell_names(self) -> Sequence[str]: ...
    @property
    def cell_region(self) -> Sequence[int]: ...
    @property
    def region_names(self) -> Sequence[str]: ...
    @property
    def region_index(self) -> Mapping[str, int]: ...
    @property
    def n_pools(self) -> int: ...
    @property
    def weights(self) -> F64: ...
    @property
    def desired(self) -> I64: ...
    @property
    def cross_mask(self) -> F64: ...
    @property
    def warm_gain(self) -> F64: ...
    @property
    def lam_warm(self) -> F64: ...
    def note_change(
        self,
        stream: ChangeStream,
        cell: int,
        subject: str,
        before: str,
        after: str,
        detail: str = "",
    ) -> None: ...


class Homing:
    def __init__(self, twin: HomingTwin) -> None:
        self.twin = twin
        nm, nr = len(twin.models), len(twin.region_names)
        self.home: I64 = np.full((nm, nr), 100, dtype=np.int64)
        self.mirror: I64 = np.zeros((nm, nr), dtype=np.int64)
        self.mirror_target: F64 = np.zeros(twin.n_pools)
        self.mirror_warm: F64 = np.zeros(twin.n_pools)
        self.rerouting = False
        self.mirroring = False

    # -- operations -------------------------------------------------------------------------------
    def inverse(self, op: ops.Operation) -> ops.Operation:
        match op:
            case ops.SetRegionWeight(model=model, region=region, percent=pct):
                mi, ri = self._target(model, region, pct)
                return ops.SetRegionWeight(model, region, int(self.home[mi, ri]))
            case ops.MirrorTraffic(model=model, region=region, percent=pct):
                mi, ri = self._target(model, region, pct)
                return ops.MirrorTraffic(model, region, int(self.mirror[mi, ri]))
        raise OperationError(f"not a routing operation: {op!r}")

    def apply(self, op: ops.Operation) -> None:
        tw = self.twin
        match op:
            case ops.SetRegionWeight(model=model, region=region, percent=pct):
                mi, ri = tw.model_index[model], tw.region_index[region]
                before = int(self.home[mi, ri])
                self.home[mi, ri] = pct
                self.rerouting = bool((self.home != 100).any())
                if before != pct:
                    for ci, cr in enumerate(tw.cell_region):
                        if cr == ri:
                            tw.note_change(
                                "demand", ci, model, f"{before}%", f"{pct}%", "region weight"
                            )
            case ops.MirrorTraffic(model=model, region=region, percent=pct):
                self.mirror[tw.model_index[model], tw.region_index[region]] = pct
                self.mirroring = self.mirroring or pct > 0
            case _:
                raise OperationError(f"not a routing operation: {op!r}")

    def state(self) -> tuple[list[list[int]], list[list[int]]]:
        return self.home.tolist(), self.mirror.tolist()

    def _target(self, model: str, region: str, pct: int) -> tuple[int, int]:
        tw = self.twin
        if model not in tw.model_index:
            raise UnknownTargetError("model", model)
        if region not in tw.region_index:
            raise UnknownTargetError("region", region)
        if not 0 <= pct <= 100:
            raise OperationError(f"percent must be within 0..100, not {pct}")
        return tw.model_index[model], tw.region_index[region]

    # -- engine hooks -----------------------------------------------------------------------------
    def reroute(self, share: F64, weights: F64) -> F64:
        """Blend each (model, region) row of the routing share with the spill to other regions."""
        tw = self.twin
        for mi, ri in np.argwhere(self.home != 100).tolist():
            spill = weights[mi] * tw.cross_mask[ri]
            total = float(spill.sum())
            if total <= 0.0:
                continue  # nowhere else to go: the region keeps its users
            f = float(self.home[mi, ri]) / 100.0
            share[mi, ri] = f * share[mi, ri] + (1.0 - f) * spill / total
        return share

    def warm(self, demand: F64) -> None:
        """Move the mirrored pools' prefix-cache warmth toward the mirrored rate.

        ``demand`` is requests/s per [model, region] this step.
        """
        tw = self.twin
        nc = len(tw.cell_names)
        target = np.zeros(tw.n_pools)
        for mi, ri in np.argwhere(self.mirror > 0).tolist():
            pools = np.array(
                [mi * nc + c for c in range(nc) if tw.cell_region[c] == ri], dtype=np.int64
            )
            w = tw.weights[mi, pools % nc]
            if w.sum() <= 0:
                w = tw.desired[pools].astype(np.float64)
            if w.sum() <= 0:
                w = np.ones(pools.size)
            target[pools] = self.mirror[mi, ri] / 100.0 * demand[mi, ri] * w / w.sum()
        self.mirror_target = target
        self.mirror_warm += (target - self.mirror_warm) * tw.warm_gain
        np.maximum(tw.lam_warm, self.mirror_warm, out=tw.lam_warm)
        if not self.mirror.any() and float(self.mirror_warm.max(initial=0.0)) < 1e-6:
            self.mirroring = False
            self.mirror_warm[:] = 0.0
