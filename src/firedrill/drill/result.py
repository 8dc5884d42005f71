"""The drill report as typed values: what ``gameday run --json`` writes and the store keeps.

A game day's report is a contract: CI parses it, the store keeps it, the Markdown and HTML
renderers read it, and a person diffs two of them. These frozen dataclasses are that contract,
field by field and in the order the JSON writes them (the names are the JSON's, so existing
consumers keep working). ``DrillReport.from_json`` validates a report (the run's, or one read
back from a file or the store) and ``to_json`` writes it back key for key and number for number:
an integer stays an integer, so a report read and written again is byte-identical.

Parts whose shape belongs to another module (the spec's target, hydrate statistics, failback,
hidden dependencies, causal chains) are carried as JSON values; the schema says so.

``DRILL_REPORT_SCHEMA_VERSION`` is the version of this shape; ``firedrill schema drill-report``
prints the JSON Schema. A new optional field keeps the version; a renamed or removed one bumps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pydantic import ConfigDict, TypeAdapter, ValidationError

from firedrill.errors import FiredrillError
from firedrill.model.jsontypes import JsonObject, JsonValue

__all__ = [
    "DRILL_REPORT_SCHEMA_VERSION",
    "Admission",
    "Charts",
    "Clause",
    "DrillReport",
    "Finding",
    "IncidentRecord",
    "Injected",
    "LeverRecord",
    "Marker",
    "ReportError",
    "Reverted",
    "RevertedInjection",
    "Rto",
    "RtoTimes",
    "SecurityCheck",
    "StopConditionResult",
    "StopThreshold",
    "TimelineEvent",
    "drill_report_schema",
]

DRILL_REPORT_SCHEMA_VERSION = 1

# A JSON number as the run wrote it: an int stays an int (``0``, not ``0.0``), a float a float.
Number: TypeAlias = int | float
Point: TypeAlias = tuple[Number, Number | None]  # (t_s, value); None is a gap in the series
Curve: TypeAlias = tuple[Point, ...]


# A field the type does not know is refused, never dropped: the report is written back from the
# type, so a field added to the run but not here would silently vanish from the JSON.
_FIELDS_AS_WRITTEN = ConfigDict(extra="forbid")


class ReportError(FiredrillError):
    """A drill report that does not have the shape of the contract (the path of the field)."""


@dataclass(frozen=True)
class Clause:
    """One hypothesis clause, judged: what was expected and what was observed."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    clause: str
    metric: str
    region: str | None
    op: str
    value: Number
    expected: str
    observed: bool | Number | None  # None: not measured
    passed: bool

    def to_json(self) -> JsonObject:
        return {
            "clause": self.clause,
            "metric": self.metric,
            "region": self.region,
            "op": self.op,
            "value": self.value,
            "expected": self.expected,
            "observed": self.observed,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class RtoTimes:
    """When each RTO mark was reached, in simulated seconds (None: never)."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    t0_s: Number | None
    page_s: Number | None
    first_lever_s: Number | None
    last_shift_s: Number | None
    scale_out_s: Number | None
    hydrated_s: Number | None
    users_served_s: Number | None

    def to_json(self) -> JsonObject:
        return {
            "t0_s": self.t0_s,
            "page_s": self.page_s,
            "first_lever_s": self.first_lever_s,
            "last_shift_s": self.last_shift_s,
            "scale_out_s": self.scale_out_s,
            "hydrated_s": self.hydrated_s,
            "users_served_s": self.users_served_s,
        }


@dataclass(frozen=True)
class Rto:
    """The measured RTO, its terms against the plan, and the marks they come from."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    budget_s: Number | None
    measured_s: Number | None
    within_budget: bool | None  # None: no budget
    terms: Mapping[str, Number | None]  # detect_s, decide_s, shift_s, hydrate_s, time_to_slo_s
    planned: Mapping[str, Number]  # the same terms as planned (empty without a plan)
    posture_problem: bool  # the hydrate term alone exceeds the budget
    marks: RtoTimes

    def to_json(self) -> JsonObject:
        return {
            "budget_s": self.budget_s,
            "measured_s": self.measured_s,
            "within_budget": self.within_budget,
            "terms": dict(self.terms),
            "planned": dict(self.planned),
            "posture_problem": self.posture_problem,
            "marks": self.marks.to_json(),
        }


@dataclass(frozen=True)
class StopConditionResult:
    """A stop condition: its threshold, whether and when it fired, its last value."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    name: str
    kind: str
    threshold: Number | None
    fired: bool
    at_s: Number | None
    value: bool | Number | None

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "kind": self.kind,
            "threshold": self.threshold,
            "fired": self.fired,
            "at_s": self.at_s,
            "value": self.value,
        }


@dataclass(frozen=True)
class RevertedInjection:
    """One injected operation and its reversal."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    label: str
    kind: str
    applied_at_s: Number
    reverted_at_s: Number | None
    inverse: tuple[str, ...]
    ok: bool

    def to_json(self) -> JsonObject:
        return {
            "label": self.label,
            "kind": self.kind,
            "applied_at_s": self.applied_at_s,
            "reverted_at_s": self.reverted_at_s,
            "inverse": list(self.inverse),
            "ok": self.ok,
        }


@dataclass(frozen=True)
class Reverted:
    """Whether every injection and lever was reverted, and each reversal."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    all: bool
    injections: tuple[RevertedInjection, ...]

    def to_json(self) -> JsonObject:
        return {"all": self.all, "injections": [r.to_json() for r in self.injections]}


@dataclass(frozen=True)
class Injected:
    """An injection that started: when, and how many operations it applied."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    index: int
    label: str
    at_s: Number
    operations: int | None = None  # absent for a stepped cell drain

    def to_json(self) -> JsonObject:
        out: JsonObject = {"index": self.index, "label": self.label, "at_s": self.at_s}
        if self.operations is not None:
            out["operations"] = self.operations
        return out


@dataclass(frozen=True)
class SecurityCheck:
    """One check of the security floor."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    check: str
    passed: bool | None  # None: not exercised
    detail: str
    status: Literal["passed", "failed", "not_exercised"] | None = None  # None: older reports
    hint: str | None = None  # how the drill could exercise a check it did not

    def to_json(self) -> JsonObject:
        out: JsonObject = {"check": self.check}
        if self.status is not None:
            out["status"] = self.status
        out["passed"] = self.passed
        out["detail"] = self.detail
        if self.hint is not None:
            out["hint"] = self.hint
        return out


@dataclass(frozen=True)
class Admission:
    """Admission decisions during the run."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    admitted: int
    denied: int
    unsigned_admitted: int | None  # None: the world cannot tell

    def to_json(self) -> JsonObject:
        return {
            "admitted": self.admitted,
            "denied": self.denied,
            "unsigned_admitted": self.unsigned_admitted,
        }


@dataclass(frozen=True)
class Finding:
    """A gap the drill found, with its owner."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    kind: str
    text: str
    owner: str | None
    key: str | None = None  # names the gap whatever the run's numbers (one action item per key)
    detail: JsonObject | None = None  # what landing the finding as an artefact needs

    def to_json(self) -> JsonObject:
        out: JsonObject = {"kind": self.kind, "text": self.text, "owner": self.owner}
        if self.key is not None:
            out["key"] = self.key
        if self.detail is not None:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True)
class LeverRecord:
    """A lever the drill's response pulled (or was refused)."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    kind: str
    target: str
    scope: str
    status: str
    reason: str
    at_s: Number | None
    approvers: tuple[str, ...]
    ops: tuple[str, ...]
    inverses: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {
            "kind": self.kind,
            "target": self.target,
            "scope": self.scope,
            "status": self.status,
            "reason": self.reason,
            "at_s": self.at_s,
            "approvers": list(self.approvers),
            "ops": list(self.ops),
            "inverses": list(self.inverses),
        }


@dataclass(frozen=True)
class IncidentRecord:
    """An incident the drill's alerts opened."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    id: str
    cell: str
    region: str
    opened_at_s: Number
    sev: str
    title: str

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "cell": self.cell,
            "region": self.region,
            "opened_at_s": self.opened_at_s,
            "sev": self.sev,
            "title": self.title,
        }


@dataclass(frozen=True)
class TimelineEvent:
    """One line of the drill's timeline; ``extra`` holds its kind's own fields (``operations``,
    ``receiver``, ``status``), written after ``text``."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    at_s: Number | None
    kind: str
    text: str
    extra: Mapping[str, JsonValue] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {"at_s": self.at_s, "kind": self.kind, "text": self.text, **self.extra}


@dataclass(frozen=True)
class Marker:
    """A vertical marker on the charts (injection, shift, stop, failback, revert)."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    at_s: Number
    label: str
    kind: str

    def to_json(self) -> JsonObject:
        return {"at_s": self.at_s, "label": self.label, "kind": self.kind}


@dataclass(frozen=True)
class StopThreshold:
    """A stop condition's threshold drawn on one chart."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    name: str
    value: Number
    chart: str

    def to_json(self) -> JsonObject:
        return {"name": self.name, "value": self.value, "chart": self.chart}


def _curves(by_region: Mapping[str, Curve]) -> JsonObject:
    return {region: [list(p) for p in curve] for region, curve in by_region.items()}


@dataclass(frozen=True)
class Charts:
    """The chart series per region (one point per evaluation step) and what is drawn on them."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    ttft_p99: Mapping[str, Curve] | None = None  # seconds
    kv_usage: Mapping[str, Curve] | None = None  # share 0..1
    hydrate_gbps: Mapping[str, Curve] | None = None  # GB/s per node
    ready_replicas: Mapping[str, Curve] | None = None  # count
    markers: tuple[Marker, ...] = ()
    slo_ttft_s: Number | None = None
    kv_limit: Number | None = None  # absent without a kv_usage_max clause
    survivor: tuple[str, ...] = ()
    stop_thresholds: tuple[StopThreshold, ...] = ()

    def to_json(self) -> JsonObject:
        out: JsonObject = {}
        for key, series in (
            ("ttft_p99", self.ttft_p99),
            ("kv_usage", self.kv_usage),
            ("hydrate_gbps", self.hydrate_gbps),
            ("ready_replicas", self.ready_replicas),
        ):
            if series is not None:
                out[key] = _curves(series)
        out["markers"] = [m.to_json() for m in self.markers]
        out["slo_ttft_s"] = self.slo_ttft_s
        if self.kv_limit is not None:
            out["kv_limit"] = self.kv_limit
        out["survivor"] = list(self.survivor)
        out["stop_thresholds"] = [s.to_json() for s in self.stop_thresholds]
        return out


@dataclass(frozen=True)
class DrillReport:
    """A game day's result: verdict, hypothesis, RTO, stops, reversals, findings, timeline."""

    __pydantic_config__ = _FIELDS_AS_WRITTEN

    drill: str
    rung: str
    seed: int
    spec_sha256: str
    verdict: str  # passed | failed | aborted
    reason: str
    run_by: str | None
    runbook_author: str | None
    abort_owner: str | None
    target: JsonObject  # the drill spec's target, as written
    survivor: tuple[str, ...]
    t0_s: Number | None
    steady_state_s: Number | None
    end_s: Number | None
    hypothesis: tuple[Clause, ...]
    rto: Rto
    stop_conditions: tuple[StopConditionResult, ...]
    reverted: Reverted
    injected: tuple[Injected, ...]
    security_floor: tuple[SecurityCheck, ...]
    admission: Admission
    hydrate: JsonObject  # the first watched region's hydrate statistics ({} when none)
    hydrate_by_region: dict[str, JsonObject]
    failback: JsonObject  # drill.recovery's failback record ({"steps": []} when none)
    dependencies: tuple[JsonObject, ...]  # hidden dependencies a cut exposed
    findings: tuple[Finding, ...]
    chains: tuple[JsonObject, ...]  # causal chains from each injection
    levers: tuple[LeverRecord, ...]
    incidents: tuple[IncidentRecord, ...]
    refused: tuple[str, ...]
    timeline: tuple[TimelineEvent, ...]
    charts: Charts
    spec_path: str | None = None  # the drill file, when run from one
    # seconds of history the burn-rate alerts had when the first fault came (the backfill);
    # None in reports written before it was recorded
    alert_history_s: Number | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DrillReport:
        """Validate a report (a run's, or one read back); ``ReportError`` names the bad field."""
        raw = dict(data)
        timeline = raw.get("timeline")
        if isinstance(timeline, list | tuple):  # anything else: the validator names it
            raw["timeline"] = [_timeline_in(e) for e in timeline]
        try:
            return _ADAPTER.validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ReportError(f"drill report {where}: {first['msg']}") from exc

    def to_json(self) -> JsonObject:
        """The report as the JSON contract, key for key in the order the run writes it."""
        out: JsonObject = {
            "drill": self.drill,
            "rung": self.rung,
            "seed": self.seed,
            "spec_sha256": self.spec_sha256,
            "verdict": self.verdict,
            "reason": self.reason,
            "run_by": self.run_by,
            "runbook_author": self.runbook_author,
            "abort_owner": self.abort_owner,
            "target": self.target,
            "survivor": list(self.survivor),
            "t0_s": self.t0_s,
            "steady_state_s": self.steady_state_s,
            "alert_history_s": self.alert_history_s,
            "end_s": self.end_s,
            "hypothesis": [c.to_json() for c in self.hypothesis],
            "rto": self.rto.to_json(),
            "stop_conditions": [s.to_json() for s in self.stop_conditions],
            "reverted": self.reverted.to_json(),
            "injected": [i.to_json() for i in self.injected],
            "security_floor": [c.to_json() for c in self.security_floor],
            "admission": self.admission.to_json(),
            "hydrate": self.hydrate,
            "hydrate_by_region": dict(self.hydrate_by_region),
            "failback": self.failback,
            "dependencies": list(self.dependencies),
            "findings": [f.to_json() for f in self.findings],
            "chains": list(self.chains),
            "levers": [lv.to_json() for lv in self.levers],
            "incidents": [i.to_json() for i in self.incidents],
            "refused": list(self.refused),
            "timeline": [e.to_json() for e in self.timeline],
            "charts": self.charts.to_json(),
        }
        if self.spec_path is not None:
            out["spec_path"] = self.spec_path
        return out


_TIMELINE_KEYS = ("at_s", "kind", "text")


def _timeline_in(event: object) -> object:
    """A timeline event as written (its own fields flat) to ``TimelineEvent``'s shape."""
    if not isinstance(event, Mapping):
        return event
    extra = {k: v for k, v in event.items() if k not in _TIMELINE_KEYS}
    return {**{k: event[k] for k in _TIMELINE_KEYS if k in event}, "extra": extra}


_ADAPTER: TypeAdapter[DrillReport] = TypeAdapter(DrillReport)


def drill_report_schema() -> dict[str, object]:
    """The JSON Schema of the drill report, with its version."""
    schema = _ADAPTER.json_schema(mode="serialization")
    timeline = schema["$defs"]["TimelineEvent"]  # its extra fields are written flat
    timeline["properties"].pop("extra", None)
    timeline["additionalProperties"] = True
    timeline["description"] = (
        "One line of the drill's timeline; an event kind may add its own fields after 'text' "
        "(operations, receiver, status)."
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"firedrill:drill-report:v{DRILL_REPORT_SCHEMA_VERSION}",
        "version": DRILL_REPORT_SCHEMA_VERSION,
        **schema,
    }
