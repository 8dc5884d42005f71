"""The ``incident`` expectation: what incident command made of a run, checked field by field.

One check selects incidents (by cell and kind) and asserts what the reference's self-checks ask
of them: how many there are, their severity and the axis that decided it, the top suspect's
stream (and a word of its change or evidence), the first lever and who decided it, the order of
the levers applied, the shortcuts refused with a reason, the levers never pulled, that a lever
was verified, that comms met the first-update deadline, an action item, and that no scale-out
happened in the incident's region after it opened (scale-in/out pinned during a registry
incident). Every field is optional; each one set must hold for at least one selected incident
(``count`` counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from firedrill.scenario.run import ScenarioRun


class IncidentCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    check: Literal["incident"]
    cell: str | None = None  # select the incidents of this cell ("region:<name>" for a region)
    kind: Literal["cell", "automation", "security"] | None = None
    count: int | None = None  # exactly this many incidents selected
    sev: Literal["SEV1", "SEV2", "SEV3", "SEV4"] | None = None
    deciding_axis: Literal["security", "quality", "users", "gpu_hours", "none"] | None = None
    users_affected: bool | None = None  # the users axis reached a level
    top_suspect: str | None = None  # stream of the top suspect
    top_suspect_mentions: str | None = None  # a word of its change or evidence
    first_lever: str | None = None  # kind of the first lever journalled
    first_lever_status: Literal["applied", "proposed", "refused"] | None = None
    decided_by: str | None = None  # a role among the first lever's approvers
    applied_in_order: list[str] = []  # these kinds were applied, in this order (others between)
    refused: list[str] = []  # journalled refused, each with a reason
    never: list[str] = []  # no lever of these kinds proposed or applied
    verified: bool | None = None  # some applied lever was verified by the symptom
    comms_on_time: bool | None = None  # a first update was posted and none missed its deadline
    action_item: str | None = None  # words of an action item
    no_scale_out: bool = False  # no pool of the incident's region scaled out after it opened

    def label(self) -> str:
        where = " ".join(x for x in (self.kind, self.cell) if x)
        return f"incident {where}".strip()


def _problems(c: IncidentCheck, inc: dict[str, Any], run: ScenarioRun) -> list[str]:
    bad: list[str] = []
    levers: list[dict[str, Any]] = inc["levers"]
    if c.sev is not None and inc["sev"] != c.sev:
        bad.append(f"sev {inc['sev']}")
    if c.deciding_axis is not None and (inc["deciding_axis"] or "none") != c.deciding_axis:
        bad.append(f"decided by {inc['deciding_axis'] or 'none'}")
    if c.users_affected is not None:
        users = inc["axes"].get("users", {}).get("level", "none") != "none"
        if users != c.users_affected:
            bad.append(f"users affected: {users}")
    suspects = inc["suspects"]
    top = suspects[0] if suspects else None
    if c.top_suspect is not None and (top is None or top["stream"] != c.top_suspect):
        bad.append(f"top suspect {top['stream'] if top else 'none'}")
    if c.top_suspect_mentions is not None:
        text = "" if top is None else " ".join([top["change"], *top["evidence"]])
        if c.top_suspect_mentions not in text:
            bad.append(f"top suspect does not mention {c.top_suspect_mentions!r}")
    first = levers[0] if levers else None
    if c.first_lever is not None and (first is None or first["kind"] != c.first_lever):
        bad.append(f"first lever {first['kind'] if first else 'none'}")
    if c.first_lever_status is not None and (
        first is None or first["status"] != c.first_lever_status
    ):
        bad.append(f"first lever {first['status'] if first else 'none'}")
    if c.decided_by is not None and (first is None or c.decided_by not in first.get("roles", [])):
        bad.append(f"first lever decided by {first.get('roles', []) if first else 'nobody'}")
    applied = [lv["kind"] for lv in levers if lv["status"] == "applied"]
    if c.applied_in_order and not _in_order(c.applied_in_order, applied):
        bad.append(f"applied {applied}")
    for kind in c.refused:
        if not any(
            lv["kind"] == kind and lv["status"] == "refused" and lv["reason"] for lv in levers
        ):
            bad.append(f"{kind} not refused")
    for kind in c.never:
        if any(lv["kind"] == kind and lv["status"] != "refused" for lv in levers):
            bad.append(f"{kind} pulled")
    if c.verified is not None:
        verified = any(lv["status"] == "applied" and lv.get("verified") for lv in levers)
        if verified != c.verified:
            bad.append(f"verified: {verified}")
    if c.comms_on_time is not None:
        comms = inc.get("comms") or {}
        updates = comms.get("updates", [])
        on_time = bool(updates) and not comms.get("missed", 0)
        if on_time != c.comms_on_time:
            bad.append(f"comms on time: {on_time} ({len(updates)} updates)")
    if c.action_item is not None and not any(
        c.action_item in a["text"] for a in inc["postmortem"]["action_items"]
    ):
        bad.append(f"no action item mentions {c.action_item!r}")
    if c.no_scale_out:
        grown = _scaled_out(run, inc)
        if grown:
            bad.append(f"scaled out: {', '.join(grown)}")
    return bad


def _in_order(want: Sequence[str], got: Sequence[str]) -> bool:
    it = iter(got)
    return all(any(g == w for g in it) for w in want)


def _scaled_out(run: ScenarioRun, inc: dict[str, Any]) -> list[str]:
    """Pools of the incident's region whose desired replicas rose after it opened."""
    world = run.world
    cells = {c.name for c in world.cells() if c.region == inc["region"]}
    out: list[str] = []
    for s in world.query(
        "firedrill_replicas_desired", {}, start_s=inc["opened_at_s"], end_s=world.now_s()
    ):
        if s.label("cell") in cells and s.values.size and float(s.values.max()) > s.values[0]:
            out.append(f"{s.label('model_name')}@{s.label('cell')}")
    return sorted(out)


def evaluate_incident(
    c: IncidentCheck, incidents: Sequence[dict[str, Any]], run: ScenarioRun
) -> tuple[str, bool, str, str]:
    """(name, passed, expected, observed) of one incident check."""
    chosen = [
        i
        for i in incidents
        if (c.cell is None or i["cell"] == c.cell) and (c.kind is None or i["kind"] == c.kind)
    ]
    fields = c.model_dump(exclude={"check", "cell", "kind"}, exclude_defaults=True)
    expected = ", ".join(f"{k}={v}" for k, v in fields.items()) or "exists"
    if c.count is not None and len(chosen) != c.count:
        return c.label(), False, expected, f"{len(chosen)} incident(s)"
    if not chosen:
        return c.label(), False, expected, "no such incident"
    problems = {i["id"]: _problems(c, i, run) for i in chosen}
    ok = [k for k, v in problems.items() if not v]
    if ok:
        return c.label(), True, expected, f"{ok[0]} matches"
    seen = "; ".join(f"{k}: {', '.join(v)}" for k, v in problems.items())
    return c.label(), False, expected, seen
