"""Drill validation: every refusal names the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from firedrill.errors import SpecError
from firedrill.specfile import load_drill

HERE = Path(__file__).parent
FLEET = HERE / "gameday-fleet.yaml"
SLO = HERE / "gameday-slo.yaml"

# Line numbers below count from 1 in this text.
BASE = f"""\
name: v-drill
rung: L5
fleet: {FLEET}
slo: {SLO}
duration_cap: 15m
abort_owner: carol
target: {{model: llm-70b, region: us-east-1, namespace: serve-chat}}
survivor: [us-west-2]
admission: Enforce
blast_radius: {{regions: [us-east-1], max_nodes: 20}}
change_freeze: {{before: 30m, after: 30m}}
hypothesis:
  - {{clause: c, metric: time_to_slo_s, region: us-west-2, op: "<=", value: 600}}
rto: {{budget: 10m}}
stop_conditions:
  - {{name: s, kind: error_ratio, region: us-west-2, threshold: 0.05}}
injections:
  - {{at: 2m, kind: region_blackhole, region: us-east-1}}
  - {{at: 3m, kind: bad_digest, model: llm-70b, region: us-west-2}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "drill.yaml"
    path.write_text(text)
    return path


def _refusal(tmp_path: Path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_drill(_write(tmp_path, text))
    return info.value


def test_the_base_drill_is_valid(tmp_path: Path) -> None:
    loaded = load_drill(_write(tmp_path, BASE))
    assert loaded.spec.name == "v-drill"
    assert loaded.spec.survivor == ["us-west-2"]
    assert len(loaded.spec_sha256) == 64


@pytest.mark.parametrize(
    ("old", "new", "line", "field", "words"),
    [
        pytest.param(
            "admission: Enforce",
            "admission: Ignore",
            9,
            "admission",
            "Ignore' refused",
            id="admission-ignore",
        ),
        pytest.param(
            "namespace: serve-chat",
            "namespace: kube-system",
            7,
            "target.namespace",
            "not allowlisted",
            id="target-outside-allowlist",
        ),
        pytest.param(
            "{at: 2m, kind: region_blackhole, region: us-east-1}",
            "{at: 2m, kind: region_blackhole, region: us-east-1, duration: 13h}",
            18,
            "injections[0].duration",
            "at most 12h",
            id="blackhole-over-12h",
        ),
        pytest.param(
            "{at: 2m, kind: region_blackhole, region: us-east-1}",
            "{at: 2m, kind: region_blackhole, region: eu-west-1}",
            18,
            "injections[0].region",
            "outside the blast radius",
            id="region-outside-radius",
        ),
        pytest.param(
            "max_nodes: 20",
            "max_nodes: 10",
            18,
            "injections[0]",
            "more than the blast radius",
            id="wider-than-max-nodes",
        ),
        pytest.param(
            "{at: 2m, kind: region_blackhole, region: us-east-1}",
            "{at: 2m, kind: replica_kill, cell: use1-a, namespace: kube-system}",
            18,
            "injections[0].namespace",
            "not allowlisted",
            id="injection-in-kube-system",
        ),
        pytest.param(
            "{at: 2m, kind: region_blackhole, region: us-east-1}",
            "{at: 2m, kind: replica_kill, cell: use9-z}",
            18,
            "injections[0].cell",
            "unknown cell 'use9-z'",
            id="unknown-cell",
        ),
        pytest.param(
            "{name: s, kind: error_ratio, region: us-west-2, threshold: 0.05}",
            "{name: s, kind: expr, expr: 'sum(rate(x[5m])'}",
            16,
            "stop_conditions[0].expr",
            "expected ')'",
            id="bad-expr",
        ),
    ],
)
def test_refusals_name_file_line_and_field(
    tmp_path: Path, old: str, new: str, line: int, field: str, words: str
) -> None:
    assert old in BASE
    err = _refusal(tmp_path, BASE.replace(old, new))
    assert err.file.endswith("drill.yaml")
    assert err.field == field
    assert err.line == line
    assert words in err.reason


def test_no_stop_condition_is_refused(tmp_path: Path) -> None:
    text = BASE.replace(
        "stop_conditions:\n  - {name: s, kind: error_ratio, region: us-west-2, threshold: 0.05}\n",
        "stop_conditions: []\n",
    )
    err = _refusal(tmp_path, text)
    assert err.field == "stop_conditions"
    assert err.line == 15
    assert "stop condition" in err.reason


def test_no_duration_cap_is_refused(tmp_path: Path) -> None:
    err = _refusal(tmp_path, BASE.replace("duration_cap: 15m\n", ""))
    assert err.field == "duration_cap"
    assert "hard duration cap" in err.reason


def test_no_bad_digest_is_refused_from_l1(tmp_path: Path) -> None:
    text = BASE.replace("  - {at: 3m, kind: bad_digest, model: llm-70b, region: us-west-2}\n", "")
    err = _refusal(tmp_path, text)
    assert err.field == "injections"
    assert err.line == 17
    assert "bad digest" in err.reason


def test_l0_needs_no_bad_digest(tmp_path: Path) -> None:
    text = BASE.replace("rung: L5", "rung: L0").replace(
        "  - {at: 3m, kind: bad_digest, model: llm-70b, region: us-west-2}\n", ""
    )
    assert load_drill(_write(tmp_path, text)).spec.rung == "L0"


def test_a_release_in_the_change_freeze_is_refused(tmp_path: Path) -> None:
    text = BASE + "scheduled_changes:\n  - {at: -10m, kind: release, name: vllm-0.6.4}\n"
    err = _refusal(tmp_path, text)
    assert err.field == "scheduled_changes[0].at"
    assert err.line == 21
    assert "change freeze" in err.reason


def test_a_release_outside_the_freeze_is_fine(tmp_path: Path) -> None:
    text = BASE + "scheduled_changes:\n  - {at: -2h, kind: release, name: vllm-0.6.4}\n"
    assert load_drill(_write(tmp_path, text)).spec.scheduled_changes[0].at_s == -7200


def test_every_problem_is_reported(tmp_path: Path) -> None:
    text = BASE.replace("admission: Enforce", "admission: Ignore").replace(
        "namespace: serve-chat", "namespace: kube-system"
    )
    err = _refusal(tmp_path, text)
    assert {e.field for e in err.errors} >= {"admission", "target.namespace"}


def test_shape_errors_come_from_pydantic_with_a_line(tmp_path: Path) -> None:
    err = _refusal(tmp_path, BASE.replace("kind: bad_digest", "kind: bad_digets"))
    assert err.line == 19
    assert err.field is not None
    assert err.field.startswith("injections[1]")
