"""What changed: ranking suspects across the six change streams, and the demand trap."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.model.changes import CHANGE_STREAMS, ChangeEvent
from firedrill.respond.suspects import (
    SYMPTOM_KINDS,
    WINDOW_S,
    Symptom,
    drains,
    rank,
    recommend,
    skew_evidence,
    source_cell,
    version_skew,
)

REGION = "us-east-1"
ONSET_S = 40_000.0
MIN = 60.0


def _driver(cell: str, node: int, at_s: float, region: str = REGION) -> ChangeEvent:
    return ChangeEvent(
        at_s, "node_layer", region, cell, f"{cell}-n{node:03d}", "550.90.07", "560.35.03", "driver"
    )


def _self_check_1(*, driver_in_symptom_cell: bool = False) -> list[ChangeEvent]:
    """Cell use1-a drained for a driver rollout; ten minutes later TTFT p99 triples in use1-c."""
    changes = [
        # The drain: use1-a's route weight to 0, then its driver rollout.
        ChangeEvent(
            ONSET_S - 10 * MIN,
            "demand",
            REGION,
            "use1-a",
            "route:llm-70b",
            "100",
            "0",
            "drain for driver rollout",
        ),
        *(_driver("use1-a", n, ONSET_S - (8 - n) * MIN) for n in range(8)),
        # A canary node in use1-b took the driver hours ago.
        _driver("use1-b", 0, ONSET_S - 3 * 3600.0),
        # The router shifted use1-a's traffic into its neighbours.
        ChangeEvent(
            ONSET_S - 9 * MIN,
            "demand",
            REGION,
            "use1-c",
            "llm-70b",
            "33%",
            "50%",
            "traffic moved from use1-a",
        ),
        # Noise: yesterday's weights promotion, another region's bundle, a later fleet flag.
        ChangeEvent(
            ONSET_S - 4 * 3600.0, "weights", REGION, "use1-c", "llm-70b", "canary", "promoted"
        ),
        ChangeEvent(ONSET_S - 15 * MIN, "bundle", "eu-west-1", "euw1-a", "llm-70b", "bd-1", "bd-2"),
        ChangeEvent(ONSET_S + 5 * MIN, "network_policy", "*", "*", "egress:acme", "open", "cut"),
    ]
    if driver_in_symptom_cell:
        changes += [_driver("use1-c", n, ONSET_S - 5 * MIN) for n in range(3)]
    return changes


TTFT_USE1_C = Symptom("ttft", ONSET_S, "use1-c", REGION)


@pytest.mark.parametrize("driver_in_symptom_cell", [False, True])
def test_self_check_1_ttft_after_a_neighbour_drain_is_capacity(
    driver_in_symptom_cell: bool,
) -> None:
    suspects = rank(_self_check_1(driver_in_symptom_cell=driver_in_symptom_cell), TTFT_USE1_C)
    top = suspects[0]
    assert top.stream == "demand"
    assert top.change.cell == "use1-c"
    assert "traffic moved into use1-c from use1-a" in top.evidence
    assert "use1-a was drained 10 min before onset" in top.evidence
    # The drain itself is the runner-up: its traffic lands in use1-c.
    assert (suspects[1].stream, suspects[1].change.cell) == ("demand", "use1-a")
    assert any("drained: its traffic shifts into use1-c" in e for e in suspects[1].evidence)
    # The driver rollout is closer to onset than the drain, and still ranks below demand.
    drivers = [s for s in suspects if s.stream == "node_layer"]
    assert drivers
    assert all(s.score < top.score / 3 for s in drivers)
    if driver_in_symptom_cell:
        assert "3 nodes changed 5 min before onset" in drivers[0].evidence
    advice = recommend(suspects, TTFT_USE1_C)
    assert advice.startswith("capacity: add headroom / rebalance routes; do not roll back")
    assert "not a regression" in advice
    assert "from use1-a" in advice
    assert "rollout_abort" not in advice
    assert "bundle_revert" not in advice


def test_a_drain_alone_points_at_capacity() -> None:
    changes = [c for c in _self_check_1() if not (c.stream == "demand" and c.cell == "use1-c")]
    suspects = rank(changes, TTFT_USE1_C)
    assert (suspects[0].stream, suspects[0].change.cell) == ("demand", "use1-a")
    assert recommend(suspects, TTFT_USE1_C).startswith("capacity:")


def test_a_neighbour_drain_weighs_as_if_it_happened_in_the_cell() -> None:
    # A same-cell bundle change 20 min before onset looks guilty; the drain 10 min before onset
    # pushed use1-a's traffic into use1-c, so it counts with the cell's scope, not a neighbour's.
    changes = [
        ChangeEvent(ONSET_S - 10 * MIN, "demand", REGION, "use1-a", "route:llm-70b", "100", "0"),
        ChangeEvent(ONSET_S - 20 * MIN, "bundle", REGION, "use1-c", "llm-70b", "bd-1", "bd-2"),
    ]
    suspects = rank(changes, TTFT_USE1_C)
    assert [s.stream for s in suspects] == ["demand", "bundle"]
    assert suspects[0].score == pytest.approx(1 / (1 + 10 / 60))
    assert recommend(suspects, TTFT_USE1_C).startswith("capacity:")


def test_out_of_window_and_other_region_changes_are_not_suspects() -> None:
    suspects = rank(_self_check_1(), TTFT_USE1_C)
    assert all(s.change.region in (REGION, "*") for s in suspects)
    assert not any(s.stream == "bundle" for s in suspects)  # eu-west-1 only


def test_a_rollout_step_across_nodes_is_one_suspect() -> None:
    suspects = rank(_self_check_1(), TTFT_USE1_C)
    use1a = [s for s in suspects if s.stream == "node_layer" and s.change.cell == "use1-a"]
    assert len(use1a) == 1
    assert use1a[0].count == 8
    assert use1a[0].change.subject == "use1-a-n007"  # the node closest to onset speaks for it
    assert "8 nodes changed between 8 min and 1 min before onset" in use1a[0].evidence


def test_a_serving_config_change_before_kv_ooms_is_the_bundle() -> None:
    symptom = Symptom("kv_oom", ONSET_S, "use1-c", REGION)
    changes = [
        ChangeEvent(
            ONSET_S - 30 * MIN,
            "bundle",
            REGION,
            "use1-c",
            "llm-70b",
            "bd-7 seqs=256 gmu=0.9",
            "bd-8 seqs=512 gmu=0.9",
            "max_num_seqs 256 -> 512",
        ),
        ChangeEvent(ONSET_S - 2 * 3600.0, "demand", REGION, "use1-c", "tenant:acme", "", "launch"),
        _driver("use1-b", 1, ONSET_S - 20 * MIN),
        ChangeEvent(ONSET_S - 50 * MIN, "serving_image", REGION, "use1-b", "vllm", "0.6", "0.7"),
    ]
    suspects = rank(changes, symptom)
    assert suspects[0].stream == "bundle"
    assert suspects[0].score == pytest.approx(1 / 1.5)  # 30 min before onset, same cell
    advice = recommend(suspects, symptom)
    assert advice.startswith("roll back the bundle label (bundle_revert)")
    assert "max_num_seqs" in advice


@pytest.mark.parametrize(
    ("kind", "stream"),
    [
        ("quality", "weights"),
        ("xid", "node_layer"),
        ("egress", "network_policy"),
        ("ttft", "demand"),
        ("kv_oom", "bundle"),
    ],
)
def test_the_prior_picks_the_stream_that_causes_the_symptom(kind: str, stream: str) -> None:
    # Every stream changed in the cell at the same moment: only the prior tells them apart.
    changes = [
        ChangeEvent(ONSET_S - 15 * MIN, s, REGION, "use1-c", f"{s}-subject", "a", "b")
        for s in CHANGE_STREAMS
    ]
    symptom = Symptom(kind, ONSET_S, "use1-c", REGION)  # type: ignore[arg-type]
    assert rank(changes, symptom)[0].stream == stream


def test_scope_same_cell_beats_same_region_beats_fleet() -> None:
    at_s = ONSET_S - 20 * MIN
    changes = [
        ChangeEvent(at_s, "serving_image", "*", "*", "vllm-fleet", "0.6", "0.7"),
        ChangeEvent(at_s, "serving_image", REGION, "use1-b", "vllm-b", "0.6", "0.7"),
        ChangeEvent(at_s, "serving_image", REGION, "use1-c", "vllm-c", "0.6", "0.7"),
    ]
    suspects = rank(changes, TTFT_USE1_C)
    assert [s.change.subject for s in suspects] == ["vllm-c", "vllm-b", "vllm-fleet"]


def test_closer_before_onset_scores_higher() -> None:
    changes = [
        ChangeEvent(ONSET_S - m * MIN, "bundle", REGION, "use1-c", f"b{m}", "x", "y")
        for m in (5, 30, 90, 300)
    ]
    suspects = rank(changes, TTFT_USE1_C)
    assert [s.change.subject for s in suspects] == ["b5", "b30", "b90", "b300"]
    assert suspects[0].score > suspects[1].score > suspects[2].score > suspects[3].score


def test_the_window_is_six_hours_before_onset() -> None:
    edge = ChangeEvent(ONSET_S - WINDOW_S, "bundle", REGION, "use1-c", "edge", "x", "y")
    old = ChangeEvent(ONSET_S - WINDOW_S - 1.0, "bundle", REGION, "use1-c", "old", "x", "y")
    assert [s.change.subject for s in rank([edge, old], TTFT_USE1_C)] == ["edge"]
    assert rank([edge, old], TTFT_USE1_C, window_s=2 * 3600.0) == []


def test_no_change_before_onset_means_widen_the_search() -> None:
    later = ChangeEvent(ONSET_S + 60.0, "bundle", REGION, "use1-c", "llm-70b", "bd-1", "bd-2")
    suspects = rank([later], TTFT_USE1_C)
    assert suspects[0].score == 0.0
    assert suspects[0].evidence[0] == "changed 1 min after onset: not a cause"
    assert recommend(suspects, TTFT_USE1_C).startswith("no change before onset explains ttft")


def test_a_weak_top_suspect_is_flagged() -> None:
    old_driver = _driver("use1-b", 0, ONSET_S - 5 * 3600.0)
    assert recommend(rank([old_driver], TTFT_USE1_C), TTFT_USE1_C).startswith("weak evidence; ")


def test_demand_conventions() -> None:
    drain = ChangeEvent(0.0, "demand", REGION, "use1-a", "route:m", "100", "0")
    half = ChangeEvent(0.0, "demand", REGION, "use1-a", "route:m", "100", "50")
    more = ChangeEvent(0.0, "demand", REGION, "use1-a", "route:m", "50", "100")
    worded = ChangeEvent(0.0, "demand", REGION, "use1-a", "cell", "serving", "drained")
    shift = ChangeEvent(0.0, "demand", REGION, "use1-c", "m", "", "", "Traffic moved from use1-a")
    assert [drains(c) for c in (drain, half, worded, more, shift)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert source_cell(shift) == "use1-a"
    assert source_cell(drain) is None


cells = st.sampled_from(
    [("us-east-1", c) for c in ("use1-a", "use1-b", "use1-c", "*")]
    + [
        ("*", "*"),
        ("eu-west-1", "euw1-a"),
    ]
)
change_events = st.builds(
    lambda rc, at_s, stream, subject, after: ChangeEvent(
        at_s, stream, rc[0], rc[1], subject, "1", after, ""
    ),
    cells,
    st.floats(min_value=ONSET_S - 8 * 3600.0, max_value=ONSET_S + 3600.0),
    st.sampled_from(CHANGE_STREAMS),
    st.sampled_from(["m1", "m2", "route:m1"]),
    st.sampled_from(["0", "2", "x"]),
)
symptoms = st.builds(
    Symptom,
    st.sampled_from(SYMPTOM_KINDS),
    st.just(ONSET_S),
    st.sampled_from(["use1-a", "use1-c"]),
    st.just(REGION),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(change_events, max_size=30), symptoms)
def test_a_change_after_onset_never_ranks_above_one_before(
    changes: list[ChangeEvent], symptom: Symptom
) -> None:
    suspects = rank(changes, symptom)
    seen_after = False
    for s in suspects:
        if s.at_s > symptom.onset_s:
            seen_after = True
            assert s.score == 0.0
            assert s.evidence[0].endswith("after onset: not a cause")
        else:
            assert not seen_after, "a change before onset ranked below one after it"
            assert s.score > 0.0
        assert s.at_s >= symptom.onset_s - WINDOW_S
        assert s.change.region in (symptom.region, "*")
    assert sum(s.count for s in suspects) == sum(
        1
        for c in changes
        if c.at_s >= symptom.onset_s - WINDOW_S and c.region in (symptom.region, "*")
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(change_events, max_size=30), symptoms, st.randoms(use_true_random=False))
def test_ranking_is_deterministic_whatever_the_input_order(
    changes: list[ChangeEvent], symptom: Symptom, rnd: random.Random
) -> None:
    shuffled = list(changes)
    rnd.shuffle(shuffled)
    first = rank(changes, symptom)
    assert rank(shuffled, symptom) == first
    assert recommend(rank(shuffled, symptom), symptom) == recommend(first, symptom)


def test_self_check_ranking_is_stable() -> None:
    changes = _self_check_1(driver_in_symptom_cell=True)
    expected = rank(changes, TTFT_USE1_C)
    for seed in range(5):
        shuffled = list(changes)
        random.Random(seed).shuffle(shuffled)
        assert rank(shuffled, TTFT_USE1_C) == expected


def test_version_skew_counts_nodes_per_version() -> None:
    nodes = [
        {"driver": "550.90.07", "node_image": "v20261001", "dcgm_exporter": "3.3.8"},
        {"driver": "550.90.07", "node_image": "v20261001", "dcgm_exporter": "3.3.8"},
        {"driver": "560.35.03", "node_image": "v20261001", "dcgm_exporter": "3.3.8"},
        {"driver": "560.35.03", "node_image": "v20261001", "dcgm_exporter": "4.0.0"},
        {"driver": "560.35.03", "node_image": "v20261001"},
    ]
    skew = version_skew(nodes)
    assert skew == {
        "dcgm_exporter": {"3.3.8": 3, "4.0.0": 1},
        "driver": {"560.35.03": 3, "550.90.07": 2},
        "node_image": {"v20261001": 5},
    }
    assert list(skew["driver"]) == ["560.35.03", "550.90.07"]  # most common first
    assert skew_evidence(skew) == [
        "dcgm_exporter skew: 3.3.8 ×3, 4.0.0 ×1",
        "driver skew: 560.35.03 ×3, 550.90.07 ×2",
    ]
    assert version_skew([]) == {}
