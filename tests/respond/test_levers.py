"""Levers and their guards on the demo twin (examples/fleet.yaml).

The demo has three regions; us-east-1 holds cells use1-a/b/c, each with 56 llm-70b replicas
(TP=8) and 128 llm-8b replicas, route weights equal to those counts. At the start of a run it is
00:00 UTC, six hours before the region's 18:00 peak, so chat runs at 0.8 of its 1,016 req/s peak.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firedrill.errors import FiredrillError, OperationError
from firedrill.model import operations as ops
from firedrill.model.operations import Operation
from firedrill.respond.guards import (
    DENY_ALL_FLAG,
    FAST_BURN,
    Approver,
    CellLoad,
    GuardResult,
    UnsafeKind,
    UnsafeRequest,
    check_approvals,
    check_rollback_target,
    check_scale_in_paused,
    check_sev1,
    drain_headroom,
    paused_pools,
    refuse_unsafe,
    widens_access,
)
from firedrill.respond.levers import (
    CATALOGUE,
    ROLLBACK_ORDER,
    CompensationParams,
    ContentParams,
    DigestParams,
    DriverParams,
    FreezeParams,
    KillSwitchParams,
    Lever,
    LeverJournalEntry,
    LeverKind,
    LeverParams,
    ModelsParams,
    NoParams,
    QuarantineParams,
    QueueHoldParams,
    RouteWeightParams,
    ServingConfigParams,
    SplitParams,
    WarmPoolParams,
    drain_check,
    operations,
    pull,
    pull_drain,
    refuse,
    rollback_check,
    scale_in_check,
    scope_of,
    undo,
)
from firedrill.respond.severity import Sev
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
SPEC = load_fleet(FLEET_YAML)
SEED = 7
OLD_70B, OLD_8B = (m.weights.digest for m in SPEC.models)
NEW_70B = "sha256:" + "70" * 32
UNSIGNED_70B = "sha256:" + "b5" * 32
UNATTESTED_70B = "sha256:" + "ba" * 32
BUNDLE = "sha256:" + "bb" * 32
SERVE = "gpu-use1-a-h100-serve-0000"
US_EAST = ("use1-a", "use1-b", "use1-c")
CELLS = (*US_EAST, "usw2-a", "usw2-b", "euw1-a", "euw1-b")

IC = Approver("ines", "incident_commander")
OPS = Approver("omar", "ops_lead")
CAP = Approver("cara", "capacity_lead")
SEC = Approver("sam", "security_lead")
OWNER = Approver("mo", "model_owner")
EVERYONE = (IC, OPS, CAP, SEC, OWNER)

# The reference's rollback order: "kill switch, bundle label, route weight, Rollout abort, queue
# hold, node quarantine, and the driver last".
REFERENCE_ORDER: tuple[LeverKind, ...] = (
    "kill_switch",
    "bundle_revert",
    "route_weight",
    "rollout_abort",
    "queue_hold",
    "node_quarantine",
    "driver_rollback",
)


def fresh() -> Twin:
    return Twin(SPEC, seed=SEED)


def demo(warm_s: float = 60.0) -> Twin:
    """The demo twin after ``warm_s`` seconds, so the signals have been scraped."""
    twin = fresh()
    twin.run_for(warm_s)
    return twin


@dataclass(frozen=True)
class _Digest:
    model: int
    digest: str
    signed: bool
    attested: bool


@dataclass(frozen=True)
class _Catalog:
    digests: tuple[_Digest, ...] = (_Digest(0, "sha256:ok", True, True),)
    digest_index: Mapping[str, int] = field(default_factory=lambda: {"sha256:ok": 0})
    model_index: Mapping[str, int] = field(default_factory=lambda: {"m": 0})


def _genuine(guard: str) -> GuardResult:
    """A passing result minted by the guard itself (a made-up one is not counted)."""
    if guard == "scale_in_paused":
        return check_scale_in_paused((), incident_tags=(), applied=())
    if guard == "drain_headroom":
        return drain_headroom(
            "m", CellLoad("a", 1.0, 1.0, 10.0), [CellLoad("b", 1.0, 10.0, 10.0)], cold_penalty=0.0
        ).result
    if guard == "rollback_target":
        return check_rollback_target(_Catalog(), "m", "sha256:ok")
    if guard == "sev1":
        return check_sev1(Sev.SEV1, "x")
    raise AssertionError(guard)


def ran(*guards: str) -> tuple[GuardResult, ...]:
    results = tuple(_genuine(g) for g in guards)
    assert all(r.ok and r.guard == g for r, g in zip(results, guards, strict=True))
    return results


def weight(twin: Twin, model: str, cell: str) -> int:
    return int(twin.weights[twin.model_index[model], twin.cell_index[cell]])


def pull_drain_of(twin: Twin, cell: str, journal: list[LeverJournalEntry]) -> LeverJournalEntry:
    lever = Lever("cell_drain", cell)
    plan = drain_check(lever, twin, twin, TwinWorld(twin))
    scale = scale_in_check(lever, twin, incident_tags=(), journal=journal)
    entry = pull(
        lever,
        twin,
        approvers=[CAP],
        at_s=twin.now_s(),
        reason=f"drain {cell}",
        checks=(plan.result, scale),
    )
    journal.append(entry)
    return entry


# ---------------------------------------------------------------------------------------------
# the catalogue


def test_every_kind_has_a_spec_named_after_it() -> None:
    assert set(CATALOGUE) == set(get_args(LeverKind))
    assert all(spec.kind == kind for kind, spec in CATALOGUE.items())
    assert sorted(ROLLBACK_ORDER) == sorted(CATALOGUE)


def test_rank_follows_the_reference_rollback_order() -> None:
    ranks = [CATALOGUE[k].rank for k in REFERENCE_ORDER]
    assert ranks == sorted(ranks)
    assert len(set(ranks)) == len(ranks)
    assert ranks[0] == 1
    positions = [ROLLBACK_ORDER.index(k) for k in REFERENCE_ORDER]
    assert positions == sorted(positions)
    assert ROLLBACK_ORDER[0] == "kill_switch"
    assert ROLLBACK_ORDER[-1] == "driver_rollback"
    assert CATALOGUE["driver_rollback"].rank > max(
        s.rank for k, s in CATALOGUE.items() if k != "driver_rollback"
    )


@pytest.mark.parametrize(
    ("kind", "role"),
    [
        ("rollout_abort", "model_owner"),
        ("digest_rollback", "model_owner"),
        ("bundle_revert", "model_owner"),
        ("cell_drain", "capacity_lead"),
        ("kill_switch", "security_lead"),
        ("pod_quarantine", "security_lead"),
        ("queue_hold", "ops_lead"),
        ("node_quarantine", "ops_lead"),
    ],
)
def test_who_decides_each_lever(kind: LeverKind, role: str) -> None:
    assert role in CATALOGUE[kind].decided_by


def test_scopes() -> None:
    assert scope_of(Lever("kill_switch", "acme")) == "tenant"
    assert scope_of(Lever("kill_switch", "*")) == "fleet"
    assert scope_of(Lever("cell_drain", "use1-a")) == "cell"
    assert scope_of(Lever("bundle_revert", "llm-70b")) == "fleet"  # the base bundle
    one = RouteWeightParams((("use1-a", 10),))
    two = RouteWeightParams((("use1-a", 10), ("usw2-a", 90)))
    assert scope_of(Lever("route_weight", "llm-70b", one)) == "cell"
    assert scope_of(Lever("route_weight", "llm-70b", two)) == "fleet"  # the global route table


# ---------------------------------------------------------------------------------------------
# what each lever applies (a fresh demo twin: route weights and desired replicas as in the spec)

PLANS: list[tuple[Lever, tuple[Operation, ...]]] = [
    (Lever("kill_switch", "acme"), (ops.SetFlag("acme.max_side_effect", "read"),)),
    (Lever("kill_switch", "*"), (ops.SetFlag(DENY_ALL_FLAG, "true"),)),
    (
        Lever("bundle_revert", "llm-70b", ServingConfigParams(BUNDLE, 256, 0.9)),
        (ops.SetServingConfig("llm-70b", BUNDLE, 256, 0.9),),
    ),
    (
        Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", 10),))),
        (ops.SetRouteWeights("llm-70b", (("use1-a", 10),)),),
    ),
    (Lever("rollout_abort", "llm-70b"), (ops.AbortRollout("llm-70b"),)),
    (Lever("queue_hold", "research-h100"), (ops.SetQueueStopPolicy("research-h100", "Hold"),)),
    (
        Lever("queue_hold", "research-h100", QueueHoldParams("HoldAndDrain")),
        (ops.SetQueueStopPolicy("research-h100", "HoldAndDrain"),),
    ),
    (
        Lever("node_quarantine", SERVE, QuarantineParams("xid79", "INC-4812")),
        (
            ops.Taint(SERVE, "gpu.corp/quarantine", "xid79", "NoSchedule"),
            ops.Label(SERVE, "gpu.corp/quarantine-reason", "xid79"),
            ops.Label(SERVE, "gpu.corp/quarantine-ticket", "INC-4812"),
        ),
    ),
    (Lever("jobset_suspend", "pretrain-405b"), (ops.SuspendJobSet("pretrain-405b"),)),
    (
        Lever("scaler_pause", "use1-a"),
        (ops.PauseScaler("llm-70b", "use1-a", 56), ops.PauseScaler("llm-8b", "use1-a", 128)),
    ),
    (
        Lever("scaler_pause", "use1-a", ModelsParams(("llm-8b",))),
        (ops.PauseScaler("llm-8b", "use1-a", 128),),
    ),
    (Lever("pod_quarantine", "r000000"), (ops.QuarantinePod("r000000"),)),
    (
        Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", OLD_70B)),
        (ops.RestoreDigest("llm-70b", "us-east-1", OLD_70B),),
    ),
    (
        Lever("cell_drain", "use1-a"),
        (  # 100 -> 50 -> 0 of each model's weight
            ops.SetRouteWeights("llm-70b", (("use1-a", 28),)),
            ops.SetRouteWeights("llm-8b", (("use1-a", 64),)),
            ops.SetRouteWeights("llm-70b", (("use1-a", 0),)),
            ops.SetRouteWeights("llm-8b", (("use1-a", 0),)),
        ),
    ),
    (Lever("cell_quarantine", "use1-a"), (ops.QuarantineCell("use1-a"),)),
]


@pytest.mark.parametrize(("lever", "expected"), PLANS, ids=[p[0].kind for p in PLANS])
def test_operations_of_each_lever(lever: Lever, expected: tuple[Operation, ...]) -> None:
    assert operations(lever, fresh()) == expected


def test_driver_rollback_touches_only_the_nodes_on_another_driver() -> None:
    twin = fresh()
    nodes = [n.name for n in twin.node_views(cell="use1-b")]
    for name in (nodes[3], nodes[1]):
        twin.apply(ops.SetNodeVersion(name, "driver", "560.28.03"))
    lever = Lever("driver_rollback", "use1-b", DriverParams("550.90.07"))
    assert operations(lever, twin) == (
        ops.SetNodeVersion(nodes[1], "driver", "550.90.07"),
        ops.SetNodeVersion(nodes[3], "driver", "550.90.07"),
    )
    entry = pull(lever, twin, approvers=[OPS], at_s=0.0, reason="driver regression")
    assert entry.status == "applied"
    assert entry.inverses == (
        ops.SetNodeVersion(nodes[1], "driver", "560.28.03"),
        ops.SetNodeVersion(nodes[3], "driver", "560.28.03"),
    )
    assert {dict(n.versions)["driver"] for n in twin.node_views(cell="use1-b")} == {"550.90.07"}


def test_malformed_or_unknown_requests_are_refused_with_the_reason() -> None:
    twin = fresh()
    no_weights = pull(Lever("route_weight", "llm-70b"), twin, approvers=[OPS], at_s=0, reason="x")
    assert no_weights.status == "refused"
    assert "RouteWeightParams" in no_weights.reason
    nowhere = pull(
        Lever("cell_quarantine", "use9-z"),
        twin,
        approvers=[OPS],
        at_s=0,
        reason="x",
        checks=ran("scale_in_paused"),
    )
    assert nowhere.status == "refused"
    assert "unknown cell 'use9-z'" in nowhere.reason


# ---------------------------------------------------------------------------------------------
# drain headroom


def test_headroom_math_with_plain_numbers() -> None:
    drained = CellLoad("a", offered_rps=300.0, replicas=50, max_rps_per_replica=10.0)
    b = CellLoad("b", offered_rps=250.0, replicas=50, max_rps_per_replica=10.0)
    c = CellLoad("c", offered_rps=250.0, replicas=50, max_rps_per_replica=10.0)
    # Each receiver takes 150 req/s: (250 + 150) / 500 = 80% warm, under the 85% ceiling...
    warm = drain_headroom("m", drained, [b, c], cold_penalty=0.0)
    assert warm.ok
    assert [r.moved_rps for r in warm.receivers] == [150.0, 150.0]
    assert [r.utilization for r in warm.receivers] == pytest.approx([0.80, 0.80])
    # ...but 150 cold requests cost 240 warm ones: (250 + 240) / 500 = 98%.
    cold = drain_headroom("m", drained, [b, c], cold_penalty=0.6)
    assert not cold.ok
    assert [r.utilization_warm for r in cold.receivers] == pytest.approx([0.80, 0.80])
    assert [r.utilization for r in cold.receivers] == pytest.approx([0.98, 0.98])
    assert "b would run at 98% (80% warm) taking 150 req/s" in cold.result.reason


def test_headroom_shares_by_route_weight_and_needs_a_receiver() -> None:
    drained = CellLoad("a", 100.0, 10, 10.0)
    heavy = CellLoad("b", 0.0, 30, 10.0, route_weight=3)
    light = CellLoad("c", 0.0, 10, 10.0, route_weight=1)
    drained_out = CellLoad("d", 0.0, 10, 10.0, route_weight=0)
    h = drain_headroom("m", drained, [heavy, light, drained_out], cold_penalty=0.5)
    assert [(r.cell, r.moved_rps) for r in h.receivers] == [("b", 75.0), ("c", 25.0)]
    assert h.receivers[0].utilization == pytest.approx(75 * 1.5 / 300)
    alone = drain_headroom("m", drained, [drained_out], cold_penalty=0.5)
    assert not alone.ok
    assert "no other cell of the region" in alone.result.reason
    empty = drain_headroom("m", drained, [CellLoad("e", 0.0, 0, 10.0)], cold_penalty=0.5)
    assert not empty.ok  # a receiver with no replicas has no headroom at all


def test_drain_in_us_east_1_fits_two_receivers_but_not_one() -> None:
    twin = demo()
    journal: list[LeverJournalEntry] = []
    plan = drain_check(Lever("cell_drain", "use1-a"), twin, twin, TwinWorld(twin))
    assert plan.result.ok, plan.result.reason
    assert plan.region == "us-east-1"
    assert plan.receivers == ("use1-b", "use1-c")
    nc = len(twin.cell_names)
    chat = next(h for h in plan.headroom if h.model == "llm-70b")
    region_rps = sum(
        twin.lam[twin.model_index["llm-70b"] * nc + twin.cell_index[c]] for c in US_EAST
    )
    assert region_rps == pytest.approx(0.8 * 1016, rel=0.1)  # 00:00 UTC, six hours off peak
    assert chat.moved_rps == pytest.approx(region_rps / 3, rel=0.05)
    assert chat.cold_penalty == pytest.approx(0.6)
    for r in chat.receivers:
        pool = twin.model_index["llm-70b"] * nc + twin.cell_index[r.cell]
        keeps = min(twin.ready[pool], twin.desired[pool])
        assert r.capacity_rps == pytest.approx(keeps * twin.max_rps_per_replica[pool])
        assert r.moved_rps == pytest.approx(chat.moved_rps / 2)
        assert r.utilization == pytest.approx((r.offered_rps + 1.6 * r.moved_rps) / r.capacity_rps)
        # ~256 + 1.6 x 128 req/s on 50 replicas x 13.3 req/s: about 69%
        assert 0.6 < r.utilization < 0.85
    entry = pull_drain_of(twin, "use1-a", journal)
    assert entry.status == "applied"
    assert weight(twin, "llm-70b", "use1-a") == 0
    twin.run_for(60)  # the receivers now carry use1-a's traffic

    second = drain_check(Lever("cell_drain", "use1-b"), twin, twin, TwinWorld(twin))
    assert not second.result.ok
    assert second.receivers == ("use1-c",)
    chat = next(h for h in second.headroom if h.model == "llm-70b")
    (last,) = chat.receivers
    assert last.moved_rps == pytest.approx(region_rps / 2, rel=0.1)
    assert last.utilization_warm > 1.0  # over saturation even before the cold-cache penalty
    assert last.utilization > 1.3
    assert "use1-c would run at" in second.result.reason
    refused = pull_drain_of(twin, "use1-b", journal)
    assert refused.status == "refused"
    assert weight(twin, "llm-70b", "use1-b") == 56


def test_a_drain_without_its_headroom_check_is_refused() -> None:
    twin = demo()
    lever = Lever("cell_drain", "use1-a")
    entry = pull(lever, twin, approvers=[CAP], at_s=60, reason="x", checks=ran("scale_in_paused"))
    assert entry.status == "refused"
    assert "needs the drain_headroom guard" in entry.reason
    assert weight(twin, "llm-70b", "use1-a") == 56


def test_pull_drain_steps_and_holds_when_the_receivers_stay_healthy() -> None:
    twin = demo()
    lever = Lever("cell_drain", "use1-a")
    plan = drain_check(lever, twin, twin, TwinWorld(twin))
    seen: list[tuple[float, tuple[str, ...]]] = []

    def quiet(cells: tuple[str, ...] | list[str]) -> dict[str, float]:
        seen.append((twin.now_s(), tuple(cells)))
        return {c: 1.0 for c in cells}

    entries = pull_drain(
        lever,
        twin,
        twin,
        plan=plan,
        burn_rates=quiet,
        approvers=[CAP],
        reason="drain for driver rollout",
        checks=ran("scale_in_paused"),
        hold_s=30.0,
    )
    assert [e.status for e in entries] == ["applied", "applied"]
    assert [e.ops[0] for e in entries] == [
        ops.SetRouteWeights("llm-70b", (("use1-a", 28),)),
        ops.SetRouteWeights("llm-70b", (("use1-a", 0),)),
    ]
    assert seen == [(90.0, ("use1-b", "use1-c")), (120.0, ("use1-b", "use1-c"))]
    assert weight(twin, "llm-70b", "use1-a") == 0
    assert weight(twin, "llm-8b", "use1-a") == 0


def test_pull_drain_backs_off_when_a_receiver_burns_fast() -> None:
    twin = demo()
    lever = Lever("cell_drain", "use1-a")
    plan = drain_check(lever, twin, twin, TwinWorld(twin))
    assert plan.should_back_off({"use1-b": FAST_BURN})
    assert not plan.should_back_off({"use1-b": FAST_BURN - 0.1, "usw2-a": 99.0})
    entries = pull_drain(
        lever,
        twin,
        twin,
        plan=plan,
        burn_rates=lambda cells: {"use1-c": 20.0},
        approvers=[CAP],
        reason="drain",
        checks=ran("scale_in_paused"),
        hold_s=30.0,
    )
    assert [e.status for e in entries] == ["applied", "applied"]
    assert entries[1].reason.startswith("undo: back off")
    assert "use1-c 20.0x" in entries[1].reason
    assert weight(twin, "llm-70b", "use1-a") == 56  # stepped back from 50% to 100%
    assert weight(twin, "llm-8b", "use1-a") == 128


# ---------------------------------------------------------------------------------------------
# approvals


def test_fleet_scope_needs_two_distinct_approvers() -> None:
    twin = fresh()
    lever = Lever("bundle_revert", "llm-70b", ServingConfigParams(BUNDLE, 128, 0.85))
    one = pull(lever, twin, approvers=[OWNER], at_s=0, reason="KV OOMs after bundle change")
    assert one.status == "refused"
    assert "second approver" in one.reason
    same_person = pull(
        lever, twin, approvers=[OWNER, Approver(" MO ", "model_owner")], at_s=0, reason="x"
    )
    assert same_person.status == "refused"
    assert twin.bundle[0].digest != BUNDLE
    two = pull(lever, twin, approvers=[OWNER, IC], at_s=0, reason="KV OOMs after bundle change")
    assert two.status == "applied", two.reason
    assert twin.bundle[0].digest == BUNDLE
    assert two.approvers == (OWNER, IC)


def test_the_owner_must_be_among_the_approvers() -> None:
    twin = fresh()
    entry = pull(Lever("rollout_abort", "llm-70b"), twin, approvers=[OPS, IC], at_s=0, reason="x")
    assert entry.status == "refused"
    assert "decided by the model_owner" in entry.reason
    ok = pull(Lever("rollout_abort", "llm-70b"), twin, approvers=[OWNER], at_s=0, reason="x")
    assert ok.status == "applied"
    assert not check_approvals("x", [], decided_by={"ops_lead"}, fleet_scope=False).ok


def test_fleet_wide_kill_switch_needs_the_ic_and_security() -> None:
    twin = fresh()
    lever = Lever("kill_switch", "*")
    sev1 = (check_sev1(Sev.SEV1, "deny-all"),)
    two_people = pull(lever, twin, approvers=[SEC, OPS], at_s=0, reason="exfil", checks=sev1)
    assert two_people.status == "refused"
    assert "incident_commander" in two_people.reason
    unchecked = pull(lever, twin, approvers=[SEC, IC], at_s=0, reason="exfil")
    assert unchecked.status == "refused"
    assert "needs the sev1 guard" in unchecked.reason
    sev2_check = (check_sev1(Sev.SEV2, "deny-all"),)
    sev2 = pull(lever, twin, approvers=[SEC, IC], at_s=0, reason="exfil", checks=sev2_check)
    assert sev2.status == "refused"
    assert "SEV1 lever" in sev2.reason
    assert DENY_ALL_FLAG not in twin.flags
    applied = pull(lever, twin, approvers=[SEC, IC], at_s=0, reason="exfil", checks=sev1)
    assert applied.status == "applied"
    assert twin.flags[DENY_ALL_FLAG] == "true"


@pytest.mark.parametrize(
    "approvers",
    [
        (Approver("alice", "security_lead"), Approver("alice", "incident_commander"),
         Approver("bob", "scribe")),
        (Approver("alice", "security_lead"), Approver("Alice", "incident_commander"),
         Approver("bob", "scribe")),
        (Approver("alice", "security_lead"), Approver("ａｌｉｃｅ", "incident_commander")),
        (Approver("alice", "security_lead"), Approver("alice", "incident_commander"), OPS, CAP),
    ],
)  # fmt: skip
def test_fleet_wide_deny_all_needs_two_people_in_the_two_roles(
    approvers: tuple[Approver, ...],
) -> None:
    twin = fresh()
    sev1 = (check_sev1(Sev.SEV1, "deny-all"),)
    entry = pull(
        Lever("kill_switch", "*"), twin, approvers=approvers, at_s=0, reason="x", checks=sev1
    )
    assert entry.status == "refused"
    assert "distinct" in entry.reason
    assert DENY_ALL_FLAG not in twin.flags


def test_role_holders_are_matched_to_distinct_people() -> None:
    def deny_all(*approvers: Approver) -> bool:
        return check_approvals(
            "kill_switch",
            approvers,
            decided_by={"security_lead"},
            fleet_scope=True,
            fleet_roles={"incident_commander"},
        ).ok

    alice_sec, alice_ic = (
        Approver("alice", "security_lead"),
        Approver("alice", "incident_commander"),
    )
    assert not deny_all(alice_sec, alice_ic)
    assert not deny_all(alice_sec, alice_ic, Approver("bob", "scribe"))
    # alice could hold either role; with ivy as commander the two roles have two holders
    assert deny_all(alice_sec, alice_ic, Approver("ivy", "incident_commander"))
    assert deny_all(Approver("ivy", "incident_commander"), alice_sec)


def test_a_caller_made_passing_check_does_not_satisfy_a_guard() -> None:
    twin = fresh()
    lever = Lever("kill_switch", "*")
    forged = (GuardResult(True, "the incident is SEV1, trust me", "sev1"),)
    entry = pull(lever, twin, approvers=[SEC, IC], at_s=0, reason="x", checks=forged)
    assert entry.status == "refused"
    assert "did not come from its guard" in entry.reason
    assert "needs the sev1 guard" in entry.reason
    flipped = (dataclasses.replace(check_sev1(Sev.SEV2, "deny-all"), ok=True),)
    entry = pull(lever, twin, approvers=[SEC, IC], at_s=0, reason="x", checks=flipped)
    assert entry.status == "refused"
    assert DENY_ALL_FLAG not in twin.flags
    # a genuine result stays genuine through copies and pickling (process pools)
    genuine = check_sev1(Sev.SEV1, "deny-all")
    for same in (copy.copy(genuine), copy.deepcopy(genuine), pickle.loads(pickle.dumps(genuine))):
        assert same.genuine
    assert not GuardResult(True, "x", "sev1").genuine
    route = Lever("cell_quarantine", "euw1-b")
    fake_scale = (GuardResult(True, "pinned", "scale_in_paused"),)
    entry = pull(route, twin, approvers=[SEC], at_s=0, reason="x", checks=fake_scale)
    assert entry.status == "refused"


def test_the_global_route_table_needs_a_second_approver() -> None:
    twin = fresh()
    lever = Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", 40), ("usw2-a", 70))))
    checks = ran("scale_in_paused")
    alone = pull(lever, twin, approvers=[CAP], at_s=0, reason="x", checks=checks)
    assert alone.status == "refused"
    both = pull(lever, twin, approvers=[CAP, OPS], at_s=0, reason="x", checks=checks)
    assert both.status == "applied"
    assert weight(twin, "llm-70b", "usw2-a") == 70


# ---------------------------------------------------------------------------------------------
# rollback targets


def test_rollback_targets_are_previous_signed_attested_digests() -> None:
    twin = fresh()
    for digest, signed, attested in (
        (UNSIGNED_70B, False, True),
        (UNATTESTED_70B, True, False),
        (NEW_70B, True, True),
    ):
        twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", digest, signed, attested))

    def check(digest: str) -> GuardResult:
        return rollback_check(
            Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", digest)), TwinWorld(twin)
        )

    assert check(OLD_70B).ok
    assert "not signed" in check(UNSIGNED_70B).reason
    assert "not attested" in check(UNATTESTED_70B).reason
    assert "never published" in check("sha256:" + "00" * 32).reason
    assert "not a digest of llm-70b" in check(OLD_8B).reason

    bad = Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", UNSIGNED_70B))
    unchecked = pull(bad, twin, approvers=[OWNER], at_s=0, reason="x")
    assert unchecked.status == "refused"
    assert "needs the rollback_target guard" in unchecked.reason
    checked = pull(
        bad,
        twin,
        approvers=[OWNER],
        at_s=0,
        reason="x",
        checks=(rollback_check(bad, TwinWorld(twin)),),
    )
    assert checked.status == "refused"
    assert "admission would deny it" in checked.reason

    good = Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", OLD_70B))
    entry = pull(
        good,
        twin,
        approvers=[OWNER],
        at_s=0,
        reason="x",
        checks=(rollback_check(good, TwinWorld(twin)),),
    )
    assert entry.status == "applied"
    assert entry.inverses == (ops.RestoreDigest("llm-70b", "us-east-1", NEW_70B),)
    mi, ri = twin.model_index["llm-70b"], twin.region_index["us-east-1"]
    assert twin.digests[int(twin.region_digest[mi, ri])].digest == OLD_70B


# ---------------------------------------------------------------------------------------------
# scale-in paused first in a registry or hydrate incident


def test_registry_incident_pauses_scale_in_before_a_drain() -> None:
    twin = demo()
    journal: list[LeverJournalEntry] = []
    lever = Lever("cell_drain", "use1-a")
    headroom = drain_check(lever, twin, twin, TwinWorld(twin)).result

    def attempt() -> LeverJournalEntry:
        scale = scale_in_check(lever, twin, incident_tags={"registry"}, journal=journal)
        return pull(
            lever, twin, approvers=[CAP], at_s=twin.now_s(), reason="x", checks=(headroom, scale)
        )

    first = attempt()
    assert first.status == "refused"
    assert "pause scale-in first (scaler_pause)" in first.reason
    assert weight(twin, "llm-70b", "use1-a") == 56

    for cell in US_EAST[:2]:
        journal.append(
            pull(Lever("scaler_pause", cell), twin, approvers=[OPS], at_s=60, reason="registry")
        )
    half = attempt()
    assert half.status == "refused"
    assert "llm-70b@use1-c" in half.reason
    assert "use1-a" not in half.reason.split("pinned:")[1]

    journal.append(
        pull(Lever("scaler_pause", "use1-c"), twin, approvers=[OPS], at_s=60, reason="registry")
    )
    assert all(e.status == "applied" for e in journal)
    assert paused_pools(op for e in journal for op in e.ops) == {
        (m, c) for m in ("llm-70b", "llm-8b") for c in US_EAST
    }
    after = attempt()
    assert after.status == "applied", after.reason
    assert weight(twin, "llm-70b", "use1-a") == 0


def test_scale_in_guard_only_binds_registry_and_hydrate_incidents() -> None:
    twin = demo()
    lever = Lever("cell_drain", "use1-a")
    assert scale_in_check(lever, twin, incident_tags={"latency"}, journal=[]).ok
    assert not scale_in_check(lever, twin, incident_tags={"hydrate"}, journal=[]).ok
    assert scale_in_check(
        Lever("queue_hold", "research-h100"), twin, incident_tags={"registry"}, journal=[]
    ).ok
    paused = pull(Lever("scaler_pause", "use1-a"), twin, approvers=[OPS], at_s=0, reason="x")
    undone = undo(paused, twin, approvers=[OPS], at_s=1, reason="registry back")
    assert undone.status == "applied"
    assert paused_pools([*paused.ops, *undone.ops]) == frozenset()


# ---------------------------------------------------------------------------------------------
# the security floor


@pytest.mark.parametrize("kind", get_args(UnsafeKind))
def test_unsafe_requests_are_always_refused_with_a_reason(kind: UnsafeKind) -> None:
    request = UnsafeRequest(kind, target="us-east-1", requested_by="tired-oncall")
    verdict = refuse_unsafe(request)
    assert not verdict.ok
    assert kind.replace("_", " ") in verdict.reason
    assert "never widens" in verdict.reason
    entry = refuse(request, at_s=12.0)
    assert entry.status == "refused"
    assert entry.kind == kind
    assert entry.ops == ()
    assert entry.inverses == ()
    assert entry.reason.endswith("(requested by tired-oncall)")


def test_each_unsafe_refusal_names_the_safe_path() -> None:
    reasons = {k: refuse_unsafe(UnsafeRequest(k)).reason for k in get_args(UnsafeKind)}
    assert len(set(reasons.values())) == len(reasons)
    assert "signed and attested" in reasons["disable_signature_checks"]
    assert "pre-signed mirror" in reasons["public_bucket"]
    assert "break-glass" in reasons["cluster_admin"]
    assert "quarantine it" in reasons["delete_pod_under_investigation"]


def test_a_kill_switch_never_loosens_a_stricter_one() -> None:
    twin = fresh()
    none = Lever("kill_switch", "acme", KillSwitchParams("none"))
    assert pull(none, twin, approvers=[SEC], at_s=0, reason="x").status == "applied"
    read = pull(Lever("kill_switch", "acme"), twin, approvers=[SEC], at_s=1, reason="x")
    assert read.status == "refused"
    assert "already none, stricter than read" in read.reason
    assert twin.flags["acme.max_side_effect"] == "none"
    key = "acme.max_side_effect"
    assert widens_access(ops.SetFlag(key, "read"), ops.SetFlag(key, "none")) is not None
    assert widens_access(ops.SetFlag(key, "read"), ops.SetFlag(key, None)) is None
    assert widens_access(ops.SetFlag(key, None)) is not None
    assert widens_access(ops.UnquarantinePod("r000000")) is not None
    assert widens_access(ops.Heal("cell-registry", "use1-a", "us-east-1")) is not None


# ---------------------------------------------------------------------------------------------
# inverses: recorded before, and they restore the fleet


def snapshot(twin: Twin) -> dict[str, object]:
    return {
        "weights": twin.weights.tolist(),
        "flags": dict(twin.flags),
        "scaler_paused": twin.scaler_paused.tolist(),
        "cells": [(c.name, c.quarantined, c.route_weights) for c in twin.cells()],
        "pods": set(twin.quarantined_pods),
        "node": twin.node(SERVE),
        "queues": dict(twin.training.stop_policy),
    }


def test_inverses_are_recorded_and_restore_the_twin() -> None:
    twin = demo()
    before = snapshot(twin)
    pinned = {
        m: max(rc.desired, rc.ready)
        for v in twin.cells()
        if v.name == "use1-b"
        for rc in v.replicas
        for m in [rc.model]
    }
    journal: list[LeverJournalEntry] = [
        pull(Lever("scaler_pause", "use1-b"), twin, approvers=[OPS], at_s=60, reason="x"),
        pull(Lever("kill_switch", "acme"), twin, approvers=[SEC], at_s=60, reason="x"),
        pull(Lever("pod_quarantine", "r000000"), twin, approvers=[SEC], at_s=60, reason="x"),
        pull(Lever("node_quarantine", SERVE), twin, approvers=[OPS], at_s=60, reason="x"),
        pull(Lever("queue_hold", "research-h100"), twin, approvers=[OPS], at_s=60, reason="x"),
        pull(
            Lever("cell_quarantine", "euw1-b"),
            twin,
            approvers=[SEC],
            at_s=60,
            reason="x",
            checks=ran("scale_in_paused"),
        ),
    ]
    pull_drain_of(twin, "use1-a", journal)
    assert [e.status for e in journal] == ["applied"] * 7, [e.reason for e in journal]
    assert journal[0].inverses == (
        ops.UnpauseScaler("llm-70b", "use1-b"),
        ops.UnpauseScaler("llm-8b", "use1-b"),
    )
    assert journal[0].ops == tuple(
        ops.PauseScaler(m, "use1-b", n) for m, n in sorted(pinned.items())
    )
    assert journal[1].inverses == (ops.SetFlag("acme.max_side_effect", None),)
    assert journal[2].inverses == (ops.UnquarantinePod("r000000"),)
    assert (
        journal[-1].inverses
        == (
            ops.SetRouteWeights("llm-70b", (("use1-a", 56),)),
            ops.SetRouteWeights("llm-8b", (("use1-a", 128),)),
        )
        * 2
    )
    assert snapshot(twin) != before
    for entry in reversed(journal):
        for op in reversed(entry.inverses):
            twin.apply(op)
    assert snapshot(twin) == before


def test_undo_journals_the_way_back() -> None:
    twin = demo()
    before = snapshot(twin)
    entry = pull_drain_of(twin, "use1-a", [])
    back = undo(entry, twin, approvers=[CAP], at_s=120, reason="driver rollout done")
    assert back.status == "applied"
    assert back.ops == tuple(reversed(entry.inverses))
    assert back.reason == "undo: driver rollout done"
    assert snapshot(twin) == before
    with pytest.raises(FiredrillError):
        undo(
            refuse(UnsafeRequest("public_bucket"), at_s=0), twin, approvers=[CAP], at_s=0, reason=""
        )


def test_dry_run_proposes_and_changes_nothing() -> None:
    twin = demo()
    before = snapshot(twin)
    entry = pull(
        Lever("kill_switch", "acme"), twin, approvers=[SEC], at_s=60, reason="x", dry_run=True
    )
    assert entry.status == "proposed"
    assert entry.inverses == (ops.SetFlag("acme.max_side_effect", None),)
    assert snapshot(twin) == before


class FailingLabels:
    """The demo twin, except that labelling a node fails (an API error mid-lever)."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin

    def __getattr__(self, name: str) -> object:
        return getattr(self.twin, name)

    def apply(self, op: Operation) -> Operation:
        if isinstance(op, ops.Label):
            raise OperationError("the API server said no")
        return self.twin.apply(op)


def test_a_failure_half_way_reverts_what_was_applied() -> None:
    twin = fresh()
    fleet = FailingLabels(twin)
    entry = pull(
        Lever("node_quarantine", SERVE, QuarantineParams("xid79")),
        fleet,  # type: ignore[arg-type]
        approvers=[OPS],
        at_s=0,
        reason="x",
    )
    assert entry.status == "refused"
    assert "the API server said no" in entry.reason
    assert "1 operation(s) applied before it reverted" in entry.reason
    assert twin.node(SERVE).taints == ()


# ---------------------------------------------------------------------------------------------
# property: levers only narrow access

NAMES = st.sampled_from
PARAMS: dict[LeverKind, st.SearchStrategy[LeverParams]] = {
    "kill_switch": st.one_of(
        st.just(NoParams()), st.builds(KillSwitchParams, NAMES(["read", "none"]))
    ),
    "bundle_revert": st.builds(
        ServingConfigParams, NAMES([BUNDLE, OLD_70B]), st.integers(0, 5000), st.floats(0.0, 1.0)
    ),
    "route_weight": st.builds(
        RouteWeightParams,
        st.lists(st.tuples(NAMES(CELLS), st.integers(-5, 200)), max_size=3).map(tuple),
    ),
    "rollout_abort": st.just(NoParams()),
    "queue_hold": st.one_of(
        st.just(NoParams()), st.builds(QueueHoldParams, NAMES(["Hold", "HoldAndDrain"]))
    ),
    "node_quarantine": st.builds(
        QuarantineParams, NAMES(["xid79", "", "bad reason"]), NAMES(["", "INC-1"])
    ),
    "jobset_suspend": st.just(NoParams()),
    "scaler_pause": st.builds(
        ModelsParams, st.lists(NAMES(["llm-70b", "llm-8b"]), max_size=2, unique=True).map(tuple)
    ),
    "pod_quarantine": st.just(NoParams()),
    "driver_rollback": st.builds(DriverParams, NAMES(["550.90.07", "535.183.01"])),
    "digest_rollback": st.builds(
        DigestParams,
        NAMES(["us-east-1", "eu-west-1"]),
        NAMES([OLD_70B, OLD_8B, UNSIGNED_70B]),
    ),
    "cell_drain": st.builds(
        ModelsParams, st.lists(NAMES(["llm-70b", "llm-8b"]), max_size=2, unique=True).map(tuple)
    ),
    "cell_quarantine": st.just(NoParams()),
    "pd_rebalance": st.builds(
        SplitParams, NAMES(["llm-70b", "llm-9t"]), NAMES([0.0, 0.3, 0.6, 1.0])
    ),
    "warm_pool": st.builds(WarmPoolParams, st.integers(-1, 60)),
    "content_block": st.builds(ContentParams, NAMES(["sha256:" + "cc" * 32, ""])),
    "promotion_freeze": st.builds(
        FreezeParams, st.lists(NAMES(["bundle", "toolset"]), max_size=2).map(tuple)
    ),
    "compensation": st.builds(CompensationParams, st.floats(-1.0, 600.0)),
}
TARGETS: dict[LeverKind, list[str]] = {
    "kill_switch": ["acme", "globex", "*"],
    "bundle_revert": ["llm-70b", "llm-8b"],
    "route_weight": ["llm-70b", "llm-8b"],
    "rollout_abort": ["llm-70b", "nope"],
    "queue_hold": ["research-h100", "nope"],
    "node_quarantine": [SERVE, "gpu-use1-b-h100-serve-0001"],
    "jobset_suspend": ["pretrain-405b"],
    "scaler_pause": list(CELLS),
    "pod_quarantine": ["r000000", "r000100", "r999999"],
    "driver_rollback": ["use1-a", "euw1-b"],
    "digest_rollback": ["llm-70b", "llm-8b"],
    "cell_drain": list(CELLS),
    "cell_quarantine": list(CELLS),
    "pd_rebalance": list(CELLS),
    "warm_pool": ["acme", "globex", "nope"],
    "content_block": ["acme", "globex"],
    "promotion_freeze": ["chat", "code", "nope"],
    "compensation": ["acme", "nope"],
}
LEVERS = st.one_of(
    *(
        st.builds(Lever, st.just(kind), NAMES(TARGETS[kind]), PARAMS[kind])
        for kind in sorted(CATALOGUE)
    )
)
EVERY_GUARD = ran("drain_headroom", "scale_in_paused", "rollback_target")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LEVERS, max_size=8), st.booleans())
def test_no_sequence_of_levers_widens_access(sequence: list[Lever], undo_all: bool) -> None:
    twin = fresh()
    twin.apply(ops.SetFlag("globex.max_side_effect", "none"))  # a stricter switch already set
    journal: list[LeverJournalEntry] = []
    for lever in sequence:
        try:
            planned = operations(lever, twin)
        except FiredrillError:
            planned = ()
        for op in planned:
            try:
                before = twin.inverse_of(op)
            except FiredrillError:
                continue
            assert widens_access(op, before) is None, (lever, op)
        entry = pull(
            lever, twin, approvers=EVERYONE, at_s=twin.now_s(), reason="p", checks=EVERY_GUARD
        )
        journal.append(entry)
        for op, inverse in zip(entry.ops, entry.inverses, strict=False):
            assert widens_access(op, inverse) is None
        twin.run_for(5)
    assert twin.flags.get("globex.max_side_effect") == "none"
    if undo_all:  # and the way back restores every route weight
        for entry in reversed(journal):
            if entry.status == "applied":
                assert undo(entry, twin, approvers=EVERYONE, at_s=0, reason="p").status == "applied"
        np.testing.assert_array_equal(twin.weights, fresh().weights)
