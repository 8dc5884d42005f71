"""The durable drill journal: what a drill intends, applied and reverted, one JSON line each.

A drill can be interrupted at any point: Ctrl-C, a crash, ``kill -9``, a lost machine. Whatever it
injected must still be reverted afterwards, so every operation's inverse is written *and fsync'd*
before the operation is applied (and the journal directory is fsync'd when a journal is created,
so the file itself survives). ``firedrill gameday recover`` reads the journals that were never
finished and applies their un-reverted inverses in reverse order (``drill/recover.py``).

One file per run, JSON lines, in the journal directory (``.firedrill/journal/`` unless
``FIREDRILL_JOURNAL_DIR`` or the caller says otherwise)::

    {"kind": "header", "drill": ..., "spec_sha256": ..., "seed": ..., "run_by": ...,
     "target": "embedded" | "http://...", "pid": ..., "started": "2025-...Z"}
    {"kind": "intend", "key": 1, "op": {"op": "Partition", "args": {...}},
     "inverse": {"op": "Heal", "args": {...}}, "at_s": 300.0}
    {"kind": "applied", "key": 1, "at_s": 300.0}
    {"kind": "reverted", "key": 1, "at_s": 10800.0}
    {"kind": "finish", "verdict": "passed" | "failed" | "aborted" | "recovered"}

A crash in the middle of a write leaves a torn last line; readers ignore it (the record was never
acknowledged, so the operation it announced was never applied by the journal's contract). A
torn line anywhere else is corruption and is reported, naming the file and line.

This module is the journal's format, free of I/O: the operations' wire form and the parsing of
a journal's text. The files themselves, their ``fsync`` and their ``flock`` (a running drill holds
its journal's lock; the kernel drops it when the process dies, so recovery can tell a live drill
from a dead one) are an adapter's: ``firedrill.adapters.journal_file``, behind the
``IntentJournal`` and ``JournalStore`` ports.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from firedrill.errors import JournalError
from firedrill.model import operations as ops
from firedrill.model.journal import Intent, JournalHeader, JournalState
from firedrill.model.operations import Applied, Operation
from firedrill.model.wire import WireError, from_wire, to_wire

__all__ = [
    "DEFAULT_JOURNAL_DIR",
    "JOURNAL_DIR_ENV",
    "OPERATIONS",
    "SUFFIX",
    "VERDICTS",
    "Intent",
    "JournalHeader",
    "JournalState",
    "Verdict",
    "decode_applied",
    "decode_op",
    "encode_applied",
    "encode_op",
    "parse",
]

DEFAULT_JOURNAL_DIR = ".firedrill/journal"
JOURNAL_DIR_ENV = "FIREDRILL_JOURNAL_DIR"
SUFFIX = ".jsonl"

Verdict = Literal["passed", "failed", "aborted", "recovered"]
VERDICTS: tuple[str, ...] = ("passed", "failed", "aborted", "recovered")

# Every operation type by its class name: the journal's (and the control API's) wire names.
OPERATIONS: dict[str, type[Any]] = {
    name: cls
    for name, cls in vars(ops).items()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and name != "Applied"
}


# --- operations on the wire -------------------------------------------------------------------


def encode_op(op: Operation) -> dict[str, Any]:
    """``{"op": TypeName, "args": {...}}``; tuples become lists."""
    name = type(op).__name__
    if OPERATIONS.get(name) is not type(op):
        raise JournalError(f"not an operation: {op!r}")
    return {"op": name, "args": to_wire(op)}


def decode_op(data: object) -> Operation:
    """The operation ``encode_op`` wrote; ``JournalError`` naming the op and field otherwise."""
    if not isinstance(data, dict):
        raise JournalError(f"an operation is an object {{op, args}}, got {data!r}")
    unknown_keys = sorted(set(data) - {"op", "args"})
    if unknown_keys:
        raise JournalError(f"an operation has only 'op' and 'args', not {unknown_keys}")
    name = data.get("op")
    if not isinstance(name, str) or name not in OPERATIONS:
        raise JournalError(f"unknown operation {name!r} (known: {', '.join(sorted(OPERATIONS))})")
    try:
        op: Operation = from_wire(OPERATIONS[name], data.get("args", {}), name)
    except WireError as exc:
        raise JournalError(str(exc)) from exc
    return op


def encode_applied(applied: Applied) -> dict[str, Any]:
    """One entry of a fleet's change journal: ``{"op", "inverse", "at_s", "notes"}``."""
    return {
        "op": encode_op(applied.op),
        "inverse": encode_op(applied.inverse),
        "at_s": applied.at_s,
        "notes": list(applied.notes),
    }


def decode_applied(data: object) -> Applied:
    """The entry ``encode_applied`` wrote; ``JournalError`` naming what does not fit."""
    if not isinstance(data, dict):
        raise JournalError(f"an applied operation is an object, got {data!r}")
    unknown_keys = sorted(set(data) - {"op", "inverse", "at_s", "notes"})
    if unknown_keys:
        raise JournalError(f"an applied operation has no {unknown_keys}")
    at_s, notes = data.get("at_s"), data.get("notes", [])
    if isinstance(at_s, bool) or not isinstance(at_s, int | float):
        raise JournalError(f"an applied operation's at_s is a number, got {at_s!r}")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise JournalError(f"an applied operation's notes are strings, got {notes!r}")
    return Applied(
        op=decode_op(data.get("op")),
        inverse=decode_op(data.get("inverse")),
        at_s=float(at_s),
        notes=tuple(notes),
    )


# --- reading ----------------------------------------------------------------------------------


def _records(path: Path, text: str) -> tuple[list[dict[str, Any]], bool]:
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # tail: text after the last newline
    records: list[dict[str, Any]] = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JournalError(f"{path}:{number}: not a JSON record ({exc.msg})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            raise JournalError(f"{path}:{number}: a record is an object with a 'kind'")
        records.append(record)
    # A record is acknowledged only once its newline is on disk; anything after the last newline
    # is a write the crash interrupted.
    return records, bool(tail.strip())


def _field(record: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    value = record.get(name)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise JournalError(f"{where}: field '{name}' must be {kind.__name__}, got {value!r}")
    return value


def parse(path: Path, text: str, *, live: bool) -> JournalState:
    """A journal's text as read back from ``path``; ``JournalError`` naming file:line on
    corruption. ``live``: a running drill holds the journal (its adapter tells)."""
    records, torn = _records(path, text)
    if not records or records[0].get("kind") != "header":
        raise JournalError(f"{path}:1: a journal starts with a header record")
    h = records[0]
    where = f"{path}:1"
    header = JournalHeader(
        drill=_field(h, "drill", str, where),
        spec_sha256=_field(h, "spec_sha256", str, where),
        seed=_field(h, "seed", int, where),
        run_by=_field(h, "run_by", str, where),
        target=_field(h, "target", str, where),
        pid=_field(h, "pid", int, where),
        started=_field(h, "started", str, where),
    )
    intents: dict[int, dict[str, Any]] = {}
    verdict: str | None = None
    for number, record in enumerate(records[1:], start=2):
        where = f"{path}: record {number}"
        kind = record["kind"]
        if kind == "intend":
            key = _field(record, "key", int, where)
            if key in intents:
                raise JournalError(f"{where}: intent {key} recorded twice")
            try:
                op = decode_op(record.get("op"))
                inverse = decode_op(record.get("inverse"))
            except JournalError as exc:
                raise JournalError(f"{where}: {exc}") from exc
            intents[key] = {
                "key": key,
                "op": op,
                "inverse": inverse,
                "at_s": _field(record, "at_s", float, where),
                "applied": False,
                "reverted": False,
            }
        elif kind in ("applied", "reverted"):
            key = _field(record, "key", int, where)
            if key not in intents:
                raise JournalError(f"{where}: '{kind}' for unknown intent {key}")
            intents[key][kind] = True
        elif kind == "finish":
            verdict = _field(record, "verdict", str, where)
        elif kind == "header":
            raise JournalError(f"{where}: a second header")
        else:
            raise JournalError(f"{where}: unknown record kind {kind!r}")
    return JournalState(
        path=path,
        header=header,
        intents=tuple(Intent(**i) for i in intents.values()),
        verdict=verdict,
        live=live,
        torn_tail=torn,
    )
