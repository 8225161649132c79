"""Alembic revisions of the ``notes`` branch."""
