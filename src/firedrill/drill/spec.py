"""The drill spec: a game day as a falsifiable experiment, reviewed in Git like any other spec.

A drill names the fleet it runs on, a written hypothesis with numbers, the RTO budget split into
its terms, a hard duration cap, the stop conditions that auto-revert it, the blast radius and the
allowlist that bound where injections may land, and the injection timeline. Pydantic checks the
shape here (types, units, one field per concept); `drill.validate` checks the rules that need the
fleet (cells exist, blast radius, allowlist, change freeze, the bad-digest injection), so both
kinds of error name the file, line and field of the drill.

Durations are Prometheus-style strings (``90s``, ``5m``, ``3h``); each has a ``*_s`` property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from firedrill.detect.slo import SloSpec
from firedrill.model.spec import NAME_RE, FleetSpec
from firedrill.remediate.policy import PolicySpec
from firedrill.respond.guards import Role
from firedrill.respond.severity import SevMatrix, refuse_price

DURATION_RE = r"^[0-9]+(ms|s|m|h|d)$"
SIGNED_DURATION_RE = r"^-?[0-9]+(ms|s|m|h|d)$"
_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

Duration = Annotated[str, Field(pattern=DURATION_RE)]
SignedDuration = Annotated[str, Field(pattern=SIGNED_DURATION_RE)]
Name = Annotated[str, Field(pattern=NAME_RE, max_length=63)]
Rung = Literal["L0", "L1", "L2", "L3", "L4", "L5", "L6", "L7"]
RUNGS: tuple[Rung, ...] = ("L0", "L1", "L2", "L3", "L4", "L5", "L6", "L7")
Comparison = Literal["<", "<=", "==", "!=", ">=", ">"]
FindingKind = Literal["runbook_step", "alert", "admission_policy", "release_gate"]

# The region blackhole of the AWS FIS Cross-Region: Connectivity scenario: 3 h default, 12 h max.
BLACKHOLE_DEFAULT = "3h"
BLACKHOLE_MAX_S = 12 * 3600.0

HypothesisMetric = Literal[
    "time_to_slo_s",
    "rto_s",
    "ttft_p99_s",
    "kv_usage_max",
    "unsigned_admitted",
    "paid_5xx_ratio",
    "error_ratio",
    "p2p_hit_rate",
    "first_ready_s",
    "hydrate_s",
    "origin_errors",
    "peak_gbps_per_node",
    "nodes_drained",
    "replicas_ejected",
    "survivor_digest_attested",
    "hidden_dependencies",
    "expr",
]


def seconds(text: str) -> float:
    """Seconds of a (possibly negative) duration such as '90s', '5m', '-30m'."""
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("-")
    for unit in ("ms", "s", "m", "h", "d"):
        if body.endswith(unit) and body[: -len(unit)].isdigit():
            return sign * int(body[: -len(unit)]) * _UNITS_S[unit]
    raise ValueError(f"not a duration: {text!r}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- scope ---------------------------------------------------------------------------------------


class TargetSpec(_Strict):
    """What the drill is about: one model, in one region or a few cells, for a tenant tier."""

    model: Name
    region: Name | None = None
    cells: list[Name] = []
    tenant_tier: Literal["paid", "free", "all"] = "all"
    namespace: str = "serve-chat"


class AllowlistSpec(_Strict):
    """Where injections may land: namespace globs (``staging-*``), and optionally cells/regions."""

    namespaces: list[str] = ["serve-chat", "serve-batch", "staging-*"]
    cells: list[Name] = []  # empty: any cell of the blast radius
    regions: list[Name] = []  # empty: any region of the blast radius


class BlastRadiusSpec(_Strict):
    """The widest an injection may reach."""

    regions: list[Name] = []
    cells: list[Name] = []  # empty: any cell in the regions above
    max_nodes: Annotated[int, Field(ge=0)] = 300


class ChangeFreezeSpec(_Strict):
    """No releases, promotions or node rollouts from ``before`` T0 to ``after`` the cap."""

    before: Duration = "30m"
    after: Duration = "30m"

    @property
    def before_s(self) -> float:
        return seconds(self.before)

    @property
    def after_s(self) -> float:
        return seconds(self.after)


class ScheduledChange(_Strict):
    """A change on the release calendar near the drill (checked against the change freeze)."""

    at: SignedDuration  # relative to T0; negative: before the drill starts
    kind: Literal["release", "promotion", "node_rollout"]
    name: str
    owner: str | None = None

    @property
    def at_s(self) -> float:
        return seconds(self.at)


# --- hypothesis, RTO -----------------------------------------------------------------------------


class HypothesisClause(_Strict):
    """One falsifiable clause: ``metric`` (for a region/model) ``op`` ``value``."""

    clause: str
    metric: HypothesisMetric
    op: Comparison
    value: float
    region: Name | None = None
    model: Name | None = None
    expr: str | None = None  # with metric 'expr': a PromQL-subset expression, evaluated at the end
    service: Name | None = None  # with metric 'hidden_dependencies': one service of the fleet
    owner: str | None = None  # who owns the gap when the clause fails
    finding: FindingKind = "runbook_step"  # what kind of action item a failure becomes

    @model_validator(mode="after")
    def _expr_iff_metric_expr(self) -> HypothesisClause:
        if self.metric == "expr" and not self.expr:
            raise ValueError("metric 'expr' needs an 'expr'")
        if self.metric != "expr" and self.expr is not None:
            raise ValueError(f"'expr' is only for metric 'expr' (metric is '{self.metric}')")
        if self.service is not None and self.metric != "hidden_dependencies":
            raise ValueError(
                f"'service' is only for metric 'hidden_dependencies' (metric is '{self.metric}')"
            )
        return self


class RtoTerms(_Strict):
    """The plan per RTO term."""

    detect: Duration = "2m"
    decide: Duration = "2m"
    shift: Duration = "3m"
    hydrate: Duration = "3m"
    time_to_slo: Duration = "2m"

    def seconds(self) -> dict[str, float]:
        return {
            "detect_s": seconds(self.detect),
            "decide_s": seconds(self.decide),
            "shift_s": seconds(self.shift),
            "hydrate_s": seconds(self.hydrate),
            "time_to_slo_s": seconds(self.time_to_slo),
        }


class RtoSpec(_Strict):
    budget: Duration
    terms: RtoTerms = RtoTerms()
    slo_hold: Duration = "2m"  # survivor TTFT p99 within SLO for this long = users served

    @property
    def budget_s(self) -> float:
        return seconds(self.budget)

    @property
    def slo_hold_s(self) -> float:
        return seconds(self.slo_hold)


# --- stop conditions -----------------------------------------------------------------------------


class _StopBase(_Strict):
    name: Name
    hold: Duration = "0s"  # the condition must hold this long before it fires

    @property
    def hold_s(self) -> float:
        return seconds(self.hold)


class AlertStop(_StopBase):
    """An alert from the generated SLO rules firing (labels matching ``matchers``)."""

    kind: Literal["alert"]
    alertname: str
    matchers: dict[str, str] = {}


class Paid5xxStop(_StopBase):
    """The paid tier's 5xx ratio over ``window`` (all regions, or one) above ``threshold``."""

    kind: Literal["paid_5xx_ratio"]
    threshold: Annotated[float, Field(gt=0, le=1)]
    window: Duration = "5m"
    region: Name | None = None

    @property
    def window_s(self) -> float:
        return seconds(self.window)


class ErrorRatioStop(_StopBase):
    """All tiers' error ratio over ``window`` (all regions, or one) above ``threshold``."""

    kind: Literal["error_ratio"]
    threshold: Annotated[float, Field(gt=0, le=1)]
    window: Duration = "5m"
    region: Name | None = None

    @property
    def window_s(self) -> float:
        return seconds(self.window)


class TtftStop(_StopBase):
    """The region's TTFT p99 (over ``window``) above ``threshold_s``."""

    kind: Literal["ttft_p99"]
    threshold_s: Annotated[float, Field(gt=0)]
    region: Name
    window: Duration = "5m"

    @property
    def window_s(self) -> float:
        return seconds(self.window)


class KvUsageStop(_StopBase):
    """The region's highest cell KV-cache usage above ``threshold``."""

    kind: Literal["kv_usage"]
    threshold: Annotated[float, Field(gt=0, le=1)]
    region: Name


class ExprStop(_StopBase):
    """A PromQL-subset expression (``drill.expr``) that fires when it returns any sample."""

    kind: Literal["expr"]
    expr: str


StopCondition = Annotated[
    AlertStop | Paid5xxStop | ErrorRatioStop | TtftStop | KvUsageStop | ExprStop,
    Field(discriminator="kind"),
]


# --- injections ----------------------------------------------------------------------------------


class _InjectionBase(_Strict):
    at: Duration  # after T0
    duration: Duration | None = None  # reverted after this long; None: at the end of the drill
    namespace: str | None = None  # None: the target's namespace
    note: str = ""

    @property
    def at_s(self) -> float:
        return seconds(self.at)

    @property
    def duration_s(self) -> float | None:
        return None if self.duration is None else seconds(self.duration)


class ReplicaKill(_InjectionBase):
    """Pod kill: ``count`` replicas of the model in a cell are lost (their nodes stay)."""

    kind: Literal["replica_kill"]
    cell: Name
    count: Annotated[int, Field(ge=1)] = 1
    model: Name | None = None  # None: the target model


class DcgmField(_InjectionBase):
    """``dcgmi test --inject``: a contrived value in a DCGM field on ``nodes`` (or a ``share``)."""

    kind: Literal["dcgm_field"]
    cell: Name
    field: Literal[202, 230, 319]  # PCIe replay counter, XID (with the XID as value), DBE ECC
    value: float
    gpu: Annotated[int, Field(ge=0, le=15)] = 0
    nodes: Annotated[int, Field(ge=1)] | None = None
    share: Annotated[float, Field(gt=0, le=1)] | None = None

    @model_validator(mode="after")
    def _nodes_or_share(self) -> DcgmField:
        if self.nodes is not None and self.share is not None:
            raise ValueError("give 'nodes' or 'share', not both")
        return self


class NvlinkFlap(_InjectionBase):
    kind: Literal["nvlink_flap"]
    cell: Name
    nodes: Annotated[int, Field(ge=1)] = 1


class Thermal(_InjectionBase):
    """gpu-burn-like stress: the replica on each GPU decodes ``slowdown`` times slower."""

    kind: Literal["thermal"]
    cell: Name
    nodes: Annotated[int, Field(ge=1)] = 1
    gpu: Annotated[int, Field(ge=0, le=15)] = 0
    slowdown: Annotated[float, Field(gt=1)] = 2.0


class CellDrain(_InjectionBase):
    """Drain a cell through the control plane's lever (100 -> 50 -> 0 with the headroom guard)."""

    kind: Literal["cell_drain"]
    cell: Name
    model: Name | None = None


class RegistryPartition(_InjectionBase):
    """Chaos Mesh NetworkChaos: a cell cannot reach its region's registry."""

    kind: Literal["registry_partition"]
    cell: Name


class HydrateStorm(_InjectionBase):
    """Recycle ``percent`` of a pool so it must re-hydrate, at most ``max_surge`` % at a time."""

    kind: Literal["hydrate_storm"]
    cell: Name
    pool: Name | None = None  # None: the target model's serving pool
    percent: Annotated[float, Field(gt=0, le=100)] = 30.0
    max_surge: Annotated[float, Field(gt=0, le=100)] = 10.0
    model: Name | None = None


class RegionBlackhole(_InjectionBase):
    """Cross-region cut (and users cut at the edge) plus replication pause: FIS's scenario."""

    kind: Literal["region_blackhole"]
    region: Name
    duration: Duration | None = BLACKHOLE_DEFAULT
    pause_replication: bool = True
    edge: bool = True  # users cannot reach the region through the global edge either


class CapacityDenial(_InjectionBase):
    """Insufficient-capacity errors for new GPU nodes in a region (FIS ICE)."""

    kind: Literal["capacity_denial"]
    region: Name


class BadDigest(_InjectionBase):
    """Try to deploy an unsigned (or unattested) digest: admission must deny it everywhere."""

    kind: Literal["bad_digest"]
    model: Name
    region: Name
    duration: Duration | None = "2m"  # the deploy attempt is rolled back after this long
    signed: bool = False
    attested: bool = False

    @model_validator(mode="after")
    def _is_bad(self) -> BadDigest:
        if self.signed and self.attested:
            raise ValueError("a bad digest must be unsigned or unattested")
        return self


class NewDigestDuringPause(_InjectionBase):
    """Promote a new signed digest in the primary while replication is paused (RPO_weights).

    With ``survivor_attempt`` the new digest is also rolled out at once as a canary
    (``canary_percent`` of each pool), the way someone in a hurry would: every survivor is then
    really asked to run a digest that has not landed there, so the security floor's ready-gate
    check is exercised rather than reported ``not_exercised``.
    """

    kind: Literal["new_digest_during_pause"]
    model: Name
    region: Name
    survivor_attempt: bool = False
    canary_percent: Annotated[int, Field(ge=1, le=100)] = 10


Injection = Annotated[
    ReplicaKill
    | DcgmField
    | NvlinkFlap
    | Thermal
    | CellDrain
    | RegistryPartition
    | HydrateStorm
    | RegionBlackhole
    | CapacityDenial
    | BadDigest
    | NewDigestDuringPause,
    Field(discriminator="kind"),
]
InjectionKind = Literal[
    "replica_kill",
    "dcgm_field",
    "nvlink_flap",
    "thermal",
    "cell_drain",
    "registry_partition",
    "hydrate_storm",
    "region_blackhole",
    "capacity_denial",
    "bad_digest",
    "new_digest_during_pause",
]


# --- recovery ------------------------------------------------------------------------------------


class CompetingPuller(_Strict):
    """A batch/eval job that also pulls weights during recovery."""

    name: Name
    region: Name
    at: Duration
    nodes: Annotated[int, Field(ge=1)]
    gbytes: Annotated[float, Field(gt=0)]
    critical: bool = False  # critical pullers are never frozen

    @property
    def at_s(self) -> float:
        return seconds(self.at)


class FailbackSpec(_Strict):
    """Controlled failback: the same ready-gate in reverse, stepped, with hysteresis."""

    enabled: bool = False
    start: Duration | None = None  # after T0; None: once the primary is back (blackhole healed)
    probe_green: Duration = "10m"
    steps: list[Annotated[int, Field(ge=0, le=100)]] = [0, 10, 40, 70, 100]
    step_hold: Duration = "5m"
    hysteresis: Duration = "30m"
    prefix_warmup: bool = True

    @model_validator(mode="after")
    def _steps_rise(self) -> FailbackSpec:
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError(f"failback steps must rise strictly (got {self.steps})")
        if self.steps and self.steps[-1] != 100:
            raise ValueError("failback steps must end at 100")
        return self

    @property
    def start_s(self) -> float | None:
        return None if self.start is None else seconds(self.start)

    @property
    def probe_green_s(self) -> float:
        return seconds(self.probe_green)

    @property
    def step_hold_s(self) -> float:
        return seconds(self.step_hold)

    @property
    def hysteresis_s(self) -> float:
        return seconds(self.hysteresis)


class ShiftSpec(_Strict):
    """How a region failover moves the region's users: its share of the global route (percent)
    steps down through ``steps``, each held ``step_hold`` while the survivors are watched."""

    steps: list[Annotated[int, Field(ge=0, le=100)]] = [50, 0]
    step_hold: Duration = "30s"

    @model_validator(mode="after")
    def _steps_fall(self) -> ShiftSpec:
        if not self.steps or self.steps[-1] != 0:
            raise ValueError("failover shift steps must end at 0")
        if any(b >= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError(f"failover shift steps must fall strictly (got {self.steps})")
        return self

    @property
    def step_hold_s(self) -> float:
        return seconds(self.step_hold)


def _default_owners() -> dict[FindingKind, str]:
    return {
        "runbook_step": "sre-oncall",
        "alert": "observability",
        "admission_policy": "security",
        "release_gate": "release-eng",
    }


# --- the drill -----------------------------------------------------------------------------------


class DrillSpec(_Strict):
    """A game day: hypothesis, guardrails, injections, recovery."""

    name: Name
    rung: Rung
    description: str = ""
    fleet: str  # path, relative to the drill file
    slo: str  # path, relative to the drill file
    policy: str | None = None  # path; None: the default remediation policy
    fleet_overrides: dict[str, Any] = {}  # merged (deeply) into the loaded fleet spec
    policy_overrides: dict[str, Any] = {}  # merged (deeply) into the loaded policy
    seed: int = 0
    start_hour_utc: Annotated[float, Field(ge=0, lt=24)] | None = None
    duration_cap: Duration | None = None  # required: validation refuses a drill without one
    evaluation_step: Duration = "15s"  # stop conditions and clauses are evaluated this often
    run_by: str | None = None
    runbook_author: str | None = None
    abort_owner: str | None = None
    # The ladder: this rung runs only when the action items that runs of the rung below raised
    # are closed (or an override reason is recorded).
    require_closed_findings: bool = False
    # Who approves the response's levers, by incident role (default: run_by is the incident
    # commander, the other roles are the on-call aliases).
    responders: dict[Role, str] = {}
    target: TargetSpec
    survivor: list[Name] = []  # region(s) expected to absorb the traffic
    allowlist: AllowlistSpec = AllowlistSpec()
    blast_radius: BlastRadiusSpec = BlastRadiusSpec()
    admission: Literal["Enforce", "Audit", "Ignore"] = "Enforce"
    change_freeze: ChangeFreezeSpec = ChangeFreezeSpec()
    scheduled_changes: list[ScheduledChange] = []
    hypothesis: list[HypothesisClause] = []
    rto: RtoSpec | None = None
    decide_latency: Duration = "90s"
    shift: ShiftSpec = ShiftSpec()
    stop_conditions: list[StopCondition] = []
    injections: list[Injection] = []
    competing_pullers: list[CompetingPuller] = []
    freeze_competitors: bool = True
    failback: FailbackSpec = FailbackSpec()
    owners: dict[FindingKind, str] = Field(default_factory=_default_owners)
    # Severity thresholds (default: respond/severity.py's table); the GPU-hour price is the fleet's.
    severity: SevMatrix | None = None

    @field_validator("severity", mode="before")
    @classmethod
    def _severity_price_is_the_fleets(cls, data: object) -> object:
        return refuse_price(data)

    @model_validator(mode="before")
    @classmethod
    def _survivor_as_list(cls, data: object) -> object:
        # ``survivor: us-west-2`` reads better than a one-item list in the common case.
        if isinstance(data, dict) and isinstance(data.get("survivor"), str):
            return {**data, "survivor": [data["survivor"]]}
        return data

    @property
    def duration_cap_s(self) -> float | None:
        return None if self.duration_cap is None else seconds(self.duration_cap)

    @property
    def evaluation_step_s(self) -> float:
        return seconds(self.evaluation_step)

    @property
    def decide_latency_s(self) -> float:
        return seconds(self.decide_latency)

    @property
    def rung_index(self) -> int:
        return RUNGS.index(self.rung)

    def owner(self, kind: FindingKind) -> str:
        return self.owners.get(kind) or _default_owners()[kind]

    def responder(self, role: Role) -> str:
        """The person in ``role`` for this drill's response."""
        if role in self.responders:
            return self.responders[role]
        if role == "incident_commander" and self.run_by:
            return self.run_by
        return role.replace("_", "-")


@dataclass(frozen=True)
class LoadedDrill:
    """A validated drill with the specs it names (overrides merged) and its file's digest."""

    spec: DrillSpec
    fleet: FleetSpec
    slo: SloSpec
    policy: PolicySpec
    path: str
    spec_sha256: str
