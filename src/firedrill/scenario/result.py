"""The respond report as typed values: what ``respond --json`` writes and the store ingests.

The run of a scenario is a contract read by CI (``passed``, the expectations), by the store
(``incidents``, kept by ``firedrill.store.ingest``) and by people. These frozen dataclasses hold
its top level field by field, under the JSON's own names. ``RespondReport.from_json`` validates
a report in its JSON form (the run's, made plain, or one read back from a file) and ``to_json``
writes it back value for value: an integer stays an integer, so a report read and written again
is byte-identical.

An incident's record (severity history, levers, comms, break-glass, postmortem) is carried as a
JSON object here; ``firedrill.store.respond_report`` checks it field by field before storing it.

``RESPOND_REPORT_SCHEMA_VERSION`` is the version of this shape; ``firedrill schema
respond-report`` prints the JSON Schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from pydantic import ConfigDict, TypeAdapter, ValidationError

from firedrill.errors import FiredrillError
from firedrill.model.jsontypes import JsonObject

__all__ = [
    "RESPOND_REPORT_SCHEMA_VERSION",
    "AlertRecord",
    "ChangeRecord",
    "Expectation",
    "NotificationRecord",
    "OperationRecord",
    "Remediation",
    "ReportError",
    "RespondReport",
    "plain",
    "respond_report_schema",
]

RESPOND_REPORT_SCHEMA_VERSION = 1

Number: TypeAlias = int | float  # an int stays an int in the JSON


# A field the type does not know is refused, never dropped: the report is written back from the
# type, so a field added to the run but not here would silently vanish from the JSON.
_FIELDS_AS_WRITTEN = ConfigDict(extra="forbid")


class ReportError(FiredrillError):
    """A respond report that does not have the shape of the contract (the path of the field)."""


@dataclass(frozen=True)
class OperationRecord:
    """An operation the scenario's timeline applied to the fleet."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    at_s: Number
    op: str  # the operation's type, e.g. ``Taint``
    args: JsonObject  # its fields
    note: str

    def to_json(self) -> JsonObject:
        return {"at_s": self.at_s, "op": self.op, "args": self.args, "note": self.note}


@dataclass(frozen=True)
class NotificationRecord:
    """A notification Alertmanager's routing sent to a receiver."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    receiver: str
    alertname: str
    cell: str
    at_s: Number
    alerts: int  # alerts firing in the group
    resolved: int  # alerts resolved in the group
    group_key: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {
            "receiver": self.receiver,
            "alertname": self.alertname,
            "cell": self.cell,
            "at_s": self.at_s,
            "alerts": self.alerts,
            "resolved": self.resolved,
            "group_key": list(self.group_key),
        }


@dataclass(frozen=True)
class AlertRecord:
    """An alert changing state at an evaluation."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    at_s: Number
    alertname: str
    state: str  # firing | resolved
    labels: dict[str, str]
    value: Number | None

    def to_json(self) -> JsonObject:
        return {
            "at_s": self.at_s,
            "alertname": self.alertname,
            "state": self.state,
            "labels": dict(self.labels),
            "value": self.value,
        }


@dataclass(frozen=True)
class Remediation:
    """What the GPU remediation controller did, refused and paged about."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    dry_run: bool
    actions: tuple[JsonObject, ...]
    blocked: tuple[JsonObject, ...]
    pages: tuple[JsonObject, ...]
    paused_cells: dict[str, str]  # cell -> the floor that paused it
    quarantine_actions_total: dict[str, Number]  # per node
    chains: tuple[JsonObject, ...]  # from each fault to its remediation, stage by stage

    def to_json(self) -> JsonObject:
        return {
            "dry_run": self.dry_run,
            "actions": list(self.actions),
            "blocked": list(self.blocked),
            "pages": list(self.pages),
            "paused_cells": dict(self.paused_cells),
            "quarantine_actions_total": dict(self.quarantine_actions_total),
            "chains": list(self.chains),
        }


@dataclass(frozen=True)
class ChangeRecord:
    """A change to the fleet (a rollout, a config, a policy), as the suspects ranking saw it."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    at_s: Number
    stream: str
    subject: str
    cell: str
    region: str
    before: str
    after: str
    detail: str

    def to_json(self) -> JsonObject:
        return {
            "at_s": self.at_s,
            "stream": self.stream,
            "subject": self.subject,
            "cell": self.cell,
            "region": self.region,
            "before": self.before,
            "after": self.after,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Expectation:
    """One of the scenario's expectations, checked."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    check: str
    expected: str
    observed: str
    passed: bool

    def to_json(self) -> JsonObject:
        return {
            "check": self.check,
            "expected": self.expected,
            "observed": self.observed,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class RespondReport:
    """A scenario's run: what happened, what was notified and done, the incidents, the checks."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    scenario: str
    seed: int
    spec_sha256: str
    sim_seconds: Number
    timeline: tuple[OperationRecord, ...]
    notifications: tuple[NotificationRecord, ...]
    alerts: tuple[AlertRecord, ...]
    remediation: Remediation
    training: JsonObject  # per training job set: the hang runbook's record
    incidents: tuple[JsonObject, ...]  # the incident records (``firedrill.scenario.command``)
    changes: tuple[ChangeRecord, ...]
    expectations: tuple[Expectation, ...]
    passed: bool
    # seconds of history the burn-rate alerts saw at the first event, the steady state backfilled
    # back past the longest window (0: an event in the first step; None: not recorded)
    alert_history_s: Number | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RespondReport:
        """Validate a report in its JSON form; ``ReportError`` names the bad field."""
        try:
            return _ADAPTER.validate_python(dict(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ReportError(f"respond report {where}: {first['msg']}") from exc

    def to_json(self) -> JsonObject:
        """The report as the JSON contract."""
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "spec_sha256": self.spec_sha256,
            "sim_seconds": self.sim_seconds,
            "timeline": [t.to_json() for t in self.timeline],
            "notifications": [n.to_json() for n in self.notifications],
            "alerts": [a.to_json() for a in self.alerts],
            "remediation": self.remediation.to_json(),
            "training": self.training,
            "alert_history_s": self.alert_history_s,
            "incidents": list(self.incidents),
            "changes": [c.to_json() for c in self.changes],
            "expectations": [e.to_json() for e in self.expectations],
            "passed": self.passed,
        }

    def dumps(self) -> str:
        """The report's text as ``respond --json`` writes it (keys sorted)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


def plain(data: Mapping[str, object]) -> JsonObject:
    """A report as built by the run, in its JSON form: what is not JSON (an enum, a date) is
    written as its text, as ``respond --json`` always wrote it."""
    out: JsonObject = json.loads(json.dumps(data, sort_keys=True, default=str))
    return out


_ADAPTER: TypeAdapter[RespondReport] = TypeAdapter(RespondReport)


def respond_report_schema() -> dict[str, object]:
    """The JSON Schema of the respond report, with its version."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"firedrill:respond-report:v{RESPOND_REPORT_SCHEMA_VERSION}",
        "version": RESPOND_REPORT_SCHEMA_VERSION,
        **_ADAPTER.json_schema(mode="serialization"),
    }
