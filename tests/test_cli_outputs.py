"""Output paths are checked before anything runs (exit 4), and ``-`` writes to stdout.

An output that cannot be written is one under a regular file ("blocker/result.json"): no user,
root included, can create it, so the check is exercised whatever the test runs as.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from firedrill.cli import app

ROOT = Path(__file__).resolve().parents[1]
DRILL = str(ROOT / "examples" / "drills" / "l1-replica-kill.yaml")
SCENARIO = str(ROOT / "examples" / "scenarios" / "xid13-no-drain.yaml")
SLO = str(ROOT / "examples" / "slo.yaml")
FLEET = str(ROOT / "examples" / "fleet.yaml")
POLICY = str(ROOT / "examples" / "policy.yaml")
runner = CliRunner()


def _blocked(tmp_path: Path) -> Path:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    return blocker


CASES = {
    "gameday run --json": (["gameday", "run", DRILL, "--json"], "file"),
    "gameday run --markdown": (["gameday", "run", DRILL, "--markdown"], "file"),
    "gameday run --html": (["gameday", "run", DRILL, "--html"], "file"),
    "gameday run --out": (["gameday", "run", DRILL, "--out"], "dir"),
    "gameday run --runs --json": (["gameday", "run", DRILL, "--runs", "2", "--json"], "file"),
    "respond --json": (["respond", SCENARIO, "--json"], "file"),
    "alerting compare --json": (["alerting", "compare", SLO, "--json"], "file"),
    "alerting compare --html": (["alerting", "compare", SLO, "--html"], "file"),
    "twin run --out": (["twin", "run", FLEET, "--hours", "0.01", "--out"], "dir"),
    "rules generate --out": (["rules", "generate", SLO, "--out"], "dir"),
    "export nhc --out": (["export", "nhc", POLICY, "--out"], "file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unwritable_output_is_refused_before_running(tmp_path: Path, case: str) -> None:
    args, kind = CASES[case]
    target = _blocked(tmp_path) / ("result.json" if kind == "file" else "out")
    journals = tmp_path / "journals"
    extra = ["--journal-dir", str(journals)] if args[0] == "gameday" else []
    quiet = ["--quiet"] if args[0] not in ("rules", "export") else []
    result = runner.invoke(app, [*args, str(target), *extra, *quiet])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 4, result.output
    assert str(target) in result.output.replace("\n", "")
    assert args[-1] in result.output  # names the option
    assert not journals.exists() or not any(journals.iterdir())  # no drill started


def test_an_output_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["respond", SCENARIO, "--json", str(tmp_path), "--quiet"])
    assert result.exit_code == 4, result.output
    assert "is a directory" in result.output.replace("\n", " ")


def test_gameday_json_dash_writes_the_result_to_stdout(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["gameday", "run", DRILL, "--json", "-", "--journal-dir", str(tmp_path)]
    )
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    assert report["drill"]
    assert report["verdict"] in ("passed", "failed")
    assert not (tmp_path / "-").exists()
    assert not Path("-").exists()


def test_respond_json_dash_writes_the_run_to_stdout() -> None:
    result = runner.invoke(app, ["respond", SCENARIO, "--json", "-"])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.stdout)
    assert data["scenario"] == "xid13-no-drain"
    assert not Path("-").exists()
