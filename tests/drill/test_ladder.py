"""The drill ladder's rules: the gate, the standings, L5 recency and rotation warnings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from firedrill.drill.ladder import (
    LadderRun,
    gate,
    highest_passed,
    last_success,
    rotation_warnings,
    rung_number,
    since_text,
    standings,
)

T0 = datetime(2025, 10, 1, 14, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=60)


def run(
    rung: int,
    verdict: str = "passed",
    *,
    day: float,
    by: str = "alice",
    model: str = "llm-70b",
    author: str | None = None,
) -> LadderRun:
    return LadderRun(
        drill=f"l{rung}-drill",
        model=model,
        rung=rung,
        verdict=verdict,
        run_by=by,
        started_at=T0 + timedelta(days=day),
        runbook_author=author,
    )


def test_l0_is_always_allowed_and_l1_needs_two_tabletops() -> None:
    assert gate([], model="llm-70b", rung=0).allowed
    refused = gate([], model="llm-70b", rung=1)
    assert not refused.allowed
    assert refused.reason == (
        "L1 for llm-70b needs L0 passed twice in a row (latest L0 runs, newest first: no runs)"
    )
    assert not gate([run(0, day=1)], model="llm-70b", rung=1).allowed
    assert gate([run(0, day=1), run(0, day=2)], model="llm-70b", rung=1).allowed


def test_twice_in_a_row_means_the_two_latest_runs_in_time_order() -> None:
    history = [run(4, day=1), run(4, "failed", day=3), run(4, day=2)]  # stored out of order
    g = gate(history, model="llm-70b", rung=5)
    assert not g.allowed
    assert "newest first: failed, passed" in g.reason
    history.append(run(4, day=4))
    assert not gate(history, model="llm-70b", rung=5).allowed  # failed, then one pass
    history.append(run(4, "aborted", day=5))
    assert not gate(history, model="llm-70b", rung=5).allowed
    history += [run(4, day=6), run(4, day=7)]
    assert gate(history, model="llm-70b", rung=5).allowed


def test_passes_of_another_model_do_not_count() -> None:
    history = [run(2, day=1, model="llm-8b"), run(2, day=2, model="llm-8b")]
    assert gate(history, model="llm-8b", rung=3).allowed
    assert not gate(history, model="llm-70b", rung=3).allowed


def test_an_override_needs_a_reason_and_says_so() -> None:
    assert not gate([], model="llm-70b", rung=5, override_reason="   ").allowed
    g = gate([], model="llm-70b", rung=5, override_reason="regulator deadline, IC approved")
    assert g.allowed
    assert g.overridden
    assert g.reason.endswith("overridden: regulator deadline, IC approved")
    assert not gate([run(0, day=1), run(0, day=2)], model="llm-70b", rung=1).overridden


def test_rungs_are_l0_to_l7() -> None:
    assert rung_number("L5") == 5 == rung_number(5)
    for bad in ("L8", "5", "X1", -1, 8, True):
        with pytest.raises(ValueError, match=r"L0\.\.L7"):
            rung_number(bad)


def test_last_successful_l5_is_counted_in_whole_days() -> None:
    history = [run(5, day=10), run(5, day=18.5), run(5, "failed", day=50)]
    last = last_success(history, "llm-70b", 5)
    assert last is not None
    assert last.started_at == T0 + timedelta(days=18.5)
    assert since_text("llm-70b", 5, last, NOW) == "last successful L5 for llm-70b: 41 days ago"
    one = run(5, day=59)
    assert since_text("llm-70b", 5, one, NOW) == "last successful L5 for llm-70b: 1 day ago"
    assert since_text("llm-8b", 5, None, NOW) == "last successful L5 for llm-8b: never"


def test_rotation_warnings() -> None:
    history = [run(3, day=1, by="alice"), run(3, day=2, by="bob")]
    assert rotation_warnings(history, model="llm-70b", rung=3, run_by="carol") == []
    (same,) = rotation_warnings(history, model="llm-70b", rung=3, run_by="bob")
    assert same == "bob ran L3 for llm-70b last time too: rotate who runs the drill"
    (author,) = rotation_warnings(
        history, model="llm-70b", rung=3, run_by="carol", runbook_author="carol"
    )
    assert "wrote the runbook" in author
    assert "worst tester" in author


def test_rotation_compares_people_canonically() -> None:
    history = [run(3, day=1, by="alice"), run(3, day=2, by="Bob ")]
    (same,) = rotation_warnings(history, model="llm-70b", rung=3, run_by="bob")
    assert "last time too" in same
    (author,) = rotation_warnings(
        history, model="llm-70b", rung=3, run_by="carol", runbook_author="CAROL"
    )
    assert "wrote the runbook" in author


def test_standings_per_model() -> None:
    history = [
        run(0, day=1, by="alice"),
        run(0, day=2, by="bob"),
        run(1, day=3, by="carol"),
        run(1, day=4, by="carol", author="carol"),
        run(0, day=5, model="llm-8b", by="dave"),
    ]
    big, small = standings(history, NOW)
    assert (big.model, big.highest_passed, big.highest_allowed, big.runs) == ("llm-70b", 1, 2, 4)
    assert big.last_l5 == "last successful L5 for llm-70b: never"
    assert big.warnings == (
        "L1: carol ran the last two runs; rotate who runs the drill",
        "L1: carol ran a drill of a runbook they wrote (l1-drill)",
    )
    assert (small.model, small.highest_passed, small.highest_allowed) == ("llm-8b", 0, 0)
    assert highest_passed(history, "llm-405b") is None
