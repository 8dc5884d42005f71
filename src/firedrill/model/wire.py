"""Frozen dataclasses to JSON and back, checked against their type hints.

Operations and fleet views cross process boundaries twice in a drill: into the durable journal
(so a later process can revert them) and over the remote twin's control API. Both need the same
exact round trip, with a clear reason when the JSON does not fit (which operation, which field,
what was expected). Tuples travel as JSON lists; nested dataclasses as objects.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

__all__ = ["WireError", "from_wire", "to_wire"]

T = TypeVar("T")


class WireError(ValueError):
    """JSON that does not fit the dataclass; the message names the field."""


def to_wire(value: object) -> Any:
    """A JSON-ready copy: dataclasses become objects, tuples lists; scalars stay."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_wire(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}
_MAX_FLOAT_INT = int(sys.float_info.max)


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def from_wire(cls: type[T], data: object, where: str | None = None) -> T:
    """An instance of the dataclass ``cls`` from ``data``; ``WireError`` naming the field."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise WireError(f"{where}: expected an object, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise WireError(f"{where} has no field(s) {unknown} (fields: {sorted(fields)})")
    hints = _hints(cls)
    values: dict[str, object] = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{where}: missing field '{name}'")
            continue
        values[name] = _conform(data[name], hints[name], f"{where}.{name}")
    return cls(**values)


def _conform(value: object, hint: Any, where: str) -> object:
    """``value`` checked against one type hint; lists become tuples."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed or type(value) not in {type(a) for a in allowed}:
            raise WireError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        problems = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _conform(value, option, where)
            except WireError as exc:
                problems.append(str(exc))
        raise WireError(problems[0] if len(problems) == 1 else f"{where}: {value!r} fits no type")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise WireError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_conform(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise WireError(f"{where}: expected {len(args)} items, got {len(value)}")
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(_conform(v, a, f"{where}[{i}]") for i, (v, a) in pairs)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_wire(hint, value, where)
    if hint is type(None):
        if value is not None:
            raise WireError(f"{where}: expected null, got {value!r}")
        return None
    if hint is bool:
        if not isinstance(value, bool):
            raise WireError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, int) and abs(value) > _MAX_FLOAT_INT:  # float() would overflow
            raise WireError(f"{where}: a {value.bit_length()}-bit integer is too large a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise WireError(f"{where}: expected a string, got {value!r}")
        return value
    raise WireError(f"{where}: cannot read a field of type {hint!r}")
