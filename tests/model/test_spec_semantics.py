"""Values the schema's types accept but no run can use are refused at load, naming where.

Each case takes a shipped example, breaks one value the way a slip or a hostile hand would, and
loads it the way the commands do: the answer is a `SpecError` with the file, the line and the
field (exit 4), never a traceback from the first use (a NumPy overflow, a MemoryError, a hang).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.errors import SpecError
from firedrill.specfile import load_drill, load_fleet, load_scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LOADERS: dict[str, Callable[[Path], Any]] = {
    "fleet.yaml": load_fleet,
    "scenarios/phantom-xid-canary.yaml": load_scenario,
    "scenarios/exporter-upgrade-storm.yaml": load_scenario,
    "drills/l5-region-blackhole.yaml": load_drill,
}
ARGS = "args: {node: gpu-use1-a-h100-serve-0003, gpu: 0, field_id: 230, value: 79}"

# (example, text to replace, replacement, the field named, text in the reason)
CASES: dict[str, tuple[str, str, str, str, str]] = {
    "peak_rps .inf": (
        "fleet.yaml",
        "us-east-1: 1016",
        "us-east-1: .inf",
        "products[0].peak_rps.us-east-1",
        "finite",
    ),
    "peak_rps quoted 1e400": (
        "fleet.yaml",
        "us-east-1: 1016",
        'us-east-1: "1e400"',
        "products[0].peak_rps.us-east-1",
        "finite",
    ),
    "sandboxes 1e12": (
        "fleet.yaml",
        "sandboxes: 40}",
        "sandboxes: 1000000000000}",
        "tenants[0].sandboxes",
        "less than or equal",
    ),
    "replicas far above the cell": (
        "fleet.yaml",
        "replicas: {llm-70b: 56, llm-8b: 128}",
        "replicas: {llm-70b: 90000, llm-8b: 128}",
        "regions[0].cells[0]",
        "cannot hold",
    ),
    "prefill_c_s_per_token2 .inf": (
        "fleet.yaml",
        "prefill_c_s_per_token2: 0.0",
        "prefill_c_s_per_token2: .inf",
        "prefill_c_s_per_token2",
        "finite",
    ),
    "scenario seed negative": (
        "scenarios/phantom-xid-canary.yaml",
        "seed: 7",
        "seed: -1",
        "seed",
        "greater than",
    ),
    "args: a list for a value": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        "args: {node: gpu-use1-a-h100-serve-0003, gpu: 0, field_id: 230, value: [79]}",
        "timeline[0].args",
        "InjectDcgmField.value: expected a number",
    ),
    "args: a map for a node": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        "args: {node: {x: 1}, gpu: 0, field_id: 230, value: 79}",
        "timeline[0].args",
        "InjectDcgmField.node: expected a string",
    ),
    "args: a missing field_id": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        "args: {node: gpu-use1-a-h100-serve-0003, gpu: 0, value: 79}",
        "timeline[0].args",
        "missing field 'field_id'",
    ),
    "args: NaN": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        "args: {node: gpu-use1-a-h100-serve-0003, gpu: 0, field_id: 230, value: .nan}",
        "timeline[0].args",
        "InjectDcgmField.value: must be a finite number",
    ),
    "args: a negative GPU": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        "args: {node: gpu-use1-a-h100-serve-0003, gpu: -3, field_id: 230, value: 79}",
        "timeline[0].args",
        "InjectDcgmField.gpu: must be within 0..63",
    ),
    "args: a 400-digit float": (
        "scenarios/phantom-xid-canary.yaml",
        ARGS,
        f"args: {{node: gpu-use1-a-h100-serve-0003, gpu: 0, field_id: 230, value: {'9' * 400}}}",
        "timeline[0].args",
        "InjectDcgmField.value: a 1329-bit integer is too large",
    ),
    "a 400-digit duration": (
        "scenarios/phantom-xid-canary.yaml",
        "  - at: 2m",
        f"  - at: {'9' * 400}s",
        "timeline[0].at",
        "should match pattern",
    ),
    "an unknown component": (
        "scenarios/exporter-upgrade-storm.yaml",
        "component: dcgm_exporter",
        "component: hypervisor",
        "timeline[0].args",
        "SetNodeVersion.component: 'hypervisor'",
    ),
    "drill seed negative": (
        "drills/l5-region-blackhole.yaml",
        "seed: 7",
        "seed: -5",
        "seed",
        "greater than",
    ),
    "drill budget of 400 digits": (
        "drills/l5-region-blackhole.yaml",
        "budget: 10m",
        f"budget: {'9' * 400}m",
        "rto.budget",
        "should match pattern",
    ),
}


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples"


def _break(examples: Path, case: str) -> tuple[Path, Callable[[Path], Any], int, str, str]:
    name, old, new, field, reason = CASES[case]
    path = examples / name
    text = path.read_text()
    assert old in text, (name, old)
    path.write_text(text.replace(old, new, 1))  # the first one: the line to point at
    # a cell that cannot hold its replicas is pointed at by its name
    needle = "name: use1-a" if "cannot hold" in reason else new
    line = next(i for i, row in enumerate(path.read_text().splitlines(), 1) if needle in row)
    return path, LOADERS[name], line, field, reason


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_value_no_run_can_use_is_refused_at_load(examples: Path, case: str) -> None:
    path, loader, line, field, reason = _break(examples, case)
    with pytest.raises(SpecError) as info:
        loader(path)
    error = info.value
    assert error.file == str(path)
    assert error.line == line, str(error)
    assert error.field is not None
    assert field in error.field, str(error)
    assert reason in error.reason, str(error)


def test_the_examples_still_load(examples: Path) -> None:
    for name, loader in LOADERS.items():
        loader(examples / name)
    for scenario in (examples / "scenarios").glob("*.yaml"):
        load_scenario(scenario)
    for drill in (examples / "drills").glob("*.yaml"):
        load_drill(drill)


@pytest.mark.parametrize(
    ("case", "command"),
    [
        ("args: a list for a value", "respond"),
        ("an unknown component", "respond"),
        ("sandboxes 1e12", "twin run"),
        ("drill budget of 400 digits", "gameday run"),
    ],
)
def test_the_cli_exits_4_naming_file_and_line(
    examples: Path, tmp_path: Path, case: str, command: str
) -> None:
    path, _, line, _, _ = _break(examples, case)
    args = [*command.split(), str(path)]
    if command == "twin run":
        args += ["--out", str(tmp_path / "out"), "--hours", "0.01", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--quiet"] if command != "twin run" else args)
    assert result.exit_code == 4, result.output
    assert f"{path}:{line}" in result.output.replace("\n", "")


@pytest.mark.parametrize("command", ["twin run", "alerting compare", "gameday run"])
def test_a_negative_seed_is_a_usage_error_not_a_traceback(tmp_path: Path, command: str) -> None:
    spec = {
        "twin run": str(EXAMPLES / "fleet.yaml"),
        "alerting compare": str(EXAMPLES / "slo.yaml"),
        "gameday run": str(EXAMPLES / "drills" / "l1-replica-kill.yaml"),
    }[command]
    result = CliRunner().invoke(
        app, [*command.split(), spec, "--seed", "-1", "--quiet"], catch_exceptions=True
    )
    assert result.exit_code == 2, result.output
    assert "--seed" in result.output
