"""Background GPU fault processes: per-node Poisson processes by fault class.

A fleet of N nodes with a class rate of k events per 1,000 node-days is one Poisson process of rate
N·k/1000/86400 per second; each event lands on a uniformly drawn node and GPU. Phantom XIDs come
only from nodes whose DCGM exporter version is in the spec's bad list: the GPU is healthy, only the
exporter's gauge says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from firedrill.model.spec import REMEDIABLE_KINDS, REMEDIABLE_XIDS, FaultsSpec, XidRateSpec
from firedrill.twin.draws import poisson


@dataclass(frozen=True)
class FaultEvent:
    at_s: float
    node: int
    gpu: int
    kind: str  # xid | ecc_dbe | row_remap_pending | link_flap | thermal | pcie_replay
    xid: int  # the XID DCGM reports for it (0 when none)
    phantom: bool = False

    @property
    def remediable(self) -> bool:
        if self.phantom:
            return False
        return self.kind in REMEDIABLE_KINDS or (self.kind == "xid" and self.xid in REMEDIABLE_XIDS)

    @property
    def label(self) -> str:
        """The class name used in summaries: 'xid79', 'ecc_dbe', ..."""
        return f"xid{self.xid}" if self.kind == "xid" else self.kind


# XID DCGM shows alongside a non-XID fault class (0: no XID).
KIND_XID = {"ecc_dbe": 48, "row_remap_pending": 63, "link_flap": 74, "thermal": 0, "pcie_replay": 0}


class FaultProcess:
    def __init__(self, spec: FaultsSpec, nodes: int, gpus_per_node: int, rng: np.random.Generator):
        self.classes: list[XidRateSpec] = list(spec.background)
        self.per_node_s = np.array([c.per_1000_node_days / 1000.0 / 86400.0 for c in self.classes])
        self.nodes = nodes
        self.gpus = gpus_per_node
        self.rng = rng
        self.phantom_rate_s = spec.phantom_xid_per_node_hour / 3600.0
        self.phantom_xid = spec.phantom_xid
        self.bad_nodes: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._lam_key = (-1.0, -1)
        self._lam = self.per_node_s

    def set_bad_nodes(self, bad: npt.NDArray[np.int64]) -> None:
        self.bad_nodes = bad

    def sample(self, t_s: float, dt_s: float) -> list[FaultEvent]:
        out: list[FaultEvent] = []
        if (dt_s, self.nodes) != self._lam_key:  # rates for this step and fleet size, once
            self._lam = self.per_node_s * self.nodes * dt_s
            self._lam_key = (dt_s, self.nodes)
        counts = poisson(self.rng, self._lam)  # no classes: nothing drawn, as numpy does
        if np.count_nonzero(counts):
            for ci in np.nonzero(counts)[0]:
                cls = self.classes[int(ci)]
                for _ in range(int(counts[ci])):
                    node = int(self.rng.integers(self.nodes))
                    gpu = int(self.rng.integers(self.gpus))
                    xid = (
                        cls.xid if cls.kind == "xid" and cls.xid is not None else KIND_XID[cls.kind]
                    )
                    out.append(FaultEvent(t_s, node, gpu, cls.kind, xid))
        if self.bad_nodes.size:
            k = int(self.rng.poisson(self.phantom_rate_s * self.bad_nodes.size * dt_s))
            for _ in range(k):
                node = int(self.bad_nodes[int(self.rng.integers(self.bad_nodes.size))])
                gpu = int(self.rng.integers(self.gpus))
                out.append(FaultEvent(t_s, node, gpu, "xid", self.phantom_xid, phantom=True))
        return out
