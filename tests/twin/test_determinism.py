"""Same spec + seed gives a byte-identical summary; another seed gives another run."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from firedrill.cli import app

FLEET = "examples/fleet.yaml"
REQUIRED_CELL_KEYS = {
    "requests",
    "errors",
    "ttft_p50_s",
    "ttft_p99_s",
    "mean_queue_wait_s",
    "utilization",
    "kv_usage_mean",
    "ready_replicas_mean",
}


def _run(tmp_path: Path, name: str, seed: int) -> dict[str, object]:
    out = tmp_path / name
    result = CliRunner().invoke(
        app,
        [
            "twin",
            "run",
            FLEET,
            "--hours",
            "0.25",
            "--seed",
            str(seed),
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads((out / "summary.json").read_text())
    return data


def test_same_seed_is_byte_identical_apart_from_wall_time(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", 7)
    b = _run(tmp_path, "b", 7)
    assert isinstance(a.pop("wall_seconds"), float)
    b.pop("wall_seconds")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert (tmp_path / "a" / "series.om.txt").read_bytes() == (
        tmp_path / "b" / "series.om.txt"
    ).read_bytes()


def test_another_seed_is_another_run(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", 7)
    c = _run(tmp_path, "c", 8)
    cells_a = a["cells"]
    cells_c = c["cells"]
    assert isinstance(cells_a, dict)
    assert isinstance(cells_c, dict)
    assert cells_a["use1-a"]["requests"] != cells_c["use1-a"]["requests"]


def test_summary_contract(tmp_path: Path) -> None:
    s = _run(tmp_path, "a", 1)
    for key in ("seed", "spec_sha256", "sim_seconds", "wall_seconds", "gpu_fault_events"):
        assert key in s
    assert s["seed"] == 1
    assert s["sim_seconds"] == 900
    cells = s["cells"]
    assert isinstance(cells, dict)
    assert len(cells) == 7
    for cell in cells.values():
        assert set(cell) >= REQUIRED_CELL_KEYS
        assert cell["requests"] > 0
        assert 0 < cell["ttft_p50_s"] <= cell["ttft_p99_s"]
