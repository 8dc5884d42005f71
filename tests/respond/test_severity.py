"""Severity on four axes, the SEV matrix, and a severity that only goes up during the incident."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from firedrill.errors import OperationError
from firedrill.respond.severity import (
    NOT_APPLIED,
    Impact,
    Sev,
    SeverityTracker,
    SevMatrix,
    assess,
)


def test_a_hung_16k_gpu_job_is_sev2_with_zero_users_affected() -> None:
    a = assess(Impact(gpus_stalled=16_384))
    assert a.sev is Sev.SEV2
    assert a.deciding_axis == "gpu_hours"
    assert a.axes["gpu_hours"].value == pytest.approx(32_768.0)  # $ per hour at $2/GPU-h
    assert a.axes["users"].level is Sev.NONE
    assert "$32,768/h" in a.reason


def test_the_gpu_hour_price_comes_from_the_matrix() -> None:
    pricey = SevMatrix.model_validate({"gpu_hours": {"gpu_hour_usd": 8.0}})
    assert assess(Impact(gpus_stalled=16_384), pricey).sev is Sev.SEV1  # $131K/h
    assert assess(Impact(gpus_stalled=1_024)).sev is Sev.SEV4  # $2K/h at the default price
    assert assess(Impact(gpus_stalled=100)).sev is Sev.NONE  # $200/h


@pytest.mark.parametrize(
    ("impact", "sev"),
    [
        (Impact(burn_rate=14.4, paid_tier=True, regions_affected=1), Sev.SEV2),
        (Impact(burn_rate=20.0, paid_tier=True, regions_affected=2), Sev.SEV1),
        (Impact(burn_rate=20.0, paid_tier=False, regions_affected=1), Sev.SEV3),
        (Impact(burn_rate=20.0, paid_tier=False, regions_affected=2), Sev.SEV2),
        (Impact(burn_rate=14.3, paid_tier=True, regions_affected=1), Sev.SEV3),
        (Impact(burn_rate=6.0, regions_affected=1), Sev.SEV3),
        (Impact(burn_rate=2.0, regions_affected=1), Sev.SEV4),
        (Impact(requests_failed_frac=0.3, paid_tier=True, regions_affected=2), Sev.SEV1),
        (Impact(requests_failed_frac=0.05, paid_tier=True, regions_affected=1), Sev.SEV2),
        (Impact(burn_rate=50.0, paid_tier=True, regions_affected=0), Sev.NONE),
    ],
)
def test_users_axis_defaults(impact: Impact, sev: Sev) -> None:
    a = assess(impact)
    assert a.axes["users"].level is sev
    assert a.sev is sev


def test_security_is_sev1_regardless_of_latency() -> None:
    for impact in (Impact(weights_exfiltrated=True), Impact(unapproved_side_effects=1)):
        a = assess(impact)
        assert a.sev is Sev.SEV1
        assert a.deciding_axis == "security"
        assert a.axes["users"].level is Sev.NONE
    assert assess(Impact(tripwires=3)).sev is Sev.SEV2


def test_ties_go_to_security_then_quality() -> None:
    a = assess(
        Impact(
            burn_rate=30.0,
            paid_tier=True,
            regions_affected=3,
            weights_exfiltrated=True,
            golden_drop_pts=40.0,
        )
    )
    assert a.sev is Sev.SEV1
    assert a.deciding_axis == "security"
    a = assess(Impact(burn_rate=30.0, paid_tier=True, regions_affected=1, golden_drop_pts=12.0))
    assert (a.sev, a.deciding_axis) == (Sev.SEV2, "quality")


def test_quality_axis_defaults() -> None:
    assert assess(Impact(golden_drop_pts=12.0)).sev is Sev.SEV2
    assert assess(Impact(golden_drop_pts=9.9)).sev is Sev.SEV3
    assert assess(Impact(golden_drop_pts=30.0)).sev is Sev.SEV1
    a = assess(Impact(bad_weights=True))
    assert (a.sev, a.deciding_axis) == (Sev.SEV2, "quality")


def test_nothing_measured_is_no_incident() -> None:
    a = assess(Impact())
    assert a.sev is Sev.NONE
    assert a.deciding_axis is None
    assert set(a.axes) == {"security", "quality", "users", "gpu_hours"}


@settings(max_examples=200, deadline=None)
@given(
    frac=st.floats(min_value=0.0, max_value=1.0),
    paid=st.booleans(),
    regions=st.integers(min_value=0, max_value=5),
)
def test_fast_and_wrong_is_never_rated_below_slow(frac: float, paid: bool, regions: int) -> None:
    slow = assess(Impact(requests_failed_frac=frac, paid_tier=paid, regions_affected=regions))
    wrong = assess(Impact(wrong_answers_frac=frac, paid_tier=paid, regions_affected=regions))
    assert wrong.sev <= slow.sev  # a lower number is more severe


def test_the_matrix_is_validated_config() -> None:
    m = SevMatrix.model_validate({"quality": {"sev2_drop_pts": 5.0}, "security": {"tripwire": 3}})
    assert assess(Impact(golden_drop_pts=6.0), m).sev is Sev.SEV2
    assert assess(Impact(tripwires=1), m).sev is Sev.SEV3
    with pytest.raises(ValidationError):
        SevMatrix.model_validate({"gpu_hours": {"sev2_usd_per_h": 200_000.0}})  # above SEV1
    with pytest.raises(ValidationError):
        SevMatrix.model_validate({"users": {"sev4": [{"paid_tier": True}]}})  # no threshold
    with pytest.raises(ValidationError):
        SevMatrix.model_validate({"security": {"weight_exfil": 5}})
    with pytest.raises(ValidationError):
        SevMatrix.model_validate({"quality": {"sev2_drop_pct": 5.0}})  # a typo is an error


@pytest.mark.parametrize(
    "bad",
    [{"burn_rate": -1.0}, {"requests_failed_frac": 1.5}, {"golden_drop_pts": float("nan")}],
)
def test_impact_rejects_impossible_measurements(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Impact(**bad)  # type: ignore[arg-type]


def test_tracker_goes_up_and_journals_what_it_did_not_apply() -> None:
    t = SeverityTracker()
    assert (t.sev, t.history) == (Sev.NONE, [])
    seen: list[Sev] = []
    for impact, at_s in (
        (Impact(burn_rate=7.0, regions_affected=1), 60.0),  # SEV3
        (Impact(gpus_stalled=16_384), 120.0),  # SEV2
        (Impact(burn_rate=2.0, regions_affected=1), 600.0),  # SEV4: lower, not applied
        (Impact(gpus_stalled=16_384), 660.0),  # SEV2 again: unchanged
    ):
        t.raise_to(assess(impact), at_s=at_s)
        seen.append(t.sev)
    assert seen == [Sev.SEV3, Sev.SEV2, Sev.SEV2, Sev.SEV2]
    h = t.history
    assert [(r.at_s, r.sev, r.axis, r.applied) for r in h] == [
        (60.0, Sev.SEV3, "users", True),
        (120.0, Sev.SEV2, "gpu_hours", True),
        (600.0, Sev.SEV4, "users", False),
        (660.0, Sev.SEV2, "gpu_hours", False),
    ]
    assert h[2].reason.startswith(NOT_APPLIED)
    assert "already SEV2" in h[3].reason


def test_downgrade_only_in_the_postmortem_with_who_and_why() -> None:
    t = SeverityTracker()
    assert t.raise_to(assess(Impact(weights_exfiltrated=True)), at_s=0.0)
    with pytest.raises(ValueError, match="who"):
        t.downgrade_in_postmortem(Sev.SEV3, who="", why="false positive", at_s=3600.0)
    with pytest.raises(ValueError, match="why"):
        t.downgrade_in_postmortem(Sev.SEV3, who="ic:alice", why="  ", at_s=3600.0)
    with pytest.raises(ValueError, match="lower"):
        t.downgrade_in_postmortem(Sev.SEV1, who="ic:alice", why="same", at_s=3600.0)
    assert (t.sev, len(t.history)) == (Sev.SEV1, 1)
    t.downgrade_in_postmortem(
        Sev.SEV3, who="ic:alice", why="the copy was to our own DR bucket", at_s=7200.0
    )
    assert t.sev is Sev.SEV3
    last = t.history[-1]
    assert (last.axis, last.who, last.applied) == ("postmortem", "ic:alice", True)
    assert "DR bucket" in last.reason
    assert "from SEV1" in last.reason
    with pytest.raises(OperationError):
        t.raise_to(assess(Impact(tripwires=1)), at_s=7300.0)


def test_history_never_runs_backwards() -> None:
    t = SeverityTracker()
    t.raise_to(assess(Impact(tripwires=1)), at_s=100.0)
    with pytest.raises(ValueError, match="before the last record"):
        t.raise_to(assess(Impact(tripwires=1)), at_s=50.0)


impacts = st.builds(
    Impact,
    burn_rate=st.floats(min_value=0.0, max_value=50.0),
    requests_failed_frac=st.floats(min_value=0.0, max_value=1.0),
    paid_tier=st.booleans(),
    regions_affected=st.integers(min_value=0, max_value=4),
    gpus_stalled=st.integers(min_value=0, max_value=100_000),
    golden_drop_pts=st.floats(min_value=0.0, max_value=40.0),
    wrong_answers_frac=st.floats(min_value=0.0, max_value=1.0),
    bad_weights=st.booleans(),
    weights_exfiltrated=st.booleans(),
    unapproved_side_effects=st.integers(min_value=0, max_value=3),
    tripwires=st.integers(min_value=0, max_value=3),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(impacts, st.floats(min_value=0.0, max_value=600.0)), max_size=25))
def test_severity_never_decreases_during_the_incident(
    steps: list[tuple[Impact, float]],
) -> None:
    t = SeverityTracker()
    now_s = 0.0
    worst = Sev.NONE
    for impact, gap_s in steps:
        now_s += gap_s
        before = t.sev
        a = assess(impact)
        applied = t.raise_to(a, at_s=now_s)
        assert t.sev <= before  # a lower number is more severe: never less severe than before
        assert applied == (a.sev < before)
        worst = min(worst, a.sev)
        assert t.sev is worst
    assert len(t.history) == len(steps)
    assert all(
        r.applied == (NOT_APPLIED not in r.reason and "already" not in r.reason) for r in t.history
    )


@settings(max_examples=100, deadline=None)
@given(
    impact=impacts,
    who=st.sampled_from(["", " ", "ic:alice"]),
    why=st.sampled_from(["", "\t", "misread the dashboard"]),
)
def test_a_downgrade_without_who_and_why_changes_nothing(
    impact: Impact, who: str, why: str
) -> None:
    t = SeverityTracker()
    t.raise_to(assess(impact), at_s=0.0)
    before, n = t.sev, len(t.history)
    assume(not (who.strip() and why.strip()))
    with pytest.raises(ValueError, match="a downgrade needs"):
        t.downgrade_in_postmortem(Sev.NONE, who=who, why=why, at_s=60.0)
    assert (t.sev, len(t.history), t.in_postmortem) == (before, n, False)


def test_the_gpu_hours_axis_is_priced_by_the_fleet() -> None:
    from firedrill.respond.severity import refuse_price, severity_for

    impact = Impact(gpus_stalled=4096)
    at_two = assess(impact, severity_for(2.0))
    at_five = assess(impact, severity_for(5.0))
    assert at_two.axes["gpu_hours"].value == 8192.0
    assert at_two.axes["gpu_hours"].level is Sev.SEV3
    assert at_five.axes["gpu_hours"].value == 20480.0
    assert at_five.axes["gpu_hours"].level is Sev.SEV2
    tighter = SevMatrix.model_validate({"gpu_hours": {"sev2_usd_per_h": 30000}})
    assert severity_for(5.0, tighter).gpu_hours.sev2_usd_per_h == 30000
    assert severity_for(5.0, tighter).gpu_hours.gpu_hour_usd == 5.0
    with pytest.raises(ValueError, match="fleet's gpu_hour_usd"):
        refuse_price({"gpu_hours": {"gpu_hour_usd": 3.0}})
    with pytest.raises(ValueError, match="finite price"):
        severity_for(math.inf)
