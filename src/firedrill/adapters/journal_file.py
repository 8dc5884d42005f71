"""Drill journals as files: one JSON-lines file per run, each record ``fsync``'d, ``flock``'d.

The journal's format (records, operations on the wire, parsing) is ``firedrill.drill.journal``;
this adapter owns the files. Every record is durable before the call returns (the directory is
``fsync``'d when a journal is created, so the file itself survives). While a ``Journal`` is open it
holds an exclusive ``flock`` on its file; the kernel drops the lock when the process dies however
it dies, so recovery can tell a live drill (locked: leave it alone) from a dead one (unlocked,
unfinished: revert it). ``JournalFiles`` is the ``JournalStore`` port over a directory.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from firedrill.drill.journal import (
    DEFAULT_JOURNAL_DIR,
    JOURNAL_DIR_ENV,
    SUFFIX,
    VERDICTS,
    Verdict,
    encode_op,
    parse,
)
from firedrill.errors import JournalError
from firedrill.model.journal import JournalHeader, JournalState
from firedrill.model.operations import Operation

__all__ = ["Journal", "JournalFiles", "default_directory", "pending", "read"]


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """``$FIREDRILL_JOURNAL_DIR`` if set (and not empty), else ``.firedrill/journal``."""
    env = os.environ if environ is None else environ
    return Path(env.get(JOURNAL_DIR_ENV) or DEFAULT_JOURNAL_DIR)


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
    return parse(path, text, live=_is_locked(path))


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


class JournalFiles:
    """The journals of one directory, as recovery reads and re-opens them (``JournalStore``)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def unfinished(self, paths: Sequence[Path] | None = None) -> list[JournalState]:
        if paths is None:
            return pending(self.directory, include_live=True)
        return [s for s in (read(p) for p in paths) if not s.finished]

    def reopen(self, path: Path) -> Journal:
        return Journal.open(path)
