"""The reference's incident-command self-checks, run as scenarios on the demo fleets.

Each scenario also asserts its outcome in its ``expect`` list (``test_examples`` runs them all);
these tests read the JSON report for the details a reviewer would check by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from firedrill.cli import app

runner = CliRunner()
SCENARIOS = Path("examples/scenarios")
ROLLBACKS = {"driver_rollback", "rollout_abort", "bundle_revert", "digest_rollback"}


def _respond(name: str, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    result = runner.invoke(
        app, ["respond", str(SCENARIOS / f"{name}.yaml"), "--json", str(out), "--quiet", *extra]
    )
    data: dict[str, Any] = json.loads(out.read_text())
    return result.exit_code, data


def _incident(data: dict[str, Any], cell: str) -> dict[str, Any]:
    (inc,) = [i for i in data["incidents"] if i["cell"] == cell]
    found: dict[str, Any] = inc
    return found


def test_ttft_after_a_neighbour_drain_is_capacity_not_a_regression(tmp_path: Path) -> None:
    code, data = _respond("ttft-after-neighbour-drain", tmp_path)
    assert code == 0, data["expectations"]
    inc = _incident(data, "use1-b")
    top = inc["suspects"][0]
    assert top["stream"] == "demand"
    assert top["cell"] == "use1-a"  # the drained neighbour, not the driver rollout in it
    assert "not a regression" in inc["recommendation"]
    lever = inc["levers"][0]
    assert lever["kind"] == "route_weight"
    assert lever["status"] == "applied"
    assert lever["roles"] == ["capacity_lead"]
    assert lever["verified"] is True
    assert lever["verified_at_s"] > lever["at_s"]
    # the inverse puts use1-a back to 0, as recorded before the lever was applied
    assert lever["inverse"] == [
        {"op": "SetRouteWeights", "args": {"model": "llm-70b", "weights": [["use1-a", 0]]}}
    ]
    assert inc["mitigated_at_s"] == lever["at_s"]
    assert not {lv["kind"] for i in data["incidents"] for lv in i["levers"]} & ROLLBACKS


def test_in_advise_mode_the_same_lever_is_only_proposed(tmp_path: Path) -> None:
    code, data = _respond("ttft-after-neighbour-drain", tmp_path, "--mode", "advise")
    assert code == 1  # the scenario expects a verified mitigation; advise applies nothing
    inc = _incident(data, "use1-b")
    lever = inc["levers"][0]
    assert lever["kind"] == "route_weight"
    assert lever["status"] == "proposed"
    assert lever["verified"] is None
    assert inc["mitigated_at_s"] is None
    assert inc["responder_mode"] == "advise"


def test_a_hung_4k_gpu_run_is_contained_and_sized_by_gpu_hours(tmp_path: Path) -> None:
    code, data = _respond("training-hang-512", tmp_path)
    assert code == 0, data["expectations"]
    (inc,) = data["incidents"]
    assert inc["deciding_axis"] == "gpu_hours"
    assert inc["axes"]["users"]["level"] == "none"
    assert inc["axes"]["gpu_hours"]["value"] >= 4096 * 2.0  # $/h of the stalled gang
    lever = inc["levers"][0]
    assert lever["kind"] == "jobset_suspend"
    assert lever["status"] == "applied"
    assert lever["verified"] is True
    run = data["training"]["pretrain-405b"]
    assert run["rank"] == 2345
    assert run["node"] in run["excluded"]
    assert run["resumed_on_excluded_node"] is False


def test_an_exporter_upgrade_storm_is_one_incident_held_by_the_budget(tmp_path: Path) -> None:
    code, data = _respond("exporter-upgrade-storm", tmp_path)
    assert code == 0, data["expectations"]
    inc = _incident(data, "use1-a")
    top = inc["suspects"][0]
    assert top["stream"] == "node_layer"
    assert any("dcgm_exporter" in e for e in top["evidence"])
    assert {b["budget"] for b in data["remediation"]["blocked"]} >= {"min_healthy"}
    (item,) = [a for a in inc["postmortem"]["action_items"] if a["kind"] == "automation_guardrail"]
    assert "budgets.min_healthy 0.9" in item["text"]
    assert "max_quarantines_per_cell_hour 20" in item["text"]
    assert not {lv["kind"] for lv in inc["levers"]} & ROLLBACKS


def test_a_registry_outage_runs_the_ordered_runbook_and_refuses_shortcuts(
    tmp_path: Path,
) -> None:
    code, data = _respond("registry-down-before-peak", tmp_path)
    assert code == 0, data["expectations"]
    inc = _incident(data, "region:us-east-1")
    assert inc["sev"] == "SEV2"
    levers = inc["levers"]
    applied = [(lv["kind"], lv["target"]) for lv in levers if lv["status"] == "applied"]
    assert applied[:3] == [("scaler_pause", c) for c in ("use1-a", "use1-b", "use1-c")]
    assert applied[3] == ("route_weight", "llm-70b")
    route = levers[3]
    assert route["scope"] == "fleet"  # several cells: the global route table
    assert set(route["roles"]) == {"capacity_lead", "incident_commander"}
    assert all(c["ok"] for c in route["checks"])
    assert any(c["guard"] == "scale_in_paused" for c in route["checks"])
    weights = dict(route["operations"][0]["args"]["weights"])
    assert weights["use1-b"] < weights["use1-a"] == weights["use1-c"]  # use1-b has fewer warm
    refused = {lv["kind"]: lv["reason"] for lv in levers if lv["status"] == "refused"}
    assert "pre-signed internal mirror" in refused["public_mirror"]
    assert "keep Fail" in refused["admission_ignore"]
    assert "read-only grant" in refused["widen_bucket_iam"]
    assert "signed and attested" in refused["disable_signature_checks"]
    (grant,) = inc["breakglass"]
    assert set(grant["approvers"]) == {"ic-oncall", "security-lead"}
    assert grant["security_pages"]
    assert [a["event"] for a in grant["audit"]][-1] == "use"
    comms = inc["comms"]
    first = comms["updates"][0]
    assert first["at_s"] <= comms["first_update_due_s"] == inc["opened_at_s"] + 900
    assert first["status_page"] == {
        "product": "chat",
        "region": "us-east-1",
        "text": "Investigating error rates for chat in us-east-1.",
    }
    assert comms["missed"] == 0


def test_a_responder_run_is_reproducible(tmp_path: Path) -> None:
    _, a = _respond("registry-down-before-peak", tmp_path / "a")
    _, b = _respond("registry-down-before-peak", tmp_path / "b")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_mode_is_advise_or_auto(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["respond", str(SCENARIOS / "registry-down-before-peak.yaml"), "--mode", "yolo"]
    )
    assert result.exit_code == 2
    assert "advise or auto" in result.output


def test_a_bad_responder_policy_names_the_line_and_field(tmp_path: Path) -> None:
    text = (SCENARIOS / "registry-down-before-peak.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(
        text.replace("../", str(SCENARIOS.resolve().parent) + "/").replace(
            "  mode: auto\n", "  mode: auto\n  decides: {route_weight: model_owner}\n"
        )
    )
    result = runner.invoke(app, ["respond", str(bad)])
    assert result.exit_code == 4
    assert "responder.decides" in result.output
    assert "model_owner cannot decide" in " ".join(result.output.split())


def _training_scenario(tmp_path: Path, extra: str) -> Path:
    """training-hang-512 with its fleet and SLO named absolutely, and ``extra`` YAML added."""
    here = SCENARIOS.resolve()
    text = (here / "training-hang-512.yaml").read_text()
    text = text.replace("fleet: ../fleet-train.yaml", f"fleet: {here.parent / 'fleet-train.yaml'}")
    text = text.replace("slo: ../slo-train.yaml", f"slo: {here.parent / 'slo-train.yaml'}")
    text = text.replace("policy: ../policy.yaml", f"policy: {here.parent / 'policy.yaml'}")
    text = text.split("\nexpect:")[0] + "\n" + extra
    path = tmp_path / "hang.yaml"
    path.write_text(text)
    return path


def test_the_gpu_hours_axis_prices_an_hour_as_the_fleet_does(tmp_path: Path) -> None:
    """At $5 per GPU-hour the page and the incident's axis quote the same $20,480/h."""
    path = _training_scenario(tmp_path, "fleet_overrides: {gpu_hour_usd: 5.0}\n")
    out = tmp_path / "hang.json"
    result = runner.invoke(app, ["respond", str(path), "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    (inc,) = data["incidents"]
    axis = inc["axes"]["gpu_hours"]
    assert axis["value"] == 4096 * 5.0
    assert "$5/GPU-h = $20,480/h" in axis["reason"]
    assert "burning $20,480/h" in data["training"]["pretrain-405b"]["page"]
    assert inc["sev"] == "SEV2"  # $20,480/h >= the $20,000/h SEV2 threshold (at $2: SEV3)


def test_severity_thresholds_come_from_the_spec_but_not_the_price(tmp_path: Path) -> None:
    path = _training_scenario(
        tmp_path,
        "fleet_overrides: {gpu_hour_usd: 5.0}\nseverity: {gpu_hours: {sev2_usd_per_h: 30000}}\n",
    )
    out = tmp_path / "hang.json"
    result = runner.invoke(app, ["respond", str(path), "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    (inc,) = json.loads(out.read_text())["incidents"]
    assert inc["sev"] == "SEV3"  # $20,480/h is below the spec's $30,000/h
    priced = _training_scenario(tmp_path, "severity: {gpu_hours: {gpu_hour_usd: 9.0}}\n")
    result = runner.invoke(app, ["respond", str(priced), "--json", str(out), "--quiet"])
    assert result.exit_code == 4
    assert "gpu_hour_usd" in result.output
    assert "fleet" in result.output


def test_the_hang_runbooks_quarantine_is_a_lever_and_no_action_item_is_about_xid(
    tmp_path: Path,
) -> None:
    code, data = _respond("training-hang-512", tmp_path)
    assert code == 0, data["expectations"]
    (inc,) = data["incidents"]
    run = data["training"]["pretrain-405b"]
    suspend, quarantine = inc["levers"]
    assert (suspend["kind"], suspend["order"]) == ("jobset_suspend", 1)
    assert (quarantine["kind"], quarantine["order"]) == ("node_quarantine", 2)
    assert quarantine["status"] == "applied"
    assert quarantine["at_s"] == run["suspended_at_s"]
    assert [o["op"] for o in quarantine["operations"]] == ["Taint", "Label"]
    assert {o["args"]["node"] for o in quarantine["operations"]} == {run["node"]}
    assert [o["op"] for o in quarantine["inverse"]] == ["Label", "Untaint"]
    assert [s["op"] for s in run["runbook_steps"]] == [
        "SuspendJobSet", "Taint", "Label", "ResumeJobSet"
    ]  # fmt: skip
    items = inc["postmortem"]["action_items"]
    assert items
    assert not any("xid" in i["text"].lower() for i in items), items
    assert any(run["node"] in i["text"] for i in items)
