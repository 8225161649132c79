"""Alembic revisions of the ``caches`` branch."""
