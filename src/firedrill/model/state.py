"""Read-only views of fleet state, as the control plane sees it through the ``Fleet`` port."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeView:
    name: str
    region: str
    cell: str
    pool: str
    role: str
    gpus: int
    ready: bool
    cordoned: bool
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect)
    labels: tuple[tuple[str, str], ...]
    versions: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ReplicaCounts:
    """Replicas of one model in one cell, by lifecycle state."""

    model: str
    cell: str
    desired: int
    cold: int
    pulling: int
    loading: int
    warming: int
    ready: int
    draining: int


@dataclass(frozen=True)
class CellView:
    name: str
    region: str
    nodes: int
    quarantined: bool
    replicas: tuple[ReplicaCounts, ...]
    route_weights: tuple[tuple[str, int], ...]  # model -> weight


@dataclass(frozen=True)
class FaultRecord:
    """A GPU or node fault the fleet saw (an XID, an ECC error, a link flap, a hot GPU)."""

    at_s: float
    node: str
    gpu: int
    kind: str  # xid | ecc_dbe | row_remap_pending | link_flap | thermal | pcie_replay
    label: str  # 'xid79', 'ecc_dbe', ...: the class name summaries use
    phantom: bool = False  # reported by a bad exporter, no real fault behind it


@dataclass(frozen=True)
class ReplicaTransition:
    """One serving replica changing lifecycle state (a pod event on a real fleet)."""

    at_s: float
    replica: str  # pod name
    model: str
    cell: str
    from_state: str | None  # None: the replica was created
    to_state: str  # cold | pulling | loading | warming | ready | draining | ejected | gone
    node: str | None  # the node it is bound to (None: not bound)
