"""The SLO spec: objectives per product × model, evaluated per cell, and how to alert on them.

Defaults are the SRE workbook's multiwindow, multi-burn-rate table (5-8) for a 30-day period:
page at 14.4× over 1 h and 5 m, page at 6× over 6 h and 30 m, ticket at 3× over 1 d and 2 h,
ticket at 1× over 3 d and 6 h.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from firedrill.detect.alertmanager import RoutingSpec
from firedrill.detect.disagg import PdImbalanceAlerting
from firedrill.detect.quality import QualityAlerting
from firedrill.model.spec import NAME_RE, VLLM_TTFT_BUCKETS_S

Duration = Annotated[str, Field(pattern=r"^[0-9]{1,9}(ms|s|m|h|d|w)$")]  # 9 digits at most
_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_s(text: str) -> float:
    """Seconds of a Prometheus duration such as '5m', '1h', '3d'."""
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d|w)", text)
    if m is None:
        raise ValueError(f"not a duration: {text!r}")
    return int(m.group(1)) * _UNITS_S[m.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SliKind = Literal["ttft", "availability", "goodput"]
SLI_TITLES: dict[str, str] = {"ttft": "TTFT", "availability": "Availability", "goodput": "Goodput"}


class Objective(_Strict):
    """One SLO: a product served by a model, one SLI, a target ratio."""

    name: Annotated[str, Field(pattern=NAME_RE, max_length=63)]
    product: str
    model: str
    sli: SliKind
    target: Annotated[float, Field(gt=0.5, lt=1.0)] = 0.99
    ttft_threshold_s: Annotated[float, Field(gt=0)] = 2.0  # ttft and goodput SLIs
    min_events_per_hour: Annotated[int, Field(ge=0)] = 100  # below this a cell never pages

    @property
    def budget(self) -> float:
        return 1.0 - self.target

    @model_validator(mode="after")
    def _threshold_is_a_bucket_edge(self) -> Objective:
        # TTFT is a histogram: only a bucket boundary can be counted exactly (le="2.0"). Any
        # other threshold has no series, so Prometheus would never evaluate the SLO at all.
        if self.sli in ("ttft", "goodput") and self.ttft_threshold_s not in VLLM_TTFT_BUCKETS_S:
            edges = ", ".join(f"{x:g}" for x in VLLM_TTFT_BUCKETS_S if 0.05 <= x <= 20)
            raise ValueError(
                f"ttft_threshold_s {self.ttft_threshold_s:g} is not a TTFT bucket boundary "
                f"({edges} ...)"
            )
        return self


class BurnTier(_Strict):
    """One row of the multiwindow table: alert when both windows burn faster than ``factor``."""

    tier: Literal["fast", "slow", "drift", "budget"]
    severity: Literal["page", "ticket"]
    factor: Annotated[float, Field(gt=0)]
    long: Duration
    short: Duration

    @model_validator(mode="after")
    def _short_is_shorter(self) -> BurnTier:
        if duration_s(self.short) >= duration_s(self.long):
            raise ValueError(f"short window {self.short} must be shorter than long {self.long}")
        return self


def _default_tiers() -> list[BurnTier]:
    return [
        BurnTier(tier="fast", severity="page", factor=14.4, long="1h", short="5m"),
        BurnTier(tier="slow", severity="page", factor=6.0, long="6h", short="30m"),
        BurnTier(tier="drift", severity="ticket", factor=3.0, long="1d", short="2h"),
        BurnTier(tier="budget", severity="ticket", factor=1.0, long="3d", short="6h"),
    ]


class CauseThresholds(_Strict):
    """Thresholds of the cause (ticket) alerts."""

    kv_usage: Annotated[float, Field(gt=0, le=1)] = 0.95
    queue_to_running_ratio: Annotated[float, Field(gt=0)] = 1.0
    pod_ttft_p99_s: Annotated[float, Field(gt=0)] = 4.0
    gpu_temp_c: Annotated[float, Field(gt=0)] = 87.0
    pcie_replays_per_5m: Annotated[float, Field(gt=0)] = 1000.0


class Guardrails(_Strict):
    """Paging on the remediation system itself."""

    quarantines_per_cell_hour: Annotated[int, Field(ge=1)] = 20
    flapping_window: Duration = "90m"
    quarantined_fraction: Annotated[float, Field(gt=0, le=1)] = 0.10


class SloSpec(_Strict):
    service: Annotated[str, Field(pattern=NAME_RE)] = "inference"
    period: Duration = "30d"
    evaluation_interval: Duration = "15s"
    objectives: list[Objective]
    tiers: list[BurnTier] = Field(default_factory=_default_tiers)
    causes: CauseThresholds = CauseThresholds()
    guardrails: Guardrails = Guardrails()
    quality: QualityAlerting = QualityAlerting()  # golden-set ModelQualityBurn per digest
    prefill_decode: PdImbalanceAlerting = PdImbalanceAlerting()  # PrefillDecodeImbalance
    routing: RoutingSpec = RoutingSpec()

    @field_validator("objectives")
    @classmethod
    def _unique(cls, v: list[Objective]) -> list[Objective]:
        if not v:
            raise ValueError("must not be empty")
        names = [o.name for o in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"objective names must be unique: {sorted(dup)}")
        return v

    @field_validator("tiers")
    @classmethod
    def _tiers_unique(cls, v: list[BurnTier]) -> list[BurnTier]:
        tiers = [t.tier for t in v]
        if len(set(tiers)) != len(tiers):
            raise ValueError("each tier may appear once")
        return v

    @property
    def period_s(self) -> float:
        return duration_s(self.period)

    def windows(self) -> list[str]:
        """Every window a rule needs, shortest first."""
        ws = {"5m", "1h"} | {t.long for t in self.tiers} | {t.short for t in self.tiers}
        return sorted(ws, key=duration_s)
