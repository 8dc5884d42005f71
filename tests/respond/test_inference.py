"""Inference runbooks: the prefill/decode rebalance (scaler pinned first), the KV bundle revert."""

from __future__ import annotations

from pathlib import Path

import pytest

from firedrill.model import operations as ops
from firedrill.respond.guards import Approver
from firedrill.respond.inference import balanced_share, pd_runbook
from firedrill.respond.levers import Lever, ModelsParams, SplitParams, pull, undo
from firedrill.respond.responder import RUNBOOKS, RunbookContext
from firedrill.respond.suspects import Symptom, rank
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PD = load_fleet(EXAMPLES / "fleet-pd.yaml")
DEMO = load_fleet(EXAMPLES / "fleet.yaml")
CAPACITY = Approver("cap", "capacity_lead")
SYMPTOM_A = Symptom("pd_imbalance", 0.0, "use1-pd-a", "us-east-1")


@pytest.mark.parametrize(
    ("need_p", "need_d", "share"),
    [(5.0, 5.0, 0.5), (11.7, 8.8, 0.55), (1.0, 99.0, 0.1), (99.0, 1.0, 0.9), (0.0, 0.0, 0.5)],
)
def test_balanced_share_loads_both_roles_alike(need_p: float, need_d: float, share: float) -> None:
    assert balanced_share(need_p, need_d) == share


def shifted(seconds: float = 600.0) -> Twin:
    twin = Twin(PD, 3, hours_hint=0.5)
    twin.run_for(120)
    twin.apply(ops.SetRequestShape("llm-70b", 2000.0, 250.0))
    twin.run_for(seconds)
    return twin


def test_a_balanced_pool_gets_no_lever() -> None:
    twin = Twin(PD, 3, hours_hint=0.2)
    twin.run_for(600)
    assert pd_runbook(SYMPTOM_A, twin, at_s=twin.t) == []


def test_long_prompts_pin_the_scaler_then_move_the_split_to_prefill() -> None:
    twin = shifted()
    pin, rebalance = pd_runbook(SYMPTOM_A, twin, at_s=twin.t)
    assert pin.request == Lever("scaler_pause", "use1-pd-a", ModelsParams(("llm-70b",)))
    assert pin.prerequisite
    assert rebalance.request == Lever("pd_rebalance", "use1-pd-a", SplitParams("llm-70b", 0.55))
    assert not rebalance.prerequisite
    assert "prefill saturated" in rebalance.reason
    assert "40% -> 55%" in rebalance.reason


def test_the_rebalance_lever_is_reversible_and_decided_by_capacity() -> None:
    twin = shifted(300.0)
    assert twin.pd is not None
    lever = Lever("pd_rebalance", "use1-pd-a", SplitParams("llm-70b", 0.55))
    refused = pull(lever, twin, approvers=[Approver("ops", "ops_lead")], at_s=twin.t, reason="x")
    assert refused.status == "refused"
    assert "capacity_lead" in refused.reason
    entry = pull(lever, twin, approvers=[CAPACITY], at_s=twin.t, reason="prefill saturated")
    assert entry.status == "applied"
    assert entry.inverses == (ops.SetPrefillDecodeSplit("llm-70b", "use1-pd-a", 0.4),)
    p = twin.cell_index["use1-pd-a"]
    assert twin.pd.share[p] == 0.55
    twin.run_for(600)
    assert twin.pd.waiting()[p] < 20  # the backlog drained
    back = undo(entry, twin, approvers=[CAPACITY], at_s=twin.t, reason="test")
    assert back.status == "applied"
    assert twin.pd.share[p] == 0.4


def test_the_rebalance_is_refused_where_nothing_is_disaggregated() -> None:
    twin = Twin(DEMO, 3, record=False)
    lever = Lever("pd_rebalance", "use1-a", SplitParams("llm-70b", 0.5))
    entry = pull(lever, twin, approvers=[CAPACITY], at_s=0.0, reason="x")
    assert entry.status == "refused"
    assert "not served disaggregated" in entry.reason
    bad = Lever("pd_rebalance", "use1-a", SplitParams("llm-70b", 1.0))
    assert "strictly within 0..1" in pull(bad, twin, approvers=[CAPACITY], at_s=0, reason="").reason


def test_the_kv_runbook_reverts_the_bundle_before_the_serving_levers() -> None:
    twin = Twin(DEMO, 3, record=False)
    twin.run_for(60)
    twin.apply(ops.SetServingConfig("llm-8b", "sha256:" + "b2" * 32, 512, 0.27))
    symptom = Symptom("kv_oom", 300.0, "use1-a", "us-east-1")
    ctx = RunbookContext(
        incident_id="INC-1",
        symptom=symptom,
        suspects=tuple(rank(twin.changes(since_s=0.0), symptom)),
        fleet=twin,
        at_s=300.0,
        signals=twin,
        catalog=TwinWorld(twin),
    )
    kinds = [c.request.kind for c in RUNBOOKS["kv_oom"](ctx)]
    assert kinds[0] == "bundle_revert"
    assert "cell_drain" in kinds  # the serving runbook's levers follow


def test_the_pd_runbook_needs_signals() -> None:
    twin = shifted(60.0)
    ctx = RunbookContext("INC-1", SYMPTOM_A, (), twin, twin.t)
    assert RUNBOOKS["pd_imbalance"](ctx) == []
    with_signals = RunbookContext("INC-1", SYMPTOM_A, (), twin, twin.t, signals=twin)
    assert RUNBOOKS["pd_imbalance"](with_signals)
