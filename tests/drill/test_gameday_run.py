"""The drill runner on the twin: steady state, stop conditions that revert, RTO terms, verdicts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.drill.result import (
    DRILL_REPORT_SCHEMA_VERSION,
    DrillReport,
    ReportError,
    drill_report_schema,
)
from firedrill.drill.run import DrillResult, SteadyStateError, run_drill
from firedrill.drill.spec import LoadedDrill
from firedrill.model.series import Labels, labels_of
from firedrill.specfile import load_drill
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld, embedded_world

HERE = Path(__file__).parent
BASE = HERE / "gameday-blackhole.yaml"
EXAMPLES = HERE.parent.parent / "examples" / "drills"
PRIMARY_STOP = (
    "{name: primary-5xx, kind: error_ratio, region: us-east-1, threshold: 0.05, window: 1m}"
)
SURVIVOR_STOP = (
    "{name: survivor-5xx, kind: error_ratio, region: us-west-2, threshold: 0.05, window: 5m}"
)


def _variant(tmp_path: Path, *edits: tuple[str, str], extra: str = "") -> Path:
    text = BASE.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("fleet: gameday-fleet.yaml", f"fleet: {HERE / 'gameday-fleet.yaml'}")
    text = text.replace("slo: gameday-slo.yaml", f"slo: {HERE / 'gameday-slo.yaml'}")
    path = tmp_path / "drill.yaml"
    path.write_text(text + extra)
    return path


def _run(loaded: LoadedDrill, **kw: Any) -> DrillResult:
    kw.setdefault("make_world", embedded_world)
    return run_drill(loaded.spec, loaded.fleet, loaded.slo, loaded.policy, **kw)


def _state(tw: Twin) -> dict[str, Any]:
    """What a drill may change and must put back."""
    return {
        "partitions": sorted(tw.partitions),
        "replication_paused": sorted(tw.replication_paused),
        "capacity_denied": sorted(tw.capacity_denied),
        "route_weights": tw.weights.tolist(),
        "scalers_paused": tw.scaler_paused.tolist(),
        "region_digest": tw.region_digest.tolist(),
        # DCGM's XID field (230) keeps the last XID seen: a record, not a fault left behind
        "dcgm": sorted(k for k, v in tw.dcgm.items() if v and k[2] != 230),
        "links_down": sorted(n.name for n in tw.nodes if n.link_down),
        "cells_quarantined": tw.cell_quarantined.tolist(),
        "recovery": tw.recovery.state(),
    }


def _baseline(loaded: LoadedDrill) -> dict[str, Any]:
    fleet = loaded.fleet
    if loaded.spec.start_hour_utc is not None:
        fleet = fleet.model_copy(update={"start_hour_utc": loaded.spec.start_hour_utc})
    return _state(Twin(fleet, 0, record=False))


@pytest.fixture(scope="module")
def blackhole() -> DrillResult:
    return _run(load_drill(BASE))


def test_the_blackhole_passes_with_terms_summing_to_the_measured_rto(
    blackhole: DrillResult,
) -> None:
    r = blackhole.report
    assert r["verdict"] == "passed", r["reason"]
    rto = r["rto"]
    terms = rto["terms"]
    assert all(terms[k] is not None for k in terms)
    assert sum(terms.values()) == pytest.approx(rto["measured_s"])
    assert 0 < rto["measured_s"] <= rto["budget_s"]
    marks = rto["marks"]
    # detect ends at the first page, decide after the modelled 60 s, the shift after two steps
    assert marks["page_s"] > marks["t0_s"] == 120.0
    assert terms["decide_s"] == pytest.approx(60.0)
    assert terms["shift_s"] == pytest.approx(30.0)
    assert marks["users_served_s"] >= marks["last_shift_s"]


def test_the_alerts_see_days_of_history_and_the_fast_page_waits_for_the_workbook_time(
    blackhole: DrillResult,
) -> None:
    """A total regional outage 2 minutes in: with the windows backfilled past the longest one
    (3 d), the 14.4x page needs 0.001 x 1 h x 14.4 = 51.8 s of outage and the 6x tier 130 s;
    on the run's own 2 minutes of history both fired at the first evaluation after T0."""
    r = blackhole.report
    assert r["alert_history_s"] >= 3 * 86400
    t0 = r["t0_s"]
    pages = [e for e in r["timeline"] if e["kind"] == "page"]

    def first(name: str) -> float:
        return float(min(e["at_s"] for e in pages if e["text"].startswith(name)))

    fast = first("CellAvailabilityBurnFast")
    assert fast >= t0 + 51.84
    assert first("CellAvailabilityBurnSlow") >= t0 + 129.6 > fast


def test_failover_goes_through_the_levers_with_guards(blackhole: DrillResult) -> None:
    applied = [lv for lv in blackhole.report["levers"] if lv["status"] == "applied"]
    kinds = [lv["kind"] for lv in applied]
    # scalers pinned first, then the region weight stepped 50 -> 0, then undone at the cap
    assert kinds[:2] == ["scaler_pause", "scaler_pause"]
    shift = [lv for lv in applied if lv["kind"] == "route_weight"][:2]
    assert [lv["ops"][0].split("percent=")[1] for lv in shift] == ["50)", "0)"]
    assert all(len(lv["approvers"]) == 2 for lv in shift)  # fleet-wide: two approvers


def test_every_injection_and_lever_is_reverted_at_the_cap(blackhole: DrillResult) -> None:
    assert isinstance(blackhole.world, TwinWorld)
    assert blackhole.report["reverted"]["all"] is True
    assert _state(blackhole.world.twin) == _baseline(load_drill(BASE))


def test_the_new_digest_waits_while_replication_is_paused(blackhole: DrillResult) -> None:
    floor = {c["check"]: c for c in blackhole.report["security_floor"]}
    assert floor["survivor_serves_last_attested_digest"]["passed"] is True
    gate = floor["ready_gate_refuses_unlanded_digest"]
    assert (gate["status"], gate["passed"]) == ("passed", True)
    assert "refused" in str(gate["detail"])  # a survivor really tried, and the gate held


def test_a_ready_gate_nothing_tried_is_not_exercised_not_passed(tmp_path: Path) -> None:
    path = _variant(tmp_path, (",\n     survivor_attempt: true}", "}"))
    r = _run(load_drill(path)).report
    floor = {c["check"]: c for c in r["security_floor"]}
    gate = floor["ready_gate_refuses_unlanded_digest"]
    assert gate["status"] == "not_exercised"
    assert gate["passed"] is None  # not a pass, and not a failure either
    assert "nothing tried to run" in str(gate["detail"])
    assert "survivor_attempt" in str(gate["hint"])  # how this drill could exercise it
    assert not any("ready_gate_refuses_unlanded_digest" in f["text"] for f in r["findings"])
    assert floor["survivor_serves_last_attested_digest"]["status"] == "passed"


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    loaded = load_drill(_variant(tmp_path, ("duration_cap: 15m", "duration_cap: 8m")))
    a = _run(loaded, seed=5).to_json()
    b = _run(loaded, seed=5).to_json()
    assert a == b
    assert _run(loaded, seed=6).to_json() != a


def test_jitter_is_deterministic_per_seed(tmp_path: Path) -> None:
    from firedrill.drill.run import Jitter

    loaded = load_drill(_variant(tmp_path, ("duration_cap: 15m", "duration_cap: 8m")))
    a = _run(loaded, jitter=Jitter(seed=1)).report
    b = _run(loaded, jitter=Jitter(seed=1)).report
    c = _run(loaded, jitter=Jitter(seed=2)).report
    assert json.dumps(a) == json.dumps(b)
    assert a["t0_s"] != c["t0_s"]


def test_a_stop_condition_reverts_everything_and_aborts(tmp_path: Path) -> None:
    path = _variant(
        tmp_path,
        (
            SURVIVOR_STOP,
            PRIMARY_STOP,
        ),
        extra="  - {at: 2m, kind: capacity_denial, region: us-east-1}\n",
    )
    loaded = load_drill(path)
    result = _run(loaded)
    r = result.report
    assert r["verdict"] == "aborted"
    fired = [s for s in r["stop_conditions"] if s["fired"]]
    assert [s["name"] for s in fired] == ["primary-5xx"]
    assert fired[0]["at_s"] < 200.0  # right after the blackhole, not at the cap
    assert r["reverted"]["all"] is True
    assert isinstance(result.world, TwinWorld)
    assert _state(result.world.twin) == _baseline(loaded)


def test_the_cli_exits_3_on_abort_and_1_on_a_missed_rto(tmp_path: Path) -> None:
    runner = CliRunner()
    journals = tmp_path / "journal"
    aborted = _variant(
        tmp_path,
        (
            SURVIVOR_STOP,
            PRIMARY_STOP,
        ),
        ("duration_cap: 15m", "duration_cap: 6m"),
    )
    res = runner.invoke(
        app, ["gameday", "run", str(aborted), "--quiet", "--journal-dir", str(journals)]
    )
    assert res.exit_code == 3, res.output
    late = tmp_path / "late"
    late.mkdir()
    over = _variant(late, ("budget: 10m", "budget: 1m"), ("duration_cap: 15m", "duration_cap: 8m"))
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        ["gameday", "run", str(over), "--quiet", "--out", str(out), "--journal-dir", str(journals)],
    )
    assert res.exit_code == 1, res.output
    result = json.loads((out / "result.json").read_text())
    assert result["verdict"] == "failed"
    assert "exceeds" in result["reason"]
    assert (out / "report.md").read_text().startswith("# Game day")
    assert any(f["kind"] == "runbook_step" and "budget" in f["text"] for f in result["findings"])
    # every journal the CLI wrote is finished: nothing left for `gameday recover`
    for path in journals.glob("*.jsonl"):
        assert '"kind": "finish"' in path.read_text().splitlines()[-1]


def test_the_cli_exits_4_on_a_bad_spec(tmp_path: Path) -> None:
    bad = _variant(tmp_path, ("namespace: serve-chat", "namespace: kube-system"))
    res = CliRunner().invoke(app, ["gameday", "run", str(bad), "--quiet"])
    assert res.exit_code == 4
    assert "target.namespace" in res.output


class _Hot(Twin):
    """A twin whose survivor already burns before T0 (steady state does not hold)."""

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        if name == "drill_test_gauge":
            return self.t, [labels_of(region="us-west-2")], np.array([1.0])
        return super().instant(name, matchers)


def test_steady_state_refuses_before_anything_is_injected(tmp_path: Path) -> None:
    path = _variant(
        tmp_path,
        (
            SURVIVOR_STOP,
            "{name: gauge, kind: expr, expr: 'drill_test_gauge > 0'}",
        ),
    )
    loaded = load_drill(path)
    world = _Hot(loaded.fleet, 3)
    with pytest.raises(SteadyStateError) as info:
        _run(loaded, world=TwinWorld(world))
    assert "already true" in str(info.value)
    assert world.t == pytest.approx(120.0)  # stopped at T0
    assert not world.partitions
    assert not world.replication_paused
    assert not any(a.op.__class__.__name__ == "Partition" for a in world.journal)


def test_a_clause_that_fails_in_steady_state_refuses(tmp_path: Path) -> None:
    path = _variant(
        tmp_path,
        (
            '  - {clause: zero unsigned digests admitted, metric: unsigned_admitted, op: "==", '
            "value: 0}",
            '  - {clause: impossible, metric: ttft_p99_s, region: us-west-2, op: "<", value: 0.01}',
        ),
    )
    with pytest.raises(SteadyStateError) as info:
        _run(load_drill(path))
    assert "impossible" in str(info.value)


def test_a_bad_digest_is_denied_in_every_region(tmp_path: Path) -> None:
    # no blackhole: the unsigned digest replicates from us-east-1 to both other regions
    path = _variant(
        tmp_path,
        (
            "{at: 2m, kind: region_blackhole, region: us-east-1, duration: 3h}",
            "{at: 2m, kind: bad_digest, model: llm-70b, region: us-east-1, duration: 6m}",
        ),
        (
            "  - {at: 4m, kind: new_digest_during_pause, model: llm-70b, region: us-east-1,\n"
            "     survivor_attempt: true}\n",
            "",
        ),
        ("  - {at: 3m, kind: bad_digest, model: llm-70b, region: us-east-1, duration: 5m}\n", ""),
        ("rung: L5", "rung: L4"),
        ("duration_cap: 15m", "duration_cap: 10m"),
    )
    r = _run(load_drill(path)).report
    floor = {c["check"]: c for c in r["security_floor"]}
    assert floor["bad_digest_denied_everywhere"]["passed"] is True
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        assert region in str(floor["bad_digest_denied_everywhere"]["detail"])
    assert r["admission"]["unsigned_admitted"] == 0
    assert r["admission"]["denied"] > 0


@pytest.fixture(scope="module")
def l5() -> DrillResult:
    loaded = load_drill(EXAMPLES / "l5-region-blackhole.yaml")
    return _run(loaded, spec_sha256=loaded.spec_sha256)


def test_the_l5_example_passes_within_its_10_minute_rto(l5: DrillResult) -> None:
    r = l5.report
    assert r["verdict"] == "passed", r["reason"]
    assert r["rto"]["budget_s"] == 600.0
    assert sum(r["rto"]["terms"].values()) == pytest.approx(r["rto"]["measured_s"])
    assert r["rto"]["measured_s"] <= 600.0
    assert all(h["passed"] for h in r["hypothesis"])
    assert all(c["passed"] for c in r["security_floor"])
    assert all(c["status"] == "passed" for c in r["security_floor"])
    gate = next(
        c for c in r["security_floor"] if c["check"] == "ready_gate_refuses_unlanded_digest"
    )
    assert "refused" in str(gate["detail"])
    assert "us-west-2" in str(gate["detail"])
    assert r["findings"], "a realistic pass still has findings"
    assert all(f["owner"] for f in r["findings"])
    charts = r["charts"]
    assert set(charts["ttft_p99"]) == {"us-east-1", "us-west-2", "eu-west-1"}
    assert any(m["kind"] == "shift" for m in charts["markers"])


def test_the_typed_report_writes_the_run_back_byte_for_byte(l5: DrillResult) -> None:
    typed = DrillReport.from_json(l5.report)
    assert json.dumps(typed.to_json(), indent=2) == json.dumps(l5.report, indent=2)
    assert typed.verdict == "passed"
    assert typed.rto.budget_s == 600.0
    assert typed.charts.ttft_p99 is not None
    jsonschema.validate(typed.to_json(), drill_report_schema())
    assert drill_report_schema()["version"] == DRILL_REPORT_SCHEMA_VERSION


def test_a_report_of_the_wrong_shape_is_refused_naming_the_field(l5: DrillResult) -> None:
    bad = {**l5.report, "rto": {**l5.report["rto"], "marks": {"t0_s": "soon"}}}
    with pytest.raises(ReportError, match=r"drill report rto\.marks"):
        DrillReport.from_json(bad)
    # a field the type does not know is refused, not dropped from the JSON written back
    unknown = {**l5.report, "findings": [{**l5.report["findings"][0], "new": 1}]}
    with pytest.raises(ReportError, match=r"drill report findings\.0\.new"):
        DrillReport.from_json(unknown)


def test_the_l2_example_names_where_the_dbe_chain_broke() -> None:
    loaded = load_drill(EXAMPLES / "l2-gpu-faults.yaml")
    r = _run(loaded).report
    assert r["verdict"] == "failed"
    dbe = [c for c in r["chains"] if c["kind"] == "ecc_dbe"]
    assert len(dbe) == 1
    assert dbe[0]["broken_at"] == "health_condition"
    reached = [s["name"] for s in dbe[0]["stages"] if s["status"] == "ok"]
    assert "alert" in reached
    assert "drain" not in reached
    assert any(
        "ecc_dbe" in f["text"]
        and "alert but no drain" in f["text"]
        and "health_condition" in f["text"]
        for f in r["findings"]
    )
    xid = [c for c in r["chains"] if c["kind"] == "xid79"]
    assert xid
    assert xid[0]["broken_at"] is None


# -- property: whatever is injected and whenever the drill stops, nothing is left behind ---------

INJECTIONS = {
    "blackhole": "  - {at: 2m, kind: region_blackhole, region: us-east-1, duration: 3h}\n",
    "capacity": "  - {at: 2m, kind: capacity_denial, region: us-east-1}\n",
    "registry": "  - {at: 2m, kind: registry_partition, cell: use1-a}\n",
    "dcgm": "  - {at: 2m, kind: dcgm_field, cell: use1-b, field: 319, value: 4, nodes: 1}\n",
    "nvlink": "  - {at: 2m, kind: nvlink_flap, cell: use1-b, nodes: 1}\n",
    "thermal": "  - {at: 2m, kind: thermal, cell: use1-a, nodes: 1, slowdown: 2.0}\n",
    "kill": "  - {at: 2m, kind: replica_kill, cell: use1-a, count: 2}\n",
    "storm": "  - {at: 2m, kind: hydrate_storm, cell: use1-a, percent: 50, max_surge: 25}\n",
    "newdigest": "  - {at: 3m, kind: new_digest_during_pause, model: llm-70b, region: us-east-1}\n",
    "tried": "  - {at: 3m, kind: new_digest_during_pause, model: llm-70b, region: us-east-1, "
    "survivor_attempt: true}\n",
}


class _Abort(Twin):
    """A twin with one extra gauge, 1 from ``abort_at`` on: a stop condition fires on it."""

    abort_at = 1e12

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        if name == "drill_test_abort":
            value = 1.0 if self.t >= self.abort_at else 0.0
            return self.t, [labels_of(region="us-west-2")], np.array([value])
        return super().instant(name, matchers)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    chosen=st.sets(st.sampled_from(sorted(INJECTIONS)), min_size=1, max_size=4),
    abort_at=st.integers(min_value=125, max_value=420),
)
def test_after_any_abort_nothing_is_left_injected(
    tmp_path: Path, chosen: set[str], abort_at: int
) -> None:
    text = BASE.read_text()
    head, _, _ = text.partition("injections:\n")
    head = head.replace("fleet: gameday-fleet.yaml", f"fleet: {HERE / 'gameday-fleet.yaml'}")
    head = head.replace("slo: gameday-slo.yaml", f"slo: {HERE / 'gameday-slo.yaml'}")
    head = head.replace(SURVIVOR_STOP, "{name: forced, kind: expr, expr: 'drill_test_abort > 0'}")
    head = head.replace("duration_cap: 15m", "duration_cap: 8m")
    head = head.replace("max_nodes: 20", "max_nodes: 40")
    body = "".join(INJECTIONS[k] for k in sorted(chosen))
    body += "  - {at: 2m, kind: bad_digest, model: llm-70b, region: us-west-2}\n"
    path = tmp_path / f"prop-{abort_at}-{'-'.join(sorted(chosen))}.yaml"
    path.write_text(head + "injections:\n" + body)
    loaded = load_drill(path)
    twin = _Abort(loaded.fleet, 3, hours_hint=0.2)
    twin.abort_at = float(abort_at)
    result = _run(loaded, world=TwinWorld(twin))
    assert result.report["verdict"] == "aborted"
    assert result.report["reverted"]["all"] is True
    assert _state(twin) == _baseline(loaded)
