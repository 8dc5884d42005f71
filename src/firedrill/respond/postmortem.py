"""Postmortems that change the fleet: metrics from the timeline, and at least one action item.

A postmortem is blameless and built from the scribe's timeline. It measures time to detect,
mitigate and resolve (each from the incident's start), GPU-hours lost, requests failed and tokens
refunded, and lists the changes that contributed (the suspects ranked before onset).

A postmortem that changes nothing is not finished: ``complete`` is False, and ``validate``
raises, until it has at least one action item of a kind that changes the fleet — an alert, a
runbook step, a guardrail on automation, or a game-day scenario. ``propose_action_items``
suggests them from what went wrong (a missed first-update deadline, a remediation the budget
blocked, a fault no alert caught, a drain that became a capacity problem).

Quarterly, ``cluster_by_root_cause`` groups incidents by root-cause class: patterns that recur
across teams show up there and nowhere else.

The postmortem is also the only place a severity comes down; ``downgrade`` applies it to the
incident's tracker and records who lowered it and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from firedrill.errors import FiredrillError
from firedrill.respond.severity import Sev, SeverityTracker
from firedrill.respond.suspects import Suspect, drains, source_cell

TimelineKind = Literal["start", "detect", "declare", "update", "mitigate", "resolve", "note"]
ActionKind = Literal["alert", "runbook_step", "automation_guardrail", "game_day_scenario"]
ACTION_KINDS: Final[tuple[ActionKind, ...]] = (
    "alert",
    "runbook_step",
    "automation_guardrail",
    "game_day_scenario",
)
DetectedBy = Literal["alert", "human", "customer"]


class PostmortemError(FiredrillError):
    """A postmortem is inconsistent or incomplete."""


@dataclass(frozen=True)
class TimelineEvent:
    """One line of the scribe's timeline."""

    at_s: float
    kind: TimelineKind
    text: str
    who: str = ""

    def __post_init__(self) -> None:
        if not math.isfinite(self.at_s):
            raise ValueError(f"at_s must be finite, got {self.at_s}")


@dataclass(frozen=True)
class IncidentFacts:
    """What the incident cost and how it went, beyond the timeline."""

    incident_id: str
    title: str
    root_cause_class: str  # e.g. "bundle_config", "node_layer", "capacity"
    sev: Sev
    gpu_hours_lost: float = 0.0
    requests_failed: int = 0
    tokens_refunded: int = 0
    suspects: Sequence[Suspect] = ()
    detected_by: DetectedBy = "alert"
    first_update_late_s: float = 0.0  # seconds the first update was late; 0 when on time
    budget_blocked: Sequence[str] = ()  # remediations a budget stopped, by lever
    capacity_drain: bool = False  # a drain left too little headroom elsewhere

    def __post_init__(self) -> None:
        if not self.incident_id.strip():
            raise ValueError("incident_id must not be empty")
        if not self.root_cause_class.strip():
            raise ValueError("root_cause_class must not be empty")
        for name in ("gpu_hours_lost", "requests_failed", "tokens_refunded", "first_update_late_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class ActionItem:
    """A change to the fleet the incident taught: what kind, what, and why."""

    kind: ActionKind
    title: str
    why: str
    owner: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind '{self.kind}': one of {ACTION_KINDS}")
        if not self.title.strip():
            raise ValueError("an action item needs a title")


@dataclass(frozen=True)
class Downgrade:
    """A severity lowered in the postmortem, with who and why."""

    from_sev: Sev
    to_sev: Sev
    who: str
    why: str
    at_s: float


@dataclass(frozen=True)
class Postmortem:
    """The incident's record: timeline, metrics, contributing changes and action items."""

    incident_id: str
    title: str
    root_cause_class: str
    sev: Sev
    timeline: tuple[TimelineEvent, ...]
    ttd_s: float | None  # detect - start; None when the timeline has no detect
    ttm_s: float | None  # mitigate - start
    ttr_s: float | None  # resolve - start
    gpu_hours_lost: float
    requests_failed: int
    tokens_refunded: int
    contributing_changes: tuple[Suspect, ...]
    action_items: tuple[ActionItem, ...] = ()
    downgrades: tuple[Downgrade, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether the postmortem changes the fleet: at least one action item."""
        return bool(self.action_items)

    def validate(self) -> None:
        """Raise unless the postmortem is complete and resolved."""
        if not self.action_items:
            raise PostmortemError(
                f"postmortem {self.incident_id} has no action item: add an alert, a runbook "
                "step, an automation guardrail or a game-day scenario"
            )
        if self.ttr_s is None:
            raise PostmortemError(f"postmortem {self.incident_id} has no resolve time")


def _first(events: Sequence[TimelineEvent], kind: TimelineKind) -> float | None:
    return next((e.at_s for e in events if e.kind == kind), None)


def build_postmortem(
    events: Iterable[TimelineEvent],
    facts: IncidentFacts,
    *,
    action_items: Iterable[ActionItem] = (),
) -> Postmortem:
    """The postmortem of an incident from its timeline and facts; milestones must be in order."""
    timeline = tuple(sorted(events, key=lambda e: e.at_s))
    start = _first(timeline, "start")
    if start is None:
        raise PostmortemError(f"incident {facts.incident_id}: the timeline has no start")
    milestone_kinds: tuple[TimelineKind, ...] = ("detect", "mitigate", "resolve")
    milestones: dict[str, float | None] = {k: _first(timeline, k) for k in milestone_kinds}
    previous, previous_kind = start, "start"
    for kind, at in milestones.items():
        if at is None:
            continue
        if at < previous:
            raise PostmortemError(
                f"incident {facts.incident_id}: {kind} at {at:g} s is before {previous_kind} "
                f"at {previous:g} s"
            )
        previous, previous_kind = at, kind

    def since_start(kind: str) -> float | None:
        at = milestones[kind]
        return None if at is None else at - start

    contributing = tuple(s for s in facts.suspects if s.before_onset and s.score > 0)
    return Postmortem(
        incident_id=facts.incident_id,
        title=facts.title,
        root_cause_class=facts.root_cause_class.strip().lower(),
        sev=facts.sev,
        timeline=timeline,
        ttd_s=since_start("detect"),
        ttm_s=since_start("mitigate"),
        ttr_s=since_start("resolve"),
        gpu_hours_lost=facts.gpu_hours_lost,
        requests_failed=facts.requests_failed,
        tokens_refunded=facts.tokens_refunded,
        contributing_changes=contributing,
        action_items=tuple(action_items),
    )


def propose_action_items(facts: IncidentFacts) -> list[ActionItem]:
    """Action items suggested by what went wrong; people accept, edit or drop them."""
    items: list[ActionItem] = []
    if facts.first_update_late_s > 0:
        items.append(
            ActionItem(
                "runbook_step",
                "post the first update from a template at declaration, before triage",
                f"the first update was {facts.first_update_late_s / 60:.0f} min late",
            )
        )
    for lever in dict.fromkeys(facts.budget_blocked):
        items.append(
            ActionItem(
                "automation_guardrail",
                f"pre-approve a bounded {lever} for this failure mode, with its budget checked "
                "before it fires",
                f"{lever} was blocked by its budget mid-incident",
            )
        )
    if facts.detected_by != "alert":
        items.append(
            ActionItem(
                "alert",
                f"alert on the symptom of '{facts.title}'",
                f"no alert caught the fault: it was detected by a {facts.detected_by}",
            )
        )
    drained = [
        s
        for s in facts.suspects
        if s.before_onset and (drains(s.change) or source_cell(s.change) is not None)
    ]
    if facts.capacity_drain or drained:
        where = f" ({drained[0].change.cell})" if drained else ""
        items.append(
            ActionItem(
                "game_day_scenario",
                f"drain a cell{where} at peak and check its neighbours' headroom first",
                "a drain moved traffic into a cell without the capacity for it",
            )
        )
    return items


def with_action_items(pm: Postmortem, items: Iterable[ActionItem]) -> Postmortem:
    """The postmortem with more action items."""
    return replace(pm, action_items=(*pm.action_items, *items))


def downgrade(
    pm: Postmortem, tracker: SeverityTracker, level: Sev, who: str, why: str, at_s: float
) -> Postmortem:
    """Lower the incident's severity (the only place it comes down) and record it here."""
    from_sev = tracker.sev
    tracker.downgrade_in_postmortem(level, who, why, at_s)
    record = Downgrade(from_sev, level, who.strip(), why.strip(), at_s)
    return replace(pm, sev=level, downgrades=(*pm.downgrades, record))


def cluster_by_root_cause(postmortems: Iterable[Postmortem]) -> dict[str, list[str]]:
    """Incident ids per root-cause class, the most frequent class first (ties by name)."""
    clusters: dict[str, list[str]] = {}
    for pm in postmortems:
        clusters.setdefault(pm.root_cause_class, []).append(pm.incident_id)
    ordered = sorted(clusters.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return {cause: sorted(ids) for cause, ids in ordered}
