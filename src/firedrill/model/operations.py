"""Typed operations on a fleet. Applying one through ``Fleet.apply`` returns its inverse.

Every lever, injection and remediation is one of these values. Recording the inverse *before*
the operation is applied is what makes levers reversible and drills auto-reverting; so the inverse
is computed from the fleet's current state, not guessed by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from firedrill.model import sandbox as _sandbox

# The agent sandbox operations live in firedrill.model.sandbox; re-exported here.
BlockContentHash = _sandbox.BlockContentHash
ClearExfiltration = _sandbox.ClearExfiltration
ClearPromptInjection = _sandbox.ClearPromptInjection
FreezePromotions = _sandbox.FreezePromotions
InjectExfiltration = _sandbox.InjectExfiltration
InjectPromptInjection = _sandbox.InjectPromptInjection
PromoteToolset = _sandbox.PromoteToolset
RunCompensations = _sandbox.RunCompensations
SandboxOperation = _sandbox.SandboxOperation
SetWarmPool = _sandbox.SetWarmPool
UnblockContentHash = _sandbox.UnblockContentHash
UnfreezePromotions = _sandbox.UnfreezePromotions

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
WorkloadClass = Literal["inference", "training"]


@dataclass(frozen=True)
class Cordon:
    node: str


@dataclass(frozen=True)
class Uncordon:
    node: str


@dataclass(frozen=True)
class Taint:
    node: str
    key: str
    value: str
    effect: TaintEffect = "NoSchedule"


@dataclass(frozen=True)
class Untaint:
    node: str
    key: str
    effect: TaintEffect = "NoSchedule"


@dataclass(frozen=True)
class Label:
    """Set (value) or remove (value None) a node label."""

    node: str
    key: str
    value: str | None


@dataclass(frozen=True)
class Drain:
    """Cordon and evict the given workload classes; DaemonSets stay (they hold the evidence)."""

    node: str
    classes: tuple[WorkloadClass, ...] = ("inference", "training")


@dataclass(frozen=True)
class SetRouteWeights:
    """Set the global route's per-cell weights for a model (cells not named keep theirs)."""

    model: str
    weights: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class QuarantineCell:
    """Stop new routing to a cell; running requests and replicas stay."""

    cell: str


@dataclass(frozen=True)
class UnquarantineCell:
    cell: str


@dataclass(frozen=True)
class PauseScaler:
    """KEDA's paused-replicas: pin the model's scaler in a cell at a replica count."""

    model: str
    cell: str
    replicas: int


@dataclass(frozen=True)
class UnpauseScaler:
    model: str
    cell: str


@dataclass(frozen=True)
class SetReplicas:
    model: str
    cell: str
    replicas: int


@dataclass(frozen=True)
class StartRollout:
    """Begin a weights canary: share of the model's traffic on the new digest, per cell."""

    model: str
    digest: str
    canary_percent: int


@dataclass(frozen=True)
class AbortRollout:
    model: str


@dataclass(frozen=True)
class PromoteRollout:
    model: str


@dataclass(frozen=True)
class RestoreRollout:
    """Inverse of abort/promote: put a rollout back at a digest and step."""

    model: str
    stable_digest: str
    canary_digest: str | None
    canary_percent: int


@dataclass(frozen=True)
class SetFlag:
    """A kill-switch flag (toolgw-flags style); value None removes it."""

    key: str
    value: str | None


@dataclass(frozen=True)
class QuarantinePod:
    """Label a pod ir.corp/quarantine=true: cut off, kept for evidence."""

    pod: str


@dataclass(frozen=True)
class UnquarantinePod:
    pod: str


@dataclass(frozen=True)
class PromoteDigest:
    """Publish a weights digest as current in a region (replicated to others with lag)."""

    model: str
    region: str
    digest: str
    signed: bool = True
    attested: bool = True


@dataclass(frozen=True)
class RestoreDigest:
    """Inverse of a promotion: the region serves the previous digest again."""

    model: str
    region: str
    digest: str


@dataclass(frozen=True)
class PauseReplication:
    source: str
    target: str


@dataclass(frozen=True)
class ResumeReplication:
    source: str
    target: str


@dataclass(frozen=True)
class Partition:
    """Cut connectivity.

    'cell-registry': a cell (a) cannot reach its region's registry (b = region name);
    'region-region': regions a and b cannot reach each other (traffic, replication, services);
    'region-edge': users cannot reach region a's cells through the global edge (b = "edge").
    """

    kind: Literal["cell-registry", "region-region", "region-edge"]
    a: str
    b: str


@dataclass(frozen=True)
class Heal:
    kind: Literal["cell-registry", "region-region", "region-edge"]
    a: str
    b: str


@dataclass(frozen=True)
class DenyCapacity:
    """Insufficient-capacity errors for new GPU nodes in a region."""

    region: str


@dataclass(frozen=True)
class AllowCapacity:
    region: str


@dataclass(frozen=True)
class InjectDcgmField:
    """As ``dcgmi test --inject --gpuid G -f FIELD -v VALUE``: DCGM's view only."""

    node: str
    gpu: int
    field_id: int
    value: float


@dataclass(frozen=True)
class ClearDcgmField:
    node: str
    gpu: int
    field_id: int
    value: float = 0.0


@dataclass(frozen=True)
class InjectLinkFlap:
    """An NVLink/IB flap on a node: a TP replica spanning the link is lost whole."""

    node: str


@dataclass(frozen=True)
class ClearLinkFlap:
    node: str


@dataclass(frozen=True)
class InjectThermal:
    """Thermal stress on a GPU: the replica on it decodes ``slowdown`` times slower."""

    node: str
    gpu: int
    slowdown: float = 2.0


@dataclass(frozen=True)
class ClearThermal:
    node: str
    gpu: int


@dataclass(frozen=True)
class SetServingConfig:
    """A CatalogBundle change of serving config for a model (max_num_seqs, gpu_memory_util)."""

    model: str
    bundle_digest: str
    max_num_seqs: int
    gpu_memory_utilization: float


@dataclass(frozen=True)
class SetNodeVersion:
    """A node-layer change (driver, firmware, kernel, node_image, gpu_operator, dcgm_exporter)."""

    node: str
    component: Literal[
        "driver", "firmware", "kernel", "node_image", "gpu_operator", "dcgm_exporter"
    ]
    version: str


@dataclass(frozen=True)
class InjectServingErrors:
    """A share of a pool's requests fail with 5xx (a bad serving image or canary).

    ``fail_fast`` (the default) answers the 5xx at once, so the failed request never holds a
    seat: a crashing handler, a rejected request. ``fail_fast=False`` is the hang: the request
    holds its seat for a whole service and fails at the end (a stuck decode, a timeout upstream),
    so the errors also eat capacity.
    """

    model: str
    cell: str
    fraction: float
    fail_fast: bool = True


@dataclass(frozen=True)
class ResetGpu:
    """nvidia-smi -r: the GPU is healthy again after the reset (if the fault was resettable)."""

    node: str
    gpu: int


@dataclass(frozen=True)
class RebootNode:
    """Reboot a node: not Ready for the reboot's duration, then every GPU and link is fresh."""

    node: str


@dataclass(frozen=True)
class RunBurnIn:
    """dcgmi diag -r 3 and an NCCL all-reduce on a drained node; the result lands later."""

    node: str


@dataclass(frozen=True)
class KillPod:
    """Chaos Mesh pod-kill: a serving replica's process dies (its in-flight requests fail) and
    its controller restarts it on the same node, from the weights on local disk."""

    pod: str


@dataclass(frozen=True)
class EjectReplica:
    """Take one replica out of routing (a straggler); it stays on its node for evidence."""

    pod: str


@dataclass(frozen=True)
class UnejectReplica:
    pod: str


@dataclass(frozen=True)
class SuspendJobSet:
    """JobSet spec.suspend=true: the gang stops, the object and its history stay."""

    jobset: str


@dataclass(frozen=True)
class ResumeJobSet:
    """Resume from the last committed checkpoint, never on the excluded nodes."""

    jobset: str
    exclude_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SetQueueStopPolicy:
    """Kueue ClusterQueue stopPolicy: None, 'Hold' or 'HoldAndDrain'."""

    queue: str
    policy: Literal["Hold", "HoldAndDrain"] | None


@dataclass(frozen=True)
class InjectHang:
    """A rank stops entering collectives (no crash, no XID): the gang makes no progress."""

    jobset: str
    rank: int


@dataclass(frozen=True)
class InjectStraggler:
    jobset: str
    rank: int
    slowdown: float = 2.0


@dataclass(frozen=True)
class ClearTrainingFault:
    jobset: str


@dataclass(frozen=True)
class SetWeightsQuality:
    """A weights digest's true golden-set pass rate (a fast-and-wrong digest has a low one).

    A digest the fleet has not seen is published first: signed and attested (it passed the
    supply chain, it is wrong all the same) and replicated from the root regions like a
    promotion, so a canary can use it. ``quality`` None goes back to the default of the digest.
    """

    model: str
    digest: str
    quality: float | None


@dataclass(frozen=True)
class SetPrefillDecodeSplit:
    """A disaggregated pool's share of replicas that prefill (the rest decode)."""

    model: str
    cell: str
    prefill_share: float


@dataclass(frozen=True)
class SetRequestShape:
    """The model's requests change shape (a tenant starts sending long documents).

    ``prompt_median`` tokens (lognormal, the product's sigma) and ``output_mean`` tokens.
    """

    model: str
    prompt_median: float
    output_mean: float


PullerKind = Literal["batch", "eval", "scale_out"]
AdmissionMode = Literal["Enforce", "Audit", "Ignore"]


@dataclass(frozen=True)
class StartPullers:
    """Competing pullers: ``nodes`` nodes of a region each pull ``gbytes`` GB of weights from the
    region's registry (an eval sweep, a batch job, a non-critical scale-out), sharing the origin
    and the node NICs with serving hydrate. A critical group is never frozen."""

    name: str
    region: str
    nodes: int
    gbytes: float
    kind: PullerKind = "batch"
    critical: bool = False


@dataclass(frozen=True)
class StopPullers:
    name: str


@dataclass(frozen=True)
class FreezePullers:
    """Pause (``frozen``) or resume a region's non-critical competing pullers."""

    region: str
    frozen: bool


@dataclass(frozen=True)
class RecyclePool:
    """Recycle ``percent`` % of a model's ready replicas in a cell (their nodes come back with an
    empty weights cache, so they re-hydrate), at most ``max_surge`` % of the pool at a time.
    ``pool`` is the model (the Deployment) or a node pool of the cell."""

    cell: str
    pool: str
    percent: float
    max_surge: float = 10.0


@dataclass(frozen=True)
class StopRecycle:
    """Stop recycling further replicas of a pool (the ones already recycled stay recycled)."""

    cell: str
    pool: str


@dataclass(frozen=True)
class SetAdmission:
    """The admission policy's mode in a region (Kyverno validationFailureAction / failurePolicy)."""

    region: str
    mode: AdmissionMode


@dataclass(frozen=True)
class SetRegionWeight:
    """Global route weight (percent) of a region's own cells for the region's users; the rest
    goes to the other regions' cells by their route weights. 100 is the default."""

    model: str
    region: str
    percent: int


@dataclass(frozen=True)
class MirrorTraffic:
    """Mirror ``percent`` % of a region's users' requests to the region's own cells (Gateway
    API RequestMirror): responses are discarded, the prefix caches warm. 0 stops it."""

    model: str
    region: str
    percent: int


@dataclass(frozen=True)
class Noop:
    """The inverse of an operation that needs no undo (e.g. a read-only injection)."""

    reason: str = ""


Operation = (
    Cordon | Uncordon | Taint | Untaint | Label | Drain | SetRouteWeights | QuarantineCell
    | UnquarantineCell | PauseScaler | UnpauseScaler | SetReplicas | StartRollout | AbortRollout
    | PromoteRollout | RestoreRollout | SetFlag | QuarantinePod | UnquarantinePod | PromoteDigest
    | RestoreDigest | PauseReplication | ResumeReplication | Partition | Heal | DenyCapacity
    | AllowCapacity | InjectDcgmField | ClearDcgmField | InjectLinkFlap | ClearLinkFlap
    | InjectThermal | ClearThermal | SetServingConfig | SetNodeVersion | InjectServingErrors
    | ResetGpu | RebootNode | RunBurnIn | KillPod | EjectReplica | UnejectReplica | SuspendJobSet
    | ResumeJobSet | SetQueueStopPolicy | InjectHang | InjectStraggler | ClearTrainingFault | Noop
    | SandboxOperation  # agent sandboxes: firedrill.model.sandbox
    | SetWeightsQuality | SetPrefillDecodeSplit | SetRequestShape
    | StartPullers | StopPullers | FreezePullers | RecyclePool | StopRecycle | SetAdmission
    | SetRegionWeight | MirrorTraffic
)  # fmt: skip


@dataclass(frozen=True)
class Applied:
    """The journal record of one applied operation: what, its inverse, when."""

    op: Operation
    inverse: Operation
    at_s: float
    notes: tuple[str, ...] = field(default=())


# -- the drill conductor on a cluster ------------------------------------------------------------
# Journal records of a drill conducted on a Kubernetes cluster: a Chaos Mesh Workflow carrying the
# drill's timeline, created and deleted through the API. Only the Kubernetes conductor and
# ``gameday recover`` (through the same adapter) apply them; a fleet never receives them, so they
# are not members of ``Operation``.


@dataclass(frozen=True)
class CreateChaosWorkflow:
    """A drill's Chaos Mesh Workflow, created on the cluster: its timeline starts."""

    namespace: str
    name: str


@dataclass(frozen=True)
class DeleteChaosWorkflow:
    """Delete a drill's Workflow: Chaos Mesh ends every chaos it created (the auto-revert)."""

    namespace: str
    name: str
