"""Closing the loop on the example ladder: findings land as artefacts that fix the next run, and
the next hypothesis is proposed from measured runs as a diff with reasons."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.drill.actions import identity
from firedrill.drill.landing import land
from firedrill.drill.many import DrillJob, SerialExecutor, run_many
from firedrill.drill.next import detect_floor_s, propose, quantile
from firedrill.drill.run import run_drill
from firedrill.drill.spec import LoadedDrill
from firedrill.specfile import load_drill

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DRILLS = EXAMPLES / "drills"
CRDS = ROOT.parent / "shared" / "reference" / "crds"
runner = CliRunner()


def _report(loaded: LoadedDrill, **kw: Any) -> dict[str, Any]:
    result = run_drill(loaded.spec, loaded.fleet, loaded.slo, loaded.policy, **kw)
    return json.loads(json.dumps(result.report))  # as a result file holds it


def _absolute(path: Path, tmp: Path, name: str, **changes: Any) -> Path:
    """A copy of a drill spec with absolute fleet/SLO/policy paths and ``changes`` applied."""
    data = yaml.safe_load(path.read_text())
    for key in ("fleet", "slo", "policy"):
        if data.get(key):
            data[key] = str((path.parent / data[key]).resolve())
    data.update(changes)
    out = tmp / name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def test_l2_broken_chain_lands_as_a_policy_change_that_completes_it(tmp_path: Path) -> None:
    loaded = load_drill(DRILLS / "l2-gpu-faults.yaml")
    report = _report(loaded)
    dbe = next(c for c in report["chains"] if c["kind"] == "ecc_dbe")
    assert dbe["broken_at"] == "health_condition"
    landing = land(
        report, drill=loaded.spec, policy=loaded.policy, fleet=loaded.fleet, slo=loaded.slo
    )
    by_path = {a.path: a for a in landing.artefacts}
    patch = yaml.safe_load(by_path["policy/policy.patch.yaml"].content)
    assert patch == {"fields": {"ecc_dbe": "reset"}}
    key = "chain:ecc_dbe:health_condition"
    assert identity(loaded.spec.name, key) in by_path["policy/policy.patch.yaml"].fixes
    assert landing.policy is not None
    assert landing.policy.fields.ecc_dbe == "reset"
    # applied: the drill runs on the landed policy instead of the broken staging overrides
    (tmp_path / "policy.yaml").write_text(by_path["policy/policy.yaml"].content)
    fixed = _absolute(
        DRILLS / "l2-gpu-faults.yaml",
        tmp_path,
        "l2.yaml",
        policy=str(tmp_path / "policy.yaml"),
        policy_overrides={},
    )
    after = _report(load_drill(fixed))
    dbe_after = next(c for c in after["chains"] if c["kind"] == "ecc_dbe")
    assert dbe_after["broken_at"] is None, dbe_after
    assert all(f.get("key") != key for f in after["findings"])
    assert after["verdict"] == "passed"


def test_land_cli_writes_the_artefacts_and_the_nodehealthcheck(tmp_path: Path) -> None:
    result_json = tmp_path / "l2.json"
    ran = runner.invoke(
        app,
        [
            "gameday", "run", str(DRILLS / "l2-gpu-faults.yaml"), "--quiet",
            "--json", str(result_json), "--journal-dir", str(tmp_path / "j"),
        ],
    )  # fmt: skip
    assert ran.exit_code == 1, ran.output  # the staging policy fails the drill
    out = tmp_path / "landed"
    landed = runner.invoke(app, ["gameday", "land", str(result_json), "--out", str(out)])
    assert landed.exit_code == 0, landed.output
    nhc = yaml.safe_load((out / "nhc" / "nodehealthcheck.yaml").read_text())
    types = [c["type"] for c in nhc["spec"]["unhealthyConditions"]]
    assert "GpuEccDoubleBit" in types  # the fixed policy's DBE mapping reaches the NHC export
    summary = (out / "SUMMARY.md").read_text()
    assert "policy/policy.patch.yaml" in summary
    assert "FND-" in summary
    # never onto a directory that holds something
    again = runner.invoke(app, ["gameday", "land", str(result_json), "--out", str(out)])
    assert again.exit_code == 4
    assert "not an empty directory" in again.output


def test_l5_hidden_dependencies_land_as_clauses_that_fail_until_the_fleet_is_fixed(
    tmp_path: Path,
) -> None:
    loaded = load_drill(DRILLS / "l5-region-blackhole.yaml")
    report = _report(loaded)
    landing = land(
        report, drill=loaded.spec, policy=loaded.policy, fleet=loaded.fleet, slo=loaded.slo
    )
    by_path = {a.path: a for a in landing.artefacts}
    clauses = yaml.safe_load(by_path["drill/clauses.yaml"].content)["hypothesis"]
    assert {c["service"] for c in clauses} == {"probe-idp", "catalog-bundle-api"}
    services = yaml.safe_load(by_path["fleet/services.patch.yaml"].content)["services"]
    hypothesis = [h.model_dump(mode="json", exclude_none=True) for h in loaded.spec.hypothesis]
    with_clauses = _absolute(
        DRILLS / "l5-region-blackhole.yaml", tmp_path, "l5.yaml", hypothesis=hypothesis + clauses
    )
    before = _report(load_drill(with_clauses))
    added = [h for h in before["hypothesis"] if h["metric"] == "hidden_dependencies"]
    assert [h["passed"] for h in added] == [False, False]
    assert [h["observed"] for h in added] == [1.0, 1.0]
    assert before["verdict"] == "failed"
    fixed = _absolute(
        DRILLS / "l5-region-blackhole.yaml",
        tmp_path,
        "l5-fixed.yaml",
        hypothesis=hypothesis + clauses,
        fleet_overrides={"services": services},
    )
    after = _report(load_drill(fixed))
    added = [h for h in after["hypothesis"] if h["metric"] == "hidden_dependencies"]
    assert [h["passed"] for h in added] == [True, True]
    assert not [f for f in after["findings"] if f["key"].startswith("dependency:")]
    assert after["verdict"] == "passed"


def test_next_proposes_a_budget_between_the_p95_and_todays_with_its_arithmetic(
    tmp_path: Path,
) -> None:
    path = DRILLS / "l5-region-blackhole.yaml"
    loaded = load_drill(path)
    job = DrillJob(loaded.spec, loaded.fleet, loaded.slo, loaded.policy, loaded.spec_sha256)
    sweep = json.loads(json.dumps(run_many(job, runs=2, seed=5, executor=SerialExecutor())))
    single = _report(loaded)
    rtos = [r["measured_s"] for r in sweep["results"] if r["measured_s"] is not None]
    rtos.append(single["rto"]["measured_s"])
    p95 = quantile(rtos, 0.95)
    proposal = propose(path.read_text(), loaded.spec, [sweep, single], loaded.slo, margin=0.2)
    budget = next(c for c in proposal.changes if c.where == "rto.budget")
    assert budget.old == "10m"
    assert budget.new != budget.old
    new_s = (
        float(budget.new.removesuffix("m")) * 60
        if budget.new.endswith("m")
        else float(budget.new.removesuffix("s"))
    )
    assert max(p95, 60.0) <= new_s < 600.0
    assert f"{p95:.1f} s × (1 + 0.2)" in budget.reason
    assert "floor" in budget.reason
    floor, why = detect_floor_s(loaded.spec, loaded.slo)
    assert floor == pytest.approx(51.84)  # 14.4 × 0.001 × 1 h: the workbook's 52 s
    assert "14.4" in why
    # the hidden dependencies the single run found become clauses
    assert [c.where for c in proposal.changes].count("hypothesis[+]") == 2
    # every changed line carries its reason
    diff = proposal.diff(str(path))
    plus = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert plus
    assert all("#" in ln for ln in plus)
    # applying the diff with patch(1) gives a spec that loads
    target = tmp_path / "drills"
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    target = tmp_path / "examples" / "drills" / "l5-region-blackhole.yaml"
    (tmp_path / "l5.diff").write_text(diff)
    subprocess.run(
        ["patch", str(target), str(tmp_path / "l5.diff")], check=True, capture_output=True
    )
    patched = load_drill(target)
    assert patched.spec.rto is not None
    assert patched.spec.rto.budget == budget.new
    assert len(patched.spec.hypothesis) == len(loaded.spec.hypothesis) + 2


def test_next_cli_prints_the_diff_and_refuses_to_write_in_place(tmp_path: Path) -> None:
    path = DRILLS / "l5-region-blackhole.yaml"
    result_json = tmp_path / "r.json"
    result_json.write_text(json.dumps(_report(load_drill(path))))
    out = runner.invoke(app, ["gameday", "next", str(path), "--from", str(result_json)])
    assert out.exit_code == 0, out.output
    assert "+  budget:" in out.output
    assert "hidden_dependencies" in out.output
    refused = runner.invoke(
        app, ["gameday", "next", str(path), "--from", str(result_json), "--write", str(path)]
    )
    assert refused.exit_code == 4
    assert "must not be the drill itself" in refused.output
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"drill": "someone-else", "verdict": "passed"}))
    mixed = runner.invoke(app, ["gameday", "next", str(path), "--from", str(other)])
    assert mixed.exit_code == 4
    assert "another drill" in mixed.output


def _synthetic(findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"drill": "l2-gpu-faults-llm-70b", "verdict": "failed", "findings": findings}


def test_landed_alert_rules_pass_promtool_and_the_admission_policy_the_upstream_crd(
    tmp_path: Path,
) -> None:
    loaded = load_drill(DRILLS / "l2-gpu-faults.yaml")
    report = _synthetic(
        [
            {
                "kind": "alert", "text": "no alert", "owner": "sre", "key": "chain:ecc_dbe:alert",
                "detail": {"fault": "ecc_dbe", "broken_at": "alert"},
            },
            {
                "kind": "alert", "text": "no series", "owner": "sre",
                "key": "chain:xid79:exporter_series",
                "detail": {"fault": "xid79", "broken_at": "exporter_series"},
            },
            {
                "kind": "admission_policy", "text": "unsigned", "owner": "sec",
                "key": "admission:unsigned_admitted", "detail": {"unsigned": 2},
            },
        ]
    )  # fmt: skip
    landing = land(
        report, drill=loaded.spec, policy=loaded.policy, fleet=loaded.fleet, slo=loaded.slo
    )
    by_path = {a.path: a for a in landing.artefacts}
    rules = tmp_path / "rules.yaml"
    rules.write_text(by_path["alerts/gpu-health.rules.yaml"].content)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by `make tools`"
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "DCGM_FI_DEV_XID_ERRORS" in by_path["dcgm-exporter/counters.csv"].content
    policy = yaml.safe_load(by_path["admission/kyverno-require-signed.yaml"].content)
    crd = yaml.safe_load((CRDS / "kyverno.io_clusterpolicies.yaml").read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    jsonschema.validate(policy, schema["schema"]["openAPIV3Schema"])
    verify = policy["spec"]["rules"][0]["verifyImages"][0]
    assert verify["failureAction"] == "Enforce"
    assert verify["required"] is True
