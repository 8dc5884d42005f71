"""``respond --db`` and ``firedrill incident list|show|timeline|handoff|postmortem`` on a store.

One real run (a phantom XID on a canary node: an automation incident, quarantined, resolved,
with a postmortem) is kept once per module in a SQLite file; each test works on a copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from firedrill.cli import app
from firedrill.store import audit, incidents, open_store, postmortems, roles

CANARY = Path("examples/scenarios/phantom-xid-canary.yaml").resolve()
runner = CliRunner()


def _run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return runner.invoke(app, list(args), env={"FIREDRILL_DB": None, **(env or {})})


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    db = tmp_path_factory.mktemp("kept") / "incidents.db"
    result = _run("respond", str(CANARY), "--quiet", "--db", str(db))
    assert result.exit_code == 0, result.output
    return db, result


@pytest.fixture
def db(kept: tuple[Path, Result], tmp_path: Path) -> Path:
    copy = tmp_path / "incidents.db"
    shutil.copyfile(kept[0], copy)
    return copy


def _audit_records(db: Path) -> int:
    with open_store(f"sqlite:///{db}", read_only=True) as store, store.session() as s:
        result = audit.verify(s)
    assert result.ok
    return result.records


def test_respond_db_keeps_the_incidents_and_says_where(kept: tuple[Path, Result], db: Path) -> None:
    assert "INC-0001 stored as INC-0001" in kept[1].output
    again = _run("respond", str(CANARY), "--quiet", "--db", f"sqlite:///{db}")
    assert again.exit_code == 0, again.output
    assert "nothing written" in again.output  # the same run twice is stored once
    with open_store(f"sqlite:///{db}", read_only=True) as store, store.session() as s:
        assert [i.id for i in incidents.list(session=s)] == ["INC-0001"]


def test_a_bad_store_is_refused_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    result = _run("respond", str(CANARY), "--quiet", "--json", str(out), "--db", "mysql://x/y")
    assert result.exit_code == 4
    assert "unsupported database" in result.output
    assert not out.exists()  # nothing ran


def test_list_filters(db: Path) -> None:
    result = _run("incident", "list", "--db", str(db))
    assert result.exit_code == 0, result.output
    assert "INC-0001" in result.output
    assert "resolved" in result.output
    for flags in (["--status", "open"], ["--sev", "1"], ["--cell", "euw1-a"]):
        none = _run("incident", "list", "--db", str(db), *flags)
        assert none.exit_code == 0, none.output
        assert "INC-0001" not in none.output
    some = _run("incident", "list", "--db", str(db), "--sev", "SEV4", "--cell", "use1-a")
    assert "INC-0001" in some.output


def test_show_has_axes_severity_levers_and_roles(db: Path) -> None:
    result = _run("incident", "show", "INC-0001", "--db", str(db))
    assert result.exit_code == 0, result.output
    for text in ("SEV4", "axes", "security", "severity history", "node_quarantine", "roles"):
        assert text in result.output


def test_timeline_json_is_chronological(db: Path) -> None:
    result = _run("incident", "timeline", "INC-0001", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["incident"] == "INC-0001"
    times = [e["at_s"] for e in doc["events"]]
    assert times == sorted(times)
    kinds = [e["kind"] for e in doc["events"]]
    assert {"opened", "lever", "mitigated", "resolved"} <= set(kinds)


def test_handoff_says_the_sentence_and_records_it(db: Path) -> None:
    before = _audit_records(db)
    result = _run(
        "incident", "handoff", "INC-0001", "--db", str(db), "--role", "ic", "--to", "Bo",
        "--open-threads", "exporter rollback", "ticket backlog", "--next-update", "04:30",
        "--at", "04:00", "--by", "alice",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        "IC handing to Bo at 04:00 UTC; open threads exporter rollback, ticket backlog; "
        "next update 04:30"
    )
    assert _audit_records(db) == before + 1
    with open_store(f"sqlite:///{db}", read_only=True) as store, store.session() as s:
        (h,) = roles.handoffs(session=s, incident_id="INC-0001")
        assert (h.to_person, h.open_threads) == ("Bo", ["exporter rollback", "ticket backlog"])
        assert h.next_update_s - h.at_s == 1800.0
    show = _run("incident", "show", "INC-0001", "--db", str(db))
    assert "incident_commander: Bo since 04:00:00" in show.output


def test_handing_a_role_to_its_holder_is_refused(db: Path) -> None:
    args = ["incident", "handoff", "INC-0001", "--db", str(db), "--to", "Bo"]
    assert _run(*args, "--next-update", "04:30", "--at", "04:00").exit_code == 0
    again = _run(*args, "--next-update", "05:30", "--at", "05:00")
    assert again.exit_code == 4
    assert "already holds" in again.output


@pytest.mark.parametrize(
    "command",
    [
        ["show", "INC-0404"],
        ["timeline", "INC-0404"],
        ["postmortem", "INC-0404"],
        ["handoff", "INC-0404", "--to", "Bo", "--next-update", "04:30", "--at", "04:00"],
    ],
    ids=["show", "timeline", "postmortem", "handoff"],
)
def test_an_unknown_incident_is_exit_4_and_writes_nothing(db: Path, command: list[str]) -> None:
    before = _audit_records(db)
    result = _run("incident", *command, "--db", str(db))
    assert result.exit_code == 4
    assert "no incident 'INC-0404'" in result.output
    assert _audit_records(db) == before


def test_a_missing_store_is_exit_4_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    for command in (["list"], ["handoff", "INC-0001", "--to", "Bo", "--next-update", "04:30"]):
        result = _run("incident", *command, "--db", str(missing))
        assert result.exit_code == 4
        assert "no store" in result.output
    assert not missing.exists()


def test_the_db_defaults_to_firedrill_db_and_the_environment(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(db, tmp_path / "firedrill.db")
    assert "INC-0001" in _run("incident", "list").output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _run("incident", "list").exit_code == 4  # no firedrill.db here
    from_env = _run("incident", "list", env={"FIREDRILL_DB": str(db)})
    assert "INC-0001" in from_env.output


def test_postmortem_numbers_and_markdown(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "pm" / "INC-0001.md"
    result = _run("incident", "postmortem", "INC-0001", "--db", str(db), "--markdown", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text == result.stdout
    for heading in ("| TTD | TTM | TTR | GPU-hours lost | requests failed |", "## Action items"):
        assert heading in text
    assert "| 45 s | 45 s | 4 min 15 s |" in text  # detected 45 s in, resolved 255 s in
    assert "runbook_step" in text
    # the same store, the same bytes
    again = _run("incident", "postmortem", "INC-0001", "--db", str(db))
    assert again.stdout == text


def test_postmortem_refuses_an_unresolved_incident_or_one_without_action_items(
    db: Path, tmp_path: Path
) -> None:
    with open_store(f"sqlite:///{db}") as store, store.session() as s:
        open_one = incidents.create(
            session=s, cell="c", region="r", title="still open", sev=3, opened_at_s=10.0
        )
        bare = incidents.create(
            session=s, cell="c", region="r", title="no lessons", sev=3, opened_at_s=10.0
        )
        incidents.resolve(session=s, incident_id=bare.id, at_s=100.0)
        postmortems.create(
            session=s, incident_id=bare.id, ttd_s=0.0, ttm_s=50.0, ttr_s=90.0,
            gpu_hours_lost=0.0, requests_failed=0, tokens_refunded=0,
            root_cause_class="unknown", text="nothing learned",
        )  # fmt: skip
    out = tmp_path / "pm.md"
    pending = _run("incident", "postmortem", open_one.id, "--db", str(db), "--markdown", str(out))
    assert pending.exit_code == 1
    assert "written when it is resolved" in pending.output
    incomplete = _run("incident", "postmortem", bare.id, "--db", str(db), "--markdown", str(out))
    assert incomplete.exit_code == 1
    assert "no action item" in incomplete.output
    assert not out.exists()
