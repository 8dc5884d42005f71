"""Bounds on operation arguments, checked before an operation is accepted from outside.

An operation arrives from a spec file (a scenario's timeline) or over the remote twin's control
API, typed but otherwise as a person or a program wrote it. Python's types let through values no
fleet can act on: ``NaN`` (every comparison with it is false, so a ``slowdown < 1`` check passes
it), infinities, integers with 400 digits (NumPy arrays overflow), negative GPU indexes, shares
above one. Applying such a value half-way leaves the twin in a state nothing can read back. So
each argument is checked here, by its name and type, before anything is applied: floats are
finite and within the range their name implies, integers are within theirs, texts are short.

`problems` returns every problem (an empty list: the operation may be applied); `check` raises
the first as an `OperationError`. The fleet still refuses what only its state can tell (an
unknown node, a rollout that does not exist).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Final

from firedrill.errors import OperationError

__all__ = ["MAX_REPLICAS", "MAX_TEXT_CHARS", "RANGES", "check", "problems"]

MAX_TEXT_CHARS: Final = 1024  # names, keys, digests, flag values
MAX_ITEMS: Final = 10_000  # items in a tuple argument (route weights, excluded nodes)
MAX_REPLICAS: Final = 100_000  # replicas of one model in one cell
MAX_MAGNITUDE: Final = 1e15  # any other number

# (low, high) inclusive, by argument name; a number not named here is within +-MAX_MAGNITUDE.
RANGES: Final[dict[str, tuple[float, float]]] = {
    "gpu": (0, 63),
    "field_id": (0, 65_535),  # DCGM field ids are 16-bit
    "value": (-MAX_MAGNITUDE, MAX_MAGNITUDE),
    "slowdown": (1.0, 1_000.0),
    "replicas": (0, MAX_REPLICAS),
    "canary_percent": (0, 100),
    "percent": (0, 100),
    "max_surge": (0, 100),
    "fraction": (0.0, 1.0),
    "prefill_share": (0.0, 1.0),
    "quality": (0.0, 1.0),
    "approved_share": (0.0, 1.0),
    "gpu_memory_utilization": (0.0, 1.0),
    "max_num_seqs": (1, 65_536),
    "nodes": (0, 100_000),
    "gbytes": (0.0, 1e6),  # GB
    "rank": (0, 1_000_000),
    "prompt_median": (0.0, 1e6),  # tokens
    "output_mean": (0.0, 1e6),  # tokens
    "rate_per_s": (0.0, 1e6),
    "since_s": (0.0, 1e9),
    "weight": (0, 1_000_000),  # a route weight (inside SetRouteWeights.weights)
}

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def problems(op: object) -> list[str]:
    """Every argument of ``op`` that is out of bounds, as ``Op.field: reason``."""
    cls = type(op)
    if not dataclasses.is_dataclass(op) or isinstance(op, type):
        return [f"not an operation: {cls.__name__}"]
    found: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(op):
        where = f"{cls.__name__}.{f.name}"
        found.extend(_value(getattr(op, f.name), hints.get(f.name), f.name, where))
    return found


def check(op: object) -> None:
    """Raise `OperationError` naming the first out-of-bounds argument of ``op``."""
    found = problems(op)
    if found:
        raise OperationError(found[0])


def _value(value: object, hint: object, name: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        return []
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            return [f"{where}: at most {MAX_TEXT_CHARS} characters, got {len(value)}"]
        if "\x00" in value:
            return [f"{where}: a NUL character is not allowed"]
        return []
    if isinstance(value, int | float):
        return _number(value, name, where)
    if isinstance(value, tuple | list):
        if len(value) > MAX_ITEMS:
            return [f"{where}: at most {MAX_ITEMS} items, got {len(value)}"]
        out: list[str] = []
        for i, item in enumerate(value):
            if name == "weights" and isinstance(item, tuple | list) and len(item) == 2:
                out.extend(_value(item[0], None, "cell", f"{where}[{i}][0]"))
                out.extend(_value(item[1], None, "weight", f"{where}[{i}][1]"))
            else:
                out.extend(_value(item, None, name, f"{where}[{i}]"))
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return problems(value)
    return [f"{where}: unexpected value of type {type(value).__name__}"]


def _number(value: float, name: str, where: str) -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: must be a finite number, got {value!r}"]
    low, high = RANGES.get(name, (-MAX_MAGNITUDE, MAX_MAGNITUDE))
    if not low <= value <= high:
        shown = repr(value)
        if isinstance(value, int) and abs(value) >= 10**18:
            shown = f"an integer of {value.bit_length()} bits"
        return [f"{where}: must be within {low:g}..{high:g}, got {shown}"]
    return []
