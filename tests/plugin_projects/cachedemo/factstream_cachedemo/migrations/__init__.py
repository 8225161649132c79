"""Alembic revisions of the ``cachedemo`` branch."""
