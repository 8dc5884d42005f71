"""Concurrent processes migrating one fresh store take turns: none fails, the schema is whole.

Several ``respond --db postgresql://…`` started together on an empty database each migrate it
first. Without a lock they all create the same tables at once and all but one fail on a
duplicate key in PostgreSQL's catalogue. Each process here waits at a start line (a file) so the
migrations really overlap, then opens the store for writing the way ``respond --db`` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pytest

import firedrill
from firedrill.store import open_store
from tests.store.conftest import PostgresServer, _database

SRC = Path(firedrill.__file__).resolve().parents[1]
PROCESSES = 3
WORKER = """
import sys, time
from pathlib import Path
from firedrill.app.respond import open_for_writing
from firedrill.store import audit
url, start = sys.argv[1], Path(sys.argv[2])
while not start.exists():
    time.sleep(0.005)
store = open_for_writing(url)
with store.session() as session:
    audit.append(session, actor="worker", action="test.migrated", subject=sys.argv[3], at_s=1.0)
store.close()
print("migrated")
"""


def _race(url: str, tmp_path: Path) -> list[subprocess.CompletedProcess[str]]:
    start = tmp_path / "start"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(start), f"w{i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(PROCESSES)
    ]
    time.sleep(3.0)  # every worker has imported firedrill and waits at the start line
    start.touch()
    done = []
    for w in workers:
        out, err = w.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(w.args, w.returncode, out, err))
    return done


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_concurrent_first_migrations_take_turns(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    context: AbstractContextManager[str]
    if backend == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        context = _database(server)
    else:
        context = nullcontext(f"sqlite:///{tmp_path / 'store.db'}")
    with context as url:
        done = _race(url, tmp_path)
        for proc in done:
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert proc.stdout.strip() == "migrated"
        with open_store(url, read_only=True) as store:
            assert store.revision() == store.head_revision()
            with store.session() as session:
                from firedrill.store import audit

                result = audit.verify(session)
        assert result.ok
        assert result.records == PROCESSES  # every process's write landed, none was lost
