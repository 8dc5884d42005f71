"""Levers: the typed, reversible mitigations an incident commander hands out.

Mitigate before root cause, with the cheapest reversible lever that has the smallest blast radius.
Each lever kind has a ``LeverSpec`` in ``CATALOGUE``: its scope, its rank in the reference's
rollback order (kill switch, bundle label, route weight, rollout abort, queue hold, node quarantine,
and the driver last), the role that decides it, the guards it cannot be pulled without, and a
planner that turns a request (``Lever``: kind, target, params) into the ordered operations it
applies through the ``Fleet`` port.

Pulling a lever validates first and acts second: approvals and guards are checked, the operations
are planned, the inverse of every one is computed from the fleet's current state and recorded,
and only then is anything applied. Every pull, refused ones included, leaves a
``LeverJournalEntry`` with who approved it, why, when, what it did and how to undo it. Levers only
narrow access: a plan that would widen it is refused (``guards.check_narrows``).

A cell drain also goes in steps (``pull_drain``): 100 → 50 → 0, holding after each step and
stepping back when the receiving cells start to burn.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeGuard, TypeVar

from firedrill.errors import FiredrillError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.operations import Operation
from firedrill.model.state import CellView
from firedrill.ports import Clock, Fleet, Signals
from firedrill.respond.guards import (
    DENY_ALL_FLAG,
    DRAIN_STEPS_PERCENT,
    QUARANTINE_TAINT,
    SIDE_EFFECT_SUFFIX,
    Approver,
    CapacityView,
    DigestCatalog,
    DrainPlan,
    GuardResult,
    Role,
    UnsafeKind,
    UnsafeRequest,
    check_approvals,
    check_narrows,
    check_rollback_target,
    check_scale_in_paused,
    plan_cell_drain,
    refuse_unsafe,
    side_effect_rank,
)

LeverKind = Literal[
    "kill_switch",
    "bundle_revert",
    "route_weight",
    "rollout_abort",
    "queue_hold",
    "node_quarantine",
    "jobset_suspend",
    "scaler_pause",
    "pod_quarantine",
    "driver_rollback",
    "digest_rollback",
    "cell_drain",
    "cell_quarantine",
    "warm_pool",
    "content_block",
    "promotion_freeze",
    "compensation",
    "pd_rebalance",
]
Scope = Literal["cell", "tenant", "model", "fleet"]
LeverStatus = Literal["applied", "proposed", "refused"]

FLEET_WIDE = "*"  # a kill switch's target for the fleet-wide egress deny-all
REASON_LABEL = "gpu.corp/quarantine-reason"
TICKET_LABEL = "gpu.corp/quarantine-ticket"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_SCOPE_ORDER: Mapping[Scope, int] = {"tenant": 0, "cell": 1, "model": 2, "fleet": 3}


class LeverError(FiredrillError):
    """A lever request is malformed: params of another kind, a value out of range, nothing to do."""


# ---------------------------------------------------------------------------------------------
# requests


@dataclass(frozen=True)
class NoParams:
    """The lever needs nothing beyond its target (or takes its defaults)."""


@dataclass(frozen=True)
class KillSwitchParams:
    max_side_effect: Literal["read", "none"] = "read"


@dataclass(frozen=True)
class ServingConfigParams:
    """The last-known-good CatalogBundle serving config a bundle revert goes back to."""

    bundle_digest: str
    max_num_seqs: int
    gpu_memory_utilization: float


@dataclass(frozen=True)
class RouteWeightParams:
    weights: tuple[tuple[str, int], ...]  # (cell, weight)


@dataclass(frozen=True)
class RegionWeightParams:
    """The global route's share (percent) of a region's users its own cells serve; the rest go
    to the other regions' cells. A region failover steps it down, a failback back up."""

    region: str
    percent: int


@dataclass(frozen=True)
class QueueHoldParams:
    policy: Literal["Hold", "HoldAndDrain"] = "Hold"


@dataclass(frozen=True)
class QuarantineParams:
    reason: str = "incident"
    ticket: str = ""


@dataclass(frozen=True)
class ModelsParams:
    """The models a cell lever acts on; empty means every model the cell runs or is routed."""

    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriverParams:
    version: str  # the driver to go back to
    nodes: tuple[str, ...] = ()  # empty: every node of the cell on another driver


@dataclass(frozen=True)
class DigestParams:
    region: str
    digest: str  # a previous, signed and attested digest


@dataclass(frozen=True)
class SplitParams:
    """A disaggregated model's prefill share in the lever's cell (the rest of it decodes)."""

    model: str
    prefill_share: float


@dataclass(frozen=True)
class WarmPoolParams:
    replicas: int = 0  # the tenant's SandboxWarmPool size; 0 starts no new session


@dataclass(frozen=True)
class ContentParams:
    content_hash: str  # the injecting content (doc, URL, ticket) to block at retrieval


@dataclass(frozen=True)
class FreezeParams:
    kinds: tuple[Literal["bundle", "toolset"], ...] = ("bundle", "toolset")


@dataclass(frozen=True)
class CompensationParams:
    since_s: float  # completed writes from then on
    sessions: tuple[str, ...] = ()  # only these sessions' writes (empty: the tenant's)
    content_hash: str = ""  # only writes that followed this content


LeverParams = (
    WarmPoolParams | ContentParams | FreezeParams | CompensationParams
    | NoParams | KillSwitchParams | ServingConfigParams | RouteWeightParams | RegionWeightParams
    | QueueHoldParams
    | QuarantineParams | ModelsParams | DriverParams | DigestParams | SplitParams
)  # fmt: skip


@dataclass(frozen=True)
class Lever:
    """A lever request. ``target`` is, by kind: a tenant (or ``*``), model, cell, queue, node,
    JobSet or pod; ``params`` carry the rest (see each kind's planner)."""

    kind: LeverKind
    target: str
    params: LeverParams = NoParams()


@dataclass(frozen=True)
class LeverStep:
    """Operations applied together; a stepped lever (a drain) holds between its steps."""

    label: str
    ops: tuple[Operation, ...]


Planner = Callable[[Lever, Fleet], tuple[LeverStep, ...]]


@dataclass(frozen=True)
class LeverSpec:
    kind: LeverKind
    scope: Scope  # blast radius of one request; some requests widen to fleet (``scope_of``)
    rank: int  # position in the rollback order: fastest and smallest first
    decided_by: frozenset[Role]  # one approver must hold one of these roles
    summary: str
    plan: Planner
    fleet_roles: frozenset[Role] = frozenset()  # also required when the request is fleet-wide
    requires: tuple[str, ...] = ()  # guards that must have run (by GuardResult.guard)
    moves_traffic: bool = False
    fleet_requires: tuple[str, ...] = ()  # also required when the request is fleet-wide
    # Outside the on-call role: applied only under a two-person break-glass grant, whatever a
    # policy lists (a policy may add kinds, never remove these).
    breakglass: bool = False


# ---------------------------------------------------------------------------------------------
# planners


P = TypeVar("P", bound=LeverParams)


def _params(lever: Lever, kind: type[P], default: P | None) -> P:
    if isinstance(lever.params, kind):
        return lever.params
    if isinstance(lever.params, NoParams) and default is not None:
        return default
    raise LeverError(f"{lever.kind} takes {kind.__name__}, not {type(lever.params).__name__}")


def _cell_view(fleet: Fleet, cell: str) -> CellView:
    for view in fleet.cells():
        if view.name == cell:
            return view
    raise UnknownTargetError("cell", cell)


def _one(label: str, *operations: Operation) -> tuple[LeverStep, ...]:
    return (LeverStep(label, tuple(operations)),)


def _plan_kill_switch(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, KillSwitchParams, KillSwitchParams())
    if lever.target == FLEET_WIDE:
        return _one("fleet-wide egress deny-all", ops.SetFlag(DENY_ALL_FLAG, "true"))
    if not _NAME.fullmatch(lever.target):
        raise LeverError(f"kill_switch targets a tenant name or '*', not {lever.target!r}")
    key = f"{lever.target}{SIDE_EFFECT_SUFFIX}"
    # The inverse carries the flag's current value: a stricter switch already set stays.
    now = fleet.inverse_of(ops.SetFlag(key, p.max_side_effect))
    current = now.value if isinstance(now, ops.SetFlag) else None
    if side_effect_rank(current) < side_effect_rank(p.max_side_effect):
        raise LeverError(f"{key} is already {current}, stricter than {p.max_side_effect}")
    return _one(f"{key} = {p.max_side_effect}", ops.SetFlag(key, p.max_side_effect))


def _plan_bundle_revert(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, ServingConfigParams, None)
    if not (1 <= p.max_num_seqs <= 4096 and 0.1 < p.gpu_memory_utilization <= 1.0):
        raise LeverError("a serving config has max_num_seqs 1..4096, gpu_memory_utilization 0.1..1")
    return _one(
        f"{lever.target} bundle back to {p.bundle_digest}",
        ops.SetServingConfig(
            lever.target, p.bundle_digest, p.max_num_seqs, p.gpu_memory_utilization
        ),
    )


def _plan_route_weight(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    if isinstance(lever.params, RegionWeightParams):
        r = lever.params
        if not 0 <= r.percent <= 100:
            raise LeverError("a region weight is a percent within 0..100")
        return _one(
            f"{lever.target} {r.region} region weight {r.percent}%",
            ops.SetRegionWeight(lever.target, r.region, r.percent),
        )
    p = _params(lever, RouteWeightParams, None)
    cells = [c for c, _ in p.weights]
    if not p.weights or len(set(cells)) != len(cells):
        raise LeverError("route_weight names each cell once, at least one")
    if any(w < 0 for _, w in p.weights):
        raise LeverError("route weights are >= 0")
    return _one(f"{lever.target} route weights", ops.SetRouteWeights(lever.target, p.weights))


def _plan_rollout_abort(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    _params(lever, NoParams, None)
    return _one(f"abort {lever.target} rollout", ops.AbortRollout(lever.target))


def _plan_queue_hold(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, QueueHoldParams, QueueHoldParams())
    return _one(f"{lever.target} {p.policy}", ops.SetQueueStopPolicy(lever.target, p.policy))


def _plan_node_quarantine(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, QuarantineParams, QuarantineParams())
    for value in (p.reason, p.ticket):
        if value and not _LABEL_VALUE.fullmatch(value):
            raise LeverError(f"{value!r} is not a label value")
    if not p.reason:
        raise LeverError("a node quarantine carries a reason")
    node = lever.target
    steps: list[Operation] = [
        ops.Taint(node, QUARANTINE_TAINT, p.reason, "NoSchedule"),
        ops.Label(node, REASON_LABEL, p.reason),
    ]
    if p.ticket:
        steps.append(ops.Label(node, TICKET_LABEL, p.ticket))
    return _one(f"quarantine {node}: {p.reason}", *steps)


def _plan_jobset_suspend(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    _params(lever, NoParams, None)
    return _one(f"suspend {lever.target}", ops.SuspendJobSet(lever.target))


def _plan_scaler_pause(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, ModelsParams, ModelsParams())
    view = _cell_view(fleet, lever.target)
    known = {rc.model for rc in view.replicas}
    for m in p.models:
        if m not in known:
            raise UnknownTargetError("model", m)
    chosen = [
        rc
        for rc in view.replicas
        if (rc.model in p.models if p.models else rc.desired > 0 or rc.ready > 0)
    ]
    # Freeze at what serves now: a scale-in already under way stops too.
    pins = tuple(ops.PauseScaler(rc.model, view.name, max(rc.desired, rc.ready)) for rc in chosen)
    if not pins:
        raise LeverError(f"no scaler to pause in {view.name}")
    return _one(f"pin scalers in {view.name}", *pins)


def _plan_pod_quarantine(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    _params(lever, NoParams, None)
    return _one(f"quarantine pod {lever.target}", ops.QuarantinePod(lever.target))


def _plan_driver_rollback(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, DriverParams, None)
    nodes = {n.name: n for n in fleet.node_views(cell=lever.target)}
    for name in p.nodes:
        if name not in nodes:
            raise UnknownTargetError("node", name)
    chosen = p.nodes or tuple(sorted(nodes))
    back = tuple(
        ops.SetNodeVersion(name, "driver", p.version)
        for name in chosen
        if dict(nodes[name].versions).get("driver") != p.version
    )
    if not back:
        raise LeverError(f"every chosen node of {lever.target} already runs driver {p.version}")
    return _one(f"driver {p.version} on {len(back)} node(s) of {lever.target}", *back)


def _plan_digest_rollback(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, DigestParams, None)
    return _one(
        f"{lever.target} in {p.region} back to {p.digest}",
        ops.RestoreDigest(lever.target, p.region, p.digest),
    )


def _plan_cell_drain(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, ModelsParams, ModelsParams())
    view = _cell_view(fleet, lever.target)
    weights = dict(view.route_weights)
    for m in p.models:
        if m not in weights:
            raise UnknownTargetError("model", m)
    routed = [(m, w) for m, w in view.route_weights if w > 0 and (not p.models or m in p.models)]
    if not routed:
        raise LeverError(f"nothing is routed to {view.name}")
    return tuple(
        LeverStep(
            f"{view.name} weight {pct}%",
            tuple(ops.SetRouteWeights(m, ((view.name, w * pct // 100),)) for m, w in routed),
        )
        for pct in DRAIN_STEPS_PERCENT[1:]
    )


def _plan_cell_quarantine(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    _params(lever, NoParams, None)
    return _one(f"quarantine cell {lever.target}", ops.QuarantineCell(lever.target))


def _plan_pd_rebalance(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, SplitParams, None)
    if not 0.0 < p.prefill_share < 1.0:
        raise LeverError("a prefill share is strictly within 0..1")
    view = _cell_view(fleet, lever.target)
    if p.model not in {rc.model for rc in view.replicas}:
        raise UnknownTargetError("model", p.model)
    return _one(
        f"{p.model} in {view.name}: prefill {p.prefill_share:.0%} of replicas",
        ops.SetPrefillDecodeSplit(p.model, view.name, p.prefill_share),
    )


def _plan_warm_pool(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, WarmPoolParams, WarmPoolParams())
    if p.replicas < 0:
        raise LeverError("a warm pool has >= 0 replicas")
    now = fleet.inverse_of(ops.SetWarmPool(lever.target, p.replicas))
    if isinstance(now, ops.SetWarmPool) and now.replicas < p.replicas:
        raise LeverError(
            f"{lever.target}'s warm pool is {now.replicas}: containment never grows it"
        )
    return _one(
        f"{lever.target} warm pool to {p.replicas}", ops.SetWarmPool(lever.target, p.replicas)
    )


def _plan_content_block(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, ContentParams, None)
    return _one(
        f"block {p.content_hash} at retrieval for {lever.target}",
        ops.BlockContentHash(lever.target, p.content_hash),
    )


def _plan_promotion_freeze(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, FreezeParams, FreezeParams())
    if not p.kinds or len(set(p.kinds)) != len(p.kinds):
        raise LeverError("promotion_freeze names each kind (bundle, toolset) once, at least one")
    return _one(
        f"freeze {'/'.join(p.kinds)} promotions of {lever.target}",
        *(ops.FreezePromotions(lever.target, k) for k in p.kinds),
    )


def _plan_compensation(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    p = _params(lever, CompensationParams, None)
    which = f" of {', '.join(p.sessions)}" if p.sessions else ""
    cause = f" after {p.content_hash}" if p.content_hash else ""
    return _one(
        f"compensate {lever.target}'s completed writes{which}{cause} since {p.since_s:.0f} s",
        ops.RunCompensations(lever.target, p.since_s, p.sessions, p.content_hash),
    )


def _roles(*roles: Role) -> frozenset[Role]:
    return frozenset(roles)


_SPECS = (
    LeverSpec(
        "kill_switch", "tenant", 1, _roles("security_lead"),
        "a tenant's tools down to read-only side effects ('*': fleet-wide egress deny-all)",
        _plan_kill_switch, fleet_roles=_roles("incident_commander"), fleet_requires=("sev1",),
    ),
    LeverSpec(
        "warm_pool", "tenant", 1, _roles("security_lead"),
        "a tenant's sandbox warm pool down (0: no new session starts)", _plan_warm_pool,
    ),
    LeverSpec(
        "content_block", "tenant", 2, _roles("security_lead"),
        "block injecting content by hash at retrieval, for one tenant", _plan_content_block,
    ),
    LeverSpec(
        "promotion_freeze", "model", 2, _roles("security_lead", "model_owner"),
        "freeze a product's CatalogBundle/toolset promotions (rollbacks still go)",
        _plan_promotion_freeze,
    ),
    LeverSpec(
        "compensation", "tenant", 2, _roles("security_lead"),
        "run the registered compensations of a tenant's completed writes", _plan_compensation,
    ),
    LeverSpec(
        "pod_quarantine", "tenant", 1, _roles("security_lead"),
        "cut a pod off for forensics, keeping it", _plan_pod_quarantine,
    ),
    LeverSpec(
        "bundle_revert", "fleet", 2, _roles("model_owner"),
        "the model's CatalogBundle back to its last-known-good serving config",
        _plan_bundle_revert,
    ),
    LeverSpec(
        "route_weight", "cell", 3, _roles("ops_lead", "capacity_lead"),
        "set a model's route weights (several cells: the global route table)",
        _plan_route_weight, requires=("scale_in_paused",), moves_traffic=True,
    ),
    LeverSpec(
        "cell_drain", "cell", 3, _roles("capacity_lead"),
        "shift a cell's traffic to its region in steps 100 -> 50 -> 0",
        _plan_cell_drain, requires=("drain_headroom", "scale_in_paused"), moves_traffic=True,
    ),
    LeverSpec(
        "cell_quarantine", "cell", 3, _roles("ops_lead", "security_lead"),
        "stop new routing to a cell, keeping its replicas for evidence and fast return",
        _plan_cell_quarantine, requires=("scale_in_paused",), moves_traffic=True, breakglass=True,
    ),
    LeverSpec(
        "scaler_pause", "cell", 3, _roles("ops_lead", "capacity_lead"),
        "pin a cell's scalers at the replicas serving now (registry/hydrate incidents: first)",
        _plan_scaler_pause,
    ),
    LeverSpec(
        "pd_rebalance", "cell", 3, _roles("capacity_lead"),
        "move a disaggregated pool's replicas to the role that saturates (prefill or decode)",
        _plan_pd_rebalance,
    ),
    LeverSpec(
        "rollout_abort", "model", 4, _roles("model_owner"),
        "abort a weights canary: stable back to 100%", _plan_rollout_abort,
    ),
    LeverSpec(
        "digest_rollback", "model", 4, _roles("model_owner"),
        "a region back to a previous signed and attested weights digest",
        _plan_digest_rollback, requires=("rollback_target",), breakglass=True,
    ),
    LeverSpec(
        "queue_hold", "cell", 5, _roles("ops_lead"),
        "Kueue stopPolicy Hold: no new admissions, running work continues", _plan_queue_hold,
    ),
    LeverSpec(
        "jobset_suspend", "cell", 5, _roles("ops_lead"),
        "suspend a JobSet: the gang stops, the object and its history stay",
        _plan_jobset_suspend,
    ),
    LeverSpec(
        "node_quarantine", "cell", 6, _roles("ops_lead"),
        "taint and label a node with the reason", _plan_node_quarantine,
    ),
    LeverSpec(
        "driver_rollback", "cell", 7, _roles("ops_lead"),
        "a cell's nodes back to a previous driver: the slowest lever, last",
        _plan_driver_rollback, breakglass=True,
    ),
)  # fmt: skip

CATALOGUE: Mapping[LeverKind, LeverSpec] = {s.kind: s for s in _SPECS}
BREAKGLASS_KINDS: frozenset[LeverKind] = frozenset(k for k, s in CATALOGUE.items() if s.breakglass)
ROLLBACK_ORDER: tuple[LeverKind, ...] = tuple(
    sorted(CATALOGUE, key=lambda k: (CATALOGUE[k].rank, _SCOPE_ORDER[CATALOGUE[k].scope], k))
)


def is_lever_kind(kind: str) -> TypeGuard[LeverKind]:
    return kind in CATALOGUE


def scope_of(lever: Lever) -> Scope:
    """The blast radius of a request: its lever's scope, or fleet when it edits fleet-wide state."""
    if lever.kind == "kill_switch" and lever.target == FLEET_WIDE:
        return "fleet"
    if (
        lever.kind == "route_weight"
        and isinstance(lever.params, RouteWeightParams)
        and len(lever.params.weights) > 1
    ):
        return "fleet"  # more than one cell: the global route table, not one cell's weight
    if lever.kind == "route_weight" and isinstance(lever.params, RegionWeightParams):
        return "fleet"  # a region's share of the global route
    return CATALOGUE[lever.kind].scope


def steps(lever: Lever, fleet: Fleet) -> tuple[LeverStep, ...]:
    """The lever's operations, grouped in the steps it applies them in."""
    return CATALOGUE[lever.kind].plan(lever, fleet)


def operations(lever: Lever, fleet: Fleet) -> tuple[Operation, ...]:
    """The ordered operations a lever applies."""
    return tuple(op for step in steps(lever, fleet) for op in step.ops)


# ---------------------------------------------------------------------------------------------
# guards, wired to lever requests


def approvals(lever: Lever, approvers: Sequence[Approver]) -> GuardResult:
    spec = CATALOGUE[lever.kind]
    return check_approvals(
        lever.kind,
        approvers,
        decided_by=spec.decided_by,
        fleet_scope=scope_of(lever) == "fleet",
        fleet_roles=spec.fleet_roles,
    )


def traffic_pools(lever: Lever, fleet: Fleet) -> tuple[tuple[str, str], ...]:
    """(model, cell) pools whose load a traffic lever changes: every cell of the region(s)."""
    if not CATALOGUE[lever.kind].moves_traffic:
        return ()
    views = list(fleet.cells())
    region_of = {v.name: v.region for v in views}
    if lever.kind == "route_weight" and isinstance(lever.params, RegionWeightParams):
        models: set[str] = {lever.target}
        named = [v.name for v in views if v.region == lever.params.region]
    elif lever.kind == "route_weight":
        p = _params(lever, RouteWeightParams, None)
        models = {lever.target}
        named = [c for c, _ in p.weights]
    else:
        here = _cell_view(fleet, lever.target)
        chosen = lever.params.models if isinstance(lever.params, ModelsParams) else ()
        models = {m for m, w in here.route_weights if w > 0 and (not chosen or m in chosen)}
        named = [here.name]
    for c in named:
        if c not in region_of:
            raise UnknownTargetError("cell", c)
    regions = {region_of[c] for c in named}
    return tuple(
        sorted(
            (rc.model, v.name)
            for v in views
            if v.region in regions
            for rc in v.replicas
            if rc.model in models and (rc.desired > 0 or rc.ready > 0)
        )
    )


def applied_ops(journal: Sequence[LeverJournalEntry]) -> tuple[Operation, ...]:
    """Every operation the journal's applied entries made, in order."""
    return tuple(op for e in journal if e.status == "applied" for op in e.ops)


def scale_in_check(
    lever: Lever,
    fleet: Fleet,
    *,
    incident_tags: Collection[str],
    journal: Sequence[LeverJournalEntry],
) -> GuardResult:
    """The scale-in guard for this lever, read from what the incident's journal applied."""
    if not CATALOGUE[lever.kind].moves_traffic:
        return check_scale_in_paused(
            (), incident_tags=incident_tags, applied=(), moves_no_traffic=lever.kind
        )
    return check_scale_in_paused(
        traffic_pools(lever, fleet), incident_tags=incident_tags, applied=applied_ops(journal)
    )


def drain_check(lever: Lever, fleet: Fleet, signals: Signals, capacity: CapacityView) -> DrainPlan:
    """The headroom check of a cell drain, with the plan that watches its receivers."""
    if lever.kind != "cell_drain":
        raise LeverError(f"{lever.kind} is not a cell drain")
    models = lever.params.models if isinstance(lever.params, ModelsParams) else ()
    return plan_cell_drain(
        lever.target, cells=fleet.cells(), signals=signals, capacity=capacity, models=models
    )


def rollback_check(lever: Lever, catalog: DigestCatalog) -> GuardResult:
    if lever.kind != "digest_rollback":
        raise LeverError(f"{lever.kind} is not a digest rollback")
    p = _params(lever, DigestParams, None)
    return check_rollback_target(catalog, lever.target, p.digest)


# ---------------------------------------------------------------------------------------------
# the journal and pulling


@dataclass(frozen=True)
class LeverJournalEntry:
    """One pull, refused ones included: what, who approved, why, when, and how to undo it.

    ``inverses`` are computed from the fleet's state before any operation is applied; applying
    them in reverse order undoes the lever (``undo``). For a refusal, ``reason`` says why.
    """

    kind: LeverKind | UnsafeKind
    scope: Scope
    target: str
    ops: tuple[Operation, ...]
    inverses: tuple[Operation, ...]
    status: LeverStatus
    reason: str
    approvers: tuple[Approver, ...]
    at_s: float
    checks: tuple[GuardResult, ...] = ()


@dataclass(frozen=True)
class _Vetted:
    scope: Scope
    steps: tuple[LeverStep, ...]
    checks: tuple[GuardResult, ...]
    refusals: tuple[str, ...]


def _vet(
    lever: Lever, fleet: Fleet, approvers: Sequence[Approver], checks: Sequence[GuardResult]
) -> _Vetted:
    spec = CATALOGUE[lever.kind]
    results = [approvals(lever, approvers), *checks]
    refusals = [r.reason for r in results if not r.ok]
    # A passing result counts only when a guard minted it: a caller cannot vouch for a guard.
    refusals += [
        f"the {r.guard or 'unnamed'} check did not come from its guard: it is not counted"
        for r in checks
        if r.ok and not r.genuine
    ]
    ran = {r.guard for r in checks if r.genuine}
    fleet_wide = spec.fleet_requires if scope_of(lever) == "fleet" else ()
    refusals += [
        f"{lever.kind} needs the {g} guard before it is pulled"
        for g in (*spec.requires, *fleet_wide)
        if g not in ran
    ]
    planned: tuple[LeverStep, ...] = ()
    try:
        planned = steps(lever, fleet)
    except FiredrillError as exc:
        refusals.append(f"cannot plan {lever.kind} on {lever.target}: {exc}")
    return _Vetted(scope_of(lever), planned, tuple(results), tuple(refusals))


def _inverses(fleet: Fleet, operations: Sequence[Operation]) -> tuple[Operation, ...]:
    return tuple(fleet.inverse_of(op) for op in operations)


def _apply_all(
    fleet: Fleet, operations: Sequence[Operation], inverses: Sequence[Operation]
) -> str | None:
    """Apply in order; on a failure, revert what was applied and say what happened."""
    done: list[Operation] = []
    for op, inverse in zip(operations, inverses, strict=True):
        try:
            fleet.apply(op)
        except FiredrillError as exc:
            for back in reversed(done):
                fleet.apply(back)
            return f"{op} failed: {exc}; the {len(done)} operation(s) applied before it reverted"
        done.append(inverse)
    return None


def _entry(
    lever: Lever,
    scope: Scope,
    operations: Sequence[Operation],
    inverses: Sequence[Operation],
    status: LeverStatus,
    reason: str,
    approvers: Sequence[Approver],
    at_s: float,
    checks: Sequence[GuardResult],
) -> LeverJournalEntry:
    return LeverJournalEntry(
        kind=lever.kind,
        scope=scope,
        target=lever.target,
        ops=tuple(operations),
        inverses=tuple(inverses),
        status=status,
        reason=reason,
        approvers=tuple(approvers),
        at_s=at_s,
        checks=tuple(checks),
    )


def _pull_step(
    lever: Lever,
    fleet: Fleet,
    operations: Sequence[Operation],
    *,
    scope: Scope,
    approvers: Sequence[Approver],
    at_s: float,
    reason: str,
    checks: Sequence[GuardResult],
    dry_run: bool,
) -> LeverJournalEntry:
    try:
        inverses = _inverses(fleet, operations)
    except FiredrillError as exc:
        why = f"cannot apply {lever.kind} on {lever.target}: {exc}"
        return _entry(lever, scope, operations, (), "refused", why, approvers, at_s, checks)
    narrow = check_narrows(operations, inverses)
    checks = (*checks, narrow)
    if not narrow.ok:
        return _entry(
            lever, scope, operations, inverses, "refused", narrow.reason, approvers, at_s, checks
        )
    if dry_run:
        return _entry(
            lever, scope, operations, inverses, "proposed", reason, approvers, at_s, checks
        )
    failed = _apply_all(fleet, operations, inverses)
    status: LeverStatus = "refused" if failed else "applied"
    return _entry(
        lever, scope, operations, inverses, status, failed or reason, approvers, at_s, checks
    )


def pull(
    lever: Lever,
    fleet: Fleet,
    *,
    approvers: Sequence[Approver],
    at_s: float,
    reason: str,
    checks: Sequence[GuardResult] = (),
    dry_run: bool = False,
) -> LeverJournalEntry:
    """Vet, plan, record the inverses, then apply every step at once (or only propose it).

    ``checks`` are the guards the caller ran (drain headroom, rollback target, scale-in paused);
    a lever refuses to go without the ones its spec ``requires``.
    """
    v = _vet(lever, fleet, approvers, checks)
    planned = tuple(op for s in v.steps for op in s.ops)
    if v.refusals:
        return _entry(
            lever, v.scope, planned, (), "refused", "; ".join(v.refusals), approvers, at_s, v.checks
        )
    return _pull_step(
        lever,
        fleet,
        planned,
        scope=v.scope,
        approvers=approvers,
        at_s=at_s,
        reason=reason,
        checks=v.checks,
        dry_run=dry_run,
    )


def pull_drain(
    lever: Lever,
    fleet: Fleet,
    clock: Clock,
    *,
    plan: DrainPlan,
    burn_rates: Callable[[Sequence[str]], Mapping[str, float]],
    approvers: Sequence[Approver],
    reason: str,
    checks: Sequence[GuardResult] = (),
    hold_s: float = 300.0,
) -> tuple[LeverJournalEntry, ...]:
    """Drain a cell step by step, watching the receivers' burn rates after each step.

    Each step is its own journal entry. After a step, the drain holds ``hold_s`` seconds and reads
    the receivers' burn rates; when one burns fast, the last step is undone and the drain stops.
    """
    if lever.kind != "cell_drain" or plan.cell != lever.target:
        raise LeverError(f"pull_drain drains the plan's cell {plan.cell}, not {lever}")
    v = _vet(lever, fleet, approvers, (*checks, plan.result))
    if v.refusals:
        planned = tuple(op for s in v.steps for op in s.ops)
        why = "; ".join(dict.fromkeys(v.refusals))
        at = clock.now_s()
        return (_entry(lever, v.scope, planned, (), "refused", why, approvers, at, v.checks),)
    journal: list[LeverJournalEntry] = []
    for step in v.steps:
        entry = _pull_step(
            lever,
            fleet,
            step.ops,
            scope=v.scope,
            approvers=approvers,
            at_s=clock.now_s(),
            reason=f"{reason} ({step.label})",
            checks=v.checks,
            dry_run=False,
        )
        journal.append(entry)
        if entry.status != "applied":
            break
        clock.advance(hold_s)
        rates = burn_rates(plan.receivers)
        hot = plan.burning(rates)
        if hot:
            burning = ", ".join(f"{c} {rates[c]:.1f}x" for c in hot)
            journal.append(
                undo(
                    entry,
                    fleet,
                    approvers=approvers,
                    at_s=clock.now_s(),
                    reason=f"back off: receivers burning fast ({burning} >= {plan.fast_burn}x)",
                )
            )
            break
    return tuple(journal)


def undo(
    entry: LeverJournalEntry,
    fleet: Fleet,
    *,
    approvers: Sequence[Approver],
    at_s: float,
    reason: str,
) -> LeverJournalEntry:
    """Apply an applied entry's inverses in reverse order, journalled like any pull."""
    if entry.status != "applied" or not is_lever_kind(entry.kind):
        raise LeverError(f"only an applied lever can be undone, not a {entry.status} {entry.kind}")
    lever = Lever(entry.kind, entry.target)
    spec = CATALOGUE[entry.kind]
    ok = check_approvals(
        entry.kind,
        approvers,
        decided_by=spec.decided_by,
        fleet_scope=entry.scope == "fleet",
        fleet_roles=spec.fleet_roles,
    )
    back = tuple(reversed(entry.inverses))
    why = f"undo: {reason}"
    if not ok.ok:
        return _entry(lever, entry.scope, back, (), "refused", ok.reason, approvers, at_s, (ok,))
    try:
        inverses = _inverses(fleet, back)
    except FiredrillError as exc:
        msg = f"cannot undo: {exc}"
        return _entry(lever, entry.scope, back, (), "refused", msg, approvers, at_s, (ok,))
    failed = _apply_all(fleet, back, inverses)
    status: LeverStatus = "refused" if failed else "applied"
    return _entry(lever, entry.scope, back, inverses, status, failed or why, approvers, at_s, (ok,))


_UNSAFE_SCOPE: Mapping[UnsafeKind, Scope] = {
    "disable_signature_checks": "fleet",
    "admission_ignore": "fleet",
    "public_bucket": "fleet",
    "public_mirror": "fleet",
    "widen_bucket_iam": "fleet",
    "cluster_admin": "fleet",
    "delete_pod_under_investigation": "tenant",
}


def refuse(request: UnsafeRequest, *, at_s: float) -> LeverJournalEntry:
    """Journal an unsafe shortcut as refused, with the reason and the safe path."""
    verdict = refuse_unsafe(request)
    by = f" (requested by {request.requested_by})" if request.requested_by else ""
    return LeverJournalEntry(
        kind=request.kind,
        scope=_UNSAFE_SCOPE[request.kind],
        target=request.target,
        ops=(),
        inverses=(),
        status="refused",
        reason=verdict.reason + by,
        approvers=(),
        at_s=at_s,
        checks=(verdict,),
    )
