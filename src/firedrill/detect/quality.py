"""Quality alerting: page when a weights digest answers the golden set worse than signed-off ones.

A model that is fast and wrong burns no latency budget, so the SLO burn-rate pages never see it.
The online quality SLI is the golden-set pass rate per weights digest, per cell
(``firedrill_golden_set_requests_total{model_name, digest, cell, region, result}``; see
``twin/quality.py``), and ``ModelQualityBurn`` fires per (cell, region, model_name, digest) when the
digest's failure ratio over ``window`` exceeds the signed-off baseline's by a tier's drop::

    sum by (cell, region, model_name, digest) (increase(golden{result="fail"}[10m]))
      / sum by (cell, region, model_name, digest) (increase(golden[10m]))  >  (1 - baseline) + drop
    and sum by (cell, region, model_name, digest) (increase(golden[10m])) >= min_probes

Tiers mirror the quality axis of the SEV matrix: each carries its drop as ``golden_drop_pts``,
which incident triage reads as the drop in percentage points (and the share of answers gone
wrong). Per digest, so a canary is judged on its own answers: a bad canary at 10% of traffic
shows its full drop instead of a tenth of it. ``min_probes`` keeps a cell that was sent too few
probes from paging on noise: at 0.5 probes/s a 10-minute window holds about 300, and a 5-point
drop above a 97% baseline is then about five standard deviations out.

This module is the spec and the rule text only; ``detect/golden.py`` evaluates the same rules
in-process on the twin's clock.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ALERT = "ModelQualityBurn"
SERIES = "firedrill_golden_set_requests_total"
BY = ("cell", "region", "model_name", "digest")
DROP_LABEL = "golden_drop_pts"

Duration = Annotated[str, Field(pattern=r"^[0-9]+(ms|s|m|h|d|w)$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QualityTier(_Strict):
    """Alert when a digest's golden-set pass rate is ``drop_pts`` points below the baseline."""

    drop_pts: Annotated[float, Field(gt=0, lt=100)]
    severity: Literal["page", "ticket"]


def _default_tiers() -> list[QualityTier]:
    # The quality axis: >= 25 points SEV1, >= 10 SEV2 (both page); 5 points tickets the owner.
    return [
        QualityTier(drop_pts=25, severity="page"),
        QualityTier(drop_pts=10, severity="page"),
        QualityTier(drop_pts=5, severity="ticket"),
    ]


class QualityAlerting(_Strict):
    """Golden-set quality alerting of an SLO spec (``quality:``)."""

    baseline_pass_rate: Annotated[float, Field(gt=0, le=1)] = 0.97  # signed-off weights
    window: Duration = "10m"
    hold: Duration = "2m"  # the alerts' ``for:``
    min_probes: Annotated[int, Field(ge=1)] = 100  # per cell and digest over ``window``
    tiers: list[QualityTier] = Field(default_factory=_default_tiers)

    @field_validator("tiers")
    @classmethod
    def _distinct(cls, v: list[QualityTier]) -> list[QualityTier]:
        drops = [t.drop_pts for t in v]
        if len(set(drops)) != len(drops):
            raise ValueError("each tier's drop_pts may appear once")
        return v

    def fail_ratio_threshold(self, tier: QualityTier) -> float:
        """The failure ratio above which the tier fires, as the rule text writes it."""
        return float(_fmt((1.0 - self.baseline_pass_rate) + tier.drop_pts / 100.0))


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def _by() -> str:
    return ", ".join(BY)


def tier_expr(q: QualityAlerting, tier: QualityTier) -> str:
    by = f"sum by ({_by()})"
    fails = f'{by} (increase({SERIES}{{result="fail"}}[{q.window}]))'
    probes = f"{by} (increase({SERIES}[{q.window}]))"
    return (
        f"(\n  {fails}\n  /\n  {probes}\n) > {_fmt(q.fail_ratio_threshold(tier))}\n"
        f"and\n{probes} >= {q.min_probes}"
    )


def tier_labels(q: QualityAlerting, tier: QualityTier) -> dict[str, str]:
    return {
        "severity": tier.severity,
        "team": "inference",
        DROP_LABEL: _fmt(tier.drop_pts),
        "baseline_pass_rate": _fmt(q.baseline_pass_rate),
    }


def quality_group(q: QualityAlerting, interval: str) -> dict[str, Any]:
    """The ``model-quality`` rule group: one ``ModelQualityBurn`` rule per tier."""
    rules = []
    for tier in q.tiers:
        drop = _fmt(tier.drop_pts)
        rules.append(
            {
                "alert": ALERT,
                "expr": tier_expr(q, tier),
                "for": q.hold,
                "labels": tier_labels(q, tier),
                "annotations": {
                    "summary": (
                        f"Golden-set pass rate of {{{{ $labels.model_name }}}} "
                        f"{{{{ $labels.digest }}}} at least {drop} points below "
                        f"{_fmt(q.baseline_pass_rate * 100)}% in {{{{ $labels.cell }}}}"
                    ),
                    "description": (
                        "Fast and wrong is no better than slow: roll the digest back to the "
                        "last signed and attested one (a canary: abort the rollout)."
                    ),
                    "runbook_url": "https://runbooks.firedrill.dev/inference/model-quality",
                },
            }
        )
    return {"name": "model-quality", "interval": interval, "rules": rules}


_DROP = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def drop_pts(labels: dict[str, str]) -> float:
    """The golden-set drop an alert's labels carry (0 when it carries none)."""
    text = labels.get(DROP_LABEL, "")
    return float(text) if _DROP.match(text) else 0.0
