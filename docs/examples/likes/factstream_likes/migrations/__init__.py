"""Alembic revisions of the ``likes`` branch."""
