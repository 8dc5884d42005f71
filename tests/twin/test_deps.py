"""Hidden dependencies break what they should, only when a cut separates user and service; probes,
per-region admission with its ready-gate, and the failback's routing knobs.

Two regions, ``a`` (cell c0-0) and ``b`` (cell c1-0, replicating weights from ``a``), 16 nodes and
10 llm-70b replicas each; every service lives in ``a`` and is used by both.
"""

from __future__ import annotations

import numpy as np
import pytest

from firedrill.errors import OperationError
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec, RegistrySpec, ServiceKind, ServiceSpec
from firedrill.twin.engine import READY, Twin
from firedrill.twin.replica import ReplicaState
from tests.twin.fleets import D, fleet, model

NEW = "sha256:" + "12" * 32
BAD = "sha256:" + "66" * 32
CUT = ops.Partition("region-region", "a", "b")


def two_regions(*kinds: ServiceKind, p2p: bool = True, rps: float = 40.0) -> FleetSpec:
    reg = RegistrySpec(p2p=p2p)
    spec = fleet(regions={"a": (1, 16, 10, rps), "b": (1, 16, 10, rps)}, m=model(), registry=reg)
    regions = [spec.regions[0], spec.regions[1].model_copy(update={"replicate_from": "a"})]
    services = [ServiceSpec(name=f"{k.replace('_', '-')}-a", kind=k, region="a") for k in kinds]
    return FleetSpec.model_validate(
        {**spec.model_dump(), "regions": [r.model_dump() for r in regions], "services": services}
    )


def failures(twin: Twin, kind: str, region: str) -> float:
    deps = twin.recovery.deps
    return float(
        sum(
            deps.failures[i, twin.region_index[region]]
            for i, s in enumerate(deps.services)
            if s.kind == kind
        )
    )


@pytest.mark.parametrize("cut", [False, True])
def test_tokenizer_cut_stops_new_replicas_not_serving_ones(cut: bool) -> None:
    twin = Twin(two_regions("tokenizer"), seed=1)
    if cut:
        twin.apply(CUT)
    twin.apply(ops.SetReplicas("llm-70b", "c1-0", 12))
    twin.apply(ops.SetReplicas("llm-70b", "c0-0", 12))
    twin.run_for(300)
    b, a = twin.cells()[1].replicas[0], twin.cells()[0].replicas[0]
    assert a.ready == 12  # the tokenizer's own region is never cut from it
    if cut:
        assert (b.ready, b.loading) == (10, 2)
        assert failures(twin, "tokenizer", "b") > 0
        twin.apply(ops.Heal("region-region", "a", "b"))
        twin.run_for(60)
        assert twin.cells()[1].replicas[0].ready == 12
    else:
        assert b.ready == 12
        assert failures(twin, "tokenizer", "b") == 0


def test_bundle_api_cut_refuses_bundle_changes_and_changes_nothing() -> None:
    twin = Twin(two_regions("bundle_api"), seed=1)
    change = ops.SetServingConfig("llm-70b", NEW, 128, 0.9)
    twin.apply(CUT)
    before = twin.bundle[0]
    with pytest.raises(OperationError, match="CatalogBundle API 'bundle-api-a' in a"):
        twin.apply(change)
    assert twin.bundle[0] == before
    assert twin.journal[-1].op == CUT
    assert failures(twin, "bundle_api", "b") == 1
    twin.apply(ops.Heal("region-region", "a", "b"))
    twin.apply(change)
    assert twin.bundle[0].digest == NEW


@pytest.mark.parametrize("cut", [False, True])
def test_signature_mirror_cut_fails_admission_closed_for_new_digests(cut: bool) -> None:
    twin = Twin(two_regions("signature_mirror"), seed=1)
    if cut:
        twin.apply(CUT)
    twin.apply(ops.PromoteDigest("llm-70b", "b", NEW))  # published in b's own registry
    twin.run_for(120)
    new = twin.digest_index[NEW]
    running_new = sum(1 for r in twin.replicas if r.digest == new and r.state != ReplicaState.GONE)
    decisions = twin.recovery.admission.decisions
    unverifiable = decisions.get((1, new, "deny", "signature_unverifiable"), 0)
    if cut:
        assert running_new == 0
        assert unverifiable > 0
        assert twin.cells()[1].replicas[0].ready == 10  # the old digest keeps serving
        assert failures(twin, "signature_mirror", "b") > 0
    else:
        assert running_new > 0
        assert unverifiable == 0
    # digests b already verified are still admitted through the cut
    assert decisions.get((1, new, "admit", "verified"), 0) == (0 if cut else running_new)


@pytest.mark.parametrize("cut", [False, True])
def test_idp_cut_fails_probes_with_auth_errors(cut: bool) -> None:
    twin = Twin(two_regions("idp"), seed=1)
    if cut:
        twin.apply(CUT)
    twin.run_for(120)
    probes = {
        (s.label("region"), s.label("result")): s.values[-1]
        for s in twin.query("firedrill_probe_requests_total", start_s=120, end_s=120)
    }
    assert probes[("a", "ok")] == 9  # 120 s at a 15 s scrape, and one at t=0
    assert probes[("b", "auth_failed")] == (8 if cut else 0)
    assert probes[("b", "ok")] == (1 if cut else 9)
    ttft = twin.query("firedrill_probe_ttft_seconds", {"region": "b"}, start_s=120, end_s=120)
    assert np.isnan(ttft[0].values[-1]) == cut


@pytest.mark.parametrize("cut", [False, True])
def test_registry_cut_stops_origin_pulls(cut: bool) -> None:
    twin = Twin(two_regions("registry", p2p=False), seed=1)
    if cut:
        twin.apply(CUT)
    twin.apply(ops.SetReplicas("llm-70b", "c1-0", 12))
    twin.run_for(120)
    b = twin.cells()[1].replicas[0]
    assert b.ready == (10 if cut else 12)
    assert (b.pulling == 2) == cut
    assert (failures(twin, "registry", "b") > 0) == cut


def test_no_service_declared_means_nothing_breaks() -> None:
    twin = Twin(two_regions(), seed=1)
    twin.apply(CUT)
    twin.apply(ops.SetReplicas("llm-70b", "c1-0", 12))
    twin.apply(ops.SetServingConfig("llm-70b", NEW, 128, 0.9))
    twin.run_for(300)
    assert twin.cells()[1].replicas[0].ready == 12
    assert "firedrill_dependency_failures_total" not in twin.series_names()


def test_edge_cut_makes_the_regions_services_unreachable_for_others() -> None:
    twin = Twin(two_regions("idp"), seed=1)
    twin.apply(ops.Partition("region-edge", "a", "edge"))
    twin.run_for(30)
    deps = twin.recovery.deps
    assert deps.reach().tolist() == [[True, False]]
    assert deps.probes[0, 0].tolist() == [1.0, 2.0, 0.0]  # a: ok at t=0, then through a cut edge
    assert deps.probes[0, 1, 2] == 2.0  # b: no token


# -- admission and the ready-gate ---------------------------------------------------------------


def test_paused_replication_keeps_the_survivor_on_its_attested_digest() -> None:
    twin = Twin(two_regions(), seed=1)
    old = twin.digest_index[D]
    twin.apply(ops.PauseReplication("a", "b"))
    twin.apply(ops.PromoteDigest("llm-70b", "a", NEW))
    twin.apply(ops.StartRollout("llm-70b", NEW, 50))  # a global canary: b cannot run it yet
    twin.run_for(600)
    new = twin.digest_index[NEW]
    b_digests = {r.digest for r in twin.replicas if r.cell == 1 and r.state == READY}
    assert b_digests == {old}
    assert twin.recovery.admission.gate_refusals[(1, new)] > 0
    assert twin.cells()[1].replicas[0].ready == 10
    info = twin.instant("firedrill_weights_digest_info", {"region": "b"})
    assert [dict(lab)["digest"] for lab, v in zip(info[1], info[2], strict=True) if v == 1] == [D]

    twin.apply(ops.ResumeReplication("a", "b"))
    twin.run_for(1200)  # lands after the lag, then rolls one replica at a time (10% surge)
    assert {r.digest for r in twin.replicas if r.cell == 1 and r.state == READY} == {new}


@pytest.mark.parametrize(
    ("mode", "admitted"), [("Enforce", False), ("Audit", True), ("Ignore", True)]
)
def test_admission_mode_decides_whether_an_unsigned_digest_runs(mode: str, admitted: bool) -> None:
    twin = Twin(two_regions(), seed=1)
    twin.apply(ops.SetAdmission("b", mode))  # type: ignore[arg-type]
    twin.apply(ops.PromoteDigest("llm-70b", "b", BAD, signed=False))
    twin.run_for(60)
    bad = twin.digest_index[BAD]
    decisions = twin.recovery.admission.decisions
    assert (decisions.get((1, bad, "admit", "unsigned"), 0) > 0) == admitted
    assert (decisions.get((1, bad, "deny", "unsigned"), 0) > 0) == (not admitted)
    series = twin.query(
        "firedrill_admission_requests_total", {"digest": BAD}, start_s=0, end_s=twin.t
    )
    assert {s.label("decision") for s in series} == {"admit" if admitted else "deny"}


# -- region weight and mirroring ----------------------------------------------------------------


def test_region_weight_sends_a_share_of_the_users_home() -> None:
    twin = Twin(two_regions(rps=40.0), seed=1)
    twin.apply(ops.SetRouteWeights("llm-70b", (("c0-0", 0),)))
    twin.run_for(5)
    assert twin.lam.tolist() == pytest.approx([0.0, 80.0])
    twin.apply(ops.SetRouteWeights("llm-70b", (("c0-0", 10),)))
    twin.apply(ops.SetRegionWeight("llm-70b", "a", 0))
    twin.run_for(5)
    assert twin.lam.tolist() == pytest.approx([0.0, 80.0])
    for pct in (10, 40, 70, 100):
        twin.apply(ops.SetRegionWeight("llm-70b", "a", pct))
        twin.run_for(5)
        assert twin.lam.tolist() == pytest.approx([0.4 * pct, 80.0 - 0.4 * pct])
    assert not twin.recovery.homing.rerouting


def test_mirrored_traffic_warms_the_idle_primary() -> None:
    twin = Twin(two_regions(rps=40.0), seed=1)
    twin.apply(ops.SetRouteWeights("llm-70b", (("c0-0", 0),)))
    twin.run_for(3600)  # an hour without traffic: the cache forgot
    assert twin.lam_warm[0] < 0.1
    twin.apply(ops.MirrorTraffic("llm-70b", "a", 100))
    twin.run_for(600)  # one time constant
    warm = twin.instant("firedrill_prefix_cache_warm_requests_per_second", {"region": "a"})[2]
    mirrored = twin.instant("firedrill_mirrored_requests_per_second", {"region": "a"})[2]
    assert mirrored[0] == pytest.approx(40.0)
    assert warm[0] == pytest.approx(40.0 * (1 - np.exp(-1)), rel=0.05)
    assert twin.lam[0] == 0.0  # mirrored requests serve no user
