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
