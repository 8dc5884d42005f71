"""Defaults that several layers must agree on, kept apart so that reading one costs no import.

The store (an adapter) and every entry point (the CLI's ``--db``, ``respond --db``, the ladder)
name the same default store here; a new default goes here, never into a second constant.
"""

from __future__ import annotations

__all__ = ["DEFAULT_DB_URL"]

DEFAULT_DB_URL = "sqlite:///firedrill.db"  # the store: a SQLite file here, or postgresql://...
