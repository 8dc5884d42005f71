"""The inference, release and quality scenarios end where their runbooks say they should.

Each runs on the twin with the responder in auto mode; besides its own expectations, the fleet
it leaves behind is checked: the weights, the bundle label, the rollout and the split are back
where the lever put them, and the incident JSON carries the evidence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from firedrill.scenario.expect import evaluate
from firedrill.scenario.report import to_json
from firedrill.scenario.run import ScenarioRun, run_scenario
from firedrill.specfile import load_scenario
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld, embedded_world

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def twin_of(run: ScenarioRun) -> Twin:
    """The embedded twin the scenario ran on (these tests look at its state)."""
    assert isinstance(run.world, TwinWorld)
    return run.world.twin


def run(name: str) -> tuple[ScenarioRun, dict[str, Any]]:
    spec, fleet, slo, policy = load_scenario(SCENARIOS / f"{name}.yaml")
    r = run_scenario(spec, fleet, slo, policy, make_world=embedded_world)
    checks = evaluate(r, list(spec.expect))
    data = to_json(r, checks, spec_sha256="test")
    assert data["passed"], json.dumps(data["expectations"], indent=1)
    return r, data


def incidents(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = data["incidents"]
    assert isinstance(out, list)
    return out


def test_fast_and_wrong_weights_are_rolled_back_in_every_region() -> None:
    r, data = run("fast-and-wrong-digest")
    twin = twin_of(r)
    m = twin.model_index["llm-70b"]
    old = twin.spec.models[m].weights.digest
    assert {twin.digests[int(d)].digest for d in twin.region_digest[m]} == {old}
    quality = [i for i in incidents(data) if i["deciding_axis"] == "quality"]
    assert quality
    assert all(i["sev"] == "SEV1" for i in quality)
    rollbacks = [lv for i in quality for lv in i["levers"] if lv["kind"] == "digest_rollback"]
    assert {lv["status"] for lv in rollbacks} == {"applied"}
    for inc in quality:
        # what changed, with skew: node-layer versions of the cell's GPU nodes
        assert set(inc["version_skew"]) == {"driver", "node_image", "dcgm_exporter"}
        assert inc["skew_evidence"] == []


def test_a_bad_canary_is_aborted_and_stable_serves_everything() -> None:
    r, data = run("bad-canary")
    twin = twin_of(r)
    assert twin.rollout[twin.model_index["llm-70b"]] is None
    assert np.all(twin.golden.canary_share() == 0.0)
    kinds = [lv["kind"] for i in incidents(data) for lv in i["levers"]]
    assert "rollout_abort" in kinds
    assert "digest_rollback" not in kinds


def test_a_bundle_revert_puts_the_last_known_good_config_back() -> None:
    r, _ = run("bundle-kv-oom")
    twin = twin_of(r)
    m = twin.model_index["llm-8b"]
    assert twin.bundle[m] == twin.spec.models[m].bundle


def test_the_split_is_rebalanced_with_the_scaler_pinned() -> None:
    r, data = run("pd-imbalance")
    twin = twin_of(r)
    assert twin.pd is not None
    assert twin.pd.share.tolist() == [0.55, 0.55]
    assert np.all(twin.scaler_paused >= 0)  # pinned before the split moved
    inc = incidents(data)[0]
    kinds = [lv["kind"] for lv in inc["levers"]]
    assert kinds[:2] == ["scaler_pause", "pd_rebalance"]


def test_the_same_scenario_and_seed_give_the_same_json() -> None:
    _, a = run("pd-imbalance")
    _, b = run("pd-imbalance")
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_a_policy_without_break_glass_kinds_still_needs_a_grant_for_a_rollback() -> None:
    """``breakglass: []`` cannot take digest_rollback out of break-glass: each rollback the
    responder applies in auto mode is under a two-person grant, and each use pages security."""
    spec, fleet, slo, policy = load_scenario(SCENARIOS / "fast-and-wrong-digest.yaml")
    assert spec.responder is not None
    responder = spec.responder.model_copy(update={"breakglass": []})
    r = run_scenario(spec.model_copy(update={"responder": responder}), fleet, slo, policy)
    data = to_json(r, evaluate(r, list(spec.expect)), spec_sha256="test")
    applied = [
        (inc, lv)
        for inc in incidents(data)
        for lv in inc["levers"]
        if lv["kind"] == "digest_rollback" and lv["status"] == "applied"
    ]
    assert applied
    for inc, lv in applied:
        assert lv["breakglass"] is not None
        (grant,) = [g for g in inc["breakglass"] if g["grant"] == lv["breakglass"]]
        assert grant["security_pages"]
        assert set(grant["approvers"]) == {"ic-oncall", "security-lead"}
