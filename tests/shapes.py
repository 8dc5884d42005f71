"""Reading JSON-shaped values (typed ``object``) in tests: each accessor checks what it narrows.

Several results are plain JSON-shaped mappings (a drill's hydrate and failback records, the
bodies a Kubernetes client sent). A test that reads into them checks the shape as it goes, so a
wrong shape fails the test with the value that was there instead of a ``TypeError`` later, and
mypy sees a real type instead of ``Any``.
"""

from __future__ import annotations

from collections.abc import Mapping


def num(value: object) -> float:
    """A number (an int is one; a bool is not)."""
    assert isinstance(value, int | float), value
    assert not isinstance(value, bool), value
    return value


def seq(value: object) -> list[object]:
    """A JSON array."""
    assert isinstance(value, list), value
    return value


def rec(value: object) -> Mapping[str, object]:
    """A JSON object."""
    assert isinstance(value, dict), value
    return value


def recs(value: object) -> list[Mapping[str, object]]:
    """A JSON array of objects."""
    return [rec(v) for v in seq(value)]


def dig(value: object, *path: str | int) -> object:
    """The value at ``path`` (object keys and array indexes), each step checked."""
    for step in path:
        value = rec(value)[step] if isinstance(step, str) else seq(value)[step]
    return value
