"""The recovery half of a drill, measured through the ports: hydrate numbers, competing pullers on
the timeline, hidden dependencies, the security floor, and the failback state machine.

Fleet: regions ``a`` (primary, cell c0-0) and ``b`` (survivor, cell c1-0, replicating from ``a``),
16 nodes and 10 llm-70b replicas each, 40 requests/s of users per region, autoscaling off.
"""

from __future__ import annotations

import itertools
import math

import pytest

from firedrill.drill.recovery import (
    Failback,
    dependency_findings,
    hydrate_stats,
    puller_ops,
    security_floor,
)
from firedrill.drill.spec import DrillSpec, FailbackSpec
from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec, LatencySpec, ServiceSpec
from firedrill.twin.engine import Twin
from tests.shapes import dig, num, recs, seq
from tests.twin.fleets import D, fleet, model

MODEL = "llm-70b"
NEW = "sha256:" + "12" * 32
BAD = "sha256:" + "66" * 32
PLAN = FailbackSpec(enabled=True, probe_green="2m", step_hold="2m", hysteresis="4m")


def two_regions(services: list[ServiceSpec] | None = None) -> FleetSpec:
    # a short cache time constant so that the failback's warm-up takes a minute, not ten
    m = model(latency=LatencySpec(cold_cache_decay_s=60.0))
    spec = fleet(regions={"a": (1, 16, 10, 40.0), "b": (1, 16, 10, 40.0)}, m=m)
    regions = [spec.regions[0], spec.regions[1].model_copy(update={"replicate_from": "a"})]
    return FleetSpec.model_validate(
        {
            **spec.model_dump(),
            "regions": [r.model_dump() for r in regions],
            "services": services or [],
        }
    )


def drill(**extra: object) -> DrillSpec:
    return DrillSpec.model_validate(
        {
            "name": "l5-test",
            "rung": "L5",
            "fleet": "fleet.yaml",
            "slo": "slo.yaml",
            "target": {"model": MODEL, "region": "a"},
            "survivor": "b",
            **extra,
        }
    )


def failed_over(seed: int = 5, services: list[ServiceSpec] | None = None) -> Twin:
    """The primary's users on the survivor for five minutes."""
    twin = Twin(two_regions(services), seed=seed, hours_hint=1.0)
    twin.apply(ops.SetRouteWeights(MODEL, (("c0-0", 0),)))
    twin.run_for(300)
    return twin


def run_failback(twin: Twin, fb: Failback, *, until_s: float = 3600.0, each: object = None) -> None:
    while not fb.done and twin.t < until_s:
        fb.tick(twin.t)
        if callable(each):
            each()
        twin.run_for(15)


# -- hydrate ----------------------------------------------------------------------------------


def test_hydrate_stats_measure_a_scale_out_in_the_survivor() -> None:
    twin = failed_over()
    start = twin.t
    twin.apply(ops.SetReplicas(MODEL, "c1-0", 14))
    twin.run_for(300)
    st = hydrate_stats(
        twin, region="b", model=MODEL, start_s=start, end_s=twin.t, slo_ttft_s=2.0, slo_hold_s=60
    )
    assert st["replicas_became_ready"] == 4
    assert st["gbytes_pulled"] == pytest.approx(4 * 140.0)
    assert 0.0 < num(st["p2p_hit_rate"]) < 1.0
    # below the 50 GB/s line rate: four pulls share the 100 GB/s origin (25 each) and the
    # swarm's upload (5 GB/s per holder), so each node moves 37.5-40 GB/s
    nic = twin.nodes[0].nic_gbps
    assert 0.7 * nic <= num(st["peak_gbps_per_node"]) < nic
    # 140 GB at ~39 GB/s, 28 s load, 20 s warm-up after the next 5 s reconcile
    assert 45 <= num(st["first_ready_s"]) <= 90
    assert st["time_to_slo_s"] == 0.0  # the survivor had the headroom all along
    assert seq(st["ready_curve"])[0] == [0.0, 10]
    assert dig(st["ready_curve"], -1, 1) == 14
    # the four clients ask the origin for what peers cannot seed (150 GB/s > 100): it answers
    # 429, at most parallel_gets / back-off per client per second while they pull
    assert 0 < num(st["origin_errors"]) <= 4 * 16 / 2.0 * num(st["first_ready_s"])


def test_time_to_slo_waits_for_the_ttft_to_come_back() -> None:
    twin = Twin(two_regions(), seed=5, hours_hint=1.0)
    twin.apply(ops.SetReplicas(MODEL, "c1-0", 2))  # 2 replicas for 40 requests/s: overloaded
    twin.run_for(300)
    start = twin.t
    twin.apply(ops.SetReplicas(MODEL, "c1-0", 10))
    twin.run_for(600)
    st = hydrate_stats(
        twin, region="b", model=MODEL, start_s=start, end_s=twin.t, slo_ttft_s=2.0, slo_hold_s=120
    )
    assert st["min_ready"] == 2
    assert st["first_ready_s"] is not None
    assert st["time_to_slo_s"] is not None
    # the queue has to drain and the 60 s TTFT window has to forget it
    assert num(st["time_to_slo_s"]) > num(st["first_ready_s"])
    assert num(st["time_to_slo_s"]) < 300


# -- competing pullers on the timeline ---------------------------------------------------------


def test_puller_ops_put_the_pullers_and_the_freeze_on_the_timeline() -> None:
    spec = drill(
        injections=[{"at": "5m", "kind": "region_blackhole", "region": "a"}],
        competing_pullers=[
            {"name": "eval-sweep", "region": "b", "at": "6m", "nodes": 8, "gbytes": 140},
            {
                "name": "nightly",
                "region": "b",
                "at": "1m",
                "nodes": 4,
                "gbytes": 16,
                "critical": True,
            },
        ],
    )
    timeline = puller_ops(spec)
    assert timeline == [
        (60.0, ops.StartPullers("nightly", "b", 4, 16.0, "batch", True)),
        (300.0, ops.FreezePullers("a", True)),
        (300.0, ops.FreezePullers("b", True)),
        (360.0, ops.StartPullers("eval-sweep", "b", 8, 140.0, "batch", False)),
    ]
    spec = spec.model_copy(update={"freeze_competitors": False})
    assert not any(isinstance(op, ops.FreezePullers) for _, op in puller_ops(spec))


# -- hidden dependencies ------------------------------------------------------------------------


def test_dependency_findings_list_what_crosses_the_cut_and_what_it_broke() -> None:
    services = [
        ServiceSpec(name="tokenizer", kind="tokenizer", region="a"),
        ServiceSpec(name="idp", kind="idp", region="a"),
        ServiceSpec(name="bundle-api", kind="bundle_api", region="a", used_by=["a", "b"]),
        ServiceSpec(name="tuf-b", kind="signature_mirror", region="b", used_by=["b"]),
        ServiceSpec(name="tuf-a", kind="signature_mirror", region="a", used_by=["a"]),
    ]
    twin = failed_over(services=services)
    start = twin.t
    twin.apply(ops.Partition("region-region", "a", "b"))
    twin.apply(ops.SetReplicas(MODEL, "c1-0", 12))  # the survivor scales out
    twin.run_for(300)
    found = dependency_findings(twin.spec, twin, cut=["a"], start_s=start, end_s=twin.t)
    assert [(f["service"], f["observed"], f["crosses_cut"]) for f in found] == [
        ("idp", True, ["b"]),
        ("tokenizer", True, ["b"]),
        ("bundle-api", False, ["b"]),  # nothing tried to change the bundle
    ]
    tok = found[1]
    assert tok["lives_in"] == "a"
    assert tok["kind"] == "tokenizer"
    assert "could not finish loading" in str(tok["broke"])
    assert "failed replica starts in b" in str(dig(tok, "evidence", "b"))
    assert str(found[2]["broke"]).startswith("not exercised")


# -- security floor -----------------------------------------------------------------------------


def _floor_drill(twin: Twin) -> list[dict[str, object]]:
    twin.run_for(60)
    twin.apply(ops.PauseReplication("a", "b"))
    twin.apply(ops.PromoteDigest(MODEL, "b", BAD, signed=False))  # the bad-digest injection
    twin.run_for(60)
    twin.apply(ops.RestoreDigest(MODEL, "b", D))
    twin.apply(ops.PromoteDigest(MODEL, "a", NEW))  # a new digest while replication is paused
    twin.apply(ops.StartRollout(MODEL, NEW, 20))
    twin.run_for(600)
    twin.apply(ops.ResumeReplication("a", "b"))
    twin.run_for(300)
    return security_floor(twin, drill(), twin.journal, end_s=twin.t)


def test_security_floor_holds_on_a_correct_twin() -> None:
    checks = _floor_drill(Twin(two_regions(), seed=5, hours_hint=0.5))
    assert [c["check"] for c in checks] == [
        "bad_digest_denied_everywhere",
        "no_unsigned_digest_admitted",
        "survivor_serves_last_attested_digest",
        "ready_gate_refuses_unlanded_digest",
        "admission_never_ignore",
    ]
    assert all(c["passed"] for c in checks), checks
    assert all(c["status"] == "passed" for c in checks), checks
    assert "denied in b" in str(checks[0]["detail"])
    assert "refused" in str(checks[3]["detail"])


def test_security_floor_fails_when_admission_lets_the_bad_digest_in() -> None:
    twin = Twin(two_regions(), seed=5, hours_hint=0.5)
    twin.apply(ops.SetAdmission("b", "Ignore"))  # forced: a misconfigured webhook
    checks = {c["check"]: c for c in _floor_drill(twin)}
    assert not checks["bad_digest_denied_everywhere"]["passed"]
    assert "admitted in b" in str(checks["bad_digest_denied_everywhere"]["detail"])
    assert not checks["no_unsigned_digest_admitted"]["passed"]
    assert not checks["admission_never_ignore"]["passed"]
    assert checks["survivor_serves_last_attested_digest"]["passed"]


def test_security_floor_fails_when_the_survivor_takes_an_unlanded_digest() -> None:
    twin = Twin(two_regions(), seed=5, hours_hint=0.5)
    twin.apply(ops.PauseReplication("a", "b"))
    twin.apply(ops.PromoteDigest(MODEL, "a", NEW))
    twin.apply(ops.PromoteDigest(MODEL, "b", NEW))  # someone pushed it past the pause
    twin.run_for(300)
    checks = {c["check"]: c for c in security_floor(twin, drill(), twin.journal, end_s=twin.t)}
    assert not checks["survivor_serves_last_attested_digest"]["passed"]
    assert not checks["bad_digest_denied_everywhere"]["passed"]  # and no bad digest was tried


def test_a_ready_gate_nothing_tried_is_not_exercised() -> None:
    """A new digest waits upstream while replication is paused, and nothing asks a survivor to
    run it: the gate was never tried, so the check says not_exercised, never passed."""
    twin = Twin(two_regions(), seed=5, hours_hint=0.5)
    twin.run_for(60)
    twin.apply(ops.PauseReplication("a", "b"))
    twin.apply(ops.PromoteDigest(MODEL, "b", BAD, signed=False))
    twin.run_for(60)
    twin.apply(ops.RestoreDigest(MODEL, "b", D))
    twin.apply(ops.PromoteDigest(MODEL, "a", NEW))  # no StartRollout: nothing tries it in b
    twin.run_for(300)
    checks = {c["check"]: c for c in security_floor(twin, drill(), twin.journal, end_s=twin.t)}
    gate = checks["ready_gate_refuses_unlanded_digest"]
    assert (gate["status"], gate["passed"]) == ("not_exercised", None)
    assert "nothing tried to run" in str(gate["detail"])
    assert "survivor_attempt" in str(gate["hint"])
    assert checks["survivor_serves_last_attested_digest"]["status"] == "passed"


def test_without_a_promotion_during_a_pause_both_replication_checks_are_not_exercised() -> None:
    twin = Twin(two_regions(), seed=5, hours_hint=0.5)
    twin.run_for(60)
    twin.apply(ops.PromoteDigest(MODEL, "b", BAD, signed=False))
    twin.run_for(120)
    checks = {c["check"]: c for c in security_floor(twin, drill(), twin.journal, end_s=twin.t)}
    for name in ("survivor_serves_last_attested_digest", "ready_gate_refuses_unlanded_digest"):
        assert (checks[name]["status"], checks[name]["passed"]) == ("not_exercised", None)
    assert checks["bad_digest_denied_everywhere"]["status"] == "passed"


# -- failback -----------------------------------------------------------------------------------


def test_failback_steps_in_order_and_thaws_survivor_last() -> None:
    twin = failed_over()
    fb = Failback(PLAN, fleet=twin, signals=twin, model=MODEL, primary="a", survivor="b", slo=2.5)
    run_failback(twin, fb)
    res = fb.result()
    assert res["state"] == "done", res["reason"]
    assert res["same_digest"]
    assert res["same_bundle"]
    steps = recs(res["steps"])
    assert [s["weight"] for s in steps] == [0, 10, 40, 70, 100]
    assert all(s["held"] and not s["backed_off"] for s in steps)
    at = [num(s["at_s"]) for s in steps]
    assert all(b - a >= PLAN.step_hold_s for a, b in itertools.pairwise(at[1:]))
    assert num(res["probe_green_at_s"]) <= at[0]
    assert num(res["warmed_at_s"]) <= at[1]
    held = num(res["hysteresis_held_at_s"])
    assert held - at[-1] >= PLAN.step_hold_s + PLAN.hysteresis_s
    thaw = recs(res["thaw"])
    assert [t["side"] for t in thaw] == ["primary", "survivor"]
    assert thaw[1]["cells"] == ["c1-0"]
    assert num(thaw[1]["at_s"]) - num(thaw[0]["at_s"]) >= PLAN.step_hold_s
    # the survivor was pinned (no scale-in) until the thaw; traffic is home
    kinds = [type(op).__name__ for _, op, _ in fb.applied]
    assert kinds[:4] == ["SetRegionWeight", "SetRouteWeights", "PauseScaler", "MirrorTraffic"]
    assert kinds[-1] == "UnpauseScaler"
    assert twin.lam.tolist() == pytest.approx([40.0, 40.0])
    assert twin.scaler_paused.tolist() == [-1, -1]


def test_failback_backs_off_one_step_on_an_injected_burn() -> None:
    twin = failed_over()
    fb = Failback(PLAN, fleet=twin, signals=twin, model=MODEL, primary="a", survivor="b", slo=2.5)
    state = {"injected": False, "cleared": False}

    def burn() -> None:
        if fb.steps and fb.steps[-1].weight == 40 and not state["injected"]:
            twin.apply(ops.InjectServingErrors(MODEL, "c0-0", 0.3))  # a bad primary
            state["injected"] = True
        if state["injected"] and fb.backoffs and not state["cleared"]:
            twin.apply(ops.InjectServingErrors(MODEL, "c0-0", 0.0))
            state["cleared"] = True

    run_failback(twin, fb, each=burn)
    res = fb.result()
    assert res["state"] == "done"
    steps = [(s["weight"], s["held"], s["backed_off"]) for s in recs(res["steps"])]
    assert steps == [
        (0, True, False),
        (10, True, False),
        (40, False, True),
        (10, True, False),
        (40, True, False),
        (70, True, False),
        (100, True, False),
    ]
    assert res["backoffs"] == 1
    assert "a error burn" in str(dig(res, "steps", 2, "reason"))


def test_failback_refuses_different_digests_and_moves_nothing() -> None:
    twin = failed_over()
    twin.apply(ops.PauseReplication("a", "b"))
    twin.apply(ops.PromoteDigest(MODEL, "a", NEW))
    twin.run_for(15)  # the next scrape shows it
    fb = Failback(
        PLAN, fleet=twin, signals=twin, model=MODEL, primary="a", survivor="b", slo=2.5,
        precheck_wait_s=300.0,
    )  # fmt: skip
    run_failback(twin, fb)
    res = fb.result()
    assert res["state"] == "refused"
    assert res["same_digest"] is False
    assert res["same_bundle"] is True
    assert "weights digests differ" in str(res["reason"])
    assert res["steps"] == []
    assert fb.applied == []
    assert twin.lam[0] == 0.0


def test_failback_waits_for_replication_then_proceeds() -> None:
    twin = failed_over()
    twin.apply(ops.PromoteDigest(MODEL, "a", NEW))  # lands in b after the 120 s lag
    twin.run_for(15)
    fb = Failback(PLAN, fleet=twin, signals=twin, model=MODEL, primary="a", survivor="b", slo=2.5)
    run_failback(twin, fb, until_s=900.0)
    assert fb.phase in ("probe", "stepping")
    assert fb.digests == {"a": NEW, "b": NEW}
    assert fb.applied[0][0] >= 300 + 120


def test_failback_cannot_go_green_while_the_idp_is_cut_off() -> None:
    twin = failed_over(services=[ServiceSpec(name="idp", kind="idp", region="b")])
    twin.apply(ops.Partition("region-region", "a", "b"))  # the primary's probes need b's IdP
    fb = Failback(PLAN, fleet=twin, signals=twin, model=MODEL, primary="a", survivor="b", slo=2.5)
    run_failback(twin, fb, until_s=1500.0)
    assert fb.phase == "probe"
    assert fb.probe_green_since_s is None
    assert fb.steps == []
    twin.apply(ops.Heal("region-region", "a", "b"))
    run_failback(twin, fb, until_s=2100.0)
    assert fb.probe_green_at_s is not None
    assert fb.probe_green_at_s >= 1500 + PLAN.probe_green_s
    assert math.isfinite(fb.probe_green_at_s)
