"""Chaos Mesh, Kyverno and AWS FIS exports of drills, held to the tools' own schemas.

FIS templates are checked against botocore's service model for ``fis`` (its ParamValidator, plus
the lengths, patterns and enums of the model that ParamValidator leaves out). Chaos Mesh (chaos
kinds and Workflow) and Kyverno manifests are checked against the upstream CustomResourceDefinitions
(``shared/reference/crds``, or ``$FIREDRILL_CRD_DIR``), strictly: an unknown field fails, as with
``kubectl apply --validate=strict``. Kyverno's deny conditions are evaluated with JMESPath over the
exported resources and over broken ones, so the policy is shown to admit the one and deny the other.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import botocore.session
import jmespath
import pytest
import yaml
from botocore.exceptions import ParamValidationError
from botocore.model import ListShape, MapShape, Shape, StringShape, StructureShape
from botocore.validate import ParamValidator
from typer.testing import CliRunner

from firedrill.adapters.kubernetes.schemas import SchemaValidator, crd_directory
from firedrill.cli import app
from firedrill.drill.spec import DrillSpec, seconds
from firedrill.errors import ExportError
from firedrill.export.chaos_mesh import (
    CARRIER_KINDS,
    NEVER_TARGET,
    POD_CHAOS_KINDS,
    ChaosMeshExport,
    chaos_mesh,
    chaos_workflow,
    go_duration,
    kyverno_policy,
    render,
    render_workflow,
)
from firedrill.export.fis import (
    FIS_ACTIONS,
    PLACEHOLDER_ROLE,
    FisOptions,
    fis_template,
    iso_duration,
)
from firedrill.model.spec import FleetSpec
from firedrill.specfile import load_drill, load_fleet

ROOT = Path(__file__).resolve().parents[2]
DRILLS = sorted((ROOT / "examples" / "drills").glob("*.yaml"))
runner = CliRunner()

# Kyverno's documented condition operators (policies: preconditions and deny conditions).
KYVERNO_OPERATORS = {
    "Equals",
    "NotEquals",
    "In",
    "AnyIn",
    "AllIn",
    "NotIn",
    "AnyNotIn",
    "AllNotIn",
    "GreaterThanOrEquals",
    "GreaterThan",
    "LessThanOrEquals",
    "LessThan",
    "DurationGreaterThanOrEquals",
    "DurationGreaterThan",
    "DurationLessThanOrEquals",
    "DurationLessThan",
}


# --- helpers --------------------------------------------------------------------------------------


@functools.cache
def _schemas() -> SchemaValidator:
    """The upstream CRDs (JobSet, Kueue, Chaos Mesh, Kyverno, ...), loaded once."""
    crds = crd_directory(ROOT, os.environ)
    if crds is None:
        pytest.skip("upstream CRDs not found: set FIREDRILL_CRD_DIR to shared/reference/crds")
    return SchemaValidator(crds)


DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _check_manifest(m: dict[str, Any]) -> None:
    """Schema of its kind, plus the object-meta rules the API server enforces."""
    problems = _schemas().problems(m)
    assert not problems, "; ".join(problems)
    meta = m["metadata"]
    assert DNS_1123.match(meta["name"]), meta["name"]
    assert len(meta["name"]) <= 63, meta["name"]
    for value in meta.get("labels", {}).values():
        assert LABEL_VALUE.match(value), value
        assert len(value) <= 63, value


FIS_MODEL = botocore.session.get_session().get_service_model("fis")
_FIS_INPUT = FIS_MODEL.operation_model("CreateExperimentTemplate").input_shape
assert _FIS_INPUT is not None, "botocore's fis model lost CreateExperimentTemplate's input"
FIS_INPUT: StructureShape = _FIS_INPUT


def _check_shape(value: Any, shape: Shape, path: str = "") -> list[str]:
    """What ParamValidator does not check: max lengths/sizes, patterns and enums."""
    problems: list[str] = []
    meta = shape.metadata
    if isinstance(shape, StringShape):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: longer than {meta['max']}")
        pattern = meta.get("pattern")
        if pattern and "\\p" not in pattern and not re.fullmatch(pattern, value):
            problems.append(f"{path}: {value!r} does not match {pattern}")
        enum = shape.enum
        if enum and value not in enum:
            problems.append(f"{path}: {value!r} not in {enum}")
    elif isinstance(shape, StructureShape):
        for k, v in value.items():
            problems += _check_shape(v, shape.members[k], f"{path}.{k}")
    elif isinstance(shape, ListShape):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: more than {meta['max']} items")
        for i, v in enumerate(value):
            problems += _check_shape(v, shape.member, f"{path}[{i}]")
    elif isinstance(shape, MapShape):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: more than {meta['max']} entries")
        for k, v in value.items():
            problems += _check_shape(k, shape.key, f"{path}<key {k}>")
            problems += _check_shape(v, shape.value, f"{path}.{k}")
    return problems


def _check_fis(template: dict[str, Any]) -> None:
    """Raise if the template is not a valid CreateExperimentTemplate input."""
    report = ParamValidator().validate(template, FIS_INPUT)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())
    problems = _check_shape(template, FIS_INPUT)
    if problems:
        raise ValueError("; ".join(problems))


def _fleet() -> FleetSpec:
    return load_fleet(ROOT / "examples" / "fleet.yaml")


def _drill(**overrides: Any) -> DrillSpec:
    """A drill on the demo fleet with every Kubernetes-level fault (not validated on purpose)."""
    data: dict[str, Any] = {
        "name": "l2-everything-llm-70b",
        "rung": "L2",
        "fleet": "fleet.yaml",
        "slo": "slo.yaml",
        "duration_cap": "30m",
        "target": {"model": "llm-70b", "region": "us-east-1", "namespace": "serve-chat"},
        "allowlist": {"namespaces": ["serve-chat", "serve-batch", "staging-*"]},
        "blast_radius": {"regions": ["us-east-1"], "max_nodes": 300},
        "hypothesis": [{"clause": "x", "metric": "error_ratio", "op": "<", "value": 0.01}],
        "stop_conditions": [
            {"name": "region-5xx", "kind": "error_ratio", "threshold": 0.02},
            {"name": "kv.usage", "kind": "kv_usage", "threshold": 0.9, "region": "us-east-1"},
        ],
        "injections": [
            {"at": "2m", "kind": "replica_kill", "cell": "use1-a", "count": 3},
            {
                "at": "3m",
                "kind": "registry_partition",
                "cell": "use1-b",
                "duration": "15m",
                "namespace": "staging-chat",
            },
            {"at": "4m", "kind": "thermal", "cell": "use1-c", "nodes": 2, "slowdown": 2.0},
            {"at": "5m", "kind": "dcgm_field", "cell": "use1-a", "field": 319, "value": 4},
            {"at": "6m", "kind": "bad_digest", "model": "llm-70b", "region": "us-east-1"},
            {"at": "7m", "kind": "capacity_denial", "region": "us-east-1", "duration": "2h"},
            {"at": "7m", "kind": "hydrate_storm", "cell": "use1-a"},
            {"at": "9m", "kind": "region_blackhole", "region": "us-east-1", "duration": "40h"},
        ],
    }
    data.update(overrides)
    return DrillSpec.model_validate(data)


def _chaos(m: dict[str, Any]) -> bool:
    return bool(m["apiVersion"].startswith("chaos-mesh.org/"))


def _examples() -> list[Any]:
    return [load_drill(p) for p in DRILLS]


# --- Chaos Mesh and Kyverno -------------------------------------------------------------------


@pytest.mark.parametrize("path", DRILLS, ids=[p.stem for p in DRILLS])
def test_example_drills_export_manifests_that_fit_the_crd_schemas(path: Path) -> None:
    loaded = load_drill(path)
    export = chaos_mesh(loaded.spec, loaded.fleet)
    assert export.manifests[0]["kind"] == "ClusterPolicy"  # in force before any chaos
    for m in export.manifests:
        _check_manifest(m)
    docs = [d for d in yaml.safe_load_all(render(export)) if d is not None]
    assert docs == [json.loads(json.dumps(m)) for m in export.manifests]


def test_every_kind_with_a_kubernetes_equivalent_becomes_its_chaos_resource() -> None:
    export = chaos_mesh(_drill(), _fleet())
    chaos = [m for m in export.manifests if _chaos(m)]
    for m in chaos:
        _check_manifest(m)
    by_injection: dict[str, list[dict[str, Any]]] = {}
    for m in chaos:
        by_injection.setdefault(m["metadata"]["labels"]["firedrill.dev/injection"], []).append(m)

    (kill,) = by_injection["0"]
    assert kill["kind"] == "PodChaos"
    assert kill["spec"]["action"] == "pod-kill"
    assert (kill["spec"]["mode"], kill["spec"]["value"]) == ("fixed", "3")
    assert kill["spec"]["selector"] == {
        "namespaces": ["serve-chat"],
        "labelSelectors": {"app": "llm-70b", "cell": "use1-a"},
    }

    (cut,) = by_injection["1"]
    assert cut["kind"] == "NetworkChaos"
    assert (cut["spec"]["action"], cut["spec"]["direction"]) == ("partition", "to")
    assert cut["spec"]["externalTargets"] == ["registry.us-east-1.corp"]
    assert cut["spec"]["selector"]["namespaces"] == ["staging-chat"]  # the injection's own
    assert cut["spec"]["duration"] == "15m"

    (stress,) = by_injection["2"]
    assert stress["kind"] == "StressChaos"
    assert stress["spec"]["stressors"]["cpu"]["load"] == 50  # slowdown 2: half the time
    assert "gpu-burn" in stress["metadata"]["annotations"]["firedrill.dev/note"]

    blackhole = by_injection["7"]
    assert [m["spec"]["selector"]["labelSelectors"]["cell"] for m in blackhole] == [
        "use1-a",
        "use1-b",
        "use1-c",
    ]
    assert blackhole[0]["spec"]["externalTargets"] == [
        "registry.us-west-2.corp",
        "registry.eu-west-1.corp",
    ]
    assert "FIS" in blackhole[0]["metadata"]["annotations"]["firedrill.dev/note"]
    # Not Chaos Mesh: DCGM, bad digest, capacity, hydrate storm -> notes with commands.
    assert not {"3", "4", "5", "6"} & set(by_injection)
    notes = {n.index: n for n in export.notes}
    assert "dcgmi test --inject --gpuid 0 -f 319 -v 4" in notes[3].commands
    assert any("./gpu_burn" in c for c in notes[2].commands)
    assert "admission must deny" in notes[4].reason
    assert "firedrill export fis" in notes[5].reason
    assert any("rollout restart deploy/llm-70b" in c for c in notes[6].commands)
    for m in chaos:
        labels = m["metadata"]["labels"]
        assert labels["firedrill.dev/drill"] == "l2-everything-llm-70b"
        assert labels["firedrill.dev/rung"] == "L2"
    text = render(export)
    assert "kubectl annotate ns serve-chat chaos-mesh.org/inject=enabled" in text
    assert "kubectl annotate ns staging-chat chaos-mesh.org/inject=enabled" in text


def test_durations_never_exceed_the_cap() -> None:
    for loaded in [*_examples(), None]:
        spec = _drill() if loaded is None else loaded.spec
        fleet = _fleet() if loaded is None else loaded.fleet
        cap = spec.duration_cap_s
        assert cap is not None
        for m in chaos_mesh(spec, fleet).manifests:
            if not _chaos(m):
                continue
            if m["spec"].get("action") == "pod-kill":
                assert "duration" not in m["spec"]  # one-shot: a duration would mean nothing
                continue
            d = seconds(_go_to_prom(m["spec"]["duration"]))
            at = seconds(m["metadata"]["annotations"]["firedrill.dev/at"])
            assert 0 < d <= cap - at, (spec.name, m["metadata"]["name"], d, cap, at)


def _go_to_prom(text: str) -> str:
    """'1h30m' -> '5400s' (so the spec's own parser reads it)."""
    total = sum(
        int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", text)
    )
    assert go_duration(total) == text  # the exporter wrote a canonical Go duration
    return f"{total}s"


def test_an_over_cap_blackhole_is_clamped_to_12h() -> None:
    spec = _drill(duration_cap="2d")  # a 40 h blackhole that validation would refuse anyway
    nets = [
        m
        for m in chaos_mesh(spec, _fleet()).manifests
        if m["metadata"].get("labels", {}).get("firedrill.dev/injection") == "7"
    ]
    assert len(nets) == 3
    assert all(m["spec"]["duration"] == "12h" for m in nets)
    tpl = fis_template(spec, _fleet()).template
    cuts = [a for n, a in tpl["actions"].items() if n.startswith("i7-")]
    assert len(cuts) == 6
    assert {a["parameters"]["duration"] for a in cuts} == {"PT12H"}
    # the capacity denial (2 h wanted) is not clamped to 12 h but to its own duration
    ice = tpl["actions"]["i5-no-gpu-capacity-asg"]
    assert ice["parameters"]["duration"] == "PT2H"


def test_kube_system_never_appears() -> None:
    for loaded in _examples():
        text = render(chaos_mesh(loaded.spec, loaded.fleet))
        for m in yaml.safe_load_all(text):
            if m is not None and _chaos(m):
                assert not set(m["spec"]["selector"]["namespaces"]) & set(NEVER_TARGET)
    # An unvalidated drill that aims at kube-system is refused by the exporter itself.
    bad = _drill(
        injections=[
            {"at": "2m", "kind": "replica_kill", "cell": "use1-a", "namespace": "kube-system"}
        ]
    )
    with pytest.raises(ExportError, match=r"injections\[0\]\.namespace.*kube-system"):
        chaos_mesh(bad, _fleet())
    # So is an allowlist glob that would let chaos reach it, in the manifests and the policy.
    wide = _drill(allowlist={"namespaces": ["*"]})
    with pytest.raises(ExportError, match="kube-system"):
        chaos_mesh(wide, _fleet())
    with pytest.raises(ExportError, match="kube-system"):
        kyverno_policy(wide)


def test_validation_refuses_a_kube_system_drill_with_file_line_field(tmp_path: Path) -> None:
    src = (ROOT / "examples" / "drills" / "l1-replica-kill.yaml").read_text()
    text = src.replace("../fleet.yaml", str(ROOT / "examples" / "fleet.yaml"))
    text = text.replace("../slo.yaml", str(ROOT / "examples" / "slo.yaml"))
    text = text.replace("../policy.yaml", str(ROOT / "examples" / "policy.yaml"))
    text = text.replace("cell: use1-a, count: 1, note:", "cell: use1-a, count: 1, "
                        "namespace: kube-system, note:")  # fmt: skip
    assert "kube-system" in text
    drill = tmp_path / "bad.yaml"
    drill.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "kube-system" in ln)
    for command in ("chaos-mesh", "fis"):
        out = tmp_path / f"{command}.out"
        result = runner.invoke(app, ["export", command, str(drill), "-o", str(out)])
        assert result.exit_code == 4, result.output
        flat = " ".join(result.output.split())
        assert f"bad.yaml:{line}" in flat
        assert "injections[0].namespace" in flat
        assert not out.exists()  # nothing written


def test_kyverno_policy_fits_its_schema_and_enforces_the_allowlist() -> None:
    spec = _drill()
    policy = kyverno_policy(spec, namespaces=["serve-chat"])
    _check_manifest(policy)
    # the per-rule failureAction, not the deprecated spec.validationFailureAction
    assert "validationFailureAction" not in policy["spec"]
    assert {r["validate"]["failureAction"] for r in policy["spec"]["rules"]} == {"Enforce"}
    guarded = {
        k.rpartition("/")[2]
        for r in policy["spec"]["rules"]
        for k in r["match"]["any"][0]["resources"]["kinds"]
    }
    assert guarded == {*POD_CHAOS_KINDS, *CARRIER_KINDS}
    assert {"Schedule", "Workflow", "IOChaos", "HTTPChaos"} <= guarded
    # every chaos kind the upstream Chaos Mesh CRDs define is guarded
    upstream = {k.rpartition("/")[2] for k in _schemas().custom_kinds if k.startswith("chaos")}
    assert upstream <= guarded
    rules = {r["name"]: r for r in policy["spec"]["rules"]}
    allow = rules["chaos-namespace-allowlist"]["validate"]["deny"]["conditions"]["any"]
    assert {c["operator"] for c in allow} == {"AnyNotIn"}
    assert all(c["value"] == ["serve-chat", "serve-batch", "staging-*"] for c in allow)
    for rule in policy["spec"]["rules"]:
        conditions = rule["validate"]["deny"]["conditions"]
        for cond in conditions.get("any", []) + conditions.get("all", []):
            assert cond["operator"] in KYVERNO_OPERATORS
            assert cond["key"].startswith("{{ ")
            assert cond["key"].endswith(" }}")
    # Kyverno's AnyNotIn (wildcards in the value list): our resources pass, kube-system does not.
    for m in chaos_mesh(spec, _fleet()).manifests:
        if _chaos(m):
            assert not _any_not_in(m["spec"]["selector"]["namespaces"], allow[0]["value"])
    assert _any_not_in(["serve-chat", "kube-system"], allow[0]["value"])


def _any_not_in(keys: list[str], values: list[str]) -> bool:
    return any(not any(fnmatch.fnmatchcase(k, v) for v in values) for k in keys)


def _kyverno_denies(policy: dict[str, Any], resource: dict[str, Any]) -> list[str]:
    """The rules of ``policy`` that deny ``resource``: Kyverno's deny conditions, in JMESPath."""
    kind = f"{resource['apiVersion']}/{resource['kind']}"
    context = {"request": {"object": resource}}
    denied = []
    for rule in policy["spec"]["rules"]:
        if kind not in rule["match"]["any"][0]["resources"]["kinds"]:
            continue
        conditions = rule["validate"]["deny"]["conditions"]
        any_ = [_holds(c, context) for c in conditions.get("any", [])]
        all_ = [_holds(c, context) for c in conditions.get("all", [])]
        if (any_ and any(any_)) or (all_ and all(all_)):
            denied.append(rule["name"])
    return denied


def _holds(cond: dict[str, Any], context: dict[str, Any]) -> bool:
    key = jmespath.search(cond["key"].removeprefix("{{ ").removesuffix(" }}"), context)
    value = cond["value"]
    keys = key if isinstance(key, list) else [key]
    match cond["operator"]:
        case "Equals":
            return bool(key == value)
        case "NotEquals":
            return bool(key != value)
        case "GreaterThan":
            return float(key) > float(value)
        case "AnyIn":
            return any(any(fnmatch.fnmatchcase(str(k), v) for v in value) for k in keys)
        case "AnyNotIn":
            return _any_not_in([str(k) for k in keys], value)
    raise AssertionError(f"operator {cond['operator']} not evaluated here")


def test_l0_tabletop_exports_no_live_chaos() -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l0-tabletop.yaml")
    export = chaos_mesh(loaded.spec, loaded.fleet)
    assert [m["kind"] for m in export.manifests] == ["ClusterPolicy"]  # nothing injected
    assert len(export.notes) == len(loaded.spec.injections)
    assert all("tabletop" in n.reason for n in export.notes)
    assert chaos_workflow(loaded.spec, loaded.fleet).workflow is None
    result = runner.invoke(app, ["export", "chaos-mesh", str(loaded.path)])
    assert result.exit_code == 0, result.output
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout) if d is not None]
    assert kinds == ["ClusterPolicy"]
    result = runner.invoke(app, ["export", "chaos-mesh", str(loaded.path), "--workflow"])
    assert result.exit_code == 0, result.output
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout) if d] == ["ClusterPolicy"]


def test_a_pod_kill_is_one_shot_without_a_duration() -> None:
    export = chaos_mesh(_drill(), _fleet())
    (kill,) = [m for m in export.manifests if m["kind"] == "PodChaos"]
    assert "duration" not in kill["spec"]
    _check_manifest(kill)
    assert _kyverno_denies(export.manifests[0], kill) == []  # the policy admits a kill as is
    lasting = [m for m in export.manifests if _chaos(m) and m["kind"] != "PodChaos"]
    assert lasting
    assert all(m["spec"]["duration"] for m in lasting)


def test_l5_exports_one_workflow_carrying_the_timeline() -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l5-region-blackhole.yaml")
    export = chaos_workflow(loaded.spec, loaded.fleet)
    assert [m["kind"] for m in export.manifests] == ["ClusterPolicy", "Workflow"]
    wf = export.workflow
    assert wf is not None
    _check_manifest(wf)
    templates = {t["name"]: t for t in wf["spec"]["templates"]}
    entry = templates[wf["spec"]["entry"]]
    cap = loaded.spec.duration_cap_s
    assert entry["templateType"] == "Parallel"
    assert seconds(_go_to_prom(entry["deadline"])) == cap
    chaos_nodes = [t for t in templates.values() if t["templateType"] == "NetworkChaos"]
    assert len(chaos_nodes) == 3  # one per us-east-1 cell
    for branch in entry["children"]:
        serial = templates[branch]
        wait, node = (templates[c] for c in serial["children"])
        assert wait["templateType"] == "Suspend"
        at = seconds(_go_to_prom(wait["deadline"]))
        lasts = seconds(_go_to_prom(node["deadline"]))
        assert at == 300  # the blackhole starts at 5m
        assert at + lasts <= cap  # never past the cap
        assert "duration" not in node["networkChaos"]  # the node's deadline ends it
    # the same chaos as the per-resource export, timeline and all
    flat = [m for m in chaos_mesh(loaded.spec, loaded.fleet).manifests if _chaos(m)]
    assert [n["networkChaos"]["selector"] for n in chaos_nodes] == [
        m["spec"]["selector"] for m in flat
    ]
    assert _kyverno_denies(export.policy, wf) == []
    text = render_workflow(export)
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert docs == [json.loads(json.dumps(m)) for m in export.manifests]
    assert text == render_workflow(chaos_workflow(loaded.spec, loaded.fleet))  # deterministic


def test_kyverno_admits_the_exports_and_denies_every_escape() -> None:
    spec = _drill()
    policy = kyverno_policy(spec)
    for loaded in _examples():
        for export in (
            chaos_mesh(loaded.spec, loaded.fleet),
            chaos_workflow(loaded.spec, loaded.fleet),
        ):
            own = export.manifests[0]
            for m in export.manifests[1:]:
                assert _kyverno_denies(own, m) == [], (loaded.spec.name, m["kind"])
    wf = chaos_workflow(spec, _fleet()).workflow
    assert wf is not None
    assert _kyverno_denies(policy, wf) == []
    net = next(m for m in chaos_mesh(spec, _fleet()).manifests if m["kind"] == "NetworkChaos")
    kill = next(m for m in chaos_mesh(spec, _fleet()).manifests if m["kind"] == "PodChaos")

    def broken(m: dict[str, Any], edit: Any) -> dict[str, Any]:
        out = copy.deepcopy(m)
        edit(out)
        return out

    def node(w: dict[str, Any], kind: str) -> dict[str, Any]:
        return next(t for t in w["spec"]["templates"] if t["templateType"] == kind)

    cases = {
        "kill in kube-system": (
            broken(kill, lambda m: m["spec"]["selector"].update(namespaces=["kube-system"])),
            {"chaos-namespace-allowlist", "chaos-never-system-namespaces"},
        ),
        "partition without a duration": (
            broken(net, lambda m: m["spec"].pop("duration")),
            {"chaos-duration-required"},
        ),
        "no namespaces": (
            broken(kill, lambda m: m["spec"]["selector"].pop("namespaces")),
            {"chaos-namespaces-required"},
        ),
        "a cloud chaos (selects no pods)": (
            {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "AWSChaos",
             "spec": {"action": "ec2-stop", "duration": "5m"}},
            {"chaos-namespaces-required"},
        ),
        "workflow node in default": (
            broken(wf, lambda w: node(w, "PodChaos")["podChaos"]["selector"].update(
                namespaces=["default"])),
            {"chaos-namespace-allowlist"},
        ),
        "workflow target in kube-system": (
            broken(wf, lambda w: node(w, "NetworkChaos")["networkChaos"].update(
                target={"mode": "all", "selector": {"namespaces": ["kube-system"]}})),
            {"chaos-namespace-allowlist", "chaos-never-system-namespaces"},
        ),
        "workflow node without a deadline": (
            broken(wf, lambda w: node(w, "StressChaos").pop("deadline")),
            {"workflow-chaos-bounded"},
        ),
        "workflow node without namespaces": (
            broken(wf, lambda w: node(w, "StressChaos")["stressChaos"]["selector"].pop(
                "namespaces")),
            {"workflow-chaos-bounded"},
        ),
        "workflow nesting a schedule": (
            broken(wf, lambda w: w["spec"]["templates"].append(
                {"name": "x", "templateType": "Schedule", "deadline": "1m",
                 "schedule": {"schedule": "@every 1m", "type": "PodChaos",
                              "podChaos": kill["spec"]}})),
            {"chaos-no-nesting"},
        ),
        "schedule in kube-system": (
            {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "Schedule",
             "spec": {"schedule": "@every 5m", "type": "PodChaos",
                      "podChaos": {**kill["spec"], "selector": {"namespaces": ["kube-system"]}}}},
            {"chaos-namespace-allowlist", "chaos-never-system-namespaces"},
        ),
        "schedule of an endless partition": (
            {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "Schedule",
             "spec": {"schedule": "@every 5m", "type": "NetworkChaos",
                      "networkChaos": {k: v for k, v in net["spec"].items() if k != "duration"}}},
            {"schedule-chaos-bounded"},
        ),
        "schedule running a workflow": (
            {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "Schedule",
             "spec": {"schedule": "@every 5m", "type": "Workflow", "workflow": wf["spec"]}},
            {"chaos-no-nesting"},
        ),
    }  # fmt: skip
    for name, (resource, rules) in cases.items():
        assert set(_kyverno_denies(policy, resource)) == rules, name
    # the schedules that are fine are admitted (a kill needs no duration)
    ok = {
        "apiVersion": "chaos-mesh.org/v1alpha1",
        "kind": "Schedule",
        "spec": {"schedule": "@every 5m", "type": "PodChaos", "podChaos": kill["spec"]},
    }
    assert _kyverno_denies(policy, ok) == []
    _check_manifest({**ok, "metadata": {"name": "ok", "namespace": "chaos-system"}})


def test_the_schema_check_catches_a_broken_manifest() -> None:
    m = copy.deepcopy(next(x for x in chaos_mesh(_drill(), _fleet()).manifests if _chaos(x)))
    m["spec"]["mode"] = "some"
    with pytest.raises(AssertionError, match="mode"):
        _check_manifest(m)
    m = copy.deepcopy(next(x for x in chaos_mesh(_drill(), _fleet()).manifests if _chaos(x)))
    m["spec"]["selector"]["labelSelector"] = {"app": "x"}  # a typo: labelSelectors
    with pytest.raises(AssertionError, match="labelSelector"):
        _check_manifest(m)
    policy = kyverno_policy(_drill())
    policy["spec"]["rules"][0]["validate"]["failureAction"] = "Deny"
    with pytest.raises(AssertionError, match="failureAction"):
        _check_manifest(policy)
    wf = chaos_workflow(_drill(), _fleet()).workflow
    assert wf is not None
    wf["spec"]["templates"][1]["templateType"] = 7  # not a string
    with pytest.raises(AssertionError, match="templateType"):
        _check_manifest(wf)


def test_chaos_mesh_export_is_deterministic() -> None:
    loaded = load_drill(ROOT / "examples" / "drills" / "l1-replica-kill.yaml")
    a = render(chaos_mesh(loaded.spec, loaded.fleet))
    b = render(chaos_mesh(loaded.spec, loaded.fleet))
    assert a == b
    result = runner.invoke(app, ["export", "chaos-mesh", str(loaded.path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == a


def test_cli_writes_chaos_mesh_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "l1.yaml"
    drill = ROOT / "examples" / "drills" / "l1-replica-kill.yaml"
    result = runner.invoke(
        app, ["export", "chaos-mesh", str(drill), "-o", str(out), "--chaos-namespace", "chaos"]
    )
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d is not None]
    assert [d["kind"] for d in docs] == ["ClusterPolicy", "PodChaos", "PodChaos"]
    assert {d["metadata"]["namespace"] for d in docs[1:]} == {"chaos"}


# --- AWS FIS ----------------------------------------------------------------------------------


def _fis_exports() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for loaded in _examples():
        regions = [
            i.region
            for i in loaded.spec.injections
            if i.kind in ("region_blackhole", "capacity_denial")
        ]
        for region in dict.fromkeys(regions):
            opts = FisOptions(region=region)
            out.append(
                (
                    f"{loaded.spec.name}@{region}",
                    fis_template(loaded.spec, loaded.fleet, options=opts).template,
                )
            )
    out.append(("synthetic", fis_template(_drill(), _fleet()).template))
    return out


def test_fis_templates_fit_botocores_create_experiment_template_shape() -> None:
    exports = _fis_exports()
    assert len(exports) >= 2  # the synthetic drill and at least one example
    for name, template in exports:
        try:
            _check_fis(template)
        except (ParamValidationError, ValueError) as exc:  # pragma: no cover - failure message
            pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize(
    "breakage",
    [
        lambda t: t.pop("roleArn"),
        lambda t: t.pop("clientToken"),
        lambda t: t["stopConditions"][0].pop("source"),
        lambda t: t["actions"]["wait-until-t7m"]["parameters"].update(duration=120),
        lambda t: t.update(description="x" * 513),
        lambda t: t["tags"].update({f"k{i}": "v" for i in range(50)}),
        lambda t: t["experimentOptions"].update(emptyTargetResolutionMode="ignore"),
        lambda t: t["actions"]["wait-until-t7m"].update(startAfter="i0"),
        lambda t: t.update(actions={"has space": {"actionId": "aws:fis:wait"}}),
    ],
)
def test_the_fis_shape_check_fails_a_broken_template(breakage: Any) -> None:
    template = copy.deepcopy(fis_template(_drill(), _fleet()).template)
    _check_fis(template)
    breakage(template)
    with pytest.raises((ParamValidationError, ValueError)):
        _check_fis(template)


def test_fis_actions_are_the_documented_ones_with_their_parameters_and_targets() -> None:
    for name, template in _fis_exports():
        for action_name, action in template["actions"].items():
            doc = FIS_ACTIONS.get(action["actionId"])
            assert doc is not None, f"{name}: {action['actionId']} is not a documented action"
            params = set(action.get("parameters", {}))
            assert set(doc.required) <= params <= set(doc.parameters), (name, action_name)
            if doc.target_key is None:
                assert "targets" not in action
            else:
                assert set(action["targets"]) == {doc.target_key}
                target = template["targets"][action["targets"][doc.target_key]]
                assert target["resourceType"] == doc.resource_type
            for before in action.get("startAfter", []):
                assert before in template["actions"], (name, action_name, before)
            for key in ("duration",):
                if key in action.get("parameters", {}):
                    assert re.fullmatch(r"PT(\d+H)?(\d+M)?(\d+S)?", action["parameters"][key])


def _iso_s(text: str) -> int:
    m = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?", text)
    assert m is not None, text
    h, mi, s = (int(x or 0) for x in m.groups())
    return h * 3600 + mi * 60 + s


def test_fis_timeline_waits_then_acts_and_ends_by_the_cap() -> None:
    spec = _drill()
    tpl = fis_template(spec, _fleet()).template
    actions = tpl["actions"]

    def start_s(name: str) -> int:
        """When an action starts: the end of the wait chain it hangs from."""
        a = actions[name]
        after = a.get("startAfter", [])
        if not after:
            return 0
        (prev,) = after
        assert actions[prev]["actionId"] == "aws:fis:wait"
        return start_s(prev) + _iso_s(actions[prev]["parameters"]["duration"])

    cap = spec.duration_cap_s
    assert cap is not None
    real = {n: a for n, a in actions.items() if a["actionId"] != "aws:fis:wait"}
    assert set(real) == {
        "i5-no-gpu-capacity-asg",
        "i7-cut-tgw-us-west-2",
        "i7-cut-routes-us-west-2",
        "i7-pause-crr-us-west-2",
        "i7-cut-tgw-eu-west-1",
        "i7-cut-routes-eu-west-1",
        "i7-pause-crr-eu-west-1",
    }
    for name, a in real.items():
        index = int(name.split("-")[0][1:])
        at = spec.injections[index].at_s
        assert start_s(name) == at, name
        assert start_s(name) + _iso_s(a["parameters"]["duration"]) <= cap
    assert actions["i7-cut-tgw-us-west-2"]["parameters"]["duration"] == "PT21M"  # 30m cap - 9m
    assert actions["i5-no-gpu-capacity-asg"]["parameters"] == {
        "availabilityZoneIdentifiers": "us-east-1a,us-east-1b,us-east-1c",
        "duration": "PT23M",
        "percentage": "100",
    }


def test_stop_conditions_become_cloudwatch_alarms_in_the_account_and_region() -> None:
    spec = _drill()
    export = fis_template(spec, _fleet(), options=FisOptions(account="444455556666"))
    stops = export.template["stopConditions"]
    assert [s["source"] for s in stops] == ["aws:cloudwatch:alarm"] * len(spec.stop_conditions)
    assert [s["value"] for s in stops] == [
        "arn:aws:cloudwatch:us-east-1:444455556666:alarm:l2-everything-llm-70b-region-5xx",
        "arn:aws:cloudwatch:us-east-1:444455556666:alarm:l2-everything-llm-70b-kv.usage",
    ]
    assert export.alarms[0] == ("l2-everything-llm-70b-region-5xx", "error ratio over 5m > 0.02")
    assert export.template["tags"] == {"drill": spec.name, "rung": "L2", "model": "llm-70b"}
    assert PLACEHOLDER_ROLE in export.template["roleArn"]
    assert export.template["roleArn"].startswith("arn:aws:iam::444455556666:role/")


def test_fis_refuses_what_it_cannot_express() -> None:
    with pytest.raises(ExportError, match="no stop condition"):
        fis_template(_drill(stop_conditions=[]), _fleet())
    with pytest.raises(ExportError, match="no FIS action"):
        fis_template(_drill(injections=[{"at": "2m", "kind": "replica_kill", "cell": "use1-a"}]),
                     _fleet())  # fmt: skip
    with pytest.raises(ExportError, match="no FIS action in region 'us-west-2'"):
        fis_template(_drill(), _fleet(), options=FisOptions(region="us-west-2"))
    with pytest.raises(ExportError, match="no duration cap"):
        fis_template(_drill(duration_cap=None), _fleet())


def test_api_capacity_error_targets_the_given_node_roles() -> None:
    roles = ("arn:aws:iam::444455556666:role/karpenter-node",)
    tpl = fis_template(_drill(), _fleet(), options=FisOptions(capacity_role_arns=roles)).template
    _check_fis(tpl)
    api = tpl["actions"]["i5-no-gpu-capacity-api"]
    assert api["actionId"] == "aws:ec2:api-insufficient-instance-capacity-error"
    assert tpl["targets"][api["targets"]["Roles"]]["resourceArns"] == list(roles)


def test_iso_and_go_durations() -> None:
    assert [iso_duration(s) for s in (45 * 60, 5400, 90, 12 * 3600, 0)] == [
        "PT45M",
        "PT1H30M",
        "PT1M30S",
        "PT12H",
        "PT0S",
    ]
    assert [go_duration(s) for s in (15 * 60, 5400, 90, 3661)] == [
        "15m",
        "1h30m",
        "1m30s",
        "1h1m1s",
    ]


def test_cli_fis_with_account_and_role_is_deterministic(tmp_path: Path) -> None:
    drill = ROOT / "examples" / "drills" / "l6-capacity-denial.yaml"
    role = "arn:aws:iam::444455556666:role/fis-dr-drill"
    args = ["export", "fis", str(drill), "--account", "444455556666", "--role-arn", role]
    first = runner.invoke(app, [*args, "-o", str(tmp_path / "a.json")])
    second = runner.invoke(app, [*args, "-o", str(tmp_path / "b.json")])
    assert first.exit_code == 0, first.output
    assert second.exit_code == 0, second.output
    a = (tmp_path / "a.json").read_bytes()
    assert a == (tmp_path / "b.json").read_bytes()
    template = json.loads(a)
    _check_fis(template)
    assert template["roleArn"] == role
    assert "--region us-west-2" in " ".join(first.output.split())  # the other templates
    west = runner.invoke(app, [*args, "--region", "us-west-2"])
    assert west.exit_code == 0, west.output
    assert (
        json.loads(west.stdout)["actions"]["i0-no-gpu-capacity-asg"]["parameters"][
            "availabilityZoneIdentifiers"
        ]
        == "us-west-2a,us-west-2b,us-west-2c"
    )


def test_cli_fis_without_cloud_faults_exits_4() -> None:
    drill = ROOT / "examples" / "drills" / "l1-replica-kill.yaml"
    result = runner.invoke(app, ["export", "fis", str(drill)])
    assert result.exit_code == 4
    assert "no FIS action" in result.output


def test_exports_are_typed_results() -> None:
    export = chaos_mesh(_drill(), _fleet())
    assert isinstance(export, ChaosMeshExport)
    assert export.namespaces == ("serve-chat", "staging-chat")
