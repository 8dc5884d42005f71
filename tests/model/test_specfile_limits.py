"""Spec loaders refuse what is not a small, shallow, regular file: a clear error, exit 4.

Every loader goes through the same reader, so each limit is checked on each loader (fleet, SLO,
policy, scenario, drill), and once through the CLI for the exit code.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.detect.slo import SloSpec
from firedrill.errors import SpecError
from firedrill.remediate.policy import PolicySpec
from firedrill.specfile import load_drill, load_fleet, load_scenario, load_spec, spec_sha256

MAX_DEPTH = 64  # firedrill.specfile's limits, as documented
MAX_SPEC_KIB = 256

LOADERS: dict[str, Callable[[Path], Any]] = {
    "fleet": load_fleet,
    "slo": lambda p: load_spec(p, SloSpec),
    "policy": lambda p: load_spec(p, PolicySpec),
    "scenario": load_scenario,
    "drill": load_drill,
    "sha256": spec_sha256,
}


def _refused(loader: Callable[[Path], Any], path: Path, *, within_s: float = 10.0) -> SpecError:
    """Run the loader in a thread: a loader that blocks (a FIFO) fails the test, not the run."""
    outcome: list[BaseException | None] = []

    def go() -> None:
        try:
            loader(path)
        except BaseException as exc:  # noqa: BLE001 - the test inspects whatever escaped
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(within_s)
    assert outcome, f"the loader still runs after {within_s} s (blocked on {path})"
    error = outcome[0]
    assert isinstance(error, SpecError), f"expected a SpecError, got {error!r}"
    assert error.file == str(path)
    return error


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    error = _refused(LOADERS[kind], fifo)
    assert "regular file" in error.reason
    assert "FIFO" in error.reason


@pytest.mark.parametrize("kind", ["fleet", "drill", "sha256"])
def test_dev_zero_is_refused_not_read_forever(kind: str) -> None:
    error = _refused(LOADERS[kind], Path("/dev/zero"))
    assert "character device" in error.reason


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert "directory" in _refused(load_fleet, tmp_path).reason


@pytest.mark.parametrize("kind", sorted(set(LOADERS) - {"sha256"}))
def test_twenty_thousand_levels_of_nesting_is_a_spec_error(tmp_path: Path, kind: str) -> None:
    deep = tmp_path / "spec.yaml"
    deep.write_text("name: x\nmodels: " + "[" * 20_000 + "]" * 20_000 + "\n")
    error = _refused(LOADERS[kind], deep)
    assert f"more than {MAX_DEPTH} levels" in error.reason
    assert error.line == 2


def test_deep_block_mappings_are_refused_at_the_limit(tmp_path: Path) -> None:
    lines = [f"{'  ' * i}k{i}:" for i in range(MAX_DEPTH + 5)]
    deep = tmp_path / "spec.yaml"
    deep.write_text("\n".join(lines) + " 1\n")
    assert "levels deep" in _refused(load_fleet, deep).reason


def test_a_one_megabyte_spec_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "spec.yaml"
    rows = "".join(f"  - {{name: m{i}, weights_gb: 1}}\n" for i in range(30_000))
    big.write_text("name: big\nmodels:\n" + rows)
    assert big.stat().st_size > 1_000_000
    error = _refused(load_fleet, big, within_s=2.0)  # refused on its size, not after parsing
    assert f"at most {MAX_SPEC_KIB} KiB" in error.reason


def test_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    bomb = tmp_path / "spec.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert "aliases expand" in _refused(load_fleet, bomb).reason


def test_the_examples_are_well_inside_the_limits() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    sizes = [p.stat().st_size for p in root.rglob("*.yaml")]
    assert max(sizes) * 4 < MAX_SPEC_KIB * 1024
    load_fleet(root / "fleet-10k.yaml")


def test_cli_exits_4_on_a_fifo_and_on_deep_nesting(tmp_path: Path) -> None:
    runner = CliRunner()
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 20_000 + "]" * 20_000 + "\n")
    for path in (fifo, deep):
        result = runner.invoke(app, ["gameday", "plan", str(path)])
        assert result.exit_code == 4, result.output
        assert str(path) in result.output
