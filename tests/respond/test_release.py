"""Release and quality runbooks: rollback targets, canary aborts, bundle reverts, severity."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firedrill.model import operations as ops
from firedrill.model.series import Labels, labels_of
from firedrill.respond.incidents import impact_of
from firedrill.respond.inference import bundle_candidates, parse_serving_config
from firedrill.respond.levers import DigestParams, Lever, ServingConfigParams, rollback_check
from firedrill.respond.release import (
    bad_digests,
    golden_drops,
    quality_runbook,
    rollback_target,
    stable_at_100,
)
from firedrill.respond.responder import RUNBOOKS
from firedrill.respond.severity import Impact, assess
from firedrill.respond.suspects import Symptom, cell_skew, rank, skew_evidence
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET = load_fleet(Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml")
OLD = FLEET.models[0].weights.digest
BAD = "sha256:" + "bd" * 32
UNSIGNED = "sha256:" + "0e" * 32
CANARY = "sha256:" + "ca" * 32
SYMPTOM = Symptom("quality", 600.0, "use1-a", "us-east-1")


def quality_alert(digest: str, drop: str, cell: str = "use1-a") -> Labels:
    return labels_of(
        alertname="ModelQualityBurn",
        severity="page",
        model_name="llm-70b",
        digest=digest,
        cell=cell,
        region="us-east-1",
        golden_drop_pts=drop,
    )


def test_bad_digests_come_from_the_quality_alerts_worst_first() -> None:
    alerts = [
        quality_alert(BAD, "10"),
        quality_alert(BAD, "25", cell="use1-b"),
        quality_alert(CANARY, "5"),
        labels_of(alertname="CellTTFTBurnFast", cell="use1-a"),
    ]
    got = bad_digests(alerts)
    assert [(b.digest, b.drop_pts, b.cells) for b in got] == [
        (BAD, 25.0, ("use1-a", "use1-b")),
        (CANARY, 5.0, ("use1-a",)),
    ]


def test_rollback_goes_to_the_last_signed_and_attested_digest_before_the_bad_one() -> None:
    twin = Twin(FLEET, 3, record=False)
    mid = "sha256:" + "31" * 32
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", mid))
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", UNSIGNED, signed=False))
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", BAD))
    target, passed_over = rollback_target(TwinWorld(twin), "llm-70b", {BAD})
    assert target == mid
    assert len(passed_over) == 1
    assert "not signed" in passed_over[0]
    # with the middle one bad too, back to the spec's digest
    assert rollback_target(TwinWorld(twin), "llm-70b", {BAD, mid})[0] == OLD
    assert rollback_target(TwinWorld(twin), "llm-70b", {BAD, mid, OLD}) == (None, passed_over)


def test_bad_stable_weights_roll_the_region_back_through_the_guard() -> None:
    twin = Twin(FLEET, 3, record=False)
    twin.apply(ops.SetWeightsQuality("llm-70b", BAD, 0.5))
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", BAD))
    (c,) = quality_runbook(SYMPTOM, twin, TwinWorld(twin), alerts=[quality_alert(BAD, "25")])
    assert c.request == Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", OLD))
    assert "last signed and attested" in c.reason
    assert isinstance(c.request, Lever)
    assert rollback_check(c.request, TwinWorld(twin)).ok


def test_a_bad_canary_is_aborted_not_rolled_back() -> None:
    twin = Twin(FLEET, 3, record=False)
    twin.apply(ops.SetWeightsQuality("llm-70b", CANARY, 0.6))
    twin.apply(ops.StartRollout("llm-70b", CANARY, 20))
    (c,) = quality_runbook(SYMPTOM, twin, TwinWorld(twin), alerts=[quality_alert(CANARY, "25")])
    assert c.request == Lever("rollout_abort", "llm-70b")
    assert "20%" in c.reason
    assert OLD in c.reason
    # aborted: the canary is neither running nor stable anywhere, so nothing is left to do
    twin.apply(ops.AbortRollout("llm-70b"))
    alerts = [quality_alert(CANARY, "25")]
    assert quality_runbook(SYMPTOM, twin, TwinWorld(twin), alerts=alerts) == []


def test_stable_at_100_after_an_abort() -> None:
    twin = Twin(FLEET, 3, hours_hint=0.5)
    twin.apply(ops.SetWeightsQuality("llm-70b", CANARY, 0.6))
    twin.run_for(180)  # replicated to every region
    twin.apply(ops.StartRollout("llm-70b", CANARY, 20))
    twin.run_for(600)
    cells = {"use1-a", "usw2-a"}
    running = stable_at_100(twin, twin, "llm-70b", cells)
    assert not running.ok
    assert "still at 20%" in running.reason
    twin.apply(ops.AbortRollout("llm-70b"))
    twin.run_for(15)
    # the canary keeps serving until the stable replicas that replace it are ready
    still = stable_at_100(twin, twin, "llm-70b", cells)
    assert not still.ok
    assert "still on the canary" in still.reason
    twin.run_for(420)  # 11 canary replicas, replaced 4 at a time (4 free nodes per cell)
    ok = stable_at_100(twin, twin, "llm-70b", cells)
    assert ok.ok, ok.reason


def test_golden_drops_read_the_counters_without_an_alert() -> None:
    twin = Twin(FLEET, 3, hours_hint=0.5)
    twin.apply(ops.SetWeightsQuality("llm-70b", BAD, 0.5))
    twin.apply(ops.PromoteDigest("llm-70b", "us-east-1", BAD))
    twin.run_for(1200)
    drops = {(b.model, b.digest): b.drop_pts for b in golden_drops(twin, "use1-a", at_s=twin.t)}
    assert 40 < drops[("llm-70b", BAD)] < 54  # 3% baseline failures vs ~50%
    assert ("llm-8b", FLEET.models[1].weights.digest) not in drops or drops[
        ("llm-8b", FLEET.models[1].weights.digest)
    ] < 3
    (c,) = quality_runbook(SYMPTOM, twin, TwinWorld(twin), signals=twin)  # no alert: read the SLI
    assert c.request == Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", OLD))


def test_bundle_revert_reads_the_config_the_change_replaced() -> None:
    twin = Twin(FLEET, 3, record=False)
    new = "sha256:" + "b2" * 32
    twin.run_for(60)
    twin.apply(ops.SetServingConfig("llm-8b", new, 512, 0.27))
    change = twin.changes(since_s=0.0, cell="use1-a")[0]
    before = FLEET.models[1].bundle
    assert parse_serving_config(change.before) == ServingConfigParams(
        before.digest,
        before.serving_config.max_num_seqs,
        before.serving_config.gpu_memory_utilization,
    )
    assert parse_serving_config(change.after) == ServingConfigParams(new, 512, 0.27)
    assert parse_serving_config("no config here") is None
    suspects = rank(twin.changes(since_s=0.0), Symptom("kv_oom", 120.0, "use1-a", "us-east-1"))
    (c,) = bundle_candidates(suspects)
    config = parse_serving_config(change.before)
    assert config is not None
    assert c.request == Lever("bundle_revert", "llm-8b", config)
    assert "max_num_seqs 512" in c.reason
    assert "0.27" in c.reason
    # a change after onset is not a cause
    late = rank(twin.changes(since_s=0.0), Symptom("kv_oom", 30.0, "use1-a", "us-east-1"))
    assert bundle_candidates(late) == []


def test_the_runbooks_are_registered_by_symptom_kind() -> None:
    assert {"quality", "kv_oom", "pd_imbalance"} <= set(RUNBOOKS)


# --- severity: fast and wrong is at least as severe as the same share failing ----------------


@given(
    drop=st.sampled_from(["5", "10", "25"]),
    paid=st.booleans(),
    regions=st.integers(1, 3),
)
def test_a_quality_page_rates_at_least_a_same_size_outage(
    drop: str, paid: bool, regions: int
) -> None:
    names = ("us-east-1", "us-west-2", "eu-west-1")[:regions]
    alerts = [
        labels_of(
            alertname="ModelQualityBurn",
            severity="page",
            golden_drop_pts=drop,
            digest=BAD,
            cell=f"{r}-a",
            region=r,
            product="chat",
        )
        for r in names
    ]
    quality = assess(impact_of(alerts, paid_products={"chat"} if paid else ()))
    outage = assess(
        Impact(
            requests_failed_frac=float(drop) / 100.0,
            paid_tier=paid,
            regions_affected=regions,
        )
    )
    assert quality.sev <= outage.sev
    assert quality.deciding_axis == "quality"
    assert quality.axes["users"].level.name == "NONE"  # wrong answers burn no latency budget


def test_a_fast_and_wrong_digest_at_25_points_is_sev1() -> None:
    sev = assess(impact_of([quality_alert(BAD, "25"), quality_alert(BAD, "10")])).sev
    assert sev.name == "SEV1"


# --- version skew: part of the evidence ------------------------------------------------------


def test_cell_skew_counts_gpu_nodes_per_version() -> None:
    twin = Twin(FLEET, 3, record=False)
    nodes = [v.name for v in twin.node_views(cell="use1-a")][:10]
    for n in nodes:
        twin.apply(ops.SetNodeVersion(n, "driver", "560.35.03"))
    twin.apply(ops.SetNodeVersion(nodes[0], "kernel", "6.8.0-1020"))  # not a skew component
    skew = cell_skew(twin.node_views(cell="use1-a"))
    assert set(skew) == {"driver", "node_image", "dcgm_exporter"}
    assert skew["driver"] == {"550.90.07": 66, "560.35.03": 10}
    assert skew_evidence(skew) == ["driver skew: 550.90.07 ×66, 560.35.03 ×10"]
    assert cell_skew(twin.node_views(cell="use1-b"))["driver"] == {"550.90.07": 76}


@pytest.mark.parametrize("text", ["sha256:abc seqs=1 gmu=0.9", "sha256:" + "a" * 64 + " seqs=x"])
def test_malformed_bundle_text_is_not_a_config(text: str) -> None:
    assert parse_serving_config(text) is None
