"""Hidden dependencies and synthetic probes: what a region blackhole breaks besides traffic.

The fleet spec may declare the services the serving path depends on (``FleetSpec.services``):
where each lives and which regions use it. A region is cut from a service when a
``Partition`` region-region separates it from the service's region, or when the service's region
is cut from the edge (``region-edge``: other regions reach it through the global edge too). What a
cut breaks, by kind of service:

* ``tokenizer`` — a replica that finished loading its weights still needs the tokenizer files to
  start; it retries every ``LOAD_RETRY_S`` and stays loading. Replicas already serving keep
  serving: the cut only shows when the region has to scale out or replace replicas.
* ``bundle_api`` — a CatalogBundle change (``SetServingConfig``) is refused for the whole model
  (no region may serve a bundle another region cannot fetch).
* ``signature_mirror`` — admission fails closed for a digest the region has not verified yet;
  digests it already verified keep being admitted.
* ``idp`` — synthetic probes cannot get a token and fail with ``auth_failed``.
* ``registry`` — pulls from the registry's origin fail (peers still serve what they hold).

When several services of one kind serve a region (a mirror per region, say), any reachable one is
enough. Every failure is counted per service and consuming region in
``firedrill_dependency_failures_total{service,kind,region}``: the evidence a drill report cites.

Synthetic probes run for every model in every region that serves it, once per scrape: a request
through the region's endpoint with a token from the IdP, measuring TTFT on the region's busiest
pool from its current queue, batch and prefix-cache coldness. They are what a failback watches
before it moves any traffic (``firedrill_probe_requests_total{result}`` and
``firedrill_probe_ttft_seconds``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.series import labels_of
from firedrill.model.spec import FleetSpec, ModelSpec, ServiceKind
from firedrill.twin.serving import PoolShape
from firedrill.twin.supply import Supply

if TYPE_CHECKING:
    from firedrill.twin.recorder import SeriesStore

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class DepsTwin(Protocol):
    """What hidden dependencies and the synthetic probes read of the twin.

    They read the partitions (which services a region can reach), the pulls waiting for an
    origin, and a pool's serving state for a probe's TTFT; they write nothing of the twin's.
    """

    @property
    def spec(self) -> FleetSpec: ...
    @property
    def dt(self) -> float: ...
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
    def node_region(self) -> I64: ...
    @property
    def partitions(self) -> AbstractSet[tuple[str, str, str]]: ...
    @property
    def supply(self) -> Supply: ...
    @property
    def desired(self) -> I64: ...
    @property
    def ready(self) -> I64: ...
    @property
    def busy(self) -> I64: ...
    @property
    def queue(self) -> I64: ...
    @property
    def lam(self) -> F64: ...
    @property
    def lam_warm(self) -> F64: ...
    @property
    def prefill_mean(self) -> F64: ...
    @property
    def shape(self) -> PoolShape: ...
    @property
    def seats_per_replica(self) -> F64: ...
    @property
    def max_rps_per_replica(self) -> F64: ...
    def regions_cut(self, a: int, b: int) -> bool: ...


class Mirror(Protocol):
    """The traffic mirror's target rate per pool (``Homing``): a probe's cache reference."""

    @property
    def mirror_target(self) -> F64: ...


LOAD_RETRY_S = 30.0  # a replica waiting for its tokenizer retries this often
PROBE_RESULTS = ("ok", "error", "auth_failed")
ProbeResult = Literal["ok", "error", "auth_failed"]


@dataclass(frozen=True)
class Service:
    name: str
    kind: ServiceKind
    region: int
    users: frozenset[int]


class Dependencies:
    """Service reachability, the failures it causes, and the synthetic probes."""

    def __init__(self, twin: DepsTwin, mirror: Mirror) -> None:
        self.twin = twin
        self.mirror = mirror
        nr = len(twin.region_names)
        self.services = [
            Service(
                s.name,
                s.kind,
                twin.region_index[s.region],
                frozenset(
                    range(nr) if s.used_by == "all" else (twin.region_index[u] for u in s.used_by)
                ),
            )
            for s in twin.spec.services
        ]
        self.failures = np.zeros((len(self.services), nr))
        self._reach_key: frozenset[tuple[str, str, str]] | None = None
        self._reach = np.ones((len(self.services), nr), dtype=bool)
        nm = len(twin.models)
        self.probes = np.zeros((nm, nr, len(PROBE_RESULTS)))
        self.probe_ttft_s = np.full((nm, nr), np.nan)
        self._region_pools: list[list[list[int]]] | None = None  # pools per model, region
        self._used: dict[tuple[ServiceKind, int], list[int]] = {}

    @property
    def declared(self) -> bool:
        return bool(self.services)

    # -- reachability -----------------------------------------------------------------------------
    def reach(self) -> npt.NDArray[np.bool_]:
        """[service, consuming region]: True where the region can reach the service now."""
        key = frozenset(self.twin.partitions)
        if key != self._reach_key:
            tw = self.twin
            for si, s in enumerate(self.services):
                edge_cut = ("region-edge", tw.region_names[s.region], "edge") in key
                for ri in range(len(tw.region_names)):
                    self._reach[si, ri] = ri == s.region or not (
                        edge_cut or tw.regions_cut(ri, s.region)
                    )
            self._reach_key = key
        return self._reach

    def lost(self, kind: ServiceKind, region: int) -> list[int]:
        """Services of ``kind`` the region uses, when it can reach none of them; else []."""
        if not self.twin.partitions:
            return []  # nothing is cut: every service is reachable
        used = self._used.get((kind, region))
        if used is None:
            used = [
                si for si, s in enumerate(self.services) if s.kind == kind and region in s.users
            ]
            self._used[(kind, region)] = used
        if not used:
            return []
        reach = self.reach()
        if any(reach[si, region] for si in used):
            return []
        return used

    def fail(self, services: list[int], region: int, n: float = 1.0) -> None:
        for si in services:
            self.failures[si, region] += n

    # -- effects ----------------------------------------------------------------------------------
    def load_blocked(self, region: int) -> bool:
        """A replica in ``region`` cannot start: its tokenizer is out of reach."""
        lost = self.lost("tokenizer", region)
        self.fail(lost, region)
        return bool(lost)

    def signature_unverifiable(self, region: int) -> bool:
        lost = self.lost("signature_mirror", region)
        self.fail(lost, region)
        return bool(lost)

    def check(self, op: ops.Operation) -> None:
        """Refuse an operation a cut dependency makes impossible (a CatalogBundle change)."""
        if not isinstance(op, ops.SetServingConfig):
            return
        tw = self.twin
        mi = tw.model_index.get(op.model)
        if mi is None:
            return  # the engine names the unknown model
        nc = len(tw.cell_names)
        serving = sorted({tw.cell_region[c] for c in range(nc) if tw.desired[mi * nc + c] > 0})
        for ri in serving:
            lost = self.lost("bundle_api", ri)
            if lost:
                self.fail(lost, ri)
                s = self.services[lost[0]]
                raise OperationError(
                    f"CatalogBundle API '{s.name}' in {tw.region_names[s.region]} is unreachable "
                    f"from {tw.region_names[ri]}: the bundle change for '{op.model}' is refused"
                )

    def mask_origin(self, origin_ok: npt.NDArray[np.bool_]) -> None:
        """Nodes of regions cut from their registry service cannot pull from its origin."""
        tw = self.twin
        for ri in range(len(tw.region_names)):
            lost = self.lost("registry", ri)
            if lost:
                blocked = tw.node_region[: origin_ok.size] == ri
                origin_ok[blocked] = False
                waiting = sum(1 for p in tw.supply.pulls.values() if p.region == ri)
                self.fail(lost, ri, waiting * tw.dt)  # pull-seconds without an origin

    # -- probes -----------------------------------------------------------------------------------
    def probe(self) -> None:
        """One synthetic TTFT probe per model and region that serves it."""
        tw = self.twin
        if self._region_pools is None:
            nc = len(tw.cell_names)
            self._region_pools = [
                [
                    [mi * nc + c for c in range(nc) if tw.cell_region[c] == ri]
                    for ri in range(len(tw.region_names))
                ]
                for mi in range(len(tw.models))
            ]
        # a handful of (model, region) pairs: plain lists beat an array operation per pair
        ready_now: list[int] = tw.ready.tolist()
        desired_now: list[int] | None = None
        for mi, by_region in enumerate(self._region_pools):
            for ri, pools in enumerate(by_region):
                ready = [ready_now[p] for p in pools]
                has_ready = any(ready)
                if not has_ready:
                    if desired_now is None:
                        desired_now = tw.desired.tolist()
                    if not any(desired_now[p] for p in pools):
                        continue  # the region does not serve the model
                result: ProbeResult
                idp = self.lost("idp", ri)
                if idp:
                    self.fail(idp, ri)
                    result = "auth_failed"
                elif not has_ready or self._edge_cut(ri):
                    result = "error"  # nothing to answer, or unreachable through the edge
                else:
                    result = "ok"
                    p = pools[ready.index(max(ready))]  # the first of the busiest
                    self.probe_ttft_s[mi, ri] = _probe_ttft_s(tw, p, self.mirror.mirror_target)
                if result != "ok":
                    self.probe_ttft_s[mi, ri] = np.nan
                self.probes[mi, ri, PROBE_RESULTS.index(result)] += 1

    def _edge_cut(self, region: int) -> bool:
        return ("region-edge", self.twin.region_names[region], "edge") in self.twin.partitions

    # -- series -----------------------------------------------------------------------------------
    def register_series(self, store: SeriesStore) -> None:
        tw = self.twin
        pairs = [(m.name, r) for m in tw.models for r in tw.region_names]
        for result in PROBE_RESULTS:
            store.family(
                f"firedrill_probe_requests_total|{result}",
                [labels_of(model_name=m, region=r, result=result) for m, r in pairs],
            )
        store.family(
            "firedrill_probe_ttft_seconds", [labels_of(model_name=m, region=r) for m, r in pairs]
        )
        if self.services:
            labels = [
                labels_of(service=s.name, kind=s.kind, region=r)
                for s in self.services
                for r in tw.region_names
            ]
            store.family("firedrill_dependency_failures_total", labels)
            store.family("firedrill_dependency_reachable", labels)

    def scrape(self, store: SeriesStore, k: int) -> None:
        self.probe()
        for i, result in enumerate(PROBE_RESULTS):
            store.write(f"firedrill_probe_requests_total|{result}", k, self.probes[:, :, i].ravel())
        store.write("firedrill_probe_ttft_seconds", k, self.probe_ttft_s.ravel())
        if self.services:
            store.write("firedrill_dependency_failures_total", k, self.failures.ravel())
            reach = self.reach().astype(np.float64)
            store.write("firedrill_dependency_reachable", k, reach.ravel())


def _probe_ttft_s(tw: DepsTwin, p: int, mirror_target: F64) -> float:
    """TTFT a probe would see on pool ``p`` now: queue wait plus a prefill slowed by the batch
    and by the prefix cache's coldness."""
    ready = max(float(tw.ready.item(p)), 1.0)
    batch = float(tw.busy.item(p)) / ready
    lam: float = tw.lam.item(p)
    ref = max(lam, mirror_target.item(p), 1e-12)
    coldness = min(max(1.0 - tw.lam_warm.item(p) / ref, 0.0), 1.0)
    prefill: float = (
        tw.prefill_mean.item(p)
        * (1.0 + tw.shape.interference.item(p) * min(batch / tw.seats_per_replica.item(p), 1.0))
        * (1.0 + tw.shape.cold_penalty.item(p) * coldness)
    )
    waiting = float(sum(tw.queue[p].tolist()))
    wait = waiting / max(ready * tw.max_rps_per_replica.item(p), 1e-9)
    return prefill + wait
