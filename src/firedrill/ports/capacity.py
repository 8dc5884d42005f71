"""The ``Capacity`` port: what a cell can serve, per model, as the headroom guards need it.

A drain's headroom check asks how many requests a replica of a model serves at saturation in a
cell, and how much more a moved request costs a receiver whose prefix cache never saw it. These
are properties of the model's serving config and hardware, not of any simulator: the twin derives
them from its latency model, a real fleet from its load tests (or the serving config's limits).
"""

from __future__ import annotations

from typing import Protocol


class Capacity(Protocol):
    def max_rps_per_replica(self, model: str, cell: str) -> float:
        """Requests per second one ready replica of ``model`` serves in ``cell`` at saturation
        (every usable KV seat busy). Unknown model or cell: ``UnknownTargetError``."""
        ...

    def cold_cache_penalty(self, model: str, cell: str) -> float:
        """Extra cost of a request whose prefix the receiving cell's cache has never seen, as a
        fraction of a warm request (0.3: a moved request costs 1.3 warm ones)."""
        ...

    def capacity_errors(self) -> int:
        """New GPU nodes the cloud refused for insufficient capacity since the run started."""
        ...
