"""The ``series`` expectation: a bound on what a series did over a window of the run.

Outcomes that no alert names are still falsifiable this way: preemptions stop after a bundle
revert (``reduce: increase`` of ``vllm:num_preemptions_total`` over the last minutes at most 0),
the stable digest is back at 100% after a canary abort (``firedrill_rollout_canary_share`` at most
0), TTFT recovers after a prefill/decode rebalance. The window ends at ``at`` (default: the end of
the run) and spans ``window``; each matching series is reduced over it (its last value, maximum,
minimum, or increase from first to last sample), then the series are combined (``aggregate``),
and the result must lie within ``min`` .. ``max``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from firedrill.detect.slo import duration_s

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun

DurationText = Annotated[str, Field(pattern=r"^[0-9]+(s|m|h|d)$")]


class SeriesCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    check: Literal["series"]
    name: str
    matchers: dict[str, str] = {}
    reduce: Literal["last", "max", "min", "increase"] = "last"
    aggregate: Literal["max", "min", "sum"] = "max"  # over the matching series
    window: DurationText = "5m"
    at: DurationText | None = None  # the window's end; None: the end of the run
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bounded(self) -> SeriesCheck:
        if self.min is None and self.max is None:
            raise ValueError("a series check needs min or max")
        return self

    def label(self) -> str:
        sel = ",".join(f'{k}="{v}"' for k, v in sorted(self.matchers.items()))
        return f"{self.aggregate} {self.reduce} {self.name}{{{sel}}} over {self.window}"


def _reduce(values: np.ndarray, how: str) -> float:
    vals = values[np.isfinite(values)]
    if vals.size == 0:
        return math.nan
    if how == "last":
        return float(vals[-1])
    if how == "max":
        return float(vals.max())
    if how == "min":
        return float(vals.min())
    return float(vals[-1] - vals[0])


def evaluate_series(c: SeriesCheck, run: ScenarioRun) -> tuple[str, bool, str, str]:
    """(check, passed, expected, observed) of one series check."""
    end = duration_s(c.at) if c.at is not None else run.world.now_s()
    start = end - duration_s(c.window)
    series = run.world.query(c.name, c.matchers, start_s=start, end_s=end)
    reduced = [r for s in series if not math.isnan(r := _reduce(s.values, c.reduce))]
    lo = "-inf" if c.min is None else f"{c.min:g}"
    hi = "inf" if c.max is None else f"{c.max:g}"
    expected = f"within {lo}..{hi}"
    if not reduced:
        return c.label(), False, expected, "no samples"
    if c.aggregate == "max":
        value = max(reduced)
    elif c.aggregate == "min":
        value = min(reduced)
    else:
        value = float(sum(reduced))
    ok = (c.min is None or value >= c.min) and (c.max is None or value <= c.max)
    return c.label(), ok, expected, f"{value:g} over {len(reduced)} series"
