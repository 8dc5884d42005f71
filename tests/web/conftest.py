"""The serve tests reuse the store tests' PostgreSQL server (started once per session)."""

from tests.store.conftest import (  # noqa: F401 - fixtures, found by name
    migrated_postgres,
    migrated_sqlite,
    postgres_server,
    store,
)
