"""JSON as a type: what a report, a wire record or a stored document may hold.

``JsonObject`` is used where a value is written as JSON (reports, the store's documents), so that
mypy checks each value is one JSON can carry, instead of ``dict[str, Any]``, which checks nothing.
The alias is pydantic's, so a typed report that holds a JSON part has a JSON Schema for it too.
"""

from __future__ import annotations

from typing import TypeAlias

from pydantic import JsonValue

__all__ = ["JsonObject", "JsonValue"]

JsonObject: TypeAlias = dict[str, JsonValue]
