"""Injections: what each drill injection kind does to a fleet, as typed operations.

An injection in the spec is a fault with a scope (``region_blackhole us-east-1``); the fleet
only knows operations (``Partition``, ``PauseReplication`` ...). ``expand`` turns one into the
other *at the moment it is applied*, reading the fleet through its port (which nodes a cell has
for the model, which pods run there), so the operations name real targets. The runner records
each operation's inverse (``Fleet.inverse_of``) in the journal before applying it.

A cell drain is not expanded here: it is the control plane's own stepped lever (``failover``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from firedrill.drill.spec import (
    BadDigest,
    CapacityDenial,
    CellDrain,
    DcgmField,
    HydrateStorm,
    Injection,
    NewDigestDuringPause,
    NvlinkFlap,
    RegionBlackhole,
    RegistryPartition,
    ReplicaKill,
    Thermal,
)
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec
from firedrill.ports import Fleet

DCGM_XID = 230


def describe(inj: Injection) -> str:
    """One line for timelines and tables."""
    where = getattr(inj, "cell", None) or getattr(inj, "region", None) or ""
    extra = ""
    if isinstance(inj, DcgmField):
        extra = f" field {inj.field}={inj.value:g}"
    elif isinstance(inj, HydrateStorm):
        extra = f" {inj.percent:g}% maxSurge {inj.max_surge:g}%"
    elif isinstance(inj, ReplicaKill):
        extra = f" x{inj.count}"
    return f"{inj.kind} {where}{extra}".strip()


def digest_for(drill: str, index: int, purpose: str) -> str:
    """A deterministic weights digest for an injected promotion (never one the fleet has)."""
    return "sha256:" + hashlib.sha256(f"{drill}/{index}/{purpose}".encode()).hexdigest()


def model_nodes(fleet: Fleet, spec: FleetSpec, cell: str, model: str) -> list[str]:
    """The serving nodes of a cell that may host ``model`` (its node-pool affinity), by name."""
    pools = next((m.node_pools for m in spec.models if m.name == model), [])
    views = fleet.node_views(cell=cell)
    chosen = [v.name for v in views if v.role == "serving" and (not pools or v.pool in pools)]
    return sorted(chosen)


def _first(nodes: Sequence[str], count: int, used: set[str]) -> list[str]:
    """The first ``count`` nodes not already hit by an earlier injection of the drill."""
    free = [n for n in nodes if n not in used] or list(nodes)
    chosen = free[: max(1, min(count, len(free)))]
    used.update(chosen)
    return chosen


def replication_links(spec: FleetSpec, region: str) -> list[tuple[str, str]]:
    """(source, target) weights-replication links that touch ``region``."""
    links: list[tuple[str, str]] = []
    for r in spec.regions:
        if r.replicate_from == region:
            links.append((region, r.name))
        elif r.name == region and r.replicate_from is not None:
            links.append((r.replicate_from, region))
    return links


def expand(
    inj: Injection,
    index: int,
    *,
    drill: str,
    fleet: Fleet,
    spec: FleetSpec,
    model: str,
    used_nodes: set[str] | None = None,
) -> list[ops.Operation]:
    """The operations ``inj`` stands for now; an empty list when it has no target left.

    Node faults land on distinct nodes across a drill's injections (``used_nodes``), so two
    injections in one cell test two chains, not one node twice.
    """
    used = set() if used_nodes is None else used_nodes
    match inj:
        case ReplicaKill(cell=cell, count=count):
            m = inj.model or model
            pods: list[str] = []
            for node in model_nodes(fleet, spec, cell, m):
                pods.extend(fleet.pods_on(node))
                if len(pods) >= count:
                    break
            return [ops.KillPod(p) for p in pods[:count]]
        case DcgmField(cell=cell, field=fid, value=value, gpu=gpu):
            nodes = model_nodes(fleet, spec, cell, model)
            n = inj.nodes if inj.nodes is not None else 1
            if inj.share is not None:
                n = max(1, round(len(nodes) * inj.share))
            chosen = _first(nodes, n, used)
            return [ops.InjectDcgmField(node, gpu, fid, value) for node in chosen]
        case NvlinkFlap(cell=cell, nodes=n):
            chosen = _first(model_nodes(fleet, spec, cell, model), n, used)
            return [ops.InjectLinkFlap(node) for node in chosen]
        case Thermal(cell=cell, nodes=n, gpu=gpu, slowdown=slowdown):
            nodes = _first(model_nodes(fleet, spec, cell, model), n, used)
            return [ops.InjectThermal(node, gpu, slowdown) for node in nodes]
        case RegistryPartition(cell=cell):
            region = next((r.name for r in spec.regions for c in r.cells if c.name == cell), cell)
            return [ops.Partition("cell-registry", cell, region)]
        case HydrateStorm(cell=cell, pool=pool, percent=percent, max_surge=surge):
            return [ops.RecyclePool(cell, pool or inj.model or model, percent, surge)]
        case RegionBlackhole(region=region):
            out: list[ops.Operation] = []
            if inj.edge:
                out.append(ops.Partition("region-edge", region, "edge"))
            for other in (r.name for r in spec.regions if r.name != region):
                out.append(ops.Partition("region-region", region, other))
            if inj.pause_replication:
                out.extend(ops.PauseReplication(s, t) for s, t in replication_links(spec, region))
            return out
        case CapacityDenial(region=region):
            return [ops.DenyCapacity(region)]
        case BadDigest(model=m, region=region, signed=signed, attested=attested):
            digest = digest_for(drill, index, "unsigned")
            return [ops.PromoteDigest(m, region, digest, signed=signed, attested=attested)]
        case NewDigestDuringPause(model=m, region=region):
            digest = digest_for(drill, index, "new-during-pause")
            promote: list[ops.Operation] = [
                ops.PromoteDigest(m, region, digest, signed=True, attested=True)
            ]
            if inj.survivor_attempt:  # and someone tries to run it everywhere before it lands
                promote.append(ops.StartRollout(m, digest, inj.canary_percent))
            return promote
        case CellDrain():
            return []
    return []
