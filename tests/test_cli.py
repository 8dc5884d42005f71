"""The CLI contract: schema, clear spec errors with exit code 4, series exports."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.cli.common import ExitCode, group

runner = CliRunner()


def test_schema_fleet_is_json_schema() -> None:
    result = runner.invoke(app, ["schema", "fleet"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert "regions" in schema["properties"]
    assert schema["$schema"].startswith("https://json-schema.org/")


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("drill-report", {"verdict", "hypothesis", "rto", "timeline", "charts"}),
        ("respond-report", {"scenario", "incidents", "expectations", "passed"}),
    ],
)
def test_the_report_schemas_are_versioned_json_schema(kind: str, fields: set[str]) -> None:
    result = runner.invoke(app, ["schema", kind])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["$id"] == f"firedrill:{kind}:v{schema['version']}"
    assert fields <= set(schema["properties"])
    jsonschema.Draft202012Validator.check_schema(schema)


def test_exit_codes_are_one_enum_with_the_documented_values() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0, "FAILED": 1, "USAGE": 2, "ABORTED": 3, "INPUT": 4, "REFUSED": 5,
        "CANCELLED": 130,
    }  # fmt: skip


def test_a_command_module_finds_a_shared_group_whatever_the_order() -> None:
    import typer

    root = typer.Typer()
    first = group(root, "export", "Manifests.")
    assert group(root, "export") is first
    assert [g.name for g in root.registered_groups] == ["export"]


def test_malformed_spec_names_file_line_and_field(tmp_path: Path) -> None:
    text = Path("examples/fleet.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("weights_gb: 140", "weights_gb: lots", 1))
    result = runner.invoke(
        app, ["twin", "run", str(bad), "--hours", "0.01", "--out", str(tmp_path)]
    )
    assert result.exit_code == 4
    line = next(i for i, ln in enumerate(bad.read_text().splitlines(), 1) if "lots" in ln)
    assert f"bad.yaml:{line}" in result.output
    assert "weights_gb" in result.output
    assert not (tmp_path / "summary.json").exists()  # nothing run


def test_missing_spec_file_is_exit_4(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["twin", "run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 4


def test_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    args = ["twin", "run", "examples/fleet.yaml", "--window", "9:3", "--out", str(tmp_path)]
    assert runner.invoke(app, args).exit_code == 2


def test_promtool_input_series_export(tmp_path: Path) -> None:
    args = [
        "twin", "run", "examples/fleet.yaml", "--hours", "0.1", "--seed", "3",
        "--out", str(tmp_path), "--series", "promtool", "--window", "0:300", "--quiet",
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((tmp_path / "input_series.yaml").read_text())
    names = {item["series"].split("{", 1)[0] for item in data}
    for want in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
        "http_requests_total",
    ):
        assert want in names
    ttft = [
        i["series"] for i in data if i["series"].startswith("vllm:time_to_first_token_seconds_b")
    ]
    assert any('le="2.5"' in s for s in ttft)
    assert not any('le="2.0"' in s for s in ttft)  # real vLLM has no 2.0 s TTFT boundary
    assert all(
        'cell="' in i["series"] and 'region="' in i["series"] for i in data if "vllm" in i["series"]
    )
