"""Alembic's environment for the store's migrations.

``Store.migrate()`` runs these with its own connection (in ``config.attributes["connection"]``),
inside one transaction; without one, the URL in the configuration is used. SQLite cannot alter
most of a table in place, so migrations run in batch mode there (copy, alter, swap).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from firedrill.errors import StoreError
from firedrill.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Write the SQL instead of running it (``alembic upgrade --sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise StoreError("no connection and no sqlalchemy.url to migrate")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
