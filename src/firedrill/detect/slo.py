"""The SLO spec: objectives per product × model, evaluated per cell, and how to alert on them.

Defaults are the SRE workbook's multiwindow, multi-burn-rate table (5-8) for a 30-day period:
page at 14.4× over 1 h and 5 m, page at 6× over 6 h and 30 m, ticket at 3× over 1 d and 2 h,
ticket at 1× over 3 d and 6 h.

The spec names the exporter versions its rules target (``exporters``): a threshold a histogram
cannot count exactly, or an off-by-default DCGM field, is refused here with the spec's file, line
and field, rather than becoming a rule that selects nothing on the real fleet.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from firedrill.detect.alertmanager import RoutingSpec
from firedrill.detect.disagg import PdImbalanceAlerting
from firedrill.detect.quality import QualityAlerting
from firedrill.model.exporters import (
    DCGM_DEFAULT_VERSION,
    VLLM_DEFAULT_VERSION,
    dcgm_catalog,
    dcgm_optional_fields,
    vllm_catalog,
)
from firedrill.model.spec import NAME_RE

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
    # ttft and goodput SLIs; a boundary of vLLM's TTFT histogram (checked against the version in
    # SloSpec.exporters). vLLM has no 2.0 s boundary: "first token within 2 s" counts le="2.5".
    ttft_threshold_s: Annotated[float, Field(gt=0)] = 2.5
    min_events_per_hour: Annotated[int, Field(ge=0)] = 100  # below this a cell never pages

    @property
    def budget(self) -> float:
        return 1.0 - self.target


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


class ExporterVersions(_Strict):
    """The exporter releases the generated rules must fit (names, labels, bucket boundaries)."""

    vllm: Annotated[str, Field(pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.+-]*)?$")] = (
        VLLM_DEFAULT_VERSION
    )
    dcgm_exporter: Annotated[
        str, Field(pattern=r"^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+\.[0-9]+\.[0-9]+)?$")
    ] = DCGM_DEFAULT_VERSION
    # Fields the fleet's dcgm-exporter counters CSV enables beyond the default one.
    dcgm_extra_fields: list[str] = Field(default_factory=list)

    @field_validator("vllm", "dcgm_exporter", mode="before")
    @classmethod
    def _quoted(cls, v: object) -> object:
        # YAML reads `vllm: 0.10` as the float 0.1: the release would be lost, so refuse it.
        if isinstance(v, int | float):
            raise ValueError(f'write the release as a string, e.g. "{v}" in quotes')
        return v

    @field_validator("vllm")
    @classmethod
    def _known_vllm(cls, v: str) -> str:
        vllm_catalog(v)  # raises ValueError for a release the reference does not cover
        return v

    @field_validator("dcgm_exporter")
    @classmethod
    def _known_dcgm(cls, v: str) -> str:
        dcgm_catalog(v)
        return v

    @field_validator("dcgm_extra_fields")
    @classmethod
    def _optional_fields(cls, v: list[str]) -> list[str]:
        known = dcgm_optional_fields()
        unknown = [f for f in v if f not in known]
        if unknown:
            raise ValueError(
                f"not an optional dcgm-exporter field: {', '.join(unknown)} "
                f"(known: {', '.join(known)})"
            )
        return v


LabelKey = Annotated[
    str, Field(pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
]


class ScrapeSpec(_Strict):
    """How the fleet's exporters are found and how ``cell``/``region`` get onto their series.

    vLLM and dcgm-exporter never write ``cell`` or ``region``; the generated ServiceMonitor
    (vLLM) and PodMonitor (dcgm-exporter) copy them from the labels of the node the pod runs on,
    and copy the served model's name from a pod annotation onto vLLM's ``http_*`` series, which
    carry no ``model_name`` of their own.
    """

    namespace: Annotated[str, Field(pattern=NAME_RE)] = "monitoring"
    interval: Duration = "15s"
    cell_node_label: LabelKey = "firedrill.dev/cell"
    region_node_label: LabelKey = "topology.kubernetes.io/region"
    served_model_annotation: LabelKey = "firedrill.dev/served-model-name"
    vllm_selector: dict[LabelKey, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "vllm"}
    )
    vllm_port: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,15}$")] = "http"
    dcgm_selector: dict[LabelKey, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "dcgm-exporter"}
    )
    dcgm_port: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,15}$")] = "metrics"


class SloSpec(_Strict):
    service: Annotated[str, Field(pattern=NAME_RE)] = "inference"
    exporters: ExporterVersions = ExporterVersions()
    period: Duration = "30d"
    evaluation_interval: Duration = "15s"
    objectives: list[Objective]
    tiers: list[BurnTier] = Field(default_factory=_default_tiers)
    causes: CauseThresholds = CauseThresholds()
    guardrails: Guardrails = Guardrails()
    quality: QualityAlerting = QualityAlerting()  # golden-set ModelQualityBurn per digest
    prefill_decode: PdImbalanceAlerting = PdImbalanceAlerting()  # PrefillDecodeImbalance
    routing: RoutingSpec = RoutingSpec()
    scrape: ScrapeSpec = ScrapeSpec()  # the generated ServiceMonitor and PodMonitor
    # Generate the rule groups on series only the twin and firedrill's own components emit
    # (firedrill_*, gpu_quarantine_actions_total): quality, prefill/decode, security tripwires,
    # remediation guardrails, hydrate origin errors. Off: a real fleet would never fire them.
    twin_series: bool = False

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

    @model_validator(mode="after")
    def _thresholds_are_bucket_boundaries(self) -> SloSpec:
        # A histogram counts exactly only at its boundaries: any other threshold has no `le`
        # series, so the SLO would select nothing and never fire on the real fleet.
        ttft = vllm_catalog(self.exporters.vllm).family_of("vllm:time_to_first_token_seconds_count")
        assert ttft is not None
        bounds = ttft.buckets
        errors: list[InitErrorDetails] = []
        for i, o in enumerate(self.objectives):
            if o.sli in ("ttft", "goodput") and o.ttft_threshold_s not in bounds:
                near = ", ".join(f"{x:g}" for x in bounds if 0.1 <= x <= 10)
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "not_a_bucket_boundary",
                            "{value} s is not a boundary of vLLM {version}'s TTFT histogram "
                            "(boundaries: {near}, ...)",
                            {
                                "value": f"{o.ttft_threshold_s:g}",
                                "version": self.exporters.vllm,
                                "near": near,
                            },
                        ),
                        loc=("objectives", i, "ttft_threshold_s"),
                        input=o.ttft_threshold_s,
                    )
                )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def period_s(self) -> float:
        return duration_s(self.period)

    def windows(self) -> list[str]:
        """Every window a rule needs, shortest first."""
        ws = {"5m", "1h"} | {t.long for t in self.tiers} | {t.short for t in self.tiers}
        return sorted(ws, key=duration_s)
