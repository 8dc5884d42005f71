"""The L5 example drill gives the same report embedded and against ``firedrill twin serve``.

The served twin is started exactly as an operator would (its own process, loopback, manual clock,
the control token in a file) on the fleet and seed the embedded run builds its twin from; the
drill then runs twice through ``gameday run``: on its embedded twin, and with ``--target``. Every
fact the drill judges (digests admitted, attested survivors, refused capacity, chains) comes
through the ports, so the two reports must agree field for field.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.specfile import load_drill

ROOT = Path(__file__).resolve().parents[2]
L5 = ROOT / "examples" / "drills" / "l5-region-blackhole.yaml"
TIMEOUT_S = 20.0
CONTROL = re.compile(r"control API on http://127\.0\.0\.1:(\d+)/v1/")


def _firedrill() -> list[str]:
    script = Path(sys.executable).parent / "firedrill"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from firedrill.cli import main; main()"]


@contextmanager
def served_twin(fleet: dict[str, Any], seed: int, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``twin serve`` of ``fleet`` (a fleet spec's YAML data) at ``seed`` on a manual clock, in
    its own process as an operator starts it: (its URL, its token file); stopped on exit."""
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    log_path, token_file = tmp_path / "twin.log", tmp_path / "twin-token"
    args = ["twin", "serve", str(fleet_path), "--port", "0", "--manual-clock"]
    args += ["--seed", str(seed), "--token-file", str(token_file)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("FIREDRILL_TWIN_TOKEN", None)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*_firedrill(), *args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path
        )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while (found := CONTROL.search(log_path.read_text(errors="replace"))) is None:
            if process.poll() is not None:
                raise AssertionError(f"twin serve exited early:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"twin serve did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{found.group(1)}", token_file
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def served_l5_world(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The twin the L5 drill would build (its fleet at its start hour, its seed), served."""
    loaded = load_drill(L5)
    fleet = yaml.safe_load((L5.parent / loaded.spec.fleet).read_text())
    fleet["start_hour_utc"] = loaded.spec.start_hour_utc
    with served_twin(fleet, loaded.spec.seed, tmp_path) as served:
        yield served


def _gameday(tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    args = ["gameday", "run", str(L5), "--seed", "7", "--quiet", "--json", str(out)]
    args += ["--journal-dir", str(tmp_path / f"journal-{name}"), *extra]
    result = CliRunner().invoke(app, args, env={"FIREDRILL_TWIN_TOKEN": ""})
    assert result.exit_code == 0, f"{name}: exit {result.exit_code}\n{result.output}"
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_the_l5_drill_is_the_same_embedded_and_against_a_served_twin(
    served_l5_world: tuple[str, Path], tmp_path: Path
) -> None:
    url, token_file = served_l5_world
    embedded = _gameday(tmp_path, "embedded")
    remote = _gameday(tmp_path, "remote", "--target", url, "--token-file", str(token_file))
    assert embedded["verdict"] == remote["verdict"] == "passed"
    clauses = [(c["clause"], c["observed"], c["passed"]) for c in embedded["hypothesis"]]
    assert [(c["clause"], c["observed"], c["passed"]) for c in remote["hypothesis"]] == clauses
    observed = {c["metric"]: c["observed"] for c in remote["hypothesis"]}
    # the two clauses only the twin's internals could answer before the ports did
    assert observed["unsigned_admitted"] == 0
    assert observed["survivor_digest_attested"] == 1
    assert None not in observed.values()
    assert remote["admission"] == embedded["admission"]
    assert remote == embedded  # and everything else: RTO terms, timeline, charts
