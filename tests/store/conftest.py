"""Every store test runs twice: on a SQLite file and on a real PostgreSQL server.

The server is started once per test session from Debian's ``postgresql`` package (``make tools``
installs it): ``initdb`` into a temporary directory, listening on 127.0.0.1 only, on a free port,
with its socket in that directory and trust authentication; it is stopped (fast mode, waited for)
and removed when the session ends. As root, PostgreSQL refuses to run, so its tools run as the
``postgres`` user. Each test gets a fresh database: empty (``db_url``), or a copy of one migrated
once per session (``store``), which keeps the suite fast; the migrations themselves are tested
from scratch on an empty one.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from firedrill.store import Store, open_store

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"


def _pg_bin() -> Path:
    found = sorted(
        (Path(d) for d in glob.glob(PG_BIN_GLOB) if (Path(d) / "initdb").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        pytest.fail(
            f"PostgreSQL server binaries not found ({PG_BIN_GLOB}/initdb): the store tests need "
            "a real server; run `make tools` (installs Debian's postgresql package)",
            pytrace=False,
        )
    return found[-1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run(cmd: list[str], *, what: str, log: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
        pytest.fail(
            f"could not {what} the PostgreSQL test server (exit {proc.returncode}):\n"
            f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}{tail}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this test session, on loopback; stopped at the end."""
    pg_bin = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="firedrill-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, user="postgres", group="postgres")
    data, log = root / "data", root / "server.log"
    port = _free_port()
    started = False
    try:
        _run(
            [*as_postgres, str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"],
            what="initialise",
        )  # fmt: skip
        # durability off (a throwaway server); minimal WAL makes CREATE DATABASE cheap
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c wal_level=minimal -c max_wal_senders=0"
        )
        started = True  # from here on, always try to stop it
        _run(
            [*as_postgres, str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(log),
             "-o", options, "-w", "-t", str(START_TIMEOUT_S), "start"],
            what="start",
            log=log,
        )  # fmt: skip
        yield PostgresServer(host="127.0.0.1", port=port, user="postgres")
    finally:
        if started:
            subprocess.run(
                [*as_postgres, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                 "-t", str(START_TIMEOUT_S), "stop"],
                capture_output=True, timeout=START_TIMEOUT_S + 10, check=False,
            )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


_database_numbers = itertools.count(1)
TEMPLATE = "firedrill_migrated"


@contextmanager
def _database(server: PostgresServer, *, template: str = "template0") -> Iterator[str]:
    """A new database on the test server, copied from ``template``; dropped afterwards."""
    name = f"t{os.getpid()}_{next(_database_numbers)}"
    admin = create_engine(server.url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            # a plain file copy is several times faster than WAL-logging it (PostgreSQL >= 15)
            version = int(conn.execute(text("SHOW server_version_num")).scalar_one())
            strategy = " STRATEGY FILE_COPY" if version >= 150000 else ""
            conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {template}{strategy}"))
        yield server.url(name)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    finally:
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a fresh database on the PostgreSQL test server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with _database(request.getfixturevalue("postgres_server")) as url:
        yield url


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once; each test works on a copy."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    with open_store(f"sqlite:///{path}") as s:
        s.migrate()
    return path


@pytest.fixture(scope="session")
def migrated_postgres(postgres_server: PostgresServer) -> str:
    """A database migrated once, used as the template of each test's database."""
    admin = create_engine(postgres_server.url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {TEMPLATE} TEMPLATE template0"))
    finally:
        admin.dispose()
    with open_store(postgres_server.url(TEMPLATE)) as s:
        s.migrate()
    return TEMPLATE


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated store on each backend (a copy of a database migrated once per session)."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        with open_store(f"sqlite:///{path}") as s:
            s.migrate()  # at head already: checks the revision and does nothing
            yield s
        return
    template = request.getfixturevalue("migrated_postgres")
    server = request.getfixturevalue("postgres_server")
    with _database(server, template=template) as url, open_store(url) as s:
        s.migrate()
        yield s
