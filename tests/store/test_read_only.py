"""Read-only commands work on a store nobody can write: a WAL SQLite file on a read-only mount.

A reader of a WAL database normally creates the ``-shm`` file next to it; on a read-only file
system it cannot, and SQLite answered "unable to open database file". The store is made
read-only for real: as root, a read-only bind mount in a private mount namespace (``unshare
-m``); otherwise the directory and file lose their write bits (which binds a non-root user).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import firedrill
from firedrill.store import open_store
from tests.store.test_audit import _fill

SRC = Path(firedrill.__file__).resolve().parents[1]
RUN_CLI = "import sys; from firedrill.cli import main; sys.argv[0] = 'firedrill'; main()"
COMMANDS = {
    "audit verify": ["audit", "verify", "--db", "sqlite:///{db}"],
    "audit head": ["audit", "head", "--db", "sqlite:///{db}"],
    "incident list": ["incident", "list", "--db", "{db}"],
    "gameday ladder": ["gameday", "ladder", "--db", "sqlite:///{db}"],
}


def _wal_store(directory: Path) -> Path:
    """A migrated WAL-mode store with audit records, closed cleanly (no -wal/-shm left)."""
    directory.mkdir()
    db = directory / "store.db"
    store = open_store(f"sqlite:///{db}")
    store.migrate()
    _fill(store, 5)
    store.close()
    for leftover in ("store.db-wal", "store.db-shm"):
        assert not (directory / leftover).exists()
    return db


def _can_bind_mount_read_only(scratch: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    source, target = scratch / "probe-source", scratch / "probe-target"
    source.mkdir()
    target.mkdir()
    script = f"mount --bind {source} {target} && mount -o remount,bind,ro {target}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, check=False)
    return probe.returncode == 0


def _run_read_only(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI with the store's directory read-only; returns the finished process."""
    db = tmp_path / "store" / "store.db"
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    if os.geteuid() == 0:
        mount = tmp_path / "ro"
        mount.mkdir(exist_ok=True)
        argv = [a.format(db=mount / "store.db") for a in args]
        quoted = shlex.join([sys.executable, "-c", RUN_CLI, *argv])
        source, target = shlex.quote(str(db.parent)), shlex.quote(str(mount))
        script = (
            f"mount --bind {source} {target} && mount -o remount,bind,ro {target} && exec {quoted}"
        )
        command = ["unshare", "-m", "sh", "-c", script]
    else:
        argv = [a.format(db=db) for a in args]
        command = [sys.executable, "-c", RUN_CLI, *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def read_only_store(tmp_path: Path) -> Path:
    db = _wal_store(tmp_path / "store")
    if os.geteuid() == 0:
        if not _can_bind_mount_read_only(tmp_path):
            pytest.skip("not_exercised: no read-only mount possible here (root without unshare)")
    else:
        db.chmod(0o444)
        db.parent.chmod(0o555)
    return db


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_read_only_commands_work_on_a_read_only_wal_store(
    read_only_store: Path, tmp_path: Path, name: str
) -> None:
    before = sorted(p.name for p in read_only_store.parent.iterdir())
    done = _run_read_only(tmp_path, COMMANDS[name])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unable to open" not in done.stdout + done.stderr
    if name == "audit verify":
        assert "5 records" in done.stdout
    if name == "audit head":
        assert done.stdout.startswith("--expect-count 5 --expect-head ")
    assert sorted(p.name for p in read_only_store.parent.iterdir()) == before
    read_only_store.parent.chmod(0o755)
