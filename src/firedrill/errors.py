"""The exception tree of firedrill, in one place so callers know what to catch.

    FiredrillError
    ├── SpecError              a spec file is malformed: carries file, line and field
    ├── UnknownTargetError     an operation names a node, cell, model, ... that does not exist
    ├── OperationError         an operation is well-formed but cannot be applied in this state
    ├── ExportError            a window or series selection cannot be exported
    ├── StoreError             the store refused a read or write, or cannot be reached
    ├── JournalError           a drill journal cannot be written, or a journal file is corrupt
    ├── UnsafePathError        a file would be written through a link, or with loose modes
    ├── RemoteWorldError       a remote twin refused a request or cannot be reached
    ├── OutputError            an output file or directory cannot be written
    ├── CalibrationError       a Prometheus window holds nothing a fleet spec can be fitted to
    └── SignalsError           Prometheus or Alertmanager refused a request or cannot be reached
        ├── SignalsUnavailable the server cannot be reached, timed out, or answered 5xx
        ├── BadQueryError      the server refused the query or request itself (4xx, bad_data)
        └── SignalsMissing     the server answers but lacks the series a run needs, or they are
                               stale (it does not scrape the fleet the run controls)

Adapters map third-party exceptions onto these and chain them with ``from exc``.
"""

from __future__ import annotations

from collections.abc import Sequence


class FiredrillError(Exception):
    """Base of every error firedrill raises on purpose."""


class SpecError(FiredrillError):
    """A spec is malformed; names the file, the line and the field.

    When validation finds several problems the message names the first, and ``errors`` holds
    all of them (the first included); otherwise ``errors`` is empty.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str,
        line: int | None,
        field: str | None,
        errors: Sequence[SpecError] = (),
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        self.errors: tuple[SpecError, ...] = tuple(errors)
        where = file if line is None else f"{file}:{line}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{where}:{what} {message}".replace(": :", ":"))


class UnknownTargetError(FiredrillError):
    """An operation names a target that does not exist in the fleet."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"unknown {kind} '{name}'")


class OperationError(FiredrillError):
    """An operation cannot be applied in the fleet's current state."""


class ExportError(FiredrillError):
    """Series cannot be exported as asked."""


class StoreError(FiredrillError):
    """The store refused a read or a write (bad input, a broken constraint) or cannot be reached.

    A failed write leaves the stored data as it was: the service that raised it rolled back its
    own changes, and the session stays usable.
    """


class JournalError(FiredrillError):
    """A drill journal cannot be written, or a journal file is corrupt (names file and line)."""


class UnsafePathError(FiredrillError):
    """A secret or evidence file would be written through a symbolic link, over something that is
    not a regular file, or where its modes would let others read or change it."""


class RemoteWorldError(FiredrillError):
    """A remote twin (``firedrill twin serve``) refused a request or cannot be reached.

    ``status`` is the HTTP status when the twin answered (``None`` when it could not be reached).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class OutputError(FiredrillError):
    """An output path (``--json``, ``--out``, ...) cannot be written; checked before a run."""


class SignalsError(FiredrillError):
    """Prometheus or Alertmanager refused a request, or cannot be reached.

    ``url`` names the server; ``status`` is the HTTP status when it answered (``None`` when it
    could not be reached).
    """

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(message)


class SignalsUnavailable(SignalsError):
    """The server is down, timed out or answered 5xx even after retries: try again later."""


class BadQueryError(SignalsError):
    """The server refused the request itself (a bad query, 4xx): retrying will not help."""


class SignalsMissing(SignalsError):
    """The server answers, but the series a run reads are absent or stale (names them)."""


class CalibrationError(FiredrillError):
    """The window has nothing to fit: no series at all, or no kube-state-metrics topology."""
