"""The twin's objects that change one at a time: nodes, replicas and registered digests.

They live apart from the engine so that the sub-simulations (training, recovery, sandboxes…)
can read them without importing the engine: the twin package has no import cycle. A replica's
lifecycle state is a ``ReplicaState``, an ``IntEnum`` whose values are the column indices of the
engine's per-pool state counts (``Twin.state_counts``) and what ``Twin.replica_log`` records
(as plain ints: ``ReplicaState(value)`` gives the state back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class ReplicaState(IntEnum):
    """Where a replica is in its lifecycle; the value is its column in the state counts."""

    PENDING = 0  # created, not yet on a node (exported as "cold")
    PULLING = 1  # on a node, its weights not yet on the node's disk
    LOADING = 2  # weights loading into GPU memory
    WARMING = 3  # loaded, warming up (CUDA graphs, first requests)
    READY = 4  # serving
    DRAINING = 5  # finishing in-flight requests before it goes
    EJECTED = 6  # out of routing: crashed, restarting, or ejected by a lever
    GONE = 7  # removed; its id is never reused


STATE_NAMES = ("cold", "pulling", "loading", "warming", "ready", "draining", "ejected", "gone")
# states that count toward a pool's replicas (everything but draining and gone)
LIVE = (
    ReplicaState.PENDING,
    ReplicaState.PULLING,
    ReplicaState.LOADING,
    ReplicaState.WARMING,
    ReplicaState.READY,
    ReplicaState.EJECTED,
)


@dataclass
class Node:
    name: str
    region: int
    cell: int
    pool: str
    role: str
    gpus: int
    nic_gbps: float  # GB/s
    versions: dict[str, str]
    free: list[int]  # free GPU indices
    ready: bool = True
    cordoned: bool = False
    taints: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (value, effect)
    labels: dict[str, str] = field(default_factory=dict)
    cache: set[int] = field(default_factory=set)  # digests on local disk
    failed_gpus: set[int] = field(default_factory=set)
    link_down: bool = False
    replicas: set[int] = field(default_factory=set)

    @property
    def schedulable(self) -> bool:
        return (
            self.ready
            and not self.cordoned
            and self.role == "serving"
            and not any(eff in ("NoSchedule", "NoExecute") for _, eff in self.taints.values())
        )


@dataclass
class Replica:
    id: int
    model: int
    cell: int
    digest: int
    # No class-level default: an enum member as the class attribute (a dataclass default puts
    # it there) keeps CPython 3.11 from specializing ``r.state`` loads, which the reconcile and
    # the lifecycle do for every replica (measured: about 3% of a 10k fleet's construction).
    state: ReplicaState
    node: int = -1
    gpus: tuple[int, ...] = ()
    token: int = 0  # invalidates stale heap events
    slowdown: float = 1.0

    @property
    def pod(self) -> str:
        return f"r{self.id:06d}"


@dataclass(frozen=True)
class DigestInfo:
    model: int
    digest: str
    signed: bool
    attested: bool
