"""The scenario spec: a fleet, a seed, a duration, a timeline of operations, and expectations.

A timeline entry names an operation by its type (``InjectDcgmField``, ``SetNodeVersion``,
``Partition`` ...) with its fields as ``args``; ``cell: NAME`` (with an optional ``share``)
expands a node operation over the nodes of a cell, so "upgrade the DCGM exporter on every node
of use1-a" is one line. Expectations are typed checks on the run's outcome; the run exits 1 when
one fails.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from firedrill.detect.slo import duration_s
from firedrill.model import bounds
from firedrill.model import operations as ops
from firedrill.model.spec import NAME_RE
from firedrill.model.wire import WireError, from_wire
from firedrill.respond.responder import ResponderPolicy
from firedrill.respond.severity import SevMatrix, refuse_price
from firedrill.scenario.incident_check import IncidentCheck
from firedrill.scenario.security_check import SecurityCheck
from firedrill.scenario.series_check import SeriesCheck

OPERATIONS: dict[str, type[Any]] = {
    name: cls
    for name, cls in vars(ops).items()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and name not in ("Applied",)
}


_EXPANDED_NODE = "node-of-the-cell"  # stands in for each node a 'cell' entry expands to


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimelineEntry(_Strict):
    at: Annotated[str, Field(pattern=r"^[0-9]{1,9}(ms|s|m|h|d)$")]
    op: str
    args: dict[str, Any] = {}
    cell: str | None = None  # expand a node operation over this cell's nodes
    pool: str | None = None  # ... restricted to one node pool
    share: Annotated[float, Field(gt=0, le=1)] = 1.0  # ... the first share of them
    note: str = ""

    @field_validator("op")
    @classmethod
    def _known_op(cls, v: str) -> str:
        if v not in OPERATIONS:
            raise ValueError(f"unknown operation '{v}' (known: {', '.join(sorted(OPERATIONS))})")
        return v

    @model_validator(mode="after")
    def _args_fit(self, info: ValidationInfo) -> TimelineEntry:
        fields = {f.name for f in dataclasses.fields(OPERATIONS[self.op])}
        unknown = set(self.args) - fields
        if unknown:
            raise ValueError(
                f"{self.op} has no field(s) {sorted(unknown)} (fields: {sorted(fields)})"
            )
        if self.cell is not None and "node" not in fields:
            raise ValueError(f"'cell' expands node operations only; {self.op} has no 'node'")
        # A spec read from a file (``specfile`` passes a context) is typed and bounded now, so a
        # wrong type or a NaN is refused at load, not mid-run; an entry built in code to label an
        # operation it already holds (a drill's chain report) has no args to check.
        if info.context is not None:
            self.operation(node=_EXPANDED_NODE if self.cell is not None else None)
        return self

    def operation(self, node: str | None = None) -> ops.Operation:
        """The typed operation (``node`` fills in a node of a cell-expanded entry).

        ``ValueError`` naming the argument when ``args`` do not fit the operation's fields
        (type, presence) or its bounds (finite, in range: ``firedrill.model.bounds``).
        """
        args = dict(self.args) if node is None else {**self.args, "node": node}
        try:
            op: ops.Operation = from_wire(OPERATIONS[self.op], args, self.op)
        except WireError as exc:
            raise ValueError(f"args: {exc}") from None
        found = bounds.problems(op)
        if found:
            raise ValueError(f"args: {'; '.join(found)}")
        return op

    @property
    def at_s(self) -> float:
        return duration_s(self.at)


class NotificationCheck(_Strict):
    check: Literal["notifications"]
    receiver: Literal["page", "ticket", "security"]
    alertname: str | None = None
    min: int = 0
    max: int | None = None


class AlertCheck(_Strict):
    check: Literal["alert_fired"]
    alertname: str
    within_s: float | None = None  # of the first timeline entry
    fired: bool = True


class ActionCheck(_Strict):
    check: Literal["actions"]
    action: str
    reason: str | None = None
    min: int = 0
    max: int | None = None


class BlockedCheck(_Strict):
    check: Literal["blocked"]
    budget: str | None = None
    min: int = 0
    max: int | None = None


class ChainCheck(_Strict):
    check: Literal["chain"]
    broken_at: str | None = None  # None: the chain completed
    reached: str | None = None  # a stage that must have been reached


class ChangeCheck(_Strict):
    check: Literal["change_visible"]
    stream: str
    cell: str


class QuarantineCounterCheck(_Strict):
    check: Literal["quarantine_counter"]
    cell: str
    value: int


class TrainingCheck(_Strict):
    check: Literal["training"]
    jobset: str
    rank_named: bool = True
    suspended: bool = True
    resumed_elsewhere: bool = True


Check = Annotated[
    NotificationCheck
    | AlertCheck
    | ActionCheck
    | BlockedCheck
    | ChainCheck
    | ChangeCheck
    | QuarantineCounterCheck
    | TrainingCheck
    | IncidentCheck
    | SecurityCheck
    | SeriesCheck,
    Field(discriminator="check"),
]


class ScenarioSpec(_Strict):
    name: Annotated[str, Field(pattern=NAME_RE)]
    description: str = ""
    fleet: str  # path, relative to the scenario file
    slo: str  # path, relative to the scenario file
    policy: str | None = None  # path; None: the default policy
    policy_overrides: dict[str, Any] = {}
    fleet_overrides: dict[str, Any] = {}
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    duration: Annotated[str, Field(pattern=r"^[0-9]{1,9}(s|m|h|d)$")]
    timeline: list[TimelineEntry] = []
    expect: list[Check] = []
    training_runbook: bool = True  # run the hang runbook on stalled JobSets
    responder: ResponderPolicy | None = None  # None: incident command only reports (advise)
    # Severity thresholds (default: respond/severity.py's table); the GPU-hour price is the fleet's.
    severity: SevMatrix | None = None

    @field_validator("severity", mode="before")
    @classmethod
    def _severity_price_is_the_fleets(cls, data: object) -> object:
        return refuse_price(data)

    @property
    def duration_s(self) -> float:
        return duration_s(self.duration)

    @model_validator(mode="after")
    def _timeline_within_duration(self) -> ScenarioSpec:
        for e in self.timeline:
            if e.at_s > self.duration_s:
                raise ValueError(f"timeline entry at {e.at} is after the end ({self.duration})")
        return self


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
