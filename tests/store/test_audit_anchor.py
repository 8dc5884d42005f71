"""``audit verify`` on logs an attacker has damaged: unreadable rows, removed tails, no log at all.

A row whose JSON was broken or whose ``at_s`` was overwritten with bytes is tampering (exit 1),
not a crash; a log emptied or cut short verifies only without an anchor, and says so; with the
anchor ``audit head`` printed (kept outside the database) it is TAMPERED. The unreadable-row cases
need SQLite (PostgreSQL's typed columns refuse such values); the rest run on both backends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.store import Store, open_store
from tests.store.test_audit import _fill, _tampering

runner = CliRunner()


def _url(store: Store) -> str:
    return store.url.render_as_string(hide_password=False)


def _sqlite_store(tmp_path: Path, n: int) -> tuple[Store, str]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    store.migrate()
    _fill(store, n)
    return store, url


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("data", "'{\"i\": 3, broken'"),
        ("data", "'[1, 2]'"),
        ("data", "X'FFFE00'"),
        ("at_s", "X'0102030405'"),
        ("at_s", "'soon'"),
        ("actor", "X'00FF'"),
    ],
)
def test_an_unreadable_row_is_tampering_not_a_crash(
    tmp_path: Path, column: str, value: str
) -> None:
    store, url = _sqlite_store(tmp_path, 6)
    with store, _tampering(store) as conn:
        conn.execute(text(f"UPDATE audit_log SET {column} = {value} WHERE seq = 3"))
    result = runner.invoke(app, ["audit", "verify", "--db", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, result.output
    assert "TAMPERED" in result.output
    assert "seq 3" in result.output


def _head(url: str) -> dict[str, object]:
    result = runner.invoke(app, ["audit", "head", "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    anchor: dict[str, object] = json.loads(result.stdout)
    return anchor


def _verify(url: str, anchor: dict[str, object] | None = None) -> tuple[int, str]:
    args = ["audit", "verify", "--db", url]
    if anchor is not None:
        args += ["--expect-count", str(anchor["seq"]), "--expect-head", str(anchor["hash"])]
    result = runner.invoke(app, args)
    return result.exit_code, result.output.replace("\n", " ")


def test_deleting_every_row_is_caught_by_the_anchor(store: Store) -> None:
    _fill(store, 12)
    url = _url(store)
    anchor = _head(url)
    assert anchor["seq"] == 12
    assert _verify(url, anchor)[0] == 0
    with _tampering(store) as conn:
        conn.execute(text("DELETE FROM audit_log"))
    code, output = _verify(url)
    assert code == 0  # without an anchor an empty log is consistent: it must not say "intact"
    assert "intact" not in output
    assert "unanchored" in output
    code, output = _verify(url, anchor)
    assert code == 1, output
    assert "TAMPERED" in output
    for option, value in (("--expect-count", "12"), ("--expect-head", str(anchor["hash"]))):
        result = runner.invoke(app, ["audit", "verify", "--db", url, option, value])
        assert result.exit_code == 1, (option, result.output)
        assert "TAMPERED" in result.output


def test_records_removed_from_the_end_are_caught_by_the_anchor(store: Store) -> None:
    _fill(store, 10)
    url = _url(store)
    anchor = _head(url)
    _fill(store, 3)  # the log grows after the anchor was taken: it still holds
    assert _verify(url, anchor)[0] == 0
    with _tampering(store) as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq > 7"))
    code, output = _verify(url, anchor)
    assert code == 1, output
    assert "removed from its end" in output


def test_the_anchor_of_an_empty_log_verifies_an_empty_log(store: Store) -> None:
    url = _url(store)
    anchor = _head(url)
    assert anchor["seq"] == 0
    assert _verify(url, anchor)[0] == 0
    _fill(store, 2)
    assert _verify(url, anchor)[0] == 0  # the log grew: still consistent with its anchor


def test_a_malformed_anchor_is_a_usage_error(store: Store) -> None:
    result = runner.invoke(app, ["audit", "verify", "--db", _url(store), "--expect-head", "xyz"])
    assert result.exit_code == 2
