"""Severity on four axes: users, GPU-hours, model quality and security.

An ML platform can be badly hurt with no user-facing latency at all: a hung 16K-GPU pretraining
job at $2 per GPU-hour burns about $32K an hour with zero users affected, bad weights answer fast
and wrong, and an agent that exfiltrates weights or spends money without approval is an incident
however healthy the dashboards look. So triage measures four axes, the matrix maps each to a level,
and the incident takes the most severe one.

Two rules hold everywhere:

* Security and quality do not wait for latency. A confirmed exfiltration or unapproved side effect
  is SEV1 on its own, and wrong answers count as failed requests: a fast-and-wrong model is never
  rated below a slow (failing) one serving the same share of traffic on the same tier.
* Severity only goes up during the incident (``SeverityTracker``). A lower assessment mid-incident
  is journaled and not applied; the postmortem is the only place a SEV comes down, and it records
  who lowered it and why.

The default ``SevMatrix`` (SEV1 is the worst; below SEV4 is ``Sev.NONE``):

users (fast burn: ≥ 14.4× the error budget over 1 h and 5 m; slow burn: ≥ 6×)
    SEV1  fast burn, or ≥ 25 % of requests failed, on a paid tier in ≥ 2 regions
    SEV2  fast burn on a paid tier in one region; fast burn on any tier in ≥ 2 regions;
          ≥ 5 % of paid-tier requests failed
    SEV3  slow burn on any tier; ≥ 1 % of requests failed
    SEV4  any burn ≥ 1× (the budget runs out before the SLO window ends)
gpu_hours (GPUs stalled × the fleet's ``gpu_hour_usd``, $2 per GPU-hour by default)
    SEV1 ≥ $100K/h; SEV2 ≥ $20K/h (a hung 16K-GPU job ≈ $32K/h); SEV3 ≥ $5K/h; SEV4 ≥ $500/h
quality (golden-set pass-rate drop, percentage points)
    SEV1 ≥ 25; SEV2 ≥ 10; SEV3 ≥ 3; SEV4 ≥ 1; known-bad weights serving traffic: SEV2
security (whatever the latency)
    SEV1  confirmed weight exfiltration; any unapproved write/money side effect
    SEV2  a tripwire fired, not yet confirmed (a sandbox reaching metadata or the kube API,
          models/* read by a non-serving principal)

The quality axis also applies the users rules that have no burn-rate condition to the share of
requests answered wrong (``Impact.wrong_answers_frac``), as if those requests had failed.

Ties between axes go to security, then quality, users and GPU-hours: security and quality
never wait behind latency.

The thresholds are configurable from a scenario's or a drill's ``severity:`` section; the price
of a GPU-hour is not: it is the fleet's ``gpu_hour_usd`` (``severity_for``), the same figure the
training pages quote, so a page and the incident's axis never disagree on what an hour costs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Annotated, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from firedrill.errors import OperationError

Axis = Literal["security", "quality", "users", "gpu_hours"]
# Also the tie-break order: the first axis at the incident's level decides it.
AXES: tuple[Axis, ...] = ("security", "quality", "users", "gpu_hours")

NOT_APPLIED = "not applied: severity only goes up during an incident"


class Sev(IntEnum):
    """Incident severity: a lower number is more severe; ``NONE`` is below every SEV."""

    SEV1 = 1
    SEV2 = 2
    SEV3 = 3
    SEV4 = 4
    NONE = 5

    def __str__(self) -> str:
        return "none" if self is Sev.NONE else self.name


LEVELS: tuple[Sev, ...] = (Sev.SEV1, Sev.SEV2, Sev.SEV3, Sev.SEV4)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Frac = Annotated[float, Field(gt=0, le=1)]
Threshold = Annotated[float, Field(gt=0)] | None


class UsersRule(_Strict):
    """One way to reach a level on the users axis: every condition it sets must hold."""

    min_burn_rate: Threshold = None  # × the error budget, over the fast (1 h / 5 m) windows
    min_failed_frac: Frac | None = None  # share of requests that failed
    paid_tier: bool = False  # only when a paid tier is among those affected
    min_regions: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _needs_a_threshold(self) -> UsersRule:
        if self.min_burn_rate is None and self.min_failed_frac is None:
            raise ValueError("a users rule needs min_burn_rate or min_failed_frac")
        return self

    def matches(self, *, burn_rate: float, failed_frac: float, paid: bool, regions: int) -> bool:
        """Whether an impact with these measurements meets every condition of the rule."""
        return (
            regions >= self.min_regions
            and (paid or not self.paid_tier)
            and (self.min_burn_rate is None or burn_rate >= self.min_burn_rate)
            and (self.min_failed_frac is None or failed_frac >= self.min_failed_frac)
        )

    def __str__(self) -> str:
        parts = []
        if self.min_burn_rate is not None:
            parts.append(f"burn ≥ {self.min_burn_rate:g}×")
        if self.min_failed_frac is not None:
            parts.append(f"≥ {self.min_failed_frac:.0%} failed")
        tier = "a paid tier" if self.paid_tier else "any tier"
        return f"{' and '.join(parts)} on {tier} in ≥ {self.min_regions} region(s)"


class UsersMatrix(_Strict):
    """Users-axis rules per level; a level is reached when any one of its rules matches."""

    sev1: tuple[UsersRule, ...] = (
        UsersRule(min_burn_rate=14.4, paid_tier=True, min_regions=2),
        UsersRule(min_failed_frac=0.25, paid_tier=True, min_regions=2),
    )
    sev2: tuple[UsersRule, ...] = (
        UsersRule(min_burn_rate=14.4, paid_tier=True),
        UsersRule(min_burn_rate=14.4, min_regions=2),
        UsersRule(min_failed_frac=0.05, paid_tier=True),
    )
    sev3: tuple[UsersRule, ...] = (UsersRule(min_burn_rate=6.0), UsersRule(min_failed_frac=0.01))
    sev4: tuple[UsersRule, ...] = (UsersRule(min_burn_rate=1.0),)

    def rules(self) -> tuple[tuple[Sev, tuple[UsersRule, ...]], ...]:
        """The rules from SEV1 down."""
        return (
            (Sev.SEV1, self.sev1),
            (Sev.SEV2, self.sev2),
            (Sev.SEV3, self.sev3),
            (Sev.SEV4, self.sev4),
        )


def _check_descending(name: str, values: tuple[float | None, ...]) -> None:
    given = [v for v in values if v is not None]
    if any(a < b for a, b in itertools.pairwise(given)):
        raise ValueError(f"{name} thresholds must not grow from SEV1 to SEV4: {values}")


class GpuHoursMatrix(_Strict):
    """GPU-hours burning without progress, priced per GPU-hour; thresholds in $ per hour."""

    gpu_hour_usd: PositiveFloat = 2.0
    sev1_usd_per_h: Threshold = 100_000.0
    sev2_usd_per_h: Threshold = 20_000.0
    sev3_usd_per_h: Threshold = 5_000.0
    sev4_usd_per_h: Threshold = 500.0

    @model_validator(mode="after")
    def _descending(self) -> GpuHoursMatrix:
        _check_descending("gpu_hours", self.thresholds())
        return self

    def thresholds(self) -> tuple[float | None, ...]:
        """The $/h thresholds from SEV1 down (None: the axis never reaches that level)."""
        return (self.sev1_usd_per_h, self.sev2_usd_per_h, self.sev3_usd_per_h, self.sev4_usd_per_h)


class QualityMatrix(_Strict):
    """Golden-set pass-rate drop thresholds (percentage points), and known-bad weights."""

    sev1_drop_pts: Threshold = 25.0
    sev2_drop_pts: Threshold = 10.0
    sev3_drop_pts: Threshold = 3.0
    sev4_drop_pts: Threshold = 1.0
    bad_weights: Sev = Sev.SEV2  # weights known to be bad are serving traffic

    @model_validator(mode="after")
    def _descending(self) -> QualityMatrix:
        _check_descending("quality", self.thresholds())
        return self

    def thresholds(self) -> tuple[float | None, ...]:
        """The drop thresholds from SEV1 down (None: the axis never reaches that level)."""
        return (self.sev1_drop_pts, self.sev2_drop_pts, self.sev3_drop_pts, self.sev4_drop_pts)


class SecurityMatrix(_Strict):
    """The level each kind of security event sets, whatever the latency."""

    weight_exfil: Sev = Sev.SEV1
    unapproved_side_effect: Sev = Sev.SEV1
    tripwire: Sev = Sev.SEV2

    @model_validator(mode="after")
    def _always_an_incident(self) -> SecurityMatrix:
        if Sev.NONE in (self.weight_exfil, self.unapproved_side_effect, self.tripwire):
            raise ValueError("a security event is always an incident: levels are SEV1..SEV4")
        return self


class SevMatrix(_Strict):
    """Thresholds per axis per level; the defaults are the table in this module's docstring."""

    users: UsersMatrix = UsersMatrix()
    gpu_hours: GpuHoursMatrix = GpuHoursMatrix()
    quality: QualityMatrix = QualityMatrix()
    security: SecurityMatrix = SecurityMatrix()

    def priced(self, gpu_hour_usd: float) -> SevMatrix:
        """This matrix with the GPU-hours axis priced at ``gpu_hour_usd`` per GPU-hour."""
        if not (math.isfinite(gpu_hour_usd) and gpu_hour_usd > 0):
            raise ValueError(f"gpu_hour_usd must be a finite price > 0, got {gpu_hour_usd}")
        gpu = self.gpu_hours.model_copy(update={"gpu_hour_usd": gpu_hour_usd})
        return self.model_copy(update={"gpu_hours": gpu})


def refuse_price(data: object) -> object:
    """For a spec's ``severity:`` section: the GPU-hour price belongs to the fleet spec."""
    gpu = data.get("gpu_hours") if isinstance(data, dict) else None
    if isinstance(gpu, dict) and "gpu_hour_usd" in gpu:
        raise ValueError(
            "gpu_hours.gpu_hour_usd: the price of a GPU-hour is the fleet's gpu_hour_usd; set it "
            "in the fleet spec"
        )
    return data


def severity_for(gpu_hour_usd: float, configured: SevMatrix | None = None) -> SevMatrix:
    """The matrix a run uses: a spec's thresholds (or the defaults) at the fleet's price."""
    return (configured if configured is not None else SevMatrix()).priced(gpu_hour_usd)


@dataclass(frozen=True)
class Impact:
    """What triage measured, one value per signal; zero means not affected."""

    burn_rate: float = 0.0  # × the error budget, over the fast (1 h / 5 m) windows
    requests_failed_frac: float = 0.0  # share of requests that failed
    paid_tier: bool = False  # a paid tier is among those affected
    regions_affected: int = 0  # regions with users affected
    gpus_stalled: int = 0  # GPUs held with no progress: hung or restarting jobs, idle gangs
    golden_drop_pts: float = 0.0  # golden-set pass-rate drop, percentage points
    wrong_answers_frac: float = 0.0  # share of requests answered by bad weights or prompts
    bad_weights: bool = False  # weights known to be bad are serving traffic
    weights_exfiltrated: bool = False  # confirmed
    unapproved_side_effects: int = 0  # write/money tool calls that ran without their approval
    tripwires: int = 0  # security tripwires fired, not yet confirmed

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                continue
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value}")
        for name in ("requests_failed_frac", "wrong_answers_frac"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} is a share of requests: 0..1")


class AxisResult(NamedTuple):
    """One axis of an assessment: its level, the value that set it, and why."""

    level: Sev
    value: float
    reason: str


@dataclass(frozen=True)
class Assessment:
    """The severity of an impact: the most severe axis decides."""

    sev: Sev
    axes: dict[Axis, AxisResult]
    deciding_axis: Axis | None  # None when no axis reaches SEV4

    @property
    def reason(self) -> str:
        """The deciding axis's reason, prefixed by the axis."""
        if self.deciding_axis is None:
            return "no axis reaches SEV4"
        return f"{self.deciding_axis}: {self.axes[self.deciding_axis].reason}"


def _users_level(
    rules: UsersMatrix, *, burn_rate: float, failed_frac: float, paid: bool, regions: int
) -> tuple[Sev, UsersRule | None]:
    for sev, level_rules in rules.rules():
        for rule in level_rules:
            if rule.matches(
                burn_rate=burn_rate, failed_frac=failed_frac, paid=paid, regions=regions
            ):
                return sev, rule
    return Sev.NONE, None


def _threshold_level(value: float, thresholds: tuple[float | None, ...]) -> tuple[Sev, float]:
    for sev, threshold in zip(LEVELS, thresholds, strict=True):
        if threshold is not None and value >= threshold:
            return sev, threshold
    return Sev.NONE, math.inf


def _users(impact: Impact, m: UsersMatrix) -> AxisResult:
    tier = "paid" if impact.paid_tier else "free"
    measured = (
        f"burn {impact.burn_rate:.1f}×, {impact.requests_failed_frac:.1%} failed, {tier} tier, "
        f"{impact.regions_affected} region(s)"
    )
    sev, rule = _users_level(
        m,
        burn_rate=impact.burn_rate,
        failed_frac=impact.requests_failed_frac,
        paid=impact.paid_tier,
        regions=impact.regions_affected,
    )
    reason = f"{measured}: meets '{rule}'" if rule else f"{measured}: below every rule"
    return AxisResult(sev, impact.burn_rate, reason)


def _gpu_hours(impact: Impact, m: GpuHoursMatrix) -> AxisResult:
    usd_per_h = impact.gpus_stalled * m.gpu_hour_usd
    sev, threshold = _threshold_level(usd_per_h, m.thresholds())
    measured = (
        f"{impact.gpus_stalled} GPUs stalled × ${m.gpu_hour_usd:g}/GPU-h = ${usd_per_h:,.0f}/h"
    )
    reason = f"{measured} ≥ ${threshold:,.0f}/h" if sev is not Sev.NONE else measured
    return AxisResult(sev, usd_per_h, reason)


def _quality(impact: Impact, m: SevMatrix) -> AxisResult:
    candidates: list[tuple[Sev, str]] = []
    sev, threshold = _threshold_level(impact.golden_drop_pts, m.quality.thresholds())
    if sev is not Sev.NONE:
        candidates.append(
            (sev, f"golden-set pass rate down {impact.golden_drop_pts:g} ≥ {threshold:g} points")
        )
    if impact.bad_weights:
        candidates.append((m.quality.bad_weights, "known-bad weights are serving traffic"))
    # Fast and wrong is no better than slow: wrong answers are failed requests to the users
    # rules that look at failures alone (a wrong answer burns no latency budget).
    if impact.wrong_answers_frac > 0:
        sev, rule = _users_level(
            m.users,
            burn_rate=0.0,
            failed_frac=impact.wrong_answers_frac,
            paid=impact.paid_tier,
            regions=impact.regions_affected,
        )
        if rule is not None:
            candidates.append(
                (
                    sev,
                    f"{impact.wrong_answers_frac:.1%} of requests answered wrong, "
                    f"counted as failed: meets '{rule}'",
                )
            )
    if not candidates:
        return AxisResult(
            Sev.NONE, impact.golden_drop_pts, f"golden-set drop {impact.golden_drop_pts:g} points"
        )
    sev, reason = min(candidates, key=lambda c: c[0])
    return AxisResult(sev, impact.golden_drop_pts, reason)


def _security(impact: Impact, m: SecurityMatrix) -> AxisResult:
    candidates: list[tuple[Sev, str]] = []
    if impact.weights_exfiltrated:
        candidates.append((m.weight_exfil, "confirmed weight exfiltration"))
    if impact.unapproved_side_effects:
        candidates.append(
            (
                m.unapproved_side_effect,
                f"{impact.unapproved_side_effects} unapproved side effect(s)",
            )
        )
    if impact.tripwires:
        candidates.append((m.tripwire, f"{impact.tripwires} security tripwire(s) fired"))
    events = int(impact.weights_exfiltrated) + impact.unapproved_side_effects + impact.tripwires
    if not candidates:
        return AxisResult(Sev.NONE, 0.0, "no security event")
    sev, reason = min(candidates, key=lambda c: c[0])
    return AxisResult(sev, float(events), f"{reason} (regardless of latency)")


def assess(signals: Impact, matrix: SevMatrix | None = None) -> Assessment:
    """Rate every axis and take the most severe; ties go to the earlier axis in ``AXES``."""
    m = matrix if matrix is not None else SevMatrix()
    axes: dict[Axis, AxisResult] = {
        "security": _security(signals, m.security),
        "quality": _quality(signals, m),
        "users": _users(signals, m.users),
        "gpu_hours": _gpu_hours(signals, m.gpu_hours),
    }
    sev = min(r.level for r in axes.values())
    deciding = next(a for a in AXES if axes[a].level == sev) if sev is not Sev.NONE else None
    return Assessment(sev, axes, deciding)


class SevRecord(NamedTuple):
    """One entry of an incident's severity history."""

    at_s: float
    sev: Sev  # the level assessed (or set, in the postmortem)
    axis: str  # the deciding axis, "none", or "postmortem"
    reason: str
    applied: bool
    who: str = ""  # who lowered it, for postmortem downgrades


class SeverityTracker:
    """An incident's severity: it only goes up until the postmortem, the only way down."""

    def __init__(self) -> None:
        self._sev = Sev.NONE
        self._history: list[SevRecord] = []
        self._in_postmortem = False

    @property
    def sev(self) -> Sev:
        """The incident's current severity."""
        return self._sev

    @property
    def history(self) -> list[SevRecord]:
        """Every assessment and downgrade, applied or not, oldest first."""
        return list(self._history)

    @property
    def in_postmortem(self) -> bool:
        """Whether a postmortem downgrade has closed the incident's live phase."""
        return self._in_postmortem

    def _check_time(self, at_s: float) -> None:
        if not math.isfinite(at_s):
            raise ValueError(f"at_s must be finite, got {at_s}")
        if self._history and at_s < self._history[-1].at_s:
            raise ValueError(f"at_s {at_s} is before the last record ({self._history[-1].at_s})")

    def raise_to(self, assessment: Assessment, at_s: float) -> bool:
        """Apply an assessment if it is more severe; journal it either way. True if applied."""
        if self._in_postmortem:
            raise OperationError("the incident is in its postmortem: open a new incident")
        self._check_time(at_s)
        axis = assessment.deciding_axis or "none"
        if assessment.sev < self._sev:
            self._sev = assessment.sev
            self._history.append(SevRecord(at_s, assessment.sev, axis, assessment.reason, True))
            return True
        if assessment.sev == self._sev:
            why = f"not applied: already {self._sev} ({assessment.reason})"
        else:
            why = f"{NOT_APPLIED} ({assessment.reason})"
        self._history.append(SevRecord(at_s, assessment.sev, axis, why, False))
        return False

    def downgrade_in_postmortem(self, level: Sev, who: str, why: str, at_s: float) -> None:
        """Lower the severity in the postmortem; who and why are required and recorded."""
        if not who.strip():
            raise ValueError("a downgrade needs who lowered it")
        if not why.strip():
            raise ValueError("a downgrade needs why")
        if level <= self._sev:
            raise ValueError(
                f"a downgrade must lower the severity: {level} is not less severe than {self._sev}"
            )
        self._check_time(at_s)
        reason = f"downgraded from {self._sev} by {who.strip()}: {why.strip()}"
        self._sev = level
        self._in_postmortem = True
        self._history.append(SevRecord(at_s, level, "postmortem", reason, True, who.strip()))
