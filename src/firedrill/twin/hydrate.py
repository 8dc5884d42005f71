"""Supply and hydrate: weights moving from registries to nodes, and between regions.

Each step advances the pulls in flight (``supply.Supply``: origin and peer bandwidth, registry
throttling, cuts between a cell and its registry); a node whose pull completes caches the digest
and its pulling replicas start loading. Cross-region replication lands a digest in a region after
the region's lag, unless the link is paused or cut (it then waits until resumed or healed).
"""

from __future__ import annotations

import numpy as np

from firedrill.twin.replica import ReplicaState
from firedrill.twin.scheduling import Scheduling

PULLING = ReplicaState.PULLING


class Hydrate(Scheduling):
    """Pulls to nodes and replication between regions."""

    def _hydrate(self) -> None:
        origin_ok = np.ones(len(self.nodes), dtype=bool)
        for kind, a, _b in self.partitions:
            if kind == "cell-registry":
                ci = self.cell_index[a]
                origin_ok[self.node_cell == ci] = False
        if self.recovery.deps.declared:
            self.recovery.deps.mask_origin(origin_ok)
        done = self.supply.step(self.dt, self.nic, origin_ok, self.available)
        for pull in done:
            if pull.digest < 0:  # a competing puller's bytes
                self.recovery.pullers.pulled(pull)
                continue
            n = self.nodes[pull.node]
            n.cache.add(pull.digest)
            self.supply.add_holder(n.region, pull.digest)
            for rid in sorted(n.replicas):
                r = self.replicas[rid]
                if r.state is PULLING and r.digest == pull.digest:
                    self._begin_load(r)

    def _replication_lands(self, source: int, target: int, digest: int) -> None:
        if (source, target) in self.replication_paused or self.regions_cut(source, target):
            self.pending_replication.append((source, target, digest))
            return
        self.available.add((target, digest))
        self.pool_dirty[:] = True
        mi = self.digests[digest].model
        if int(self.region_digest[mi, source]) == digest:
            before = int(self.region_digest[mi, target])
            self.region_digest[mi, target] = digest
            if before != digest:
                self.note_region_change("weights", target, self.models[mi].name, before, digest)
        self.replicate_onward(target, digest)

    def replicate_onward(self, source: int, digest: int) -> None:
        for ri, r in enumerate(self.spec.regions):
            if r.replicate_from == self.region_names[source] and (ri, digest) not in self.available:
                self._push(self.t + r.replication_lag_s, "replicated", (source, ri, digest))

    def _flush_replication(self) -> None:
        pending, self.pending_replication = self.pending_replication, []
        for s, t, d in pending:
            self._push(self.t + self.spec.regions[t].replication_lag_s, "replicated", (s, t, d))
