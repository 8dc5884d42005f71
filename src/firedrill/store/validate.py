"""Checks the services run before they write: a refused value never reaches the database.

Both backends must accept and refuse the same things, so limits the database would enforce on one
of them only (SQLite does not check ``VARCHAR`` lengths; PostgreSQL rejects NUL characters) are
checked here, with a message naming the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, TypeVar, cast

from firedrill.errors import StoreError
from firedrill.model.identity import distinct_people
from firedrill.store.models import NAME_LEN, JsonObject, JsonValue

E = TypeVar("E", bound=StrEnum)


def name(value: object, field: str) -> str:
    """A short non-empty name: a person, a cell, a scope, a kind."""
    if not isinstance(value, str) or not value.strip():
        raise StoreError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > NAME_LEN:
        raise StoreError(f"{field} is longer than {NAME_LEN} characters")
    return text(value, field)


def text(value: object, field: str) -> str:
    """Free text (may be empty)."""
    if not isinstance(value, str):
        raise StoreError(f"{field} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise StoreError(f"{field} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StoreError(f"{field} is not valid Unicode text: {exc.reason}") from exc
    return value


def prose(value: object, field: str) -> str:
    """Non-empty free text of any length."""
    out = text(value, field)
    if not out.strip():
        raise StoreError(f"{field} must not be empty")
    return out


def number(value: object, field: str) -> float:
    """A finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StoreError(f"{field} must be a finite number, got {value!r}")
    return float(value)


def seconds(value: object, field: str) -> float:
    """A finite time in seconds."""
    return number(value, field)


def nonnegative(value: object, field: str) -> float:
    """A finite number >= 0 (a duration, GPU-hours)."""
    x = number(value, field)
    if x < 0:
        raise StoreError(f"{field} must be >= 0, got {value!r}")
    return x


def count(value: object, field: str, *, low: int = 0, high: int | None = None) -> int:
    """An integer in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"{field} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f" and <= {high}"
        raise StoreError(f"{field} must be >= {low}{upper}, got {value}")
    return value


def one_of(enum: type[E], value: object, field: str) -> E:
    """A member of a closed vocabulary, given as the member or its value."""
    allowed = ", ".join(m.value for m in enum)
    if not isinstance(value, str):
        raise StoreError(f"{field} must be one of {allowed}; got {value!r}")
    try:
        return enum(value)
    except ValueError as exc:
        raise StoreError(f"{field} must be one of {allowed}; got {value!r}") from exc


def names(values: Iterable[object], field: str, *, non_empty: bool = False) -> list[str]:
    """Distinct people's names, in the order given (compared canonically: alice is Alice)."""
    if isinstance(values, str | bytes):
        raise StoreError(f"{field} must be a list of names, not a single string")
    out = [name(v, field) for v in values]
    if len(distinct_people(out)) != len(out):
        raise StoreError(f"{field} names someone twice: {out}")
    if non_empty and not out:
        raise StoreError(f"{field} must name at least one person")
    return out


def canonical_json(value: object) -> str:
    """The one JSON text for a value: sorted keys, no spaces, UTF-8, no NaN or infinity."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def json_object(value: object, field: str) -> JsonObject:
    """A JSON object, normalised to what reading it back will give (tuples become lists, ...)."""
    if not isinstance(value, Mapping):
        raise StoreError(f"{field} must be a JSON object (a mapping), got {type(value).__name__}")
    try:
        loaded: Any = json.loads(canonical_json(value))
        canonical_json(loaded).encode("utf-8")  # lone surrogates cannot be stored
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{field} is not JSON-serialisable: {exc}") from exc
    return cast(dict[str, JsonValue], loaded)
