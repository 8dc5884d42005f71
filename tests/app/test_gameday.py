"""The ``gameday run`` use case refuses before anything is injected, and says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from firedrill.adapters.journal_file import Journal
from firedrill.app.gameday import Refused, run_gameday
from firedrill.drill.recover import RecoveryReport
from firedrill.errors import FiredrillError
from firedrill.model import operations as ops
from firedrill.specfile import load_drill
from firedrill.store.ladder import LadderCheck

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "drills"
SHA = "sha256:" + "0" * 64


class Heard:
    """A listener that keeps what the use case reported."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def recovered(self, report: RecoveryReport, directory: Path) -> None:
        self.events.append(f"recovered {len(report.journals)}")

    def gated(self, answer: LadderCheck) -> None:
        self.events.append(f"gated {answer.gate.allowed}")

    def progress(self, sim_s: float) -> None:
        self.events.append("progress")

    def stored(self, result_id: int, answer: LadderCheck) -> None:
        self.events.append("stored")

    def store_failed(self, error: FiredrillError) -> None:
        self.events.append("store_failed")


def test_leftovers_that_cannot_be_reverted_refuse_the_run(tmp_path: Path) -> None:
    journals = tmp_path / "journal"
    left = Journal.create(
        journals, drill="l1", spec_sha256=SHA, seed=1, run_by="bob", target="http://127.0.0.1:9"
    )
    left.intend(ops.DenyCapacity("us-west-2"), ops.AllowCapacity("us-west-2"), 0.0)
    left.close()
    heard = Heard()
    with pytest.raises(Refused, match="leftovers are not reverted"):
        run_gameday(
            loaded=load_drill(EXAMPLES / "l1-replica-kill.yaml"),
            listener=heard,
            journal_dir=journals,
            token_file=tmp_path / "no-token",
        )
    assert heard.events == ["recovered 1"]  # said what was left, then refused: nothing ran
    assert not [p for p in journals.glob("*.jsonl") if p != left.path]  # no new journal


def test_a_closed_ladder_gate_refuses_the_run_and_is_heard_first(tmp_path: Path) -> None:
    heard = Heard()
    with pytest.raises(Refused, match=r"^ladder: .*override with a recorded reason"):
        run_gameday(
            loaded=load_drill(EXAMPLES / "l5-region-blackhole.yaml"),
            listener=heard,
            db=f"sqlite:///{tmp_path / 'store.db'}",  # an empty store: only L0 may run
            journal_dir=tmp_path / "journal",
        )
    assert heard.events == ["recovered 0", "gated False"]
    assert not list((tmp_path / "journal").glob("*.jsonl"))  # no journal: nothing injected


def test_an_l0_tabletop_is_not_run(tmp_path: Path) -> None:
    with pytest.raises(FiredrillError, match="tabletop"):
        run_gameday(
            loaded=load_drill(EXAMPLES / "l0-tabletop.yaml"),
            listener=Heard(),
            journal_dir=tmp_path,
        )
