"""Opening the store, migrating it, and the one place database errors become ``StoreError``.

The store is a SQLite file by default (``sqlite:///firedrill.db``: a laptop, a game day, CI) and
PostgreSQL by URL (``postgresql://...``, reached through psycopg 3) when several people or
processes share it. Both run the same migrations and the same services.

A unit of work is ``with store.session() as session: ...``: it commits when the block ends and
rolls back everything if it raises. Inside it, each service call writes in a savepoint
(``writing``), so a refused write undoes only itself, earlier writes in the same unit survive and
the session stays usable. Every SQLAlchemy or driver error crossing this boundary is re-raised as
``StoreError`` chained ``from`` the original.

SQLite notes: Python's ``sqlite3`` driver manages transactions in a way that breaks savepoints, so
the engine turns that off and issues the ``BEGIN`` itself: ``BEGIN IMMEDIATE``, which takes the
write lock up front. SQLite has one writer at a time anyway; taking the lock first means a second
writer waits for it (up to ``SQLITE_BUSY_TIMEOUT_S``) instead of failing half-way when it tries to
upgrade a read lock. Foreign keys are switched on for every connection (SQLite leaves them off).
A writable store runs in WAL mode with ``synchronous=FULL``: a commit returns only once the
write-ahead log is on disk (fsync), so what the store said it kept survives a power cut, as an
alert ``firedrill serve`` acknowledged must; readers such as ``audit verify`` do not block the
writer. (``synchronous=NORMAL`` would skip that fsync and could lose the last commits on power
loss.) ``serve`` pays the fsync once per group of webhook calls, not per call (see
``app/group_commit.py`` and BENCHMARKS.md). WAL needs a local file system; the ``-wal`` and
``-shm`` files next to the database belong to it. On PostgreSQL every writable connection sets
``synchronous_commit=on`` (the server's default, which a server may have turned off): a commit
returns once its WAL record is flushed.

Read-only commands open SQLite with ``mode=ro`` and never migrate. Even so, a reader of a WAL
database has to create the ``-shm`` file next to it; on a read-only file system (a mounted
snapshot, evidence copied onto read-only media) it cannot. When the directory is not writable
and no ``-shm`` exists, the store is opened ``immutable``: SQLite then reads the database file
alone, which holds every commit unless a ``-wal`` file with content sits next to it (a writer
that did not close cleanly); that case is refused with a message rather than read incompletely.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from firedrill.errors import StoreError
from firedrill.settings import DEFAULT_DB_URL

DEFAULT_URL = DEFAULT_DB_URL
MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another SQLite writer to finish
PG_CONNECT_TIMEOUT_S = 10
# The advisory lock every migration of a PostgreSQL store holds: an arbitrary 64-bit key that
# no other firedrill lock uses.
MIGRATION_LOCK_KEY = 0x1E5C0DE_F12ED211


def parse_url(url: str) -> URL:
    """Check a store URL; ``postgresql://`` and ``postgres://`` mean PostgreSQL through psycopg."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"not a database URL: {url!r}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg"):
            raise StoreError(
                "PostgreSQL is reached through psycopg: use postgresql://... or "
                f"postgresql+psycopg://..., not {parsed.drivername}://"
            )
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise StoreError(f"SQLite is reached through sqlite3: use sqlite:///FILE, not {url!r}")
        return parsed
    raise StoreError(
        f"unsupported database {backend!r}: use sqlite:///FILE or postgresql://USER@HOST/DB"
    )


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def reason(exc: BaseException) -> str:
    """The first line of what the database said, without the SQL and its parameters."""
    orig = getattr(exc, "orig", None)
    first = str(orig if orig is not None else exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


@contextmanager
def mapped_errors(what: str) -> Iterator[None]:
    """Re-raise database errors met while doing ``what`` as ``StoreError``."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise StoreError(f"{what}: {reason(exc)}") from exc


@contextmanager
def writing(session: Session, what: str) -> Iterator[None]:
    """Run one service's writes in a savepoint: on any failure they are undone and nothing else.

    The savepoint is flushed on the way out, so constraint violations surface here (as
    ``StoreError``) rather than at some later commit.
    """
    with mapped_errors(what), session.begin_nested():
        yield


def serialize_writers(session: Session, table: str) -> None:
    """Make concurrent writers of ``table`` take turns until the end of their transaction.

    Needed where a row is derived from the previous one (the next incident number, the audit
    chain's head). PostgreSQL: a table lock that conflicts with itself and with plain inserts
    but not with readers. SQLite already has a single writer at a time.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"))


def alembic_config(url: str | URL) -> Config:
    """Alembic's configuration for this store (no ini file: the migrations ship in the package).

    New revisions: ``alembic.command.revision(alembic_config(url), message, autogenerate=True)``
    against a database migrated to head, then review the file it writes under
    ``migrations/versions``.
    """
    parsed = parse_url(url) if isinstance(url, str) else url
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolation: a literal % in a password must be doubled
    cfg.set_main_option(
        "sqlalchemy.url", parsed.render_as_string(hide_password=False).replace("%", "%%")
    )
    return cfg


@dataclass(frozen=True, eq=False)
class Store:
    """A database holding firedrill's incidents, journals, drill results and audit log."""

    url: URL
    engine: Engine
    sessions: sessionmaker[Session]
    name: str  # the URL as given, password hidden: for messages

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits at the end of the block, rolls everything back if it raises."""
        session = self.sessions()
        try:
            with mapped_errors(self.name):
                yield session
                session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema up to ``revision`` (the latest by default); a no-op when it is there.

        Migrations of one store take turns: several processes started together on a fresh
        database (three ``respond --db`` at once) would otherwise all create the same tables and
        all but one fail on a duplicate key. On PostgreSQL a transaction-scoped advisory lock is
        taken before Alembic reads the schema's revision, so the next migrator waits, then finds
        the schema at head and does nothing. On SQLite the transaction starts with ``BEGIN
        IMMEDIATE``, which takes the database's write lock up front to the same effect.
        """
        cfg = alembic_config(self.url)
        try:
            with self.engine.begin() as connection:
                if self.dialect == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                    )
                cfg.attributes["connection"] = connection
                command.upgrade(cfg, revision)
        except (SQLAlchemyError, CommandError) as exc:
            raise StoreError(f"cannot migrate {self.name}: {reason(exc)}") from exc

    def revision(self) -> str | None:
        """The schema revision the database is at (``None``: never migrated)."""
        what = f"cannot read the schema revision of {self.name}"
        with mapped_errors(what), self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def head_revision(self) -> str:
        """The latest schema revision this version of firedrill knows."""
        head = ScriptDirectory.from_config(alembic_config(self.url)).get_current_head()
        if head is None:  # pragma: no cover - the package always ships its migrations
            raise StoreError(f"no migrations under {MIGRATIONS}")
        return head

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(url: str = DEFAULT_URL, *, read_only: bool = False) -> Store:
    """Open (lazily: nothing connects yet) the store at ``url``.

    ``read_only`` is for commands that only look, such as ``audit verify``: the database refuses
    every write, and a SQLite file that does not exist is an error instead of a new empty store.
    """
    parsed = parse_url(url)
    name = _shown(parsed)
    connect_args: dict[str, Any]
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite:
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S}
        if read_only:
            database = parsed.database or ""
            if database in ("", ":memory:") or not Path(database).is_file():
                raise StoreError(f"no store at {database or 'memory'}: nothing was written there")
            # SQLite opens a URI filename with mode=ro read-only
            parsed = parsed.set(
                database=Path(database).absolute().as_uri(), query=_read_only_query(Path(database))
            )
    else:
        connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        if read_only:
            connect_args["options"] = "-c default_transaction_read_only=on"
        else:
            # a commit returns once its WAL is flushed, whatever the server's default says
            connect_args["options"] = "-c synchronous_commit=on"
    try:
        engine = create_engine(parsed, connect_args=connect_args)
    except (SQLAlchemyError, ImportError) as exc:
        raise StoreError(f"cannot open {_shown(parsed)}: {reason(exc)}") from exc
    if sqlite:
        _sqlite_transactions(engine, read_only=read_only)
    sessions = sessionmaker(engine, expire_on_commit=False)
    return Store(url=parsed, engine=engine, sessions=sessions, name=name)


def _read_only_query(database: Path) -> dict[str, str]:
    """URI parameters that open a SQLite file read-only, also where nothing can be written."""
    query = {"mode": "ro", "uri": "true"}
    shm = database.with_name(database.name + "-shm")
    if os.access(database.parent, os.W_OK) or shm.exists():
        return query  # the -shm file exists or can be created: an ordinary read-only reader
    wal = database.with_name(database.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(
            f"cannot read {database} here: its write-ahead log ({wal.name}) holds commits not "
            "yet in the database file, and its directory is read-only; open it once where it "
            "is writable (any firedrill command that reads it) or copy the three files"
        )
    return {**query, "immutable": "1"}  # nothing can change it from here: read the file alone


def _sqlite_transactions(engine: Engine, *, read_only: bool) -> None:
    begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN: savepoints work
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        if not read_only:
            cursor.execute("PRAGMA journal_mode = WAL")  # persistent: stays with the file
            cursor.execute("PRAGMA synchronous = FULL")  # per connection: fsync every commit
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)
