"""Every operation's arguments through the control API: 200 or 400, never a crash or a 500.

Arguments are drawn from each operation's type hints, with the values that broke the API before
(NaN, infinities, 20-digit integers, negative indexes, brackets, wrong types) mixed into the
right ones (real node, cell and model names). A 400 must leave the twin exactly as it was, and
``/v1/injected`` must answer after every request. Raw bodies (any bytes, any JSON) too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firedrill.adapters.twin_api import ControlApi, _static_state
from firedrill.drill.journal import OPERATIONS
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from tests.fuzz.profiles import FUZZ_CHEAP

FLEET = Path(__file__).resolve().parents[1] / "drill" / "fleet-small.yaml"
TOKEN = "f" * 43
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def world() -> tuple[Twin, ControlApi]:
    twin = Twin(load_fleet(FLEET), 5, hours_hint=1.0)
    return twin, ControlApi(twin, threading.Lock(), TOKEN)


def _targets(twin: Twin) -> dict[str, list[str]]:
    """Real names by the argument names that take them."""
    nodes = [n.name for n in twin.nodes][:8]
    regions = list(twin.region_names)
    return {
        "node": nodes,
        "cell": list(twin.cell_names),
        "model": [m.name for m in twin.models],
        "region": regions,
        "source": regions,
        "target": regions,
        "a": regions + list(twin.cell_names),
        "b": [*regions, "edge"],
        "jobset": [js.spec.name for js in twin.training.jobs] or ["none"],
        "pod": [f"{nodes[0]}/0", "pod-x"],
    }


bad_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1.0, -1, -2, 64, 2**63, 10**20]),
    st.integers(min_value=2**62, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**25), max_value=10**25),
)
wrong_types = st.one_of(
    st.text(max_size=12),
    st.just("[/x]"),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
hostile = bad_numbers | wrong_types


def _sane(hint: Any, field: str, targets: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    """A value that fits the field: a real name, a small number, an allowed literal."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return st.sampled_from(typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_sane(a, field, targets) for a in typing.get_args(hint)])
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(_sane(args[0], field, targets), max_size=3)
        parts = [_sane(a, "cell" if i == 0 else field, targets) for i, a in enumerate(args)]
        return st.tuples(*parts).map(list)
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(min_value=0, max_value=10)
    if hint is float:
        return st.floats(min_value=0.0, max_value=5.0)
    if hint is str:
        real = targets.get(field)
        if real:
            return st.sampled_from(real)
        return st.sampled_from(["sha256:0123456789abcdef0123", "Hold", "true", "x"])
    return st.none()


def _numeric(hint: Any) -> bool:
    if hint in (int, float):
        return True
    return any(_numeric(a) for a in typing.get_args(hint))


def _operation(twin: Twin) -> st.SearchStrategy[dict[str, Any]]:
    """An operation with fitting arguments, one of them (or none) replaced by a hostile value
    or left out."""
    targets = _targets(twin)

    with_numbers = sorted(
        n
        for n, c in OPERATIONS.items()
        if any(_numeric(h) for h in typing.get_type_hints(c).values())
    )

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        # operations with numeric arguments broke the API most: three draws in four
        pick = with_numbers if draw(st.integers(0, 3)) > 0 else sorted(OPERATIONS)
        name = draw(st.sampled_from(pick))
        cls = OPERATIONS[name]
        hints = typing.get_type_hints(cls)
        fields = [f.name for f in dataclasses.fields(cls)]
        args = {f: draw(_sane(hints[f], f, targets)) for f in fields}
        numeric = [f for f in fields if _numeric(hints[f])]
        if fields and draw(st.integers(0, 3)) > 0:
            # numbers broke the API most: aim at them three times in four
            pool = numeric if numeric and draw(st.integers(0, 3)) > 0 else fields
            victim = draw(st.sampled_from(pool))
            if draw(st.integers(0, 9)) == 0:
                del args[victim]
            else:
                args[victim] = draw(bad_numbers if victim in numeric else hostile)
        return {"op": name, "args": args}

    return build()


def _snapshot(twin: Twin) -> tuple[object, ...]:
    return (
        repr(_static_state(twin)),
        repr(sorted(twin.dcgm.items())),
        twin.desired.tolist(),
        len(twin.journal),
    )


def _call(api: ControlApi, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    status, text, content_type = api.handle(method, path, HEADERS, body)
    assert content_type == "application/json"
    return status, json.loads(text)


@FUZZ_CHEAP
@given(data=st.data())
def test_every_operation_is_applied_or_refused_cleanly(
    world: tuple[Twin, ControlApi], data: st.DataObject
) -> None:
    twin, api = world
    op = data.draw(_operation(twin), label="operation")
    body = json.dumps(op).encode()  # NaN and infinities travel as Python's json writes them
    for endpoint in ("/v1/inverse", "/v1/apply"):
        before = _snapshot(twin)
        status, reply = _call(api, "POST", endpoint, body)
        assert status in (200, 400), reply
        if status == 400:
            assert reply["error"]
            assert _snapshot(twin) == before, f"{op} was refused but changed the twin"
    status, injected = _call(api, "GET", "/v1/injected")
    assert status == 200
    for item in injected["injected"]:
        for key in ("baseline", "now"):
            value = item[key]
            assert not isinstance(value, float) or math.isfinite(value)


json_values = st.recursive(
    st.none() | st.booleans() | hostile | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ_CHEAP
@given(
    body=st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(
            lambda op, args: json.dumps({"op": op, "args": args}).encode(),
            st.sampled_from(sorted(OPERATIONS)),
            json_values,
        ),
    ),
    endpoint=st.sampled_from(["/v1/apply", "/v1/inverse", "/v1/advance"]),
)
def test_any_body_gets_an_answer(
    world: tuple[Twin, ControlApi], body: bytes, endpoint: str
) -> None:
    twin, api = world
    before = _snapshot(twin)
    status, reply = _call(api, "POST", endpoint, body)
    assert status in (200, 400), reply
    if status == 400:
        assert _snapshot(twin) == before
