"""Postmortems: metrics from the timeline, action items, clustering and the only way down."""

from __future__ import annotations

import pytest

from firedrill.errors import FiredrillError
from firedrill.model.changes import ChangeEvent
from firedrill.respond.postmortem import (
    ActionItem,
    IncidentFacts,
    Postmortem,
    PostmortemError,
    TimelineEvent,
    build_postmortem,
    cluster_by_root_cause,
    downgrade,
    propose_action_items,
    with_action_items,
)
from firedrill.respond.severity import Impact, Sev, SeverityTracker, assess
from firedrill.respond.suspects import Symptom, rank

TIMELINE = (
    TimelineEvent(1200.0, "detect", "TTFT fast-burn alert fires", "alertmanager"),
    TimelineEvent(1000.0, "start", "bundle digest changes in use1-a"),
    TimelineEvent(1500.0, "declare", "SEV2 declared", "ivan"),
    TimelineEvent(3000.0, "mitigate", "bundle_revert to last-known-good", "ivan"),
    TimelineEvent(7000.0, "resolve", "TTFT back under SLO for 1 h", "ivan"),
)
ALERT = ActionItem("alert", "page on KV preemption churn", "it led TTFT by 10 min")


def _facts(**overrides: object) -> IncidentFacts:
    base: dict[str, object] = {
        "incident_id": "inc-7",
        "title": "KV OOMs after a bundle change",
        "root_cause_class": "bundle_config",
        "sev": Sev.SEV2,
        "gpu_hours_lost": 512.5,
        "requests_failed": 120_000,
        "tokens_refunded": 3_000_000,
    }
    base.update(overrides)
    return IncidentFacts(**base)  # type: ignore[arg-type]


def _pm(incident_id: str, cause: str) -> Postmortem:
    return build_postmortem(
        TIMELINE,
        _facts(incident_id=incident_id, root_cause_class=cause),
        action_items=[ALERT],
    )


def test_metrics_are_measured_from_the_start() -> None:
    pm = build_postmortem(TIMELINE, _facts(), action_items=[ALERT])
    assert pm.ttd_s == 200.0
    assert pm.ttm_s == 2000.0
    assert pm.ttr_s == 6000.0
    assert (pm.gpu_hours_lost, pm.requests_failed, pm.tokens_refunded) == (
        512.5,
        120_000,
        3_000_000,
    )
    assert [e.kind for e in pm.timeline][:2] == ["start", "detect"]
    assert pm.complete
    pm.validate()


def test_without_action_items_the_postmortem_is_incomplete() -> None:
    pm = build_postmortem(TIMELINE, _facts())
    assert not pm.complete
    with pytest.raises(PostmortemError, match="no action item") as err:
        pm.validate()
    assert isinstance(err.value, FiredrillError)
    with_action_items(pm, [ALERT]).validate()


def test_an_unresolved_postmortem_does_not_validate() -> None:
    pm = build_postmortem(TIMELINE[:4], _facts(), action_items=[ALERT])
    assert pm.ttr_s is None
    with pytest.raises(PostmortemError, match="no resolve"):
        pm.validate()


def test_the_timeline_needs_a_start_and_milestones_in_order() -> None:
    with pytest.raises(PostmortemError, match="no start"):
        build_postmortem(TIMELINE[:1], _facts())
    backwards = (*TIMELINE[1:3], TimelineEvent(900.0, "mitigate", "too early"))
    with pytest.raises(PostmortemError, match="mitigate at 900 s is before"):
        build_postmortem((*backwards, TIMELINE[0]), _facts())


def test_contributing_changes_are_the_suspects_before_onset() -> None:
    symptom = Symptom("kv_oom", 1000.0, "use1-a", "use1")
    changes = [
        ChangeEvent(900.0, "bundle", "use1", "use1-a", "chat", "d1", "d2", "max_num_seqs 512"),
        ChangeEvent(1100.0, "weights", "use1", "use1-a", "llama", "v1", "v2"),
    ]
    pm = build_postmortem(TIMELINE, _facts(suspects=rank(changes, symptom)))
    assert [s.stream for s in pm.contributing_changes] == ["bundle"]


def test_action_items_are_proposed_from_what_went_wrong() -> None:
    symptom = Symptom("ttft", 1000.0, "use1-a", "use1")
    drain = ChangeEvent(400.0, "demand", "use1", "use1-b", "route", "50", "0", "drain for rollout")
    facts = _facts(
        detected_by="customer",
        first_update_late_s=300.0,
        budget_blocked=["node_quarantine", "node_quarantine"],
        suspects=rank([drain], symptom),
    )
    items = propose_action_items(facts)
    assert [i.kind for i in items] == [
        "runbook_step",
        "automation_guardrail",
        "alert",
        "game_day_scenario",
    ]
    assert "5 min late" in items[0].why
    assert "node_quarantine" in items[1].title
    assert "customer" in items[2].why
    assert "use1-b" in items[3].title
    assert build_postmortem(TIMELINE, facts, action_items=items).complete


def test_a_clean_incident_proposes_nothing() -> None:
    assert propose_action_items(_facts()) == []
    assert propose_action_items(_facts(capacity_drain=True))[0].kind == "game_day_scenario"


def test_an_action_item_kind_must_change_the_fleet() -> None:
    with pytest.raises(ValueError, match="unknown action kind"):
        ActionItem("be_more_careful", "try harder", "")  # type: ignore[arg-type]


def test_cluster_by_root_cause_most_frequent_first() -> None:
    pms = [
        _pm("inc-3", "node_layer"),
        _pm("inc-1", "bundle_config"),
        _pm("inc-9", "capacity"),
        _pm("inc-2", "Bundle_Config"),
        _pm("inc-4", "node_layer"),
        _pm("inc-5", "bundle_config"),
    ]
    clusters = cluster_by_root_cause(pms)
    assert list(clusters) == ["bundle_config", "node_layer", "capacity"]
    assert clusters["bundle_config"] == ["inc-1", "inc-2", "inc-5"]
    assert {cause: len(ids) for cause, ids in clusters.items()} == {
        "bundle_config": 3,
        "node_layer": 2,
        "capacity": 1,
    }
    assert cluster_by_root_cause([]) == {}


def test_downgrade_happens_in_the_postmortem_and_is_recorded() -> None:
    tracker = SeverityTracker()
    tracker.raise_to(assess(Impact(gpus_stalled=16_384)), 1000.0)
    before = tracker.sev
    assert before is Sev.SEV2
    pm = downgrade(_pm("inc-7", "x"), tracker, Sev.SEV3, "ivan", "one tenant only", 8000.0)
    assert tracker.sev is Sev.SEV3
    assert tracker.in_postmortem
    assert pm.sev is Sev.SEV3
    (record,) = pm.downgrades
    assert (record.from_sev, record.to_sev, record.who, record.why) == (
        Sev.SEV2,
        Sev.SEV3,
        "ivan",
        "one tenant only",
    )


def test_a_downgrade_without_why_is_refused_and_not_recorded() -> None:
    tracker = SeverityTracker()
    tracker.raise_to(assess(Impact(gpus_stalled=16_384)), 0.0)
    pm = _pm("inc-7", "x")
    with pytest.raises(ValueError, match="why"):
        downgrade(pm, tracker, Sev.SEV3, "ivan", " ", 10.0)
    assert pm.downgrades == ()
    assert tracker.sev is Sev.SEV2
