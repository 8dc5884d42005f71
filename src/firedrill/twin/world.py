"""``TwinWorld``: the embedded twin behind the ports, as one adapter among several.

The control plane never reads the twin's arrays: it asks the ports (``firedrill.ports``). The
``Twin`` itself implements ``Fleet``, ``Signals`` and ``Clock``; this adapter adds the semantic
questions only the twin's internals could answer so far — saturation throughput and the
cold-cache penalty per (model, cell), published and serving digests, faults and replica events,
JobSets, agent sandboxes — each as a method a real fleet's adapter can implement too. The served
twin's control API (``adapters/twin_api.py``) answers the same questions over HTTP through this
adapter, so embedded and remote runs read the same values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from firedrill.errors import UnknownTargetError
from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Applied, Operation
from firedrill.model.release import DigestRecord, RolloutView, ServingDigest
from firedrill.model.sandbox import EgressRecord, ToolCallRecord
from firedrill.model.series import Labels, Series
from firedrill.model.spec import FleetSpec
from firedrill.model.state import CellView, FaultRecord, NodeView, ReplicaTransition
from firedrill.twin.engine import GONE, Twin
from firedrill.twin.replica import STATE_NAMES
from firedrill.twin.sandbox import SandboxSim
from firedrill.twin.training import JobSetView, RankRecord

__all__ = ["TwinWorld", "embedded_world"]


class TwinWorld:
    """A ``Twin`` seen through the ports (``DrillWorld``, and what scenarios read)."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin

    def __repr__(self) -> str:
        return f"TwinWorld({self.twin.spec.name!r}, seed={self.twin.seed})"

    # -- Clock ----------------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.twin.now_s()

    def advance(self, seconds: float) -> None:
        self.twin.advance(seconds)

    def settle(self) -> None:
        """Bin the requests admitted since the last scrape into the TTFT histogram."""
        self.twin.flush_ttft()

    # -- Fleet ----------------------------------------------------------------------------------

    def apply(self, op: Operation) -> Operation:
        return self.twin.apply(op)

    def inverse_of(self, op: Operation) -> Operation:
        return self.twin.inverse_of(op)

    def node(self, name: str) -> NodeView:
        return self.twin.node(name)

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]:
        return self.twin.node_views(cell=cell)

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        return self.twin.pods_on(node, gpu)

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        return self.twin.burn_in_result(node)

    def cells(self) -> Sequence[CellView]:
        return self.twin.cells()

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]:
        return self.twin.changes(since_s=since_s, cell=cell)

    def rollout_view(self, model: str) -> RolloutView:
        return self.twin.rollout_view(model)

    # -- Signals --------------------------------------------------------------------------------

    def series_names(self) -> Sequence[str]:
        return self.twin.series_names()

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        return self.twin.query(name, matchers, start_s=start_s, end_s=end_s)

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        return self.twin.instant(name, matchers)

    # -- Capacity -------------------------------------------------------------------------------

    def _pool(self, model: str, cell: str) -> int:
        tw = self.twin
        if model not in tw.model_index:
            raise UnknownTargetError("model", model)
        if cell not in tw.cell_index:
            raise UnknownTargetError("cell", cell)
        return tw.model_index[model] * len(tw.cell_names) + tw.cell_index[cell]

    def max_rps_per_replica(self, model: str, cell: str) -> float:
        return float(self.twin.max_rps_per_replica[self._pool(model, cell)])

    def cold_cache_penalty(self, model: str, cell: str) -> float:
        return float(self.twin.shape.cold_penalty[self._pool(model, cell)])

    def capacity_errors(self) -> int:
        return int(self.twin.capacity_errors)

    # -- Digests --------------------------------------------------------------------------------

    def _record(self, index: int) -> DigestRecord:
        info = self.twin.digests[index]
        return DigestRecord(
            self.twin.models[info.model].name, info.digest, info.signed, info.attested
        )

    def published(self, model: str) -> Sequence[DigestRecord]:
        tw = self.twin
        if model not in tw.model_index:
            raise UnknownTargetError("model", model)
        mi = tw.model_index[model]
        return [self._record(i) for i, d in enumerate(tw.digests) if d.model == mi]

    def digest_record(self, digest: str) -> DigestRecord | None:
        index = self.twin.digest_index.get(digest)
        return None if index is None else self._record(index)

    def serving_digests(self, region: str) -> Sequence[ServingDigest]:
        tw = self.twin
        if region not in tw.region_index:
            raise UnknownTargetError("region", region)
        ri = tw.region_index[region]
        counts: dict[tuple[int, int], int] = {}
        for r in tw.replicas:
            if r.state == GONE or tw.cell_region[r.cell] != ri:
                continue
            counts[(r.model, r.digest)] = counts.get((r.model, r.digest), 0) + 1
        out = []
        for (mi, di), n in sorted(counts.items()):
            info = tw.digests[di]
            out.append(
                ServingDigest(
                    model=tw.models[mi].name,
                    region=region,
                    digest=info.digest,
                    replicas=n,
                    signed=info.signed,
                    attested=info.attested,
                    held=(ri, di) in tw.available,
                )
            )
        return out

    def unsigned_replicas_admitted(self) -> int:
        tw = self.twin
        return sum(
            1
            for r in tw.replicas
            if not (tw.digests[r.digest].signed and tw.digests[r.digest].attested)
        )

    # -- FleetHistory ---------------------------------------------------------------------------

    def fault_events(self, *, since_s: float = 0.0) -> Sequence[FaultRecord]:
        nodes = self.twin.nodes
        return [
            FaultRecord(ev.at_s, nodes[ev.node].name, ev.gpu, ev.kind, ev.label, ev.phantom)
            for ev in self.twin.fault_log
            if ev.at_s >= since_s
        ]

    def replica_transitions(self, *, since_s: float = 0.0) -> Sequence[ReplicaTransition]:
        tw = self.twin
        nc = len(tw.cell_names)
        out: list[ReplicaTransition] = []
        for t, rid, frm, to, node in tw.replica_log:
            if t < since_s:
                continue
            pool = tw.pool_of(rid)
            out.append(
                ReplicaTransition(
                    at_s=t,
                    replica=tw.replicas[rid].pod,
                    model=tw.models[pool // nc].name,
                    cell=tw.cell_names[pool % nc],
                    from_state=None if frm < 0 else STATE_NAMES[frm],
                    to_state=STATE_NAMES[to],
                    node=None if node < 0 else tw.nodes[node].name,
                )
            )
        return out

    # -- Training -------------------------------------------------------------------------------

    def jobset(self, name: str) -> JobSetView:
        return self.twin.training.jobset(name)

    def flight_recorder(self, jobset: str) -> Sequence[RankRecord]:
        return self.twin.training.flight_recorder(jobset)

    # -- Sandboxes' audit log (what the security runbook reads off the fleet) -----------------

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        return self.twin.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        return self.twin.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)

    # -- what scenarios read beyond the world ports ---------------------------------------------

    def operations(self) -> Sequence[Applied]:
        """Every operation applied to the twin, in order (with who applied it and its inverse)."""
        return self.twin.journal

    def flags(self) -> Mapping[str, str]:
        return self.twin.flags

    def quarantined_pods(self) -> frozenset[str]:
        return frozenset(self.twin.quarantined_pods)

    def quarantine_actions(self) -> Mapping[str, int]:
        """Quarantine taints applied per node name, since the start."""
        nodes = self.twin.nodes
        return {nodes[ni].name: v for ni, v in sorted(self.twin.quarantine_actions.items())}

    def fleet_spec(self) -> FleetSpec:
        return self.twin.spec

    @property
    def sandbox(self) -> SandboxSim:
        return self.twin.sandbox


def embedded_world(fleet: FleetSpec, seed: int, hours: float) -> TwinWorld:
    """A fresh embedded twin of ``fleet`` for a run of ``hours`` (a ``WorldFactory``)."""
    return TwinWorld(Twin(fleet, seed, hours_hint=hours))
