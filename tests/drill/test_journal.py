"""The durable drill journal: records outlive the writer, torn tails are tolerated."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from firedrill.adapters.journal_file import Journal, default_directory, pending, read
from firedrill.drill.journal import OPERATIONS, decode_op, encode_op
from firedrill.errors import JournalError
from firedrill.model import operations as ops

SHA = "ab" * 32


def _sample(hint: Any, name: str) -> Any:
    """A value of a field's type that differs from any default (to catch dropped fields)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return typing.get_args(hint)[-1]
    if origin in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        return _sample(options[0], name)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return (_sample(args[0], name), _sample(args[0], name + "2"))
        return tuple(_sample(a, f"{name}{i}") for i, a in enumerate(args))
    return {bool: False, int: 3, float: 2.5, str: f"{name}-x"}[hint]


def every_operation() -> list[ops.Operation]:
    out = []
    for cls in OPERATIONS.values():
        hints = typing.get_type_hints(cls)
        out.append(cls(**{f.name: _sample(hints[f.name], f.name) for f in dataclasses.fields(cls)}))
    return out


@pytest.mark.parametrize("op", every_operation(), ids=lambda op: type(op).__name__)
def test_every_operation_round_trips_through_json(op: ops.Operation) -> None:
    wire = json.loads(json.dumps(encode_op(op)))
    assert wire["op"] == type(op).__name__
    assert decode_op(wire) == op


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"op": "Nope", "args": {}}, "unknown operation 'Nope'"),
        ({"op": "Cordon", "args": {}}, "Cordon: missing field 'node'"),
        ({"op": "Cordon", "args": {"node": 1}}, "Cordon.node: expected a string"),
        ({"op": "Cordon", "args": {"node": "n", "x": 1}}, "Cordon has no field(s) ['x']"),
        (
            {"op": "Partition", "args": {"kind": "wall", "a": "x", "b": "y"}},
            "Partition.kind: 'wall' is not one of",
        ),
        ({"op": "InjectThermal", "args": {"node": "n", "gpu": True}}, "expected an integer"),
        (
            {"op": "SetRouteWeights", "args": {"model": "m", "weights": [["c", "9"]]}},
            "SetRouteWeights.weights[0][1]: expected an integer",
        ),
        (["Cordon"], "an operation is an object"),
    ],
)
def test_bad_operations_are_refused_naming_the_field(data: object, reason: str) -> None:
    with pytest.raises(JournalError) as info:
        decode_op(data)
    assert reason in str(info.value)


def _journal(directory: Path, **kw: Any) -> Journal:
    return Journal.create(
        directory, drill="l5-blackhole", spec_sha256=SHA, seed=7, run_by="alice", **kw
    )


def test_records_are_on_disk_when_each_call_returns(tmp_path: Path) -> None:
    j = _journal(tmp_path / "j", target="http://127.0.0.1:9400")
    cut = ops.Partition("region-region", "us-east-1", "us-west-2")
    heal = ops.Heal("region-region", "us-east-1", "us-west-2")
    key = j.intend(cut, heal, 300.0)
    # another reader (as after a kill -9) sees the intent before it is applied
    state = read(j.path)
    assert state.header.drill == "l5-blackhole"
    assert state.header.target == "http://127.0.0.1:9400"
    assert [(i.op, i.inverse, i.applied) for i in state.intents] == [(cut, heal, False)]
    assert state.live
    assert not state.finished
    j.applied(key, 300.0)
    pause = ops.PauseReplication("us-east-1", "us-west-2")
    k2 = j.intend(pause, ops.ResumeReplication("us-east-1", "us-west-2"), 301.0)
    j.applied(k2, 301.0)
    j.reverted(k2, 900.0)
    state = read(j.path)
    assert [(i.key, i.applied, i.reverted) for i in state.intents] == [
        (1, True, False),
        (2, True, True),
    ]
    assert [i.key for i in state.unreverted] == [1]
    j.finish("passed")
    assert j.closed
    state = read(j.path)
    assert state.finished
    assert state.verdict == "passed"
    assert not state.live
    assert pending(tmp_path / "j", include_live=True) == []


def test_pending_lists_unfinished_journals_newest_intent_first(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    keys = [
        j.intend(ops.DenyCapacity(r), ops.AllowCapacity(r), float(n))
        for n, r in enumerate(("us-east-1", "us-west-2", "eu-west-1"))
    ]
    for k in keys:
        j.applied(k, 1.0)
    j.reverted(keys[1], 2.0)
    assert pending(tmp_path) == []  # a running drill holds its journal: not for recovery
    (live,) = pending(tmp_path, include_live=True)
    assert live.live
    j.close()  # the process is gone (the lock goes with it)
    (state,) = pending(tmp_path)
    assert [i.op for i in state.unreverted] == [
        ops.DenyCapacity("eu-west-1"),
        ops.DenyCapacity("us-east-1"),
    ]


def test_a_torn_last_line_is_ignored_and_cut_before_appending(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    key = j.intend(ops.DenyCapacity("us-west-2"), ops.AllowCapacity("us-west-2"), 5.0)
    j.applied(key, 5.0)
    j.close()
    with j.path.open("a") as f:  # a crash in the middle of writing the next intent
        f.write('{"kind": "intend", "key": 2, "op": {"op": "Partition", "ar')
    state = read(j.path)
    assert state.torn_tail
    assert [(i.key, i.applied) for i in state.intents] == [(1, True)]
    with Journal.open(j.path) as again:
        again.reverted(key, 60.0)
        again.finish("recovered")
    lines = j.path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # the torn fragment is gone
    assert read(j.path).verdict == "recovered"


def test_a_torn_line_in_the_middle_is_corruption_naming_file_and_line(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.close()
    text = j.path.read_text()
    j.path.write_text(text + '{"kind": "applied", "key"\n{"kind": "finish", "verdict": "failed"}\n')
    with pytest.raises(JournalError, match=rf"{j.path.name}:2: not a JSON record"):
        read(j.path)


def test_misuse_is_refused(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    with pytest.raises(JournalError, match="no intent 9"):
        j.applied(9, 0.0)
    with pytest.raises(JournalError, match="unknown verdict"):
        j.finish("great")
    with pytest.raises(JournalError, match="holds it"):
        Journal.open(j.path)  # a second writer while the drill runs
    j.finish("aborted")
    with pytest.raises(JournalError, match="closed"):
        j.intend(ops.Noop(), ops.Noop(), 0.0)
    with pytest.raises(JournalError, match="already finished"):
        Journal.open(j.path)


def test_two_journals_in_the_same_second_get_distinct_files(tmp_path: Path) -> None:
    a, b = _journal(tmp_path, pid=42), _journal(tmp_path, pid=42)
    assert a.path != b.path
    a.close()
    b.close()
    assert len(pending(tmp_path)) == 2


def test_the_directory_comes_from_the_environment() -> None:
    assert default_directory({}) == Path(".firedrill/journal")
    assert default_directory({"FIREDRILL_JOURNAL_DIR": "/var/lib/fd"}) == Path("/var/lib/fd")
