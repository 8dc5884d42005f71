"""Guards: the checks that stop a lever from making an incident bigger.

A lever is cheap to pull and easy to regret. Each guard here answers one question with a
``GuardResult(ok, reason)`` and never touches the fleet, so the incident record can say exactly
why a lever went ahead or was refused:

* **drain headroom**: before a cell's weight goes to 0, the other cells of its region must carry its
  traffic plus the cold-prefix-cache penalty below a utilisation ceiling; the drain then goes in
  steps (100 → 50 → 0) and backs off when the receivers start to burn (``DrainPlan``);
* **approvals**: the role that owns a lever decides it (the model owner rolls back weights, the
  capacity lead signs off drains, the security lead owns kill switches), and a lever that edits
  fleet-wide state needs a second, distinct approver;
* **rollback targets**: a rollback is a deploy, so its digest must be one the fleet has seen, signed
  and attested, i.e. one admission admits;
* **scale-in first**: during a registry or hydrate incident, warm capacity that scales in cannot be
  hydrated back, so the scalers are pinned before any traffic moves;
* **the security floor**: containment narrows access, never widens it. Operations that widen access
  are recognised (``widens_access``), and the shortcuts people reach for under pressure
  (``UnsafeRequest``) are refused outright, each with what to do instead.

The math takes plain numbers (``drain_headroom``); the readers (``plan_cell_drain``,
``check_rollback_target``) only gather them through the ``Signals``, ``Capacity`` and ``Digests``
ports.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from firedrill.errors import UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.identity import canonical_identity
from firedrill.model.state import CellView
from firedrill.ports import Capacity, Digests, Signals
from firedrill.respond.severity import Sev

DRAIN_STEPS_PERCENT = (100, 50, 0)  # a drain shifts a cell's weight in these steps (reference 000)
MAX_RECEIVER_UTILIZATION = 0.85  # of saturation throughput, after the shift, penalty included
FAST_BURN = 14.4  # error-budget burn rate that pages (1 h and 5 m windows, 99.9% over 30 d)
REGISTRY_TAGS = frozenset({"registry", "hydrate"})
QUARANTINE_TAINT = "gpu.corp/quarantine"
QUARANTINE_LABELS = frozenset({"gpu.corp/quarantine-reason", "gpu.corp/quarantine-ticket"})
DENY_ALL_FLAG = "proxy.deny_all"  # the fleet-wide egress kill switch: "true" denies everything
SIDE_EFFECT_SUFFIX = ".max_side_effect"
# A tenant's tool side effects, narrowest first; no flag means no kill switch (everything allowed).
SIDE_EFFECT_LEVELS = ("none", "read", "write", "money")

Role = Literal[
    "incident_commander",
    "ops_lead",
    "comms_lead",
    "scribe",
    "model_owner",
    "capacity_lead",
    "security_lead",
]


class _Seal:
    """The mark of a result minted here; one instance, kept through copies and pickling."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "_SEAL"

    def __copy__(self) -> _Seal:
        return self

    def __deepcopy__(self, memo: object) -> _Seal:
        return self


_SEAL = _Seal()


@dataclass(frozen=True)
class GuardResult:
    """One guard's verdict. ``guard`` names the check, so a journal can show which ones ran.

    Only the guards (``passed`` and ``refused`` here) mint a genuine result: anything built
    another way (``GuardResult(True, ...)``, ``dataclasses.replace`` of a refusal) is not
    ``genuine``, and a lever pull does not count it as a guard that ran (``levers._vet``).
    """

    ok: bool
    reason: str
    guard: str = ""

    @property
    def genuine(self) -> bool:
        """Minted by a guard of this module, not made up by a caller."""
        return getattr(self, _SEAL_ATTR, None) is _SEAL


_SEAL_ATTR = "_guard_seal"  # an attribute, not a field: asdict/replace/== never see or copy it


def _mint(ok: bool, guard: str, reason: str) -> GuardResult:
    result = GuardResult(ok, reason, guard)
    object.__setattr__(result, _SEAL_ATTR, _SEAL)
    return result


def _passed(guard: str, reason: str) -> GuardResult:
    return _mint(True, guard, reason)


def refused(guard: str, reason: str) -> GuardResult:
    """A refusal: anyone may refuse (it only ever stops a lever)."""
    return _mint(False, guard, reason)


# ---------------------------------------------------------------------------------------------
# approvals


@dataclass(frozen=True)
class Approver:
    """A person approving a lever, in the incident role they hold."""

    name: str
    role: Role


def _assign(
    slots: Sequence[frozenset[Role] | None], holders: Mapping[str, frozenset[Role]]
) -> dict[int, str] | None:
    """Distinct people for the role slots (``None``: any role), or None when none exists."""

    def fill(i: int, taken: dict[int, str]) -> dict[int, str] | None:
        if i == len(slots):
            return taken
        want = slots[i]
        for person, roles in sorted(holders.items()):
            if person in taken.values() or (want is not None and not want & roles):
                continue
            found = fill(i + 1, {**taken, i: person})
            if found is not None:
                return found
        return None

    return fill(0, {})


def check_approvals(
    kind: str,
    approvers: Sequence[Approver],
    *,
    decided_by: Collection[Role],
    fleet_scope: bool,
    fleet_roles: Collection[Role] = (),
) -> GuardResult:
    """The lever's owner approved it; fleet-wide levers also have a second, distinct approver,
    and every role they need is held by a different person.

    People are told apart canonically (``model.identity``): ``alice`` and ``Alice`` are one
    person, so one person approving in two roles, or under two spellings, is one approval.
    """
    guard = "approvals"
    owners = " or ".join(sorted(decided_by))
    if not approvers:
        return refused(guard, f"{kind} needs approval by the {owners}")
    holders: dict[str, frozenset[Role]] = {}
    for a in approvers:
        who = canonical_identity(a.name)
        if not who:
            return refused(guard, f"{kind}: an approval names nobody ({a.name!r} as {a.role})")
        holders[who] = holders.get(who, frozenset()) | {a.role}
    if not any(a.role in decided_by for a in approvers):
        who = ", ".join(f"{a.name} ({a.role})" for a in approvers)
        return refused(guard, f"{kind} is decided by the {owners}; approved only by {who}")
    if fleet_scope:
        if len(holders) < 2:
            return refused(
                guard,
                f"{kind} edits fleet-wide state: it needs a second approver, distinct from "
                f"{approvers[0].name}",
            )
        missing = sorted(set(fleet_roles) - {a.role for a in approvers})
        if missing:
            return refused(guard, f"fleet-wide {kind} also needs the {', '.join(missing)}")
        slots: list[frozenset[Role] | None] = [frozenset(decided_by)]
        slots += [frozenset({r}) for r in sorted(fleet_roles)]
        if len(slots) < 2:
            slots.append(None)  # a second person, in any role
        if _assign(slots, holders) is None:
            roles = [owners, *sorted(fleet_roles)] if fleet_roles else [owners, "a second person"]
            shared = ", ".join(dict.fromkeys(f"{a.name} ({a.role})" for a in approvers))
            return refused(
                guard,
                f"fleet-wide {kind} needs the {' and the '.join(roles)} held by distinct "
                f"people; approved by {shared}",
            )
    names = ", ".join(dict.fromkeys(f"{a.name} ({a.role})" for a in approvers))
    return _passed(guard, f"{kind} approved by {names}")


# ---------------------------------------------------------------------------------------------
# cell drain headroom (pure math)


@dataclass(frozen=True)
class CellLoad:
    """One cell's load and capacity for one model, as the headroom math needs them."""

    cell: str
    offered_rps: float
    replicas: float  # ready replicas the cell keeps (a scaler about to scale in keeps fewer)
    max_rps_per_replica: float  # saturation throughput: every usable KV seat busy
    route_weight: float = 1.0

    @property
    def capacity_rps(self) -> float:
        return self.replicas * self.max_rps_per_replica


@dataclass(frozen=True)
class ReceiverLoad:
    """A receiving cell before and after it takes its share of the drained cell's traffic."""

    cell: str
    offered_rps: float
    moved_rps: float
    capacity_rps: float
    utilization_warm: float  # after the shift, as if its prefix cache already knew the traffic
    utilization: float  # after the shift, moved requests charged the cold-cache penalty


@dataclass(frozen=True)
class DrainHeadroom:
    """Whether the rest of a region can take one model's traffic off a cell."""

    model: str
    cell: str
    moved_rps: float
    cold_penalty: float
    max_utilization: float
    receivers: tuple[ReceiverLoad, ...]

    @property
    def ok(self) -> bool:
        return bool(self.receivers) and all(
            r.utilization <= self.max_utilization for r in self.receivers
        )

    @property
    def result(self) -> GuardResult:
        guard = "drain_headroom"
        limit = f"limit {self.max_utilization:.0%} of saturation"
        if not self.receivers:
            return refused(
                guard,
                f"{self.model}: no other cell of the region takes {self.cell}'s "
                f"{self.moved_rps:.0f} req/s",
            )
        over = [r for r in self.receivers if r.utilization > self.max_utilization]
        if over:
            parts = ", ".join(
                f"{r.cell} would run at {r.utilization:.0%} ({r.utilization_warm:.0%} warm) "
                f"taking {r.moved_rps:.0f} req/s"
                for r in over
            )
            return refused(
                guard,
                f"{self.model}: draining {self.cell} overloads the receivers: {parts}; "
                f"cold-cache penalty {self.cold_penalty:.0%}, {limit}",
            )
        parts = ", ".join(f"{r.cell} {r.utilization:.0%}" for r in self.receivers)
        return _passed(
            guard,
            f"{self.model}: {self.cell}'s {self.moved_rps:.0f} req/s fits: {parts} "
            f"with the cold-cache penalty, {limit}",
        )


def drain_headroom(
    model: str,
    drained: CellLoad,
    others: Sequence[CellLoad],
    *,
    cold_penalty: float,
    max_utilization: float = MAX_RECEIVER_UTILIZATION,
) -> DrainHeadroom:
    """Headroom of the receivers when ``drained`` goes to weight 0.

    The drained cell's traffic is shared among the cells that still have route weight, in
    proportion to it (how the global route spreads a region's demand). The receivers' prefix
    caches have never seen that traffic, so each moved request costs ``1 + cold_penalty`` warm
    requests. The twin applies the penalty to prefill only; charging it to the whole request is
    an upper bound, which is the side a capacity check should err on.
    """
    receivers = [c for c in others if c.route_weight > 0 and c.cell != drained.cell]
    total_weight = sum(c.route_weight for c in receivers)
    moved = max(drained.offered_rps, 0.0)
    loads: list[ReceiverLoad] = []
    for c in receivers:
        share = moved * c.route_weight / total_weight
        cap = c.capacity_rps
        warm = c.offered_rps + share
        cold = c.offered_rps + share * (1.0 + cold_penalty)
        loads.append(
            ReceiverLoad(
                cell=c.cell,
                offered_rps=c.offered_rps,
                moved_rps=share,
                capacity_rps=cap,
                utilization_warm=warm / cap if cap > 0 else float("inf"),
                utilization=cold / cap if cap > 0 else float("inf"),
            )
        )
    return DrainHeadroom(model, drained.cell, moved, cold_penalty, max_utilization, tuple(loads))


@dataclass(frozen=True)
class DrainPlan:
    """A cell drain that passed (or failed) its headroom check, and how it watches the receivers.

    The weight moves in ``steps_percent``; after each step the receivers' TTFT burn rates are
    read, and a receiver burning at or above ``fast_burn`` backs the drain off.
    """

    cell: str
    region: str
    headroom: tuple[DrainHeadroom, ...]
    steps_percent: tuple[int, ...] = DRAIN_STEPS_PERCENT
    fast_burn: float = FAST_BURN

    @property
    def receivers(self) -> tuple[str, ...]:
        return tuple(sorted({r.cell for h in self.headroom for r in h.receivers}))

    @property
    def result(self) -> GuardResult:
        if not self.headroom:
            return refused("drain_headroom", f"{self.cell} carries no routed model to drain")
        bad = [h.result for h in self.headroom if not h.ok]
        if bad:
            return refused("drain_headroom", "; ".join(r.reason for r in bad))
        return _passed("drain_headroom", "; ".join(h.result.reason for h in self.headroom))

    def burning(self, receiver_burn_rates: Mapping[str, float]) -> tuple[str, ...]:
        """Receivers burning their error budget at or above the fast-burn rate."""
        return tuple(c for c in self.receivers if receiver_burn_rates.get(c, 0.0) >= self.fast_burn)

    def should_back_off(self, receiver_burn_rates: Mapping[str, float]) -> bool:
        """Stop the drain and step back: a receiving cell started to burn fast."""
        return bool(self.burning(receiver_burn_rates))


CapacityView = Capacity  # the name the levers and the responder knew it by


def _by_cell(signals: Signals, name: str, model: str) -> dict[str, float]:
    _, labels, values = signals.instant(name, {"model_name": model})
    out: dict[str, float] = {}
    for lab, v in zip(labels, values, strict=True):
        cell = dict(lab).get("cell")
        if cell is not None:
            out[cell] = float(v)
    return out


def plan_cell_drain(
    cell: str,
    *,
    cells: Sequence[CellView],
    signals: Signals,
    capacity: Capacity,
    models: Sequence[str] = (),
    max_utilization: float = MAX_RECEIVER_UTILIZATION,
    fast_burn: float = FAST_BURN,
) -> DrainPlan:
    """Read the region's load and capacity and check the headroom for draining ``cell``.

    ``models`` defaults to every model routed to the cell. A receiver counts the replicas it keeps:
    the smaller of ready and desired, so a scaler in the middle of a scale-in is not relied on.
    """
    views = {c.name: c for c in cells}
    if cell not in views:
        raise UnknownTargetError("cell", cell)
    here = views[cell]
    region_cells = [c for c in cells if c.region == here.region]
    weights = dict(here.route_weights)
    chosen = list(models) or [m for m, w in here.route_weights if w > 0]
    plans: list[DrainHeadroom] = []
    for model in chosen:
        if model not in weights:
            raise UnknownTargetError("model", model)
        capacity.max_rps_per_replica(model, cell)  # an unknown model raises before any read
        offered = _by_cell(signals, "firedrill_offered_requests_per_second", model)
        ready = _by_cell(signals, "firedrill_replicas_ready", model)
        desired = _by_cell(signals, "firedrill_replicas_desired", model)
        loads = {
            view.name: CellLoad(
                cell=view.name,
                offered_rps=offered.get(view.name, 0.0),
                replicas=min(ready.get(view.name, 0.0), desired.get(view.name, float("inf"))),
                max_rps_per_replica=capacity.max_rps_per_replica(model, view.name),
                route_weight=0.0 if view.quarantined else dict(view.route_weights).get(model, 0),
            )
            for view in region_cells
        }
        plans.append(
            drain_headroom(
                model,
                loads[cell],
                [load for name, load in loads.items() if name != cell],
                cold_penalty=capacity.cold_cache_penalty(model, cell),
                max_utilization=max_utilization,
            )
        )
    return DrainPlan(cell, here.region, tuple(plans), fast_burn=fast_burn)


# ---------------------------------------------------------------------------------------------
# rollback targets


DigestCatalog = Digests  # the name the levers and the responder knew it by


def check_rollback_target(catalog: Digests, model: str, digest: str) -> GuardResult:
    """A rollback target was published before, for this model, signed and attested."""
    guard = "rollback_target"
    catalog.published(model)  # an unknown model raises UnknownTargetError
    info = catalog.digest_record(digest)
    if info is None:
        return refused(guard, f"{digest} was never published for {model}: not a rollback target")
    if info.model != model:
        return refused(guard, f"{digest} is not a digest of {model}")
    missing = [w for w, ok in (("signed", info.signed), ("attested", info.attested)) if not ok]
    if missing:
        return refused(
            guard,
            f"{digest} is not {' or '.join(missing)}: admission would deny it, and a rollback "
            "goes through admission like any deploy",
        )
    return _passed(guard, f"{digest} is a previous {model} digest, signed and attested")


# ---------------------------------------------------------------------------------------------
# scale-in paused before traffic moves


def paused_pools(applied: Iterable[ops.Operation]) -> frozenset[tuple[str, str]]:
    """(model, cell) pools whose scaler is pinned after ``applied`` operations, in order."""
    pinned: set[tuple[str, str]] = set()
    for op in applied:
        if isinstance(op, ops.PauseScaler):
            pinned.add((op.model, op.cell))
        elif isinstance(op, ops.UnpauseScaler):
            pinned.discard((op.model, op.cell))
    return frozenset(pinned)


def check_scale_in_paused(
    pools: Iterable[tuple[str, str]],
    *,
    incident_tags: Collection[str],
    applied: Iterable[ops.Operation],
    moves_no_traffic: str | None = None,
) -> GuardResult:
    """In a registry or hydrate incident, the pools a traffic lever touches are pinned first.

    ``moves_no_traffic`` names the lever kind when it moves no traffic (nothing to pin).
    """
    guard = "scale_in_paused"
    if moves_no_traffic is not None:
        return _passed(guard, f"{moves_no_traffic} does not move traffic")
    tags = sorted(REGISTRY_TAGS.intersection(incident_tags))
    if not tags:
        return _passed(guard, "not a registry or hydrate incident")
    pinned = paused_pools(applied)
    loose = sorted(set(pools) - pinned)
    if loose:
        where = ", ".join(f"{m}@{c}" for m, c in loose)
        return refused(
            guard,
            f"{'/'.join(tags)} incident: pause scale-in first (scaler_pause), warm capacity that "
            f"scales in cannot be hydrated back; not pinned: {where}",
        )
    return _passed(guard, f"{'/'.join(tags)} incident: scalers pinned before traffic moves")


# ---------------------------------------------------------------------------------------------
# the security floor


def side_effect_rank(value: str | None) -> int:
    """Order of a max_side_effect value: none < read < write < money < no switch < unknown."""
    if value is None:
        return len(SIDE_EFFECT_LEVELS)  # no kill switch: every side effect allowed
    if value in SIDE_EFFECT_LEVELS:
        return SIDE_EFFECT_LEVELS.index(value)
    return len(SIDE_EFFECT_LEVELS) + 1  # unknown: treat as wider than anything


def widens_access(op: ops.Operation, previous: ops.Operation | None = None) -> str | None:
    """Why ``op`` widens access, or None when it does not.

    ``previous`` is the operation that restores today's state (the op's inverse, computed
    before it is applied); with it, a flag change is judged against the flag's current value.
    """
    match op:
        case ops.UnquarantinePod(pod=pod):
            return f"lifts the forensic quarantine of pod {pod}"
        case ops.UnquarantineCell(cell=cell):
            return f"reopens routing to quarantined cell {cell}"
        case ops.Heal(kind=kind, a=a, b=b):
            return f"reopens the {kind} partition {a}/{b}"
        case ops.Uncordon(node=node):
            return f"returns node {node} to scheduling"
        case ops.Untaint(node=node, key=key) if key == QUARANTINE_TAINT:
            return f"lifts the quarantine taint of node {node}"
        case ops.Label(node=node, key=key, value=None) if key in QUARANTINE_LABELS:
            return f"removes {key} from node {node}"
        case ops.PromoteDigest(digest=digest, signed=signed, attested=attested) if not (
            signed and attested
        ):
            return f"publishes {digest}, which is not signed and attested"
        case ops.SetFlag(key=key, value=value) if key == DENY_ALL_FLAG and value != "true":
            return "lifts the fleet-wide egress deny-all"
        case ops.SetFlag(key=key, value=value) if key.endswith(SIDE_EFFECT_SUFFIX):
            if value is None or value not in SIDE_EFFECT_LEVELS[:2]:
                return f"allows {key}={value} side effects"
            if isinstance(previous, ops.SetFlag) and side_effect_rank(value) > side_effect_rank(
                previous.value
            ):
                return f"raises {key} from {previous.value} to {value}"
        case ops.SetWarmPool(tenant=tenant, replicas=n) if (
            isinstance(previous, ops.SetWarmPool) and n > previous.replicas
        ):
            return f"grows {tenant}'s sandbox warm pool from {previous.replicas} to {n}"
        case ops.UnfreezePromotions(product=product, kind=kind):
            return f"reopens {kind} promotions of {product}"
        case ops.UnblockContentHash(tenant=tenant, content_hash=h):
            return f"lets {h} back into {tenant}'s retrieval"
    return None


def check_sev1(sev: Sev, what: str) -> GuardResult:
    """A lever kept for the worst incidents (the fleet-wide egress deny-all) needs SEV1."""
    if sev is Sev.SEV1:
        return _passed("sev1", f"{what}: the incident is SEV1")
    return refused(
        "sev1",
        f"{what} is a SEV1 lever and the incident is {sev}: contain the tenant first "
        "(kill switch, warm pool, pod quarantine)",
    )


def check_narrows(
    operations: Sequence[ops.Operation], inverses: Sequence[ops.Operation]
) -> GuardResult:
    """Containment narrows access: no operation of a lever may widen it."""
    for op, inv in zip(operations, inverses, strict=True):
        why = widens_access(op, inv)
        if why is not None:
            return refused("narrows_access", f"refused: {why}; containment never widens access")
    return _passed("narrows_access", "every operation narrows or keeps access")


UnsafeKind = Literal[
    "disable_signature_checks",
    "admission_ignore",
    "public_bucket",
    "public_mirror",
    "widen_bucket_iam",
    "cluster_admin",
    "delete_pod_under_investigation",
]

# Why each shortcut is refused, and the safe path that is also the fast one.
UNSAFE_REASONS: Mapping[UnsafeKind, str] = {
    "disable_signature_checks": (
        "turning off signature checks admits any weights, including a tampered digest; roll back "
        "to a previously signed and attested digest instead"
    ),
    "admission_ignore": (
        "failurePolicy Ignore lets every deploy skip admission while the webhook is down; keep "
        "Fail and pull from the pre-signed mirror, or roll back to a signed digest"
    ),
    "public_bucket": (
        "a public weights bucket leaks weights worth more than the cluster; pause scale-in and "
        "hydrate peer-to-peer or from the pre-signed mirror"
    ),
    "public_mirror": (
        "pulling from a public mirror bypasses provenance; use the pre-signed internal mirror"
    ),
    "widen_bucket_iam": (
        "widening bucket IAM grants identities that never needed weights; keep the serving "
        "principal's read-only grant and fix the path that is broken"
    ),
    "cluster_admin": (
        "cluster-admin is unbounded and unaudited; request break-glass: two-person, time-boxed, "
        "audited at full fidelity"
    ),
    "delete_pod_under_investigation": (
        "deleting the pod destroys the evidence; quarantine it (ir.corp/quarantine label) and "
        "keep it for the security lead"
    ),
}


@dataclass(frozen=True)
class UnsafeRequest:
    """A shortcut that widens access to get a mitigation done; always refused."""

    kind: UnsafeKind
    target: str = ""
    requested_by: str = ""


def check_stable_at_100(
    model: str, cells: Collection[str], *, running_canary: str | None, on_canary: Sequence[str]
) -> GuardResult:
    """After an abort: no canary runs (``running_canary``: what still does) and no pool of
    ``cells`` has traffic on a canary digest (``on_canary``: where some still is)."""
    guard = "stable_at_100"
    if running_canary is not None:
        return refused(guard, f"{model} canary {running_canary}")
    if on_canary:
        return refused(guard, f"{model} traffic still on the canary: {', '.join(on_canary)}")
    return _passed(guard, f"{model}: stable digest at 100% in {', '.join(sorted(cells))}")


def refuse_unsafe(request: UnsafeRequest) -> GuardResult:
    """Refuse the shortcut, with the reason and the safe path."""
    what = request.kind.replace("_", " ")
    on = f" on {request.target}" if request.target else ""
    return refused(
        "security_floor",
        f"refused {what}{on}: {UNSAFE_REASONS[request.kind]} (containment narrows access, "
        "never widens it)",
    )
