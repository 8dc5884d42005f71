"""Spec files: the shipped examples load, and every kind of mistake is reported where it is."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from firedrill.errors import SpecError
from firedrill.model.spec import FleetSpec, NodePoolSpec
from firedrill.specfile import json_schema, load_fleet, load_spec, spec_sha256

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "fleet.yaml"
FLEET_10K = ROOT / "examples" / "fleet-10k.yaml"
MAKE_FLEET = ROOT / "benchmarks" / "make_fleet.py"

# A small valid fleet; each test breaks one thing. Node counts differ per pool so that a
# replacement hits exactly one place.
VALID = """\
name: test
models:
  - name: llm-70b
    weights_gb: 140
    tp: 8
    weights: {digest: "sha256:0123456789abcdef0123"}
    bundle:
      digest: "sha256:1123456789abcdef0123"
      prompt_digest: "sha256:2123456789abcdef0123"
      toolset_digest: "sha256:3123456789abcdef0123"
regions:
  - name: us-east-1
    cells:
      - name: use1-a
        node_pools:
          - name: h100-serve
            nodes: 4
        replicas: {llm-70b: 4}
      - name: use1-b
        node_pools:
          - name: h100-serve
            nodes: 5
  - name: us-west-2
    replicate_from: us-east-1
    cells:
      - name: usw2-a
        node_pools:
          - name: h100-serve
            nodes: 6
products:
  - name: chat
    model: llm-70b
    peak_rps: {us-east-1: 10, us-west-2: 5}
tenants:
  - {name: acme, tier: paid, share: 0.6}
  - {name: globex, tier: free, share: 0.4}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _broken(tmp_path: Path, old: str, new: str) -> tuple[Path, str]:
    assert VALID.count(old) == 1, old
    text = VALID.replace(old, new)
    return _write(tmp_path, text), text


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line containing `needle`."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[nth - 1]


def _load_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_fleet(path)
    assert info.value.file == str(path)
    return info.value


def _nodes(spec: FleetSpec) -> int:
    return sum(p.nodes for r in spec.regions for c in r.cells for p in c.node_pools)


# --- the shipped examples ------------------------------------------------------------------------


def test_demo_fleet_has_the_documented_shape() -> None:
    spec = load_fleet(DEMO)
    assert spec.name == "demo"
    assert 580 <= _nodes(spec) <= 620
    assert [r.name for r in spec.regions] == ["us-east-1", "us-west-2", "eu-west-1"]
    assert [c.name for r in spec.regions for c in r.cells] == [
        "use1-a", "use1-b", "use1-c", "usw2-a", "usw2-b", "euw1-a", "euw1-b",
    ]  # fmt: skip
    assert [(j.name, j.region, j.cell, j.nodes) for j in spec.training] == [
        ("pretrain-405b", "us-east-1", "use1-c", 64)
    ]
    assert spec.faults.phantom_xid_exporter_versions == ["3.3.9-3.6.1"]
    default_exporter = NodePoolSpec(name="x", nodes=1).versions.dcgm_exporter
    assert default_exporter not in spec.faults.phantom_xid_exporter_versions


@pytest.mark.parametrize(
    ("product", "rps_per_replica"), [("chat", 11.0), ("code", 30.0)], ids=["chat", "code"]
)
def test_demo_fleet_peak_demand_is_about_55_percent_of_capacity(
    product: str, rps_per_replica: float
) -> None:
    spec = load_fleet(DEMO)
    prod = next(p for p in spec.products if p.name == product)
    for region in spec.regions:
        replicas = sum(c.replicas.get(prod.model, 0) for c in region.cells)
        utilisation = prod.peak_rps[region.name] / (rps_per_replica * replicas)
        assert utilisation == pytest.approx(0.55, abs=0.01), region.name


def _make_fleet_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_fleet", MAKE_FLEET)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_10k_fleet_is_what_the_generator_writes() -> None:
    generated = _make_fleet_module().render_fleet(10_000)
    assert FLEET_10K.read_text(encoding="utf-8") == generated, (
        "examples/fleet-10k.yaml is stale: regenerate it with "
        "benchmarks/make_fleet.py --nodes 10000 --out examples/fleet-10k.yaml"
    )


def test_10k_fleet_validates_and_has_10k_nodes() -> None:
    spec = load_fleet(FLEET_10K)
    assert _nodes(spec) == pytest.approx(10_000, rel=0.01)
    assert len(spec.regions) == 3
    assert [j.nodes for j in spec.training] == [64]


def test_generator_is_deterministic_and_sized_for_other_counts() -> None:
    make_fleet = _make_fleet_module()
    assert make_fleet.render_fleet(2_000) == make_fleet.render_fleet(2_000)
    assert _nodes(make_fleet.make_fleet(2_000)) == 2_000


# --- mistakes and where they are reported --------------------------------------------------------


def test_the_valid_fixture_loads(tmp_path: Path) -> None:
    spec = load_fleet(_write(tmp_path, VALID))
    assert _nodes(spec) == 15


def test_wrong_type_deep_in_the_tree(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "nodes: 5", "nodes: many")
    err = _load_error(path)
    assert err.field == "regions[0].cells[1].node_pools[0].nodes"
    assert err.line == _line_of(text, "nodes: many")
    assert "'many'" in err.reason
    assert f"{path}:{err.line}" in str(err)


def test_unknown_key_is_a_typo_not_a_default(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "replicate_from:", "replicate_form:")
    err = _load_error(path)
    assert err.field == "regions[1].replicate_form"
    assert err.line == _line_of(text, "replicate_form:")
    assert "unknown field" in err.reason


def test_typo_in_a_required_key_reports_the_typo_first(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "weights_gb: 140", "weight_gb: 140")
    err = _load_error(path)
    assert (err.field, err.line) == ("models[0].weight_gb", _line_of(text, "weight_gb:"))
    assert {e.field for e in err.errors} == {"models[0].weight_gb", "models[0].weights_gb"}


def test_missing_required_field_points_at_its_mapping(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "            nodes: 6\n", "")
    err = _load_error(path)
    assert err.field == "regions[1].cells[0].node_pools[0].nodes"
    assert err.line == _line_of(text, "- name: h100-serve", nth=3)
    assert "missing" in err.reason


def test_every_error_is_kept_in_file_order(tmp_path: Path) -> None:
    text = VALID.replace("nodes: 4", "nodes: -1").replace("nodes: 6", "nodes: lots")
    err = _load_error(_write(tmp_path, text))
    assert [e.field for e in err.errors] == [
        "regions[0].cells[0].node_pools[0].nodes",
        "regions[1].cells[0].node_pools[0].nodes",
    ]
    assert (err.field, err.line) == (err.errors[0].field, err.errors[0].line)
    assert [e.line for e in err.errors] == [_line_of(text, "nodes: -1"), _line_of(text, "lots")]


def test_product_naming_an_unknown_model(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "model: llm-70b", "model: llm-x")
    err = _load_error(path)
    assert err.line is not None
    assert err.line == _line_of(text, "model: llm-x")
    assert err.field == "products[0].model"
    assert "unknown model 'llm-x'" in err.reason


def test_cell_declared_twice_points_at_the_second(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "- name: usw2-a", "- name: use1-a")
    err = _load_error(path)
    assert err.line == _line_of(text, "- name: use1-a", nth=2)
    assert err.field == "regions[1].cells[0].name"


def test_model_level_error_without_a_name_still_has_a_line(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "share: 0.4", "share: 0.5")
    err = _load_error(path)
    assert err.line == _line_of(text, "tenants:")
    assert "add up to 1" in err.reason


def test_bad_yaml_syntax_reports_the_line(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "nodes: 5", "nodes: 5: 6")
    err = _load_error(path)
    assert err.line == _line_of(text, "nodes: 5: 6")
    assert err.field is None
    assert "invalid YAML" in err.reason


def test_unclosed_flow_mapping_is_a_syntax_error(tmp_path: Path) -> None:
    path, _ = _broken(tmp_path, "replicas: {llm-70b: 4}", "replicas: {llm-70b: 4")
    err = _load_error(path)
    assert err.line is not None
    assert "invalid YAML" in err.reason


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "nodes: 5\n", "nodes: 5\n            nodes: 50\n")
    err = _load_error(path)
    assert err.line == _line_of(text, "nodes: 50")
    assert err.field == "regions[0].cells[1].node_pools[0].nodes"
    assert f"first on line {_line_of(text, 'nodes: 5')}" in err.reason


def test_duplicate_key_in_a_flow_mapping_is_an_error(tmp_path: Path) -> None:
    path, text = _broken(tmp_path, "{llm-70b: 4}", "{llm-70b: 4, llm-70b: 8}")
    err = _load_error(path)
    assert err.line == _line_of(text, "llm-70b: 8")
    assert err.field == "regions[0].cells[0].replicas.llm-70b"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    err = _load_error(path)
    assert err.line is None
    assert err.field is None
    assert str(path) in str(err)


def test_spec_sha256_of_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError):
        spec_sha256(tmp_path / "nowhere.yaml")


def test_empty_file(tmp_path: Path) -> None:
    err = _load_error(_write(tmp_path, "# nothing here\n"))
    assert "no document" in err.reason


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    err = _load_error(_write(tmp_path, "- just\n- a list\n"))
    assert err.line == 1


def test_load_spec_validates_any_model(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: h100-serve\nnodes: 3\nrole: training\n")
    pool = load_spec(path, NodePoolSpec)
    assert (pool.nodes, pool.role) == (3, "training")
    path.write_text("name: h100-serve\nnodes: 3\nrole: cooking\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path, NodePoolSpec)
    assert (info.value.field, info.value.line) == ("role", 3)


# --- digest and schema ---------------------------------------------------------------------------


def test_spec_sha256_is_the_digest_of_the_raw_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    assert spec_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(VALID + "# a comment changes the digest\n", encoding="utf-8")
    assert spec_sha256(path) != hashlib.sha256(VALID.encode()).hexdigest()


def test_json_schema_is_serialisable_and_describes_the_fleet() -> None:
    schema = json_schema(FleetSpec)
    assert json.loads(json.dumps(schema)) == schema
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["title"] == "FleetSpec"
    assert "regions" in schema["properties"]
    assert "regions" in schema["required"]
