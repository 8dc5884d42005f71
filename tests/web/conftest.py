"""The serve tests reuse the store tests' PostgreSQL server (started once per session) and the
adapter tests' Alertmanager."""

from tests.adapters.test_prometheus_adapter import alertmanager  # noqa: F401 - a fixture
from tests.store.conftest import (  # noqa: F401 - fixtures, found by name
    migrated_postgres,
    migrated_sqlite,
    postgres_server,
    store,
)
