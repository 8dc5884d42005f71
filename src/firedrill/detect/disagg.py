"""Prefill/decode imbalance: a cause ticket, and its in-process evaluation on the twin's clock.

In a disaggregated pool the two roles saturate separately. When the request shape moves (long
prompts), the prefill replicas run flat out and queue while the decode replicas idle: TTFT burns
and adding replicas in the same split only adds idle decoders. The ticket names that state, so
triage reaches for the split (``pd_rebalance``) instead of the usual TTFT levers::

    max by (cell, region, model_name) (firedrill_pd_utilization{role="prefill"}) > 0.9
    and
    max by (cell, region, model_name) (firedrill_pd_utilization{role="decode"}) < 0.6

held for ``5m``, and the mirror image (decode saturated, prefill idle). Per pool; the series
exist only for disaggregated models (``twin/disagg.py``), so a fleet without one never fires.

This module is the spec and the rule text; ``detect/imbalance.py`` evaluates them in-process.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

ALERT = "PrefillDecodeImbalance"
SERIES = "firedrill_pd_utilization"
BY = ("cell", "model_name", "region")
ROLE_PAIRS = (("prefill", "decode"), ("decode", "prefill"))  # (saturated, idle)

Duration = Annotated[str, Field(pattern=r"^[0-9]+(ms|s|m|h|d|w)$")]


class PdImbalanceAlerting(BaseModel):
    """Thresholds of the ``PrefillDecodeImbalance`` ticket (``prefill_decode:`` in an SLO spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    saturated: Annotated[float, Field(gt=0, le=1)] = 0.9  # utilisation of the role that queues
    idle: Annotated[float, Field(gt=0, le=1)] = 0.6  # utilisation of the role that waits
    hold: Duration = "5m"


def _fmt(x: float) -> str:
    return f"{x:.10g}"


def _expr(hot: str, cold: str, p: PdImbalanceAlerting) -> str:
    by = f"max by ({', '.join(BY)})"
    return (
        f'{by} ({SERIES}{{role="{hot}"}}) > {_fmt(p.saturated)}\n'
        f'and\n{by} ({SERIES}{{role="{cold}"}}) < {_fmt(p.idle)}'
    )


def pd_group(p: PdImbalanceAlerting, interval: str) -> dict[str, Any]:
    """The ``prefill-decode`` rule group: one ticket per saturated role."""
    rules = []
    for hot, cold in ROLE_PAIRS:
        rules.append(
            {
                "alert": ALERT,
                "expr": _expr(hot, cold, p),
                "for": p.hold,
                "labels": {"severity": "ticket", "team": "inference", "saturated": hot},
                "annotations": {
                    "summary": (
                        f"{{{{ $labels.model_name }}}} in {{{{ $labels.cell }}}}: {hot} "
                        f"saturated while {cold} idles; rebalance the split (pd_rebalance), "
                        "pause its scaler first"
                    )
                },
            }
        )
    return {"name": "prefill-decode", "interval": interval, "rules": rules}
