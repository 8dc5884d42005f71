"""The calibration report as JSON: one object per parameter, numbers that mean what they say.

Non-finite numbers (an error the fit could not estimate) become ``null``, so the file is strict
JSON that any tool reads.
"""

from __future__ import annotations

import math

from firedrill.calibrate.fleet import Calibration, Fitted
from firedrill.model.jsontypes import JsonObject


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def parameter_json(p: Fitted) -> JsonObject:
    return {
        "parameter": p.parameter,
        "unit": p.unit,
        "fitted": p.fitted,
        "base": _num(p.base),
        "value": _num(p.value),
        "error": _num(p.error),
        "error_kind": p.error_kind,
        "interval_95": None if p.low is None else [_num(p.low), _num(p.high)],
        "samples": p.samples,
        "source": p.source,
        "note": p.note,
    }


def report_json(result: Calibration) -> JsonObject:
    """The whole report: the window, then every parameter, fitted first."""
    return {
        "fleet": result.fleet.name,
        "start_unix_s": result.start_unix_s,
        "end_unix_s": result.end_unix_s,
        "step_s": result.step_s,
        "fitted": len(result.fitted),
        "not_fitted": len(result.not_fitted),
        "parameters": [parameter_json(p) for p in (*result.fitted, *result.not_fitted)],
    }
