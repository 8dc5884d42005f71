"""A ``firedrill respond`` report, read and checked before anything of it is stored.

``read_report`` takes the report's JSON (as a dict) and returns typed, frozen values with the
parts the store keeps: per incident its severity history, the incident book's events, levers
(with operations and inverses), comms updates, break-glass grants and postmortem facts. Every
check the store would make later is made here first, and a bad report is refused with the path of
the bad field (``report incidents[0].levers[1].inverse: ...``), so ``persist_report`` never
writes half a run. The run's identity is the SHA-256 of the report's canonical JSON.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast

from firedrill.errors import StoreError
from firedrill.model.identity import same_person
from firedrill.store import validate
from firedrill.store.models import ActionKind, JsonObject, LeverStatus

UNASSIGNED: Final = "unassigned"  # owner of an action item the report names no owner for
UNKNOWN_REGION: Final = "unknown"
SEVS: Final = {"SEV1": 1, "SEV2": 2, "SEV3": 3, "SEV4": 4}


@dataclass(frozen=True)
class ReportLever:
    """A lever of the report: proposed, applied (with its inverse) or refused."""

    kind: str
    scope: str
    status: LeverStatus
    at_s: float
    reason: str
    approvers: tuple[str, ...]
    operations: tuple[JsonObject, ...]
    inverse: tuple[JsonObject, ...] | None  # in undo order; required when applied
    undone_at_s: float | None = None  # verification failed and the inverse was applied
    undo: str = ""


@dataclass(frozen=True)
class ReportSevChange:
    """One entry of an incident's severity history (``applied`` False: a lower rating kept out)."""

    at_s: float
    sev: int | None  # None: below SEV4
    axis: str
    reason: str
    applied: bool


@dataclass(frozen=True)
class ReportEvent:
    """An event of the incident book's timeline (opened, alert joined, ...)."""

    at_s: float
    kind: str
    text: str
    data: JsonObject


@dataclass(frozen=True)
class ReportActionItem:
    kind: ActionKind
    text: str
    owner: str


@dataclass(frozen=True)
class ReportUpdate:
    """A comms update: the status page text (product x region) and the incident channel's."""

    at_s: float
    due_s: float | None
    first: bool
    status_page: str  # "" when none was posted (or it was refused)
    channel: str
    late_s: float


@dataclass(frozen=True)
class ReportBrokerEvent:
    """One record of the break-glass broker's journal: request, approve, grant, use, reap."""

    at_s: float
    event: str
    actor: str
    detail: str


@dataclass(frozen=True)
class ReportGrant:
    """A break-glass grant the incident's levers were applied under."""

    grant: str
    identity: str
    scope: str
    requested_by: str
    approvers: tuple[str, ...]
    granted_at_s: float
    expires_at_s: float
    events: tuple[ReportBrokerEvent, ...]

    @property
    def reaped_at_s(self) -> float | None:
        return next((e.at_s for e in self.events if e.event == "reap"), None)


@dataclass(frozen=True)
class ReportIncident:
    """One element of the report's ``incidents[]``."""

    id: str
    kind: str
    cell: str
    region: str
    title: str
    sev: int
    alerts: int
    opened_at_s: float
    mitigated_at_s: float | None
    resolved_at_s: float | None
    sev_history: tuple[ReportSevChange, ...]
    events: tuple[ReportEvent, ...]
    levers: tuple[ReportLever, ...]
    assessment: JsonObject  # axes, deciding axis, suspects, recommendation: shown as recorded
    ttd_s: float
    gpu_hours_lost: float
    requests_failed: int
    tokens_refunded: int
    action_items: tuple[ReportActionItem, ...]
    updates: tuple[ReportUpdate, ...] = ()
    grants: tuple[ReportGrant, ...] = ()

    @property
    def opening_sev(self) -> int:
        """The severity it opened at: the first applied rating (its floor when there is none)."""
        return next((h.sev for h in self.sev_history if h.applied and h.sev), self.sev)

    @property
    def root_cause_class(self) -> str:
        """The stream of the top suspect that changed before onset, else ``undetermined``."""
        suspects = self.assessment.get("suspects")
        if isinstance(suspects, list) and suspects and isinstance(suspects[0], dict):
            stream = suspects[0].get("stream")
            if isinstance(stream, str) and stream.strip():
                return stream
        return "undetermined"


@dataclass(frozen=True)
class RespondReport:
    """The parts of a respond report the store keeps."""

    scenario: str
    seed: int
    spec_sha256: str
    sim_seconds: float
    digest: str  # SHA-256 of the report's canonical JSON: the run's identity
    incidents: tuple[ReportIncident, ...]


def _where(path: str) -> str:
    return f"report {path}" if path else "report"


def _obj(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise StoreError(f"{_where(path)}: expected an object, got {type(value).__name__}")
    return cast(Mapping[str, object], value)


def _get(m: Mapping[str, object], key: str, path: str) -> object:
    if key not in m:
        raise StoreError(f"{_where(path)}: missing field '{key}'")
    return m[key]


def _str(m: Mapping[str, object], key: str, path: str, *, empty: bool = False) -> str:
    value = _get(m, key, path)
    if not isinstance(value, str) or (not empty and not value.strip()):
        what = "a string" if empty else "a non-empty string"
        raise StoreError(f"{_where(f'{path}.{key}')}: expected {what}, got {value!r}")
    return value


def _num(m: Mapping[str, object], key: str, path: str) -> float:
    value = _get(m, key, path)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StoreError(f"{_where(f'{path}.{key}')}: expected a finite number, got {value!r}")
    return float(value)


def _opt_num(m: Mapping[str, object], key: str, path: str) -> float | None:
    return None if m.get(key) is None else _num(m, key, path)


def _count(m: Mapping[str, object], key: str, path: str, default: int | None = None) -> int:
    if default is not None and m.get(key) is None:
        return default
    value = _get(m, key, path)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StoreError(f"{_where(f'{path}.{key}')}: expected an integer >= 0, got {value!r}")
    return value


def _list(m: Mapping[str, object], key: str, path: str) -> list[object]:
    value = _get(m, key, path)
    if not isinstance(value, list):
        raise StoreError(f"{_where(f'{path}.{key}')}: expected a list, got {type(value).__name__}")
    return value


def _json(value: object, path: str) -> JsonObject:
    try:
        return validate.json_object(value, "x")
    except StoreError as exc:
        raise StoreError(f"{_where(path)}: expected a JSON object, got {value!r}") from exc


def _sev(value: object, path: str, *, none_ok: bool = False) -> int | None:
    if none_ok and value == "none":
        return None
    if not isinstance(value, str) or value not in SEVS:
        allowed = ", ".join(SEVS) + (", none" if none_ok else "")
        raise StoreError(f"{_where(path)}: expected one of {allowed}, got {value!r}")
    return SEVS[value]


def _lever(value: object, path: str) -> ReportLever:
    m = _obj(value, path)
    status_text = _str(m, "status", path)
    try:
        status = LeverStatus(status_text)
    except ValueError:
        allowed = ", ".join(s.value for s in LeverStatus)
        raise StoreError(
            f"{_where(f'{path}.status')}: expected one of {allowed}, got {status_text!r}"
        ) from None
    approvers = _list(m, "approvers", path) if "approvers" in m else []
    if not all(isinstance(a, str) and a.strip() for a in approvers):
        raise StoreError(f"{_where(f'{path}.approvers')}: expected names, got {approvers!r}")
    inverse: tuple[JsonObject, ...] | None = None
    if m.get("inverse") is not None:
        inverse = tuple(
            _json(op, f"{path}.inverse[{i}]") for i, op in enumerate(_list(m, "inverse", path))
        )
    if status is LeverStatus.applied and inverse is None:
        raise StoreError(
            f"{_where(f'{path}.inverse')}: an applied lever needs its inverse, recorded before "
            "it was applied (every lever is reversible)"
        )
    operations = (
        tuple(
            _json(op, f"{path}.operations[{i}]")
            for i, op in enumerate(_list(m, "operations", path))
        )
        if m.get("operations") is not None
        else ()
    )
    reason = _str(m, "reason", path, empty=True)
    if status is LeverStatus.refused and not reason.strip():
        raise StoreError(f"{_where(f'{path}.reason')}: a refused lever needs its reason")
    undo = m.get("undo")
    return ReportLever(
        kind=_str(m, "kind", path),
        scope=_str(m, "scope", path),
        status=status,
        at_s=_num(m, "at_s", path),
        reason=reason,
        approvers=tuple(cast(list[str], approvers)),
        operations=operations,
        inverse=inverse,
        undone_at_s=_opt_num(m, "undone_at_s", path),
        undo=_text_of(undo.get("reason") if isinstance(undo, Mapping) else undo),
    )


def _text_of(value: object) -> str:
    return "" if value is None else str(value)


def _update(value: object, path: str) -> ReportUpdate:
    m = _obj(value, path)
    page = m.get("status_page")
    page_text = ""
    if page is not None:
        pm = _obj(page, f"{path}.status_page")
        page_text = _str(pm, "text", f"{path}.status_page")
    return ReportUpdate(
        at_s=_num(m, "at_s", path),
        due_s=_opt_num(m, "due_s", path),
        first=bool(m.get("first", False)),
        status_page=page_text,
        channel=_str(m, "channel", path, empty=True),
        late_s=_opt_num(m, "late_s", path) or 0.0,
    )


def _grant(value: object, path: str) -> ReportGrant:
    m = _obj(value, path)
    events = tuple(
        _broker_event(e, f"{path}.audit[{i}]")
        for i, e in enumerate(_list(m, "audit", path) if "audit" in m else [])
    )
    approvers = _list(m, "approvers", path)
    if not approvers or not all(isinstance(a, str) and a.strip() for a in approvers):
        raise StoreError(
            f"{_where(f'{path}.approvers')}: a break-glass grant needs its approvers' names, "
            f"got {approvers!r}"
        )
    requested_by = next((e.actor for e in events if e.event == "request"), "")
    if not requested_by:
        raise StoreError(f"{_where(f'{path}.audit')}: the grant's request (who asked) is missing")
    if any(same_person(requested_by, cast(str, a)) for a in approvers):
        raise StoreError(
            f"{_where(f'{path}.approvers')}: {requested_by} approved their own break-glass request"
        )
    grant = ReportGrant(
        grant=_str(m, "grant", path),
        identity=_str(m, "identity", path),
        scope=_str(m, "scope", path),
        requested_by=requested_by,
        approvers=tuple(cast(list[str], approvers)),
        granted_at_s=_num(m, "granted_at_s", path),
        expires_at_s=_num(m, "expires_at_s", path),
        events=events,
    )
    if grant.expires_at_s <= grant.granted_at_s:
        raise StoreError(f"{_where(f'{path}.expires_at_s')}: expires before it was granted")
    return grant


def _broker_event(value: object, path: str) -> ReportBrokerEvent:
    m = _obj(value, path)
    return ReportBrokerEvent(
        at_s=_num(m, "at_s", path),
        event=_str(m, "event", path),
        actor=_str(m, "actor", path),
        detail=_str(m, "detail", path, empty=True),
    )


def _sev_change(value: object, path: str) -> ReportSevChange:
    m = _obj(value, path)
    applied = m.get("applied", True)
    if not isinstance(applied, bool):
        raise StoreError(f"{_where(f'{path}.applied')}: expected true or false, got {applied!r}")
    return ReportSevChange(
        at_s=_num(m, "at_s", path),
        sev=_sev(_get(m, "sev", path), f"{path}.sev", none_ok=True),
        axis=_str(m, "axis", path, empty=True) or "none",
        reason=_str(m, "reason", path, empty=True),
        applied=applied,
    )


def _event(value: object, path: str) -> ReportEvent:
    m = _obj(value, path)
    return ReportEvent(
        at_s=_num(m, "at_s", path),
        kind=_str(m, "kind", path),
        text=_str(m, "text", path),
        data=_json(m.get("data", {}), f"{path}.data"),
    )


def _action_item(value: object, path: str) -> ReportActionItem:
    m = _obj(value, path)
    kind = _str(m, "kind", path)
    if kind not in ActionKind.__members__:
        allowed = ", ".join(k.value for k in ActionKind)
        raise StoreError(f"{_where(f'{path}.kind')}: expected one of {allowed}, got {kind!r}")
    owner = m.get("owner") or UNASSIGNED
    if not isinstance(owner, str):
        raise StoreError(f"{_where(f'{path}.owner')}: expected a name, got {owner!r}")
    return ReportActionItem(ActionKind(kind), _str(m, "text", path), owner)


def _incident(value: object, path: str) -> ReportIncident:
    m = _obj(value, path)
    pm_path = f"{path}.postmortem"
    pm = _obj(_get(m, "postmortem", path), pm_path)
    sev = _sev(_get(m, "sev", path), f"{path}.sev")
    assert sev is not None  # none_ok is False
    assessment: dict[str, object] = {
        "kind": _str(m, "kind", path),
        "axes": _json(m.get("axes", {}), f"{path}.axes"),
        "deciding_axis": m.get("deciding_axis"),
        "suspects": [
            _json(s, f"{path}.suspects[{i}]")
            for i, s in enumerate(_list(m, "suspects", path) if "suspects" in m else [])
        ],
        "recommendation": m.get("recommendation") or "",
    }
    inc = ReportIncident(
        id=_str(m, "id", path),
        kind=_str(m, "kind", path),
        cell=_str(m, "cell", path),
        region=_str(m, "region", path, empty=True) or UNKNOWN_REGION,
        title=_str(m, "title", path),
        sev=sev,
        alerts=_count(m, "alerts", path, default=0),
        opened_at_s=_num(m, "opened_at_s", path),
        mitigated_at_s=_opt_num(m, "mitigated_at_s", path),
        resolved_at_s=_opt_num(m, "resolved_at_s", path),
        sev_history=tuple(
            _sev_change(h, f"{path}.sev_history[{i}]")
            for i, h in enumerate(_list(m, "sev_history", path))
        ),
        events=tuple(
            _event(e, f"{path}.timeline[{i}]")
            for i, e in enumerate(_list(m, "timeline", path) if "timeline" in m else [])
        ),
        levers=tuple(
            _lever(lv, f"{path}.levers[{i}]") for i, lv in enumerate(_list(m, "levers", path))
        ),
        assessment=_json(assessment, path),
        ttd_s=_num(pm, "ttd_s", pm_path),
        gpu_hours_lost=_num(pm, "gpu_hours_lost", pm_path) if "gpu_hours_lost" in pm else 0.0,
        requests_failed=_count(pm, "requests_failed", pm_path, default=0),
        tokens_refunded=_count(pm, "tokens_refunded", pm_path, default=0),
        action_items=tuple(
            _action_item(a, f"{pm_path}.action_items[{i}]")
            for i, a in enumerate(_list(pm, "action_items", pm_path))
        ),
        updates=tuple(
            _update(u, f"{path}.comms.updates[{i}]")
            for i, u in enumerate(
                _list(_obj(m["comms"], f"{path}.comms"), "updates", f"{path}.comms")
                if m.get("comms") is not None
                else []
            )
        ),
        grants=tuple(
            _grant(g, f"{path}.breakglass[{i}]")
            for i, g in enumerate(_list(m, "breakglass", path) if "breakglass" in m else [])
        ),
    )
    _check_incident(inc, path)
    return inc


def _check_incident(inc: ReportIncident, path: str) -> None:
    """The checks the store would make later, made now so nothing is half written."""
    if inc.ttd_s < 0 or inc.gpu_hours_lost < 0:
        raise StoreError(f"{_where(f'{path}.postmortem')}: ttd_s and gpu_hours_lost must be >= 0")
    if inc.resolved_at_s is not None and inc.resolved_at_s < inc.opened_at_s:
        raise StoreError(f"{_where(f'{path}.resolved_at_s')}: resolved before it was opened")
    applied = [h.sev for h in inc.sev_history if h.applied and h.sev is not None]
    if any(later > earlier for earlier, later in itertools.pairwise(applied)):
        raise StoreError(
            f"{_where(f'{path}.sev_history')}: severity went down during the incident "
            "(it only goes up until the postmortem)"
        )
    if applied and applied[-1] != inc.sev:
        raise StoreError(
            f"{_where(f'{path}.sev')}: SEV{inc.sev} is not where its history ends "
            f"(SEV{applied[-1]})"
        )


def read_report(report: Mapping[str, object]) -> RespondReport:
    """Check a respond report (its JSON as a dict) and read what the store keeps of it."""
    data = _obj(report, "")
    try:
        canonical = validate.canonical_json(data)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"report is not plain JSON: {exc}") from exc
    seed = _get(data, "seed", "")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise StoreError(f"report .seed: expected an integer, got {seed!r}")
    found = tuple(
        _incident(inc, f"incidents[{i}]") for i, inc in enumerate(_list(data, "incidents", ""))
    )
    ids = [inc.id for inc in found]
    if len(set(ids)) != len(ids):
        raise StoreError(f"report incidents: an id appears twice in {ids}")
    return RespondReport(
        scenario=_str(data, "scenario", ""),
        seed=seed,
        spec_sha256=_str(data, "spec_sha256", "", empty=True),
        sim_seconds=_num(data, "sim_seconds", ""),
        digest=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        incidents=found,
    )
