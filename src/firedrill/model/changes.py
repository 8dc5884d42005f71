"""Change events: the six streams an on-call engineer checks first ("what changed?")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ChangeStream = Literal[
    "weights", "bundle", "serving_image", "node_layer", "network_policy", "demand"
]
CHANGE_STREAMS: tuple[ChangeStream, ...] = (
    "weights",
    "bundle",
    "serving_image",
    "node_layer",
    "network_policy",
    "demand",
)


@dataclass(frozen=True)
class ChangeEvent:
    """One timestamped change in one cell (or region, for fleet-wide changes: cell is '*')."""

    at_s: float
    stream: ChangeStream
    region: str
    cell: str
    subject: str  # what changed: a model, a node, a policy, a product
    before: str
    after: str
    detail: str = ""
