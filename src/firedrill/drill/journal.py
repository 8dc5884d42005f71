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

While a ``Journal`` is open it holds an exclusive ``flock`` on its file; the kernel drops the lock
when the process dies however it dies, so recovery can tell a live drill (locked: leave it alone)
from a dead one (unlocked, unfinished: revert it).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from firedrill.drill.wire import WireError, from_wire, to_wire
from firedrill.errors import JournalError
from firedrill.model import operations as ops
from firedrill.model.operations import Operation

__all__ = [
    "DEFAULT_JOURNAL_DIR",
    "JOURNAL_DIR_ENV",
    "OPERATIONS",
    "Intent",
    "Journal",
    "JournalHeader",
    "JournalState",
    "decode_op",
    "default_directory",
    "encode_op",
    "pending",
    "read",
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


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """``$FIREDRILL_JOURNAL_DIR`` if set (and not empty), else ``.firedrill/journal``."""
    env = os.environ if environ is None else environ
    return Path(env.get(JOURNAL_DIR_ENV) or DEFAULT_JOURNAL_DIR)


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


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JournalHeader:
    drill: str
    spec_sha256: str
    seed: int
    run_by: str
    target: str  # "embedded" or the remote twin's base URL
    pid: int
    started: str  # wall clock, ISO 8601 UTC


@dataclass(frozen=True)
class Intent:
    """One intended operation and what became of it."""

    key: int
    op: Operation
    inverse: Operation
    at_s: float
    applied: bool
    reverted: bool


@dataclass(frozen=True)
class JournalState:
    """A journal file as read back."""

    path: Path
    header: JournalHeader
    intents: tuple[Intent, ...]
    verdict: str | None  # None: never finished
    live: bool  # an open Journal (a running drill) holds the file's lock
    torn_tail: bool  # the last line was cut short by a crash and ignored

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    @property
    def unreverted(self) -> tuple[Intent, ...]:
        """Intents not yet reverted, newest first: the order recovery undoes them in."""
        return tuple(i for i in reversed(self.intents) if not i.reverted)


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


def _is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock, if it got one
    return False


def read(path: Path | str) -> JournalState:
    """Read one journal file; ``JournalError`` naming file:line on corruption."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JournalError(f"{path}: cannot read the journal ({exc})") from exc
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
        live=_is_locked(path),
        torn_tail=torn,
    )


def _journal_files(directory: Path) -> Iterator[Path]:
    if not directory.is_dir():
        return iter(())
    return iter(sorted(p for p in directory.iterdir() if p.suffix == SUFFIX and p.is_file()))


def pending(directory: Path | str, *, include_live: bool = False) -> list[JournalState]:
    """Unfinished journals (oldest file name first); their ``unreverted`` intents, newest first.

    Journals still held by a running drill are left out unless ``include_live``.
    """
    states = (read(p) for p in _journal_files(Path(directory)))
    return [s for s in states if not s.finished and (include_live or not s.live)]


# --- writing ----------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Journal:
    """An open journal: append records, each durable before the call returns.

    ``create`` starts a run's journal; ``open`` re-opens an unfinished one (recovery appends its
    ``reverted`` and ``finish`` records). Use as a context manager or call ``close``; ``finish``
    closes too. Not thread-safe: one writer per journal.
    """

    def __init__(self, path: Path, fd: int, state: JournalState) -> None:
        self.path = path
        self._fd: int | None = fd
        self.header = state.header
        self._next_key = max((i.key for i in state.intents), default=0) + 1
        self._known = {i.key for i in state.intents}
        self._finished = state.finished

    # construction

    @classmethod
    def create(
        cls,
        directory: Path | str,
        *,
        drill: str,
        spec_sha256: str,
        seed: int,
        run_by: str,
        target: str = "embedded",
        started: datetime | None = None,
        pid: int | None = None,
    ) -> Journal:
        """A new journal file for one run; the header is durable when this returns."""
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"{directory}: cannot create the journal directory ({exc})") from exc
        when = (started or datetime.now(UTC)).astimezone(UTC)
        pid = os.getpid() if pid is None else pid
        stem = f"{when:%Y%m%dT%H%M%S}Z-{_SAFE.sub('_', drill)[:80]}-{pid}"
        fd = -1
        path = directory / f"{stem}{SUFFIX}"
        for attempt in range(1, 1000):
            path = directory / (f"{stem}{SUFFIX}" if attempt == 1 else f"{stem}-{attempt}{SUFFIX}")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise JournalError(f"{path}: cannot create the journal ({exc})") from exc
        else:
            raise JournalError(f"{directory}: no free journal file name for {stem}")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        header = JournalHeader(
            drill=drill,
            spec_sha256=spec_sha256,
            seed=seed,
            run_by=run_by,
            target=target,
            pid=pid,
            started=when.isoformat().replace("+00:00", "Z"),
        )
        state = JournalState(path, header, (), None, live=True, torn_tail=False)
        journal = cls(path, fd, state)
        journal._write({"kind": "header", **dataclasses.asdict(header)})
        _fsync_dir(directory)
        return journal

    @classmethod
    def open(cls, path: Path | str) -> Journal:
        """Re-open an unfinished, unlocked journal to append; a torn last line is cut off first."""
        path = Path(path)
        state = read(path)
        if state.finished:
            raise JournalError(f"{path}: already finished ({state.verdict})")
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            raise JournalError(f"{path}: cannot open the journal ({exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise JournalError(
                f"{path}: a running drill (pid {state.header.pid}) holds it"
            ) from exc
        if state.torn_tail:
            data = path.read_bytes()
            os.ftruncate(fd, data.rfind(b"\n") + 1)
            os.fsync(fd)
        return cls(path, fd, state)

    # records

    def intend(self, op: Operation, inverse: Operation, at_s: float) -> int:
        """Record an operation and its inverse before it is applied; returns the intent's key."""
        key = self._next_key
        self._write(
            {
                "kind": "intend",
                "key": key,
                "op": encode_op(op),
                "inverse": encode_op(inverse),
                "at_s": float(at_s),
            }
        )
        self._next_key += 1
        self._known.add(key)
        return key

    def applied(self, key: int, at_s: float) -> None:
        """The intended operation was applied."""
        self._mark("applied", key, at_s)

    def reverted(self, key: int, at_s: float) -> None:
        """The intended operation's inverse was applied (or nothing was left to revert)."""
        self._mark("reverted", key, at_s)

    def finish(self, verdict: Verdict | str) -> None:
        """The run ended; a finished journal is never recovered. Closes the journal."""
        if verdict not in VERDICTS:
            raise JournalError(f"unknown verdict {verdict!r} (one of {', '.join(VERDICTS)})")
        self._write({"kind": "finish", "verdict": verdict})
        self._finished = True
        self.close()

    def _mark(self, kind: str, key: int, at_s: float) -> None:
        if key not in self._known:
            raise JournalError(f"{self.path}: no intent {key} to mark {kind}")
        self._write({"kind": kind, "key": key, "at_s": float(at_s)})

    def _write(self, record: Mapping[str, object]) -> None:
        if self._fd is None:
            raise JournalError(f"{self.path}: journal is closed")
        if self._finished:
            raise JournalError(f"{self.path}: journal is finished")
        data = (json.dumps(record, separators=(", ", ": "), allow_nan=False) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError as exc:
            raise JournalError(f"{self.path}: cannot write the journal ({exc})") from exc

    # lifetime

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        """Release the file (and its lock); an unfinished journal stays pending for recovery."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
